"""Write a store as the gpuwatch that imports here writes it: an hour of a fleet's polls
landed through the pipeline (FleetWatch, role "once"), then one poll of each host, an action
in the audit log, an acknowledged death, a watchdog restart, a discovered run's launch.

    python tests/data/stores/make_store.py OUT.sqlite3

Run with the gpuwatch whose store is to be kept (PROVENANCE.md says which); it needs the
tests' fixtures (tests/tui_fixtures.py) beside it, and nothing of this machine.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from tui_fixtures import (
    MORE_HOSTS,
    NOW,
    config,
    disk,
    history_points,
    latest,
    more_snapshot,
    ok,
    run_sample,
    snapshot,
)


def main(out: Path) -> None:
    if out.exists():
        raise SystemExit(f"{out} exists; not overwritten")
    cfg = config(more=True)
    hosts = {h.name: h for h in cfg.hosts}
    with Store.open(out) as store:
        fleet = FleetWatch(cfg, store, role="once", clock=lambda: NOW)
        for i in range(60):
            at = NOW - (60 - i) * 10
            for name, gpus in history_points(i).items():
                runs = ([run_sample("bert-ddp", pids=(4121,) if i < 30 else (), steps=range(0),
                                    t_end=at - 1)] if name == "gpu-zombie" else [])
                snap = snapshot(name, t=at - 1, gpus=gpus, runs=runs)
                if name == "gpu-zombie":
                    snap = replace(snap, disks=(disk("/", 1 << 40, 600 << 30),
                                                disk("/data", 4 << 40, (80 << 30) + (60 - i) * (
                                                    1 << 30) // 6, inodes_free=400_000)))
                fleet.land(ok(hosts[name], snap, at))
            for host in MORE_HOSTS:
                fleet.land(ok(host, more_snapshot(host, i), at))
        for outcome in latest(cfg):
            fleet.land(outcome)
        store.record_action(who="alice@laptop", host="gpu-zombie", action="reap",
                            phase="execute", targets=[{"pid": 5150, "start_ticks": 360000,
                                                       "boot_id": "boot-1", "user": "alice",
                                                       "cmd": "python3 -u ddp_worker.py"}],
                            command="TERM, then KILL after 10 s", outcome="sent", ok=None,
                            message="sent TERM to pid 5150", at=NOW - 5)
        store.acknowledge("gpu-oom", "gpt-sft", pids=[6001], who="alice@laptop", at=NOW - 3)
        store.record_restart("gpu-oom", "gpt-sft", death="6001", holder="watch@box:1:abc",
                             outcome="gave_up", message="died again", at=NOW - 2)
        store.save_launch("gpu-healthy", "llama-7b", {"cwd": "/data/llama-7b",
                                                      "argv": ["python", "train.py"]}, NOW - 1)
    with sqlite3.connect(out) as conn:  # one file: the WAL folded in
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
