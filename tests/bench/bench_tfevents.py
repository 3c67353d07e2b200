"""Event-file reader figures: `.venv/bin/python -m pytest tests/bench/bench_tfevents.py -s`.

Prints, from one run on one machine, and returns DESIGN §6's rows for tests/bench/table.py:

- `gpuwatch scalars FILE` against a Python process that reads the same file with TensorBoard's
  EventFileLoader (every scalar's value taken out, as TensorBoard's scalars plugin does), whole
  processes against whole processes: start-up, imports and output included; their CPU (user +
  sys, the kernel's rusage), the figure judged, and their wall times; `--json` too;
- each reader alone in a fresh interpreter (scalars/s, peak RSS): TensorBoard's, gpuwatch's
  client bulk path, the general record-at-a-time decoder, the probe's stdlib path with and
  without the C crc32c;
- the probe's first load of a 50 MB file as the box reads it, a poll at a time within the
  budget each poll has (base.DEFAULT_LIMITS: events_bytes, events_time_s), with the C crc32c
  and with the pure-Python CRC of a box without it: how many polls, the slowest poll;
- an incremental read of 1,000 events appended to the 50 MB file.

Nothing here asserts a time. The 1,000,000-scalar tensorboardX file (~47 MB: 5 tags x 200,000
steps) is written once into $GPUWATCH_BENCH_CACHE (default /tmp/gpuwatch-bench) and reused.
GPUWATCH_BENCH_SMOKE=1: a 20,000-scalar file, one run of each, a 2 MB "big" file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from figures import SMOKE, Row, print_rows, remember, size, spread, tree_cpu

SCALARS = size(1_000_000, 20_000)
TAGS = ["train/loss", "lr", "grad_norm", "train/acc", "val/loss"]
CACHE = Path(os.environ.get("GPUWATCH_BENCH_CACHE", "/tmp/gpuwatch-bench"))
BIG_BYTES = size(50_000_000, 2_000_000)
"""The file whose first load the probe spreads over polls."""
GW_RUNS, TB_RUNS = size(5, 1), size(1, 1)
"""Whole-process runs of `gpuwatch scalars` and of the EventFileLoader process (tens of
seconds each on the full file: the median of gpuwatch's runs is set against each)."""

TENSORBOARD = """
import sys
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util
n = 0
for event in EventFileLoader(sys.argv[1]).Load():
    for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "scalars":
            tensor_util.make_ndarray(value.tensor).item()
            n += 1
print(n)
"""
"""The oracle as a whole process: TensorBoard's loader and its own way to a scalar's value."""

# Each reader runs in a fresh interpreter so that its peak RSS is its own.
READERS = {
    "tensorboard EventFileLoader": """
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util
n = 0
for event in EventFileLoader(PATH).Load():
    for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "scalars":
            tensor_util.make_ndarray(value.tensor).item()
            n += 1
""",
    "gpuwatch client (bulk path)": """
from gpuwatch.remote.wire import tfevents_fast
series, offset, errors, info = tfevents_fast.read_columns(PATH)
n = sum(len(s) for s in series.values())
""",
    "gpuwatch general decoder, C crc32c": """
from gpuwatch.remote.box import tfevents
points, offset, errors, info = tfevents.read_scalars(PATH, max_bytes=1 << 40)
n = len(points)
""",
    "probe stdlib path, C crc32c": """
from gpuwatch.remote.box import tfevents
n, offset = 0, 0
while True:  # as the probe reads: 16 MiB per call
    points, offset, errors, info = tfevents.read_scalars(PATH, offset)
    n += len(points)
    if info["stopped"] != "bytes":
        break
""",
    "probe stdlib path, pure-Python CRC": """
from gpuwatch.remote.box import tfevents
tfevents.crc32c = tfevents.crc32c_py  # as on a box without the crc32c package
tfevents.CRC_IMPL = "python"
tfevents._LENGTH_CRC.clear()
n, offset = 0, 0
while True:
    points, offset, errors, info = tfevents.read_scalars(PATH, offset)
    n += len(points)
    if info["stopped"] != "bytes":
        break
assert info["crc"] == "python"
""",
    "gpuwatch scalars --json (read + format)": """
import io
from gpuwatch.tui.cli.scalars import run_scalars
out = io.StringIO()
run_scalars([PATH], None, True, out=out)
n = SCALARS
""",
}

CHILD = """
import json, resource, sys, time
PATH, SCALARS = sys.argv[1], int(sys.argv[3])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
exec(compile(sys.argv[2], "reader", "exec"))
dt = time.perf_counter() - t
print(json.dumps({"n": n, "s": dt, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "base_kb": base}))
"""


def write_bench_file(folder: Path, scalars: int) -> Path:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(folder), max_queue=10_000, flush_secs=3600)
    for step in range(scalars // len(TAGS)):
        for i, tag in enumerate(TAGS):
            w.add_scalar(tag, math.sin(step * 0.001 + i) * (i + 1), step)
    w.close()
    (path,) = folder.glob("*tfevents*")
    return path


def bench_file() -> Path:
    """The SCALARS-scalar file, written once into the cache."""
    folder = CACHE / f"tbx-{SCALARS}"
    done = folder / "DONE"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t = time.perf_counter()
        path = write_bench_file(folder, SCALARS)
        print(f"\nwrote {path} ({path.stat().st_size / 1e6:.1f} MB) in "
              f"{time.perf_counter() - t:.0f} s")
        done.write_text(path.name)
    return folder / done.read_text().strip()


def run_reader(code: str, path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), code, str(SCALARS)],
                         capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpuwatch_exe() -> str:
    """This environment's `gpuwatch` console script (the one beside its python)."""
    exe = Path(sys.executable).with_name("gpuwatch")
    if not exe.exists():
        raise RuntimeError(f"no gpuwatch console script beside {sys.executable}")
    return str(exe)


def whole_processes(path: Path) -> list[Row]:
    """`gpuwatch scalars FILE` (and `--json`) against the EventFileLoader process."""
    gw = [gpuwatch_exe(), "scalars", str(path)]
    tb = [sys.executable, "-c", TENSORBOARD, str(path)]
    tree_cpu(gw)  # warm: the page cache, the bytecode cache
    gws, tbs, jsons = [], [], []
    for i in range(max(GW_RUNS, TB_RUNS)):  # in turn, so a bad minute hits both
        if i < GW_RUNS:
            gws.append(tree_cpu(gw))
        if i < TB_RUNS:
            tbs.append(tree_cpu(tb))
        if i < GW_RUNS:
            jsons.append(tree_cpu([*gw, "--json"]))
    tb_cpu = statistics.median(c for c, _ in tbs)
    tb_wall = statistics.median(w for _, w in tbs)
    gw_cpu = spread([c for c, _ in gws])
    gw_wall = spread([w for _, w in gws])
    json_cpu = spread([c for c, _ in jsons])
    ratio = tb_cpu / gw_cpu.median
    print(f"\nwhole processes, {path.stat().st_size / 1e6:.1f} MB, {SCALARS:,} scalars "
          f"({GW_RUNS} runs of gpuwatch, {TB_RUNS} of TensorBoard, in turn): CPU (wall)")
    print(f"  EventFileLoader process        {tb_cpu:8.2f} s ({tb_wall:.2f} s)")
    print(f"  gpuwatch scalars FILE          {gw_cpu.median:8.3f} s ({gw_wall.median:.3f} s)"
          f"  {ratio:6.1f}x less CPU (wall {tb_wall / gw_wall.median:.1f}x)")
    print(f"  gpuwatch scalars --json FILE   {json_cpu.median:8.3f} s"
          f"  {tb_cpu / json_cpu.median:6.1f}x")
    return [Row(f"event files: `gpuwatch scalars` vs a TensorBoard EventFileLoader process, "
                f"whole processes, {SCALARS:,} scalars (CPU)", ">= 50x",
                f"{ratio:.1f}x (gpuwatch {gw_cpu.median:.2f} s, "
                f"{min(c for c, _ in gws):.2f}-{max(c for c, _ in gws):.2f} over {GW_RUNS} runs)",
                f"EventFileLoader {tb_cpu:.1f} s CPU; wall times {tb_wall:.1f} s against "
                f"{gw_wall.median:.2f} s ({tb_wall / gw_wall.median:.1f}x); `--json`: "
                f"{tb_cpu / json_cpu.median:.1f}x", ratio >= 50)]


def reader_rates(path: Path) -> None:
    size_mb = path.stat().st_size / 1e6
    print(f"\neach reader in a fresh interpreter, {size_mb:.1f} MB, {SCALARS:,} scalars")
    results = {}
    for name, code in READERS.items():
        r = run_reader(code, path)
        results[name] = r
        print(f"  {name:45s} {r['n'] / r['s'] / 1e3:8.0f} k scalars/s  {r['s']:7.2f} s  "
              f"peak RSS {r['rss_kb'] / 1024:6.0f} MB (after imports {r['base_kb'] / 1024:.0f})")
    tb = results["tensorboard EventFileLoader"]
    tb_rate = tb["n"] / tb["s"]
    for name, r in results.items():
        print(f"  ratio {name:39s} {r['n'] / r['s'] / tb_rate:6.1f}x TensorBoard")


def big_file(path: Path, folder: Path) -> Path:
    """A BIG_BYTES file of `path`'s records: copies of it, then as many of its first records
    as fit (whole records only)."""
    raw = path.read_bytes()
    big = folder / "events.out.tfevents.big"
    with big.open("wb") as f:
        left = BIG_BYTES
        while left >= len(raw):
            f.write(raw)
            left -= len(raw)
        end = 0
        while end < len(raw):
            nxt = end + 16 + int.from_bytes(raw[end:end + 8], "little")
            if nxt > left:
                break
            end = nxt
        f.write(raw[:end])
    return big


def first_load(big: Path) -> Row:
    """The probe's first load of `big`, a poll at a time within its per-poll budget."""
    from gpuwatch.remote.box import base, tfevents

    budget_bytes = base.DEFAULT_LIMITS["events_bytes"]
    budget_s = base.DEFAULT_LIMITS["events_time_s"]
    file_size = big.stat().st_size
    real = tfevents.crc32c
    found = {}
    for label, impl in (("C crc32c", real), ("pure-Python CRC", tfevents.crc32c_py)):
        tfevents.crc32c = impl
        tfevents.CRC_IMPL = "c" if impl is real else "python"
        tfevents._LENGTH_CRC.clear()
        try:
            offset, polls, times, n = 0, 0, [], 0
            while offset < file_size:
                t = time.process_time()
                points, offset, _, info = tfevents.read_scalars(
                    str(big), offset, budget_bytes, time.monotonic() + budget_s)
                times.append(time.process_time() - t)
                polls, n = polls + 1, n + len(points)
            found[label] = (polls, max(times), sum(times), n)
            print(f"probe first load of {file_size / 1e6:.0f} MB, {budget_bytes >> 20} MiB / "
                  f"{budget_s:g} s a poll, {label}: {polls} polls, slowest poll "
                  f"{max(times) * 1e3:.0f} ms of CPU, {sum(times):.1f} s in all, "
                  f"{n / sum(times) / 1e3:.0f} k scalars/s ({info['crc']})")
        finally:
            tfevents.crc32c = real
            tfevents.CRC_IMPL = "c"
    c_polls, c_worst, _, _ = found["C crc32c"]
    p_polls, p_worst, _, _ = found["pure-Python CRC"]
    return Row(f"the box's stdlib reader: the first load of a {file_size / 1e6:.0f} MB event "
               f"file within its per-poll budget ({budget_bytes >> 20} MiB, {budget_s:g} s)",
               f"<= {budget_s:g} s a poll",
               f"slowest poll {c_worst * 1e3:.0f} ms ({c_worst / budget_s:.2f} of the budget), "
               f"{c_polls} polls; without the C crc32c {p_worst * 1e3:.0f} ms, {p_polls} polls",
               "the budget itself (probe base.DEFAULT_LIMITS); CPU of each poll's read",
               max(c_worst, p_worst) <= budget_s)


def incremental(path: Path, big: Path, folder: Path) -> None:
    """1,000 events appended to `big`, read from the offset a first load left."""
    from gpuwatch.remote.box import tfevents
    from gpuwatch.remote.wire import tfevents_fast
    from tensorboardX import SummaryWriter

    grown = folder / "events.out.tfevents.grown"
    shutil.copyfile(big, grown)
    _, offset, _, _ = tfevents_fast.read_columns(str(grown))
    w = SummaryWriter(str(folder / "more"))
    for step in range(1000):
        w.add_scalar("train/loss", 1.0 / (step + 1), 200_000 + step)
    w.close()
    (more,) = (folder / "more").glob("*tfevents*")
    raw = more.read_bytes()
    first = 16 + int.from_bytes(raw[:8], "little")  # drop its file_version record
    with grown.open("ab") as f:
        f.write(raw[first:])
    for label, read in (("probe stdlib", tfevents.read_scalars),
                        ("client bulk", tfevents_fast.read_columns)):
        t = time.perf_counter()
        got, _end, errors, info = read(str(grown), offset)
        dt = time.perf_counter() - t
        count = len(got) if isinstance(got, list) else sum(len(s) for s in got.values())
        print(f"incremental ({label}): {grown.stat().st_size / 1e6:.1f} MB file, {count} new "
              f"scalars, {info['bytes_read']:,} bytes read from offset {offset:,} "
              f"in {dt * 1e3:.1f} ms")
        assert count == 1000 and not errors and info["bytes_read"] == len(raw) - first


def figures(tmp_path: Path) -> list[Row]:
    """Every figure of this bench, printed; DESIGN §6's rows among them, returned."""
    path = bench_file()
    print(f"\nbench_tfevents{' (smoke)' if SMOKE else ''}: {path} "
          f"({path.stat().st_size / 1e6:.1f} MB, {SCALARS:,} scalars); load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at start")
    rows = whole_processes(path)
    big = big_file(path, tmp_path)
    rows.append(first_load(big))
    incremental(path, big, tmp_path)
    return rows


def test_tfevents_figures(tmp_path: Path) -> None:
    print_rows(remember("tfevents", figures(tmp_path)), "DESIGN §6 rows:")


@pytest.mark.skipif(not SMOKE and not os.environ.get("GPUWATCH_BENCH_READERS"),
                    reason="each reader alone, minutes on the full file: "
                           "GPUWATCH_BENCH_READERS=1 to run it")
def test_read_rates() -> None:
    reader_rates(bench_file())
