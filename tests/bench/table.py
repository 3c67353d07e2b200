"""DESIGN §6's table: every target with today's figure, its baseline and its verdict.

    .venv/bin/python tests/bench/table.py [--write docs/performance.md] [--only poll,tui]
                                          [--soak 600] [--smoke]

Runs the benchmarks that measure DESIGN §6's targets (bench_poll, bench_tfevents, bench_tui,
bench_curves, and the real-curves test), in one run, and prints one row per target: today's
figure, what it is a ratio to (measured in the same run, pair by pair where it is timed), and
pass or MISS. A target this machine cannot measure says so, and which command measures it; no
figure is carried over from another day. `--write` writes the table, with the date, the
machine, the load and this command, as the page given (docs/performance.md is this table).
`--smoke` (or GPUWATCH_BENCH_SMOKE=1): small sizes, no verdict (CI). A full run takes about ten
minutes on the 2-core development machine, most of it TensorBoard reading a million scalars.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SECTIONS = ("poll", "tfevents", "tui", "curves", "real curves")


def _paths() -> None:
    """What tests/conftest.py gives the benchmarks under pytest: tests/ and its layers."""
    for folder in (HERE, HERE.parent, *(HERE.parent / layer for layer in
                                       ("unit", "box", "integration", "tui"))):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


_paths()

from figures import (  # noqa: E402
    RESULTS,
    SMOKE,
    Row,
    load,
    machine,
    not_measured,
    print_rows,
)

TARGETS: tuple[tuple[str, str], ...] = (
    ("a poll's wall time", "poll"),
    ("client CPU per poll", "poll"),
    ("the probe's own CPU", "poll"),
    ("bytes up / down", "poll"),
    ("event files", "tfevents"),
    ("the box's stdlib reader", "tfevents"),
    ("`--once` start-up vs", "poll"),
    ("`--once` start-up, local-only", "poll"),
    ("TUI:", "tui"),
    ("curve findings per poll", "curves"),
    ("fleet:", ""),
    ("store after a simulated month", ""),
    ("curve findings on real public curves", "real curves"),
    ("a real GPU training loop's step time", ""),
)
"""DESIGN §6's targets in its order (the beginning of each row's `what`) and the section that
measures each ("": none can here)."""

UNMEASURED = (
    not_measured("fleet: hosts polled at a 10 s interval from one client core (p95 staleness "
                 "<= 1.5x interval), TUI open: loop lag p99 / max, RSS over 10 min",
                 "512 hosts; <= 50 ms / <= 150 ms; <= 400 MiB flat",
                 "measured apart from this run: `.venv/bin/python -m pytest "
                 "tests/bench/bench_fleet.py -s` (64, 256, 512 hosts over real SSH, 60 s each "
                 "after a warm-up: five minutes of both cores, which would skew the other rows)"),
    not_measured("store after a simulated month of 64 hosts x 8 GPUs at 10 s: size; time to "
                 "open", "<= 1 GiB; <= 1 s",
                 "no benchmark yet (a month is 17 million GPU samples to write through the "
                 "store's retention)"),
    not_measured("a real GPU training loop's step time with gpuwatch polling its box every 2 s "
                 "vs not polled", "within noise (n >= 200 steps each, interleaved)",
                 "it needs a GPU: on a lent GPU machine, from the repository root, "
                 "`python3 tests/device/overhead.py` (docs/real-gpus.md)"),
)


@contextmanager
def sshd_factory(stack: ExitStack) -> Iterator[Callable[..., object]]:
    """`sshd_factory` as tests/conftest.py gives it: real sshd boxes, all stopped at the end."""
    from harness.sshd import SshdBox

    def start(**kwargs: object) -> SshdBox:
        box = SshdBox(Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="gpuwatch-bench-sshd-"))), **kwargs)  # type: ignore[arg-type]
        stack.callback(box.stop)
        box.start()
        return box

    yield start


def real_curves() -> list[Row]:
    """The curve findings on real public curves: tests/unit/test_curves_real.py's outcome (a
    test, not a timing: healthy curves raise no warning, each injected failure is caught)."""
    what = ("curve findings on real public curves marked healthy / broken "
            "(tests/unit/test_curves_real.py)")
    if SMOKE:
        return [not_measured(what, "0 warnings / every clear failure caught",
                             "a smoke run (CI runs the test itself)")]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests/unit/test_curves_real.py")],
                          capture_output=True, text=True, cwd=ROOT)
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return [Row(what, "0 warnings / every clear failure caught", f"pytest: {summary}",
                "the test's own assertions", done.returncode == 0)]


def measure(sections: tuple[str, ...], soak_s: float) -> list[Row]:
    """The rows of the sections asked for (those measured earlier in this process kept), in
    DESIGN §6's order, the targets not measured here among them."""
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatch-table-")))
        for name in sections:
            if name in RESULTS:
                continue
            print(f"== {name}", flush=True)
            folder = tmp / name.replace(" ", "-")
            folder.mkdir()
            if name == "poll":
                import bench_poll

                with sshd_factory(stack) as factory:
                    RESULTS[name] = bench_poll.figures(folder, factory)
            elif name == "tfevents":
                import bench_tfevents

                RESULTS[name] = bench_tfevents.figures(folder)
            elif name == "tui":
                import bench_tui

                RESULTS[name] = bench_tui.figures(folder, soak_s)
            elif name == "curves":
                import bench_curves

                RESULTS[name] = bench_curves.main([])
            else:
                RESULTS[name] = real_curves()
    return ordered(sections)


def ordered(sections: tuple[str, ...]) -> list[Row]:
    """DESIGN §6's order; a target whose section was not asked for is left out."""
    rows: list[Row] = []
    measured = [r for name in sections for r in RESULTS.get(name, [])]
    for start, section in TARGETS:
        if section and section not in sections:
            continue
        found = [r for r in (*measured, *UNMEASURED) if r.what.startswith(start)]
        if not found:
            raise AssertionError(f"no row for the target that begins {start!r}")
        rows += found
    return rows


def markdown(rows: list[Row], started: str, loads: tuple[str, str], command: str) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "# Performance",
        "",
        "Today's figure of every target of the design (DESIGN §6), from one run of one "
        "command; earlier figures are in this file's git log.",
        "",
        f"- **When**: {started}, at {commit()}",
        f"- **Machine**: {machine()}; {loads[0]} at the start, {loads[1]} at the end "
        "(other people's work shares these cores)",
        f"- **Command**: `{command}`" + (" (smoke mode: small sizes, nothing judged)"
                                          if SMOKE else ""),
        "",
        "| target | bound | today | baseline, measured in the same run | verdict |",
        "|---|---|---|---|---|",
        *(f"| {cell(r.what)} | {cell(r.target)} | {cell(r.figure)} | {cell(r.baseline)} | "
          f"{r.verdict} |" for r in rows),
        "",
        HOW_TO_READ,
    ]
    return "\n".join(lines)


HOW_TO_READ = """## How to read it

- **A ratio is to a baseline taken in the same run**, never to a figure of another day: this
  machine's speed swings 1.5-2x within hours. Where both are timed, they are taken in turn
  (A B A B ...) and the figure is the median of the pairs' ratios, with the smallest and
  largest in brackets: a wide range says the machine was busy, not that gpuwatch changed.
- **CPU, not wall time, where the target allows**: the kernel's count of a process's own
  nanoseconds (`/proc/PID/schedstat`, `rusage`) leaves out the time it waited for a core
  while others' work ran. A poll's wall time and the TUI's event-loop lag are wall times by
  nature and swing with the load.
- **`--once` start-up** is gpuwatch installed as a user installs it (a wheel of this tree in a
  venv of its own), from exec to its first TCP connection (its CPU until that moment, every
  thread), against the whole of `python -c "import asyncssh"` in the same venv; the
  local-only figure is its CPU until its probe starts against the whole of `python -c pass`.
- **Client CPU per poll** is gpuwatch's collector as the pipeline polls (its opening limiter
  included) against plain asyncssh opening a connection, running the very same command with
  the very same stdin (the probe and its request) and closing: the same bytes on the same
  wire and the same wait for the box, so that the ratio is what gpuwatch adds (the ssh
  config, host keys, the request, the document). The ratio to `run('true')` is printed too.
- **The probe's CPU** is its whole process on a simulated box (interpreter start-up,
  inflating and compiling what it is sent, running; not its children, the stand-in
  nvidia-smi and dmesg) against `python3 -c pass`, both the box's `/usr/bin/python3`.
- **Event files**: `gpuwatch scalars FILE` against a Python process that reads the same
  1,000,000-scalar tensorboardX file with TensorBoard's `EventFileLoader` and takes every
  scalar's value out: whole processes, start-up, imports and output included, user + sys CPU.
- **"not measured here"** names why, and the command that measures it where there is one.
- Each benchmark prints more than its rows here (bytes of a first poll, each reader alone,
  key latencies in tmux, ...): `.venv/bin/python -m pytest tests/bench/bench_NAME.py -s`;
  [development.md](development.md#benchmarks) lists them. CI runs every one of them in smoke
  mode (`GPUWATCH_BENCH_SMOKE=1`: small sizes, no verdict), so that none stops running.
"""


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "an unknown commit"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"commit {rev}" + (" with changes not committed" if dirty else "")


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="PATH", help="write the table as this page")
    parser.add_argument("--only", metavar="SECTIONS",
                        help=f"a comma-separated subset of {', '.join(SECTIONS)}")
    parser.add_argument("--soak", metavar="S", type=float,
                        help="the TUI's soak in seconds (the RSS target is judged at 600; "
                             "default GPUWATCH_BENCH_SOAK_S, else 120)")
    parser.add_argument("--smoke", action="store_true", help="small sizes, no verdict (CI)")
    args = parser.parse_args(argv)
    if args.smoke and not SMOKE:
        parser.error("--smoke must be given before anything is imported: use "
                     "GPUWATCH_BENCH_SMOKE=1 (run as a script, --smoke sets it)")
    sections = tuple(s.strip() for s in args.only.split(",")) if args.only else SECTIONS
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    import bench_tui

    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = load()
    rows = measure(sections, args.soak if args.soak is not None else bench_tui.SOAK_S)
    loads = (load_start, load())
    print(f"\nDESIGN §6, {started}, {machine()}; {loads[0]} at the start, {loads[1]} at the end")
    print_rows(rows)
    if args.write:
        command = " ".join(["tests/bench/table.py", *(argv if argv is not None
                                                      else sys.argv[1:])])
        Path(args.write).write_text(markdown(rows, started, loads,
                                             f".venv/bin/python {command}") + "\n")
        print(f"written: {args.write}")
    return rows


def test_the_table(tmp_path: Path) -> None:
    """Every target of DESIGN §6 has its row, measured or saying why not, and the page holds
    them all (under pytest's smoke pass, the benchmarks' own runs are taken, not repeated)."""
    rows = main(["--write", str(tmp_path / "performance.md")])
    page = (tmp_path / "performance.md").read_text()
    for start, _ in TARGETS:
        assert any(r.what.startswith(start) for r in rows), start
    for r in rows:
        assert r.figure and r.target and r.verdict
        assert f"| {r.what.replace('|', chr(92) + '|')} |" in page
    assert not [r for r in rows if r.measured and r.ok is None and not SMOKE]


if __name__ == "__main__":
    if "--smoke" in sys.argv and not SMOKE:  # before the benchmarks read it
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "GPUWATCH_BENCH_SMOKE": "1"})
    main()
