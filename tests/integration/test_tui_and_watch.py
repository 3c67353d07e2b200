"""A TUI and a `gpuwatch watch` on one store, both watching one run: one actor restarts each
death (the lease), and neither erases what the other found (the TUI's saves once cleared the
run.restart_limit that `watch` had written: the TUI judged without the watchdog's findings).

Real parts: a training process behind a real sshd on loopback, a real `gpuwatch watch`
process, the real TUI polling over SSH. What did not happen is counted in the store (its
restarts, its findings) after the TUI's own polls landed, never after a sleep."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import test_actions
import test_watchdog as wd
from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.config.schema import Config
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch import fleet as fleet_module
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.tui.app import build_app
from test_actions import Rig, wait_for

rig = test_actions.rig


def test_a_tui_and_a_watcher_on_one_store(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    # The TUI saves its findings with every poll here (once a minute in life): each of its
    # saves is a chance to erase what `watch` wrote.
    monkeypatch.setattr(fleet_module, "RUNS_SAVE_S", 0.0)
    run, work = wd.trainer(rig, max_restarts=1)
    host = rig.host(run)
    state = rig.root / "state"
    conf = rig.root / "config.toml"
    wd.watch_config(rig, run, conf)
    conf.write_text(conf.read_text().replace("max_restarts = 5", "max_restarts = 1"))
    db = state / "gpuwatch" / "gpuwatch.sqlite3"
    env = {**os.environ, "XDG_STATE_HOME": str(state), "PYTHONUNBUFFERED": "1"}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    with Store.open(db) as store:
        pid = asyncio.run(wd.first_launch(rig, host, run, work, store))
    log = rig.root / "watch.log"
    with open(log, "wb") as fh:
        watcher = subprocess.Popen(
            [sys.executable, "-c", "from gpuwatch.tui.cli import main; main()", "watch",
             "--config", str(conf)], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: "watching 1 host" in log.read_text(), timeout=30, what="the watcher")
        asyncio.run(_with_the_tui(conf, db, work, pid))
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(20)
        except subprocess.TimeoutExpired:
            watcher.kill()
    assert watcher.returncode == 0, log.read_text()[-3000:]


async def _with_the_tui(conf, db, work, pid: int) -> None:  # type: ignore[no-untyped-def]
    config = load_config(str(conf))
    config = replace(config, interval=1.0)
    with Store.open(db) as store:
        app = build_app(config, store=store, poll=True)
        landed: list[float] = []
        async with app.run_test(size=(120, 40)) as pilot:
            app.fleet.listen(lambda r: landed.append(time.monotonic()))

            async def until(test, what: str, limit_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
                deadline = time.monotonic() + limit_s
                while not test():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    await pilot.pause(0.1)

            data = app.hosts["box1"]
            await until(lambda: data.run_status("llama") == "running", "the run seen alive")
            os.kill(pid, signal.SIGKILL)  # death 1: one restart, by whichever holds the lease
            await until(lambda: len(wd.launches(work)) == 2, "the restart")
            pid = wd.launches(work)[-1]["pid"]
            await until(lambda: any(r.outcome == "verified"
                                    for r in store.restarts("box1", "llama")),
                        "the restart verified")
            await until(lambda: data.run_status("llama") == "running", "the run alive again")
            os.kill(pid, signal.SIGKILL)  # death 2: the window's one restart is used up
            await until(lambda: any(r.outcome == "gave_up"
                                    for r in store.restarts("box1", "llama")), "giving up")
            await until(lambda: any(f.code == "run.restart_limit" for f in data.findings),
                        "the TUI says the watchdog gave up")
            # Ten more polls of the TUI land, each saving its findings: nothing is erased,
            # nothing restarted twice.
            seen = len(landed)
            await until(lambda: len(landed) >= seen + 10, "ten more polls of the TUI")
        records = store.restarts("box1", "llama")
        assert [r.outcome for r in records] == ["verified", "gave_up"], records
        assert len(wd.launches(work)) == 2
        active = {f.code for f in store.findings("box1", active=True)}
        assert {"run.restart_limit", "run.dead"} <= active, active
        verdict = app.hosts["box1"].verdict(time.time(), 1.0)
        assert verdict.severity is not None and verdict.label == "critical"


async def test_on_failure_restarts_a_hand_started_run_killed_with_sigkill(rig: Rig) -> None:
    """A person starts the run by hand (`setsid nohup python train.py &`: no launch wrapper,
    so its death leaves no record of why) and sets `restart = "on-failure"`; `kill -9` of it
    reads as a death of unknown cause, which on-failure restarts, within its limits."""
    run, work = wd.trainer(rig)
    host = rig.host(run)
    by_hand = rig.spawn([wd.PY, wd.TRAIN], cwd=work, log=work / "train.log")
    wait_for(lambda: len(wd.launches(work)) == 1, what="the run started by hand")
    watcher = FleetWatch(Config(interval=1.0, hosts=(host,)), rig.store, role="watch",
                         log=lambda _line: None)
    history = watcher.history("box1")
    await wd.rounds_until(watcher, host, lambda: history.runs["llama"].status == "running")
    os.kill(by_hand.pid, signal.SIGKILL)
    wait_for(lambda: by_hand.poll() is not None, what="the kill")
    await wd.rounds_until(watcher, host, lambda: len(wd.launches(work)) == 2)
    records = rig.store.restarts("box1", "llama")
    assert len(records) == 1 and records[0].outcome in ("sent", "verified"), records
    assert wd.launches(work)[1]["resume"] is not None  # from its latest checkpoint
    watcher.close(0)
