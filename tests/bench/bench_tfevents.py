"""Event-file reader figures: `.venv/bin/python -m pytest tests/bench/bench_tfevents.py -s`.

Prints, from one run on one machine: scalars/s, wall time and peak RSS of TensorBoard's
EventFileLoader (the oracle, scalars only), gpuwatch's client path (bulk) and the general
record-at-a-time decoder (the "before"), and the probe's stdlib path with and without the C
crc32c, plus the probe's first load of the file in per-poll budgets and an incremental read
of 1,000 events appended to a 50 MB file. Nothing here asserts a wall time.

The 1,000,000-scalar tensorboardX file (~47 MB: 5 tags x 200,000 steps) is written once into
$GPUWATCH_BENCH_CACHE (default /tmp/gpuwatch-bench) and reused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCALARS = 1_000_000
TAGS = ["train/loss", "lr", "grad_norm", "train/acc", "val/loss"]
CACHE = Path(os.environ.get("GPUWATCH_BENCH_CACHE", "/tmp/gpuwatch-bench"))

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
from gpuwatch.remote import tfevents_fast
series, offset, errors, info = tfevents_fast.read_columns(PATH)
n = sum(len(s) for s in series.values())
""",
    "gpuwatch general decoder, C crc32c (before)": """
from gpuwatch.remote import tfevents
points, offset, errors, info = tfevents.read_scalars(PATH, max_bytes=1 << 40)
n = len(points)
""",
    "probe stdlib path, C crc32c": """
from gpuwatch.remote import tfevents
n, offset = 0, 0
while True:  # as the probe reads: 16 MiB per call
    points, offset, errors, info = tfevents.read_scalars(PATH, offset)
    n += len(points)
    if info["stopped"] != "bytes":
        break
""",
    "probe stdlib path, pure-Python CRC": """
from gpuwatch.remote import tfevents
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
from gpuwatch.remote.scalars_cli import run_scalars
out = io.StringIO()
run_scalars([PATH], None, True, out=out)
n = 1000000
""",
}

CHILD = """
import json, resource, sys, time
PATH = sys.argv[1]
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


@pytest.fixture(scope="module")
def bench_file() -> Path:
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
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), code], capture_output=True,
                         text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_read_rates(bench_file: Path) -> None:
    size = bench_file.stat().st_size
    print(f"\n{bench_file.name}: {size / 1e6:.1f} MB, {SCALARS:,} scalars")
    results = {}
    for name, code in READERS.items():
        r = run_reader(code, bench_file)
        results[name] = r
        print(f"  {name:45s} {r['n'] / r['s'] / 1e3:8.0f} k scalars/s  {r['s']:7.2f} s  "
              f"peak RSS {r['rss_kb'] / 1024:6.0f} MB (after imports {r['base_kb'] / 1024:.0f})")
    tb = results["tensorboard EventFileLoader"]
    tb_rate = tb["n"] / tb["s"]
    for name, r in results.items():
        print(f"  ratio {name:39s} {r['n'] / r['s'] / tb_rate:6.1f}x TensorBoard")
    before = results["gpuwatch general decoder, C crc32c (before)"]
    after = results["gpuwatch client (bulk path)"]
    print(f"  bulk path speed-up over the record-at-a-time decoder: "
          f"{before['s'] / after['s']:.1f}x")


def test_probe_first_load_in_poll_budgets(bench_file: Path) -> None:
    from gpuwatch.remote.box import tfevents

    size = bench_file.stat().st_size
    real = tfevents.crc32c
    for label, impl in (("C crc32c", real), ("pure-Python CRC", tfevents.crc32c_py)):
        tfevents.crc32c = impl
        tfevents.CRC_IMPL = "c" if impl is real else "python"
        tfevents._LENGTH_CRC.clear()
        try:
            offset, polls, worst, total, n = 0, 0, 0.0, 0.0, 0
            while offset < size:
                t = time.perf_counter()
                points, offset, _, info = tfevents.read_scalars(
                    str(bench_file), offset, 4 << 20, time.monotonic() + 0.5)
                dt = time.perf_counter() - t
                polls, worst, total, n = polls + 1, max(worst, dt), total + dt, n + len(points)
            print(f"\nprobe first load, 4 MiB / 0.5 s per poll, {label}: {polls} polls, "
                  f"worst poll {worst * 1e3:.0f} ms, {total:.1f} s CPU in all, "
                  f"{n / total / 1e3:.0f} k scalars/s ({info['crc']})")
        finally:
            tfevents.crc32c = real
            tfevents.CRC_IMPL = "c"


def test_incremental_read_after_append(bench_file: Path, tmp_path: Path) -> None:
    from gpuwatch.remote.box import tfevents
    from gpuwatch.remote.wire import tfevents_fast
    from tensorboardX import SummaryWriter

    big = tmp_path / "events.out.tfevents.big"
    shutil.copyfile(bench_file, big)
    head = bench_file.read_bytes()[:4_000_000]
    pos, need = 0, 50_000_000 - big.stat().st_size
    while pos < need:  # grow it to 50 MB with whole records of its own
        pos += 16 + int.from_bytes(head[pos:pos + 8], "little")
    with big.open("ab") as f:
        f.write(head[:pos])
    _, offset, _, _ = tfevents_fast.read_columns(str(big))
    w = SummaryWriter(str(tmp_path / "more"))
    for step in range(1000):
        w.add_scalar("train/loss", 1.0 / (step + 1), 200_000 + step)
    w.close()
    (more,) = (tmp_path / "more").glob("*tfevents*")
    raw = more.read_bytes()
    first = 16 + int.from_bytes(raw[:8], "little")  # drop its file_version record
    with big.open("ab") as f:
        f.write(raw[first:])
    for label, read in (("probe stdlib", tfevents.read_scalars),
                        ("client bulk", tfevents_fast.read_columns)):
        t = time.perf_counter()
        got, _end, errors, info = read(str(big), offset)
        dt = time.perf_counter() - t
        count = len(got) if isinstance(got, list) else sum(len(s) for s in got.values())
        print(f"\nincremental ({label}): {big.stat().st_size / 1e6:.1f} MB file, {count} new "
              f"scalars, {info['bytes_read']:,} bytes read from offset {offset:,} "
              f"in {dt * 1e3:.1f} ms")
        assert count == 1000 and not errors and info["bytes_read"] == len(raw) - first
