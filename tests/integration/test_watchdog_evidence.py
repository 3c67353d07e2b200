"""The watchdog answers one death with one launch, whatever the timing: real training processes
behind a real sshd on loopback, real watchers (in this process, and one in a process of its own
that is SIGKILLed), the box's launch marker and lock, the store's lease and heartbeat.

The times are scaled down from what was seen on real boxes (a 45-75 s launch, a 60 s lease):
a launch that waits on a gate file the test opens (as `sleep 45; exec python3 train.py` waits on
a pip install, a container start or a data sync), a watcher that asks the box after 1 s, a
lease of 3 s, a relaunch call that takes 8 s on the box (a slow `tmux new-session`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import test_actions
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.store import Store
from test_actions import PY, Rig, alive, wait_for
from test_watchdog import first_launch, launches, trainer
from watchdog_rounds import Actor, keep_rounding, rounds_until

rig = test_actions.rig  # a real sshd on loopback over a box whose /proc is this machine's

VERIFY_S = 1.0
"""After this the watcher asks the box how a restart that no poll saw yet stands."""
LEASE_S = 3.0
SLOW_CALL_S = 8.0
"""A relaunch call that outlasts the lease (tmux new-session on a loaded box)."""
ROUNDS_HELPER = Path(__file__).with_name("watchdog_rounds.py")


def gated(run: RunConfig, work: Path) -> RunConfig:
    """The run's relaunch behind a setup step that lasts until the test opens `gate`."""
    gate = shlex.quote(str(work / "gate"))
    return replace(run, relaunch=f"while [ ! -e {gate} ]; do sleep 0.1; done; exec "
                                 f"{run.relaunch}")


def slow_tmux(rig: Rig) -> Path:
    """A `tmux` first on the box's PATH whose `new-session` takes SLOW_CALL_S while the flag
    file exists (it says when it began, in `calling`); then the real tmux."""
    flag = rig.root / "slow-tmux"
    wrapper = rig.box.bin / "tmux"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = new-session ] && [ -e {shlex.quote(str(flag))} ]; then
    date +%s >> {shlex.quote(str(rig.root / "calling"))}
    sleep {SLOW_CALL_S:g}
fi
exec /usr/bin/tmux "$@"
""")
    wrapper.chmod(0o755)
    return flag


def holder_of(store: Store) -> str | None:
    lease = store.lease("box1", "llama")
    return lease[0] if lease is not None else None


def session_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def watcher_process(config: Path, store: Path) -> subprocess.Popen[str]:
    """A watcher in a process of its own (watchdog_rounds.py), to be SIGKILLed."""
    return subprocess.Popen([sys.executable, str(ROUNDS_HELPER), str(config), str(store),
                             str(LEASE_S), str(VERIFY_S)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def second_store(rig: Rig) -> Store:
    assert rig.store.path is not None
    return Store.open(rig.store.path)


async def killed_and_seen_dead(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="the kill")


async def test_a_slow_launch_is_reported_starting_never_failed_and_never_launched_twice(
        rig: Rig) -> None:
    """One watcher; the restart's launch takes longer than the watcher waits for a poll to see
    it. It is asked about on the box, reported as still starting (once), and verified when the
    run's process appears: one launch for the death, one restart counted, with its pids."""
    run, work = trainer(rig)
    pid = await first_launch(rig, rig.host(run), run, work, rig.store)
    host = rig.host(gated(run, work))
    actor = Actor(rig.store, host, lease_s=60.0, verify_s=VERIFY_S)
    await rounds_until([actor], lambda: actor.status("llama") == "running")
    await killed_and_seen_dead(pid)
    await rounds_until([actor], lambda: "starting" in actor.kinds()
                       or actor.kinds().count("restart") > 1, what="still starting")
    (work / "gate").write_text("open")
    await rounds_until([actor], lambda: "verified" in actor.kinds()
                       or actor.kinds().count("restart") > 1, what="running again")
    for _ in range(3):
        await actor.round()
    assert actor.kinds() == ["restart", "starting", "verified"], actor.events
    assert len(launches(work)) == 2  # the first launch and ONE restart
    (starting,) = [e for e in actor.events if e.kind == "starting"]
    assert "still starting" in starting.message and "has not ended" in starting.message
    (record,) = rig.store.restarts("box1", "llama")
    new_pid = launches(work)[-1]["pid"]
    assert record.outcome == "verified" and record.pids == (new_pid,)
    assert record.launch is not None and alive(new_pid)
    assert session_of(new_pid) == record.launch["pid"]  # the run is in the launch's session


async def test_a_second_launch_is_refused_while_the_first_is_still_starting(rig: Rig) -> None:
    """The box itself refuses: a relaunch (the `r` key, another watcher) while gpuwatch's
    launch of the run is still in its setup step is refused as still starting, naming it."""
    from gpuwatch.remote.actions import plan as actions
    from test_actions import poll

    run, work = trainer(rig)
    host = rig.host(gated(run, work))
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "llama", history)
    first = await actions.execute(plan, host, store=rig.store, readonly=False)
    second = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert first.ok is None and second.ok is False, second.message
    assert "still starting" in second.message
    assert first.launch is not None and second.launch is not None
    assert second.launch["pid"] == first.launch["pid"]
    assert launches(work) == []  # neither got past the gate yet
    (work / "gate").write_text("open")
    wait_for(lambda: len(launches(work)) == 1, what="the one launch")
    private = work / ".gpuwatch"
    assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_uid == os.geteuid()


async def test_two_watchers_and_a_relaunch_call_longer_than_the_lease_make_one_launch(
        rig: Rig) -> None:
    """The acting watcher's relaunch call outlasts its lease; its heartbeat keeps the lease, so
    the second watcher, polling all along, never acts on the death: one relaunch call, one
    restart counted, no false "failed"."""
    flag = slow_tmux(rig)
    run, work = trainer(rig)
    run = replace(run, detach="tmux")
    host = rig.host(run)
    pid = await first_launch(rig, host, run, work, rig.store)
    flag.write_text("slow")
    store_b = second_store(rig)
    a = Actor(rig.store, host, lease_s=LEASE_S, verify_s=VERIFY_S, kind="a")
    b = Actor(store_b, host, lease_s=LEASE_S, verify_s=VERIFY_S, kind="b")
    await rounds_until([a], lambda: a.status("llama") == "running"
                       and holder_of(rig.store) == a.holder)
    stop = asyncio.Event()
    second = asyncio.create_task(keep_rounding(b, stop))
    try:
        await killed_and_seen_dead(pid)
        await rounds_until([a], lambda: {"verified", "failed"} & {*a.kinds(), *b.kinds()}
                           or len(launches(work)) > 2, limit_s=120, what="running again")
        for _ in range(3):
            await a.round()
    finally:
        stop.set()
        await second
        store_b.close()
    assert (rig.root / "calling").exists()  # the call was slow indeed
    assert len(launches(work)) == 2
    assert a.kinds() == ["restart", "verified"] and b.kinds() == [], (a.events, b.events)
    (record,) = rig.store.restarts("box1", "llama")
    assert record.outcome == "verified" and record.holder == a.holder
    calls = [e for e in rig.store.audit_log("box1") if e.action == "relaunch"
             and e.phase == "execute"]
    assert len(calls) == 2  # the test's first launch and the one restart


@pytest.mark.parametrize("when", ["mid-call", "mid-start"])
async def test_a_watcher_killed_mid_restart_is_adopted_not_repeated(rig: Rig,
                                                                    when: str) -> None:
    """The acting watcher is SIGKILLed while its relaunch call runs on the box (the orphaned
    call still starts the run), or while the launch it sent is still in its setup step. The
    other watcher takes the lapsed lease, finds the launch on the box (its lock, its marker with
    the restart's token), reports it starting and verifies it: one launch, one count, and only
    true messages."""
    flag = slow_tmux(rig)
    run, work = trainer(rig)
    run = replace(run, detach="tmux")
    pid = await first_launch(rig, rig.host(run), run, work, rig.store)
    run = gated(run, work) if when == "mid-start" else run
    host = rig.host(run)
    if when == "mid-call":
        flag.write_text("slow")
    config = rig.root / "watch.toml"
    config.write_text(config_toml(rig, host, run))
    assert rig.store.path is not None
    killed = watcher_process(config, rig.store.path)
    rig.started.append(killed)  # type: ignore[arg-type]
    try:
        holder = json.loads(killed.stdout.readline())["holder"]  # type: ignore[union-attr]
        wait_for(lambda: holder_of(rig.store) == holder, timeout=60,
                 what="the first watcher's lease")
        store_b = second_store(rig)
        b = Actor(store_b, host, lease_s=LEASE_S, verify_s=VERIFY_S, kind="b")
        stop = asyncio.Event()
        second = asyncio.create_task(keep_rounding(b, stop))
        try:
            await killed_and_seen_dead(pid)

            def in_flight() -> bool:
                if when == "mid-call":  # the call is on the box, in its slow tmux
                    return (rig.root / "calling").exists()
                sent = [e for e in store_b.audit_log("box1")  # the call came back: started
                        if e.action == "relaunch" and e.phase == "execute"]
                return len(sent) == 2

            while not in_flight():
                assert killed.poll() is None, killed.stdout.read()  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
            killed.send_signal(signal.SIGKILL)
            killed.wait()
            said_before = killed.stdout.read()  # type: ignore[union-attr]
            if when == "mid-start":
                await wait_async(lambda: {"starting", "failed", "restart"} & {*b.kinds()},
                                 what="the survivor finding the launch still starting")
                (work / "gate").write_text("open")
            await wait_async(lambda: {"verified", "failed", "restart"} & {*b.kinds()}
                             or len(launches(work)) > 2, what="running again")
            await asyncio.sleep(1.0)  # a few more of the survivor's rounds
        finally:
            stop.set()
            await second
        records = store_b.restarts("box1", "llama")
        store_b.close()
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    assert len(launches(work)) == 2, (said_before, b.events)
    assert b.kinds() == ["starting", "verified"], (said_before, b.events)
    assert "failed" not in said_before and "did not come up" not in said_before
    (record,) = records
    new_pid = launches(work)[-1]["pid"]
    assert record.holder == holder and record.outcome == "verified"
    assert record.pids == (new_pid,) and record.launch is not None


async def wait_async(test, limit_s: float = 90.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def config_toml(rig: Rig, host: HostConfig, run: RunConfig) -> str:
    return f"""interval = 1
[hosts.box1]
ssh = "box1"
python = {json.dumps(PY)}
config_file = {json.dumps(host.settings.config_file)}
[hosts.box1.runs.llama]
process = {json.dumps(run.process)}
workdir = {json.dumps(run.workdir)}
log = "train.log"
checkpoints = "ckpt/step-*"
relaunch = {json.dumps(run.relaunch)}
detach = {json.dumps(run.detach)}
restart = "on-failure"
restart_delay_s = 0
max_restarts = 5
"""


async def test_a_clock_step_forward_fails_no_restart_in_flight(rig: Rig) -> None:
    """The wall clock jumps an hour ahead while a restart is starting: the watcher measures its
    own restart's age on its monotonic clock, so the step neither fails it nor starts another."""
    run, work = trainer(rig)
    pid = await first_launch(rig, rig.host(run), run, work, rig.store)
    host = rig.host(gated(run, work))
    step = [0.0]
    actor = Actor(rig.store, host, lease_s=60.0, verify_s=30.0,
                  clock=lambda: time.time() + step[0])
    await rounds_until([actor], lambda: actor.status("llama") == "running")
    await killed_and_seen_dead(pid)
    await rounds_until([actor], lambda: "restart" in actor.kinds(), what="the restart")
    step[0] = 3600.0
    for _ in range(4):
        await actor.round()
    (work / "gate").write_text("open")
    await rounds_until([actor], lambda: "verified" in actor.kinds() or "failed" in actor.kinds()
                       or actor.kinds().count("restart") > 1, what="running again")
    assert actor.kinds() == ["restart", "verified"], actor.events
    assert len(launches(work)) == 2
