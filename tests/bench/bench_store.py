"""The local store after a simulated month of 64 hosts x 8 GPUs polled every 10 s: its size on
disk and the time to open it (DESIGN §6: <= 1 GiB, <= 1 s).

    .venv/bin/python -m pytest tests/bench/bench_store.py -s
    .venv/bin/python tests/bench/bench_store.py [--hosts 64] [--days 30] [--keep PATH]

Every poll goes through the store's own write path, as the pipeline's `remember` calls it
(remote/watch/landing.py): `record_poll` with the poll's 8 GPU rows, its probe document and
counters, the run holding the GPUs (its span and energy), then `maintain` with the default
`[store]` policy (raw rows a day, per-minute rows a week, per-hour rows a year, 1 GiB cap). Each
host's run is restarted once a day (new processes: a new span and a `started` event), and each
host has a finding that appears and clears every hour (two events an hour), so the timeline
holds what a month of a restless fleet leaves.

What is kept of a poll depends on its age: the last day keeps every poll, the week before one
row per GPU per minute, older days one per GPU per hour, whatever the rate they came at. So by
default the month is written at the rate each tier keeps: every 10 s for the last day, every
60 s back to the week, every 300 s before (1.5 M polls instead of 16.6 M; the rollups' counts
and averages differ, not their rows). GPUWATCH_BENCH_FULL=1 writes every 10 s poll of the month
(about an hour on a quiet machine). GPUWATCH_BENCH_SMOKE=1: 4 hosts, 3 days. Nothing is
asserted: it prints figures beside their targets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuwatch.remote.config.schema import Config
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.store import GpuRow, RunHold, Store
from gpuwatch.remote.watch.fleet import FleetWatch

SMOKE = os.environ.get("GPUWATCH_BENCH_SMOKE") == "1"
FULL = os.environ.get("GPUWATCH_BENCH_FULL") == "1"
DAY = 86_400
START = 1_784_001_600.0
TARGET_BYTES, TARGET_OPEN_S = 1 << 30, 1.0


def schedule(days: int, full: bool) -> list[float]:
    """The poll times of one host over `days` days (see the module's docstring)."""
    end = START + days * DAY
    if full:
        return [START + i * 10.0 for i in range(days * DAY // 10)]
    out: list[float] = []
    t = START
    while t < end:
        age = end - t
        out.append(t)
        t += 10.0 if age <= DAY + 600 else 60.0 if age <= 7 * DAY + 3600 else 300.0
    return out


def document(rng: random.Random) -> bytes:
    """A probe document's size and texture (the store keeps the last one per host)."""
    procs = [{"pid": 4000 + i, "cmd": f"python train.py --rank {i}", "cpu_s": rng.random() * 1e5}
             for i in range(40)]
    return json.dumps({"gpus": [{"index": g, "util": rng.randint(0, 100)} for g in range(8)],
                       "processes": procs}).encode()


def readings(rng: random.Random, n: int = 4096) -> list[tuple[float, ...]]:
    """GPU readings as a busy H100 gives them (util, SM clock, power to 0.01 W, temperature,
    VRAM), drawn once: the polls cycle through them, so the values' variety (and how SQLite
    stores them) is a real poll's without paying for random numbers on every row."""
    return [(float(rng.randint(90, 100)), float(rng.choice((1965, 1980, 1950))),
             round(rng.uniform(550.0, 700.0), 2), float(rng.randint(55, 75)),
             float(61_000 + rng.randint(0, 400))) for _ in range(n)]


def write_month(path: Path, hosts: int, days: int, full: bool) -> dict[str, float]:
    rng = random.Random(0)
    times = schedule(days, full)
    names = [f"node-{i:03d}" for i in range(hosts)]
    pool = readings(rng)
    polls, t0, k = 0, time.perf_counter(), 0
    with Store.open(path) as store:
        policy = FleetWatch(Config(), store, role="watch").store_policy
        doc = document(rng)
        for t in times:
            day = int((t - START) // DAY)
            hour = int((t - START) // 3600)
            for h, name in enumerate(names):
                rows = []
                for g in range(8):
                    util, sm, watts, temp, mem = pool[k % len(pool)]
                    k += 7
                    rows.append(GpuRow(t=t, gpu=g, util_pct=util, sm_clock_mhz=sm,
                                       sm_clock_max_mhz=1980.0, power_w=watts,
                                       power_limit_w=700.0, temp_c=temp, mem_used_mib=mem))
                pids = tuple(10_000 * (day + 1) + h * 10 + r for r in range(8))
                store.record_poll(name, taken_at=t, ok=True, boot_id="boot-1", doc=doc,
                                  counters={"collector": {"reasons": "x" * 40}},
                                  gpu_rows=rows, runs={"train": RunHold(pids, tuple(range(8)))},
                                  gap_s=policy.gap_s)
                if hour % 2 == 0 and (t - START) % 3600 < 10:  # a finding every other hour
                    store.update_findings(name, [Finding(
                        "gpu.throttled", Severity.WARNING, f"GPU {h % 8} is throttled (power "
                        "cap) at 95% util", gpu=h % 8, evidence={"reasons": ["sw_power_cap"]})],
                        t)
                elif hour % 2 == 1 and (t - START) % 3600 < 10:
                    store.update_findings(name, [], t)
                store.maintain(name, t, policy)
                polls += 1
    return {"polls": polls, "write_s": time.perf_counter() - t0}


def open_times(path: Path, n: int = 5) -> list[float]:
    """Store.open and a first read, each in a fresh process (its own page cache state is the
    machine's), minus nothing: what a cron `--once` pays to open the store."""
    code = ("import time,sys; t=time.perf_counter(); from gpuwatch.remote.store import Store; "
            "i=time.perf_counter(); s=Store.open(sys.argv[1]); s.hosts(); "
            "print(time.perf_counter()-i); s.close()")
    out = []
    for _ in range(n):
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, check=True)
        out.append(float(done.stdout.strip()))
    return out


def counts(path: Path) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("gpu_samples", "gpu_rollups", "events", "run_spans", "host_state")}


def run(hosts: int, days: int, full: bool, keep: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = keep or Path(tmp) / "gpuwatch.sqlite3"
        wrote = write_month(path, hosts, days, full)
        size = path.stat().st_size
        wal = Path(f"{path}-wal")
        wal_size = wal.stat().st_size if wal.exists() else 0
        opens = open_times(path)
        rows = counts(path)
    per_poll_us = wrote["write_s"] / wrote["polls"] * 1e6
    mode = " (smoke)" if SMOKE else " (every poll)" if full else ""
    print(f"\nbench_store{mode}: {hosts} hosts x 8 GPUs, {days} days at 10 s "
          f"({int(wrote['polls']):,} polls written, {per_poll_us:.0f} us each with upkeep)")
    print(f"  rows: {', '.join(f'{k} {v:,}' for k, v in rows.items())}")
    verdict = "" if SMOKE else ("  pass" if size <= TARGET_BYTES else "  MISS")
    print(f"  size: {size / 2**20:.0f} MiB (+ WAL {wal_size / 2**20:.1f} MiB)   target <= "
          f"{TARGET_BYTES >> 20} MiB{verdict}")
    med = statistics.median(opens)
    verdict = "" if SMOKE else ("  pass" if med <= TARGET_OPEN_S else "  MISS")
    print(f"  open: median {med * 1e3:.0f} ms, worst {max(opens) * 1e3:.0f} ms of {len(opens)} "
          f"fresh processes   target <= {TARGET_OPEN_S * 1e3:.0f} ms{verdict}")


def test_store_month() -> None:
    run(4 if SMOKE else 64, 3 if SMOKE else 30, FULL and not SMOKE, None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4 if SMOKE else 64)
    ap.add_argument("--days", type=int, default=3 if SMOKE else 30)
    ap.add_argument("--keep", type=Path, help="write the store here and keep it")
    args = ap.parse_args(argv)
    run(args.hosts, args.days, FULL, args.keep)


if __name__ == "__main__":
    main()
