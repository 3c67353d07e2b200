"""What the benchmarks share: the smoke mode, one row of DESIGN §6's table, and the ways a
figure is taken on a shared machine (ratios pair by pair, CPU from the kernel's own count).

Smoke mode (`GPUWATCH_BENCH_SMOKE=1`, as CI runs them): every benchmark runs to its end on
small sizes and prints its figures; nothing is judged by time there, so a module that moved
breaks CI, not a figure. Without it, a benchmark measures at full size.

Why ratios pair by pair: this machine's speed swings 1.5-2x within minutes (other people's
work on the same two cores), so a figure is only ever compared with a baseline taken in the
same minute, A B A B ..., and the median of the pairs' ratios is quoted with their range.
Why CPU rather than wall time where the target allows: a process that waits for a core
counts that wait in its wall time; the scheduler's count of its own nanoseconds
(/proc/PID/schedstat) does not.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SMOKE = os.environ.get("GPUWATCH_BENCH_SMOKE") == "1"
"""Small sizes, a few seconds a benchmark, no verdict taken from a time (CI)."""


def size(full: int, smoke: int) -> int:
    """`full` normally, `smoke` in smoke mode."""
    return smoke if SMOKE else full


@dataclass(frozen=True)
class Row:
    """One target of DESIGN §6 with today's figure."""

    what: str
    """The target, in the words of DESIGN §6."""
    target: str
    """Its bound, as DESIGN writes it ("<= 1.2x")."""
    figure: str
    """Today's figure, or why it was not measured here and which command measures it."""
    baseline: str = ""
    """What the figure is a ratio to, measured in the same run."""
    ok: bool | None = None
    """True: within the target; False: a miss; None: not judged (not measured here, or a smoke
    run, whose sizes are too small to judge)."""

    @property
    def verdict(self) -> str:
        if self.ok is None:
            return "-" if self.measured else "not measured here"
        if SMOKE:
            return "smoke: not judged"
        return "pass" if self.ok else "MISS"

    @property
    def measured(self) -> bool:
        return not self.figure.startswith("not measured here")


def not_measured(what: str, target: str, why: str) -> Row:
    return Row(what, target, f"not measured here: {why}")


@dataclass(frozen=True)
class Spread:
    """Pairwise ratios (or samples): the median, with the smallest and largest."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def ratio(self) -> str:
        """"1.07x (0.98-1.15x, 12 pairs)"."""
        v = self.values
        return f"{self.median:.2f}x ({min(v):.2f}-{max(v):.2f}x, {len(v)} pairs)"

    def ms(self) -> str:
        v = self.values
        return f"{self.median * 1e3:.1f} ms ({min(v) * 1e3:.1f}-{max(v) * 1e3:.1f})"


def spread(values: Sequence[float]) -> Spread:
    return Spread(tuple(values))


def pairwise(a: Sequence[float], b: Sequence[float]) -> Spread:
    """The ratios a[i] / b[i] of samples taken in turn."""
    return Spread(tuple(x / y for x, y in zip(a, b, strict=True)))


# --------------------------------------------------------------------------------------------
# CPU of a process, from the kernel's own count


def task_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of a live (or zombie) process so far, from schedstat (the
    scheduler's nanoseconds; stat's ticks read an 11 ms python as 2)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    return total / 1e9


def own_cpu(argv: list[str], stdin: bytes = b"", env: dict[str, str] | None = None
            ) -> tuple[float, float, bytes]:
    """(CPU seconds of the process itself, its wall time, its stdout): read while it is a zombie
    (waitid WNOWAIT), so that its own start-up and exit count and its children do not."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err: list[bytes] = []

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()

    threads = [threading.Thread(target=feed),
               threading.Thread(target=lambda: err.append(proc.stderr.read()))]  # type: ignore[union-attr]
    for t in threads:
        t.start()
    out = proc.stdout.read()
    for t in threads:
        t.join()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    wall = time.monotonic() - t0
    with open(f"/proc/{proc.pid}/schedstat") as fh:
        cpu = int(fh.read().split()[0]) / 1e9
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {b''.join(err)[-400:]!r}")
    return cpu, wall, out


def tree_cpu(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(CPU seconds of a whole process and its waited-for children, wall seconds), from the
    kernel's rusage; its output thrown away (counted by nothing)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            err.seek(0)
            raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {err.read()[-400:]!r}")
    return usage.ru_utime + usage.ru_stime, wall


def in_turn(n: int, *measures: Callable[[], float]) -> list[list[float]]:
    """Each measure n times, in turn (A B C A B C ...): one list of samples per measure."""
    out: list[list[float]] = [[] for _ in measures]
    for _ in range(n):
        for samples, measure in zip(out, measures, strict=True):
            samples.append(measure())
    return out


# --------------------------------------------------------------------------------------------
# The machine


def machine() -> str:
    """"2 cores (AMD EPYC ...), Linux 6.1, Python 3.11.7"."""
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return (f"{os.cpu_count()} cores{f' ({model})' if model else ''}, "
            f"{platform.system()} {platform.release().split('-')[0]}, "
            f"Python {platform.python_version()}")


def load() -> str:
    """The load averages, as `uptime` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def print_rows(rows: Sequence[Row], title: str = "") -> None:
    if title:
        print(title)
    for r in rows:
        print(f"  {r.what}\n      target {r.target}: {r.figure}  [{r.verdict}]"
              + (f"\n      baseline: {r.baseline}" if r.baseline else ""), flush=True)


RESULTS: dict[str, list[Row]] = {}
"""DESIGN §6's rows of each benchmark that ran in this process (table.py takes them from here
rather than measuring again: a smoke pass under pytest runs each benchmark once)."""


def remember(section: str, rows: list[Row]) -> list[Row]:
    RESULTS[section] = rows
    return rows
