"""Discovery figures: `.venv/bin/python -m pytest tests/bench/bench_discover.py -s`.

A real process (this machine's /proc) holding a stand-in GPU, started in a project folder with a
HuggingFace-like layout (events under runs/, outputs/checkpoint-N/) and N files of a dataset
under data/. The probe runs as one poll runs it (sh -c, bundle on stdin, stand-in nvidia-smi on
PATH) with discovery off, with discovery on as a first look (the folder searched), and on in
the steady state (the client sends the run back: no search until discover_every_s has passed),
with the discover module sent on every poll (as it once was), and as now: the last discovery
sent back for the probe to reuse instead.
Prints the median probe_s the probe reports over several polls, the search's entries, time and
what bound cut it, and the bytes sent and received. Nothing here asserts a wall time.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from figures import SMOKE
from gpuwatch.remote.model.discovery import parse_discovery
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.wire.bundle import build_command, build_stdin
from tensorboardX import SummaryWriter

POLLS = 2 if SMOKE else 9
SIZES = (300,) if SMOKE else (10_000, 100_000)


def project(root: Path, files: int) -> Path:
    with SummaryWriter(str(root / "runs" / "exp1")) as writer:
        for step in range(200):
            writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    for step in (100, 200, 300):
        folder = root / "outputs" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * 4096)
        (folder / "trainer_state.json").write_text(json.dumps(
            {"log_history": [{"step": s, "loss": 1.0 / s} for s in range(1, step, 10)]}))
    data = root / "data"
    for i in range(files):
        shard = data / f"part-{i // 1000:03d}"
        if i % 1000 == 0:
            shard.mkdir(parents=True)
        (shard / f"sample-{i:06d}.json").touch()
    (root / "train.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    return root


def poll(request: dict, env: dict[str, str]) -> tuple[dict, int, int, float]:
    stdin = build_stdin(request, trim=True)
    t0 = time.monotonic()
    result = subprocess.run(["sh", "-c", build_command(sys.executable)], input=stdin, env=env,
                            capture_output=True, timeout=60, check=True)
    wall = time.monotonic() - t0
    return json.loads(zlib.decompress(result.stdout)), len(stdin), len(result.stdout), wall


def in_process(pid: int, remembered: dict, reuse: dict) -> None:
    """The discovery steps alone, in this process (no interpreter start, no nvidia-smi)."""
    from gpuwatch.remote.box import names as probe

    limits = probe.request_limits({})

    def timed(request: dict, sections: str) -> float:
        times = []
        for _ in range(3 if SMOKE else 30):
            found: dict = {}
            t0 = time.perf_counter()
            probe.collect_processes(request, limits, [pid], found)
            if "discovered" in sections:
                probe.collect_discovered(request, limits, found)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    base = {"v": 1, "runs": []}
    off = timed({**base, "want": {"discover": False}}, "processes")
    grouping = timed(base, "processes")
    first = timed(base, "processes+discovered")
    steady = timed({**base, "discovered_runs": [remembered]}, "processes+discovered")
    reused = timed({**base, "discovered_runs": [remembered], "discovery_reuse": reuse},
                   "processes+discovered")
    print(f"  in-process, median of {3 if SMOKE else 30}: process table {off:.1f} ms; with "
          f"grouping {grouping:.1f} ms; + discovered section, first look {first:.1f} ms, steady "
          f"{steady:.1f} ms, reused {reused:.1f} ms")


@pytest.mark.parametrize("files", SIZES)
def test_discovery_cost(tmp_path: Path, files: int) -> None:
    root = project(tmp_path / "proj", files)
    box = Box(tmp_path / "box", h100_sxm(1), real_proc=True)
    proc = subprocess.Popen([sys.executable, "train.py"], cwd=root, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        box.add_compute_app(0, proc.pid, "python", 1000, follows_pid=True)
        env = box.env(base_path="/usr/bin:/bin")
        base = {"v": 1, "disks": [], "runs": [], "compress": True,
                "want": {"kernel": False, "nvml": False}}
        rows = []
        off = [poll({**base, "want": {**base["want"], "discover": False}}, env)
               for _ in range(POLLS)]
        rows.append(("discovery off", off, None))
        first = [poll(base, env) for _ in range(POLLS)]
        rows.append(("on, first look (search)", first, first[-1][0]))
        (run,) = first[-1][0]["discovered"]
        d = parse_discovery(run["name"], run["discovered"])
        remembered = {**d.to_request(), "offsets": {
            f["path"]: f["offset"] for f in run["events"]["files"]}}
        before = [poll({**base, "discovered_runs": [remembered]}, env) for _ in range(POLLS)]
        rows.append(("steady, module sent (before)", before, before[-1][0]))
        reuse = first[-1][0]["discovery"]["reuse"]
        steady = [poll({**base, "discovered_runs": [remembered], "discovery_reuse": reuse}, env)
                  for _ in range(POLLS)]
        assert all("discovery" not in p[0] for p in steady)  # reused: no need for the module
        rows.append(("steady, reused", steady, steady[-1][0]))
        print(f"\n{files:,} files under the cwd ({root}), median of {POLLS} polls:")
        print(f"  {'':28} {'probe_s':>8} {'wall_s':>7} {'sent':>7} {'received':>9}  search")
        for label, polls, doc in rows:
            probe_s = statistics.median(p[0]["probe_s"] for p in polls)
            wall = statistics.median(p[3] for p in polls)
            search = ""
            if doc is not None:
                stats = doc["discovered"][0]["discovered"].get("search")
                search = ("none" if stats is None else
                          f"{stats['entries']} entries in {stats['s'] * 1000:.1f} ms, "
                          f"cut by {stats.get('capped') or 'nothing'}")
            print(f"  {label:28} {probe_s:8.3f} {wall:7.3f} {polls[-1][1]:7d} "
                  f"{polls[-1][2]:9d}  {search}")
        found = d.found
        print(f"  found: events {found['events']}, checkpoints {found['checkpoints']}, "
              f"metrics {found['metrics']}")
        in_process(proc.pid, remembered, reuse)
        assert found["events"] == str(root / "runs")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
