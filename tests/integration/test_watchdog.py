"""The watchdog end to end: real training processes behind a real sshd on loopback, killed with
SIGKILL, restarted by the watcher from their latest checkpoint through the same relaunch as the
`r` key; the restart limit; causes it must not restart; two watcher processes on one store."""

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
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.config.schema import Config, HostConfig, RunConfig
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from test_actions import PY, TRAIN, TRAINER, Rig, alive, poll, wait_for

rig = test_actions.rig  # a real sshd on loopback over a box whose /proc is this machine's

ROUNDS_TO_RESTART = 2
"""A death confirmed in one round is answered within two rounds (one poll interval each)."""


def launches(work: Path) -> list[dict]:
    path = work / "launches.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def trainer(rig: Rig, name: str = "llama", **policy: object) -> tuple[RunConfig, Path]:
    work = rig.root / name
    (work / "ckpt" / "step-00000").mkdir(parents=True)  # the first launch resumes from it too
    (work / TRAIN).write_text(TRAINER)
    run = RunConfig(name, process=TRAIN, workdir=str(work), log="train.log",
                    checkpoints="ckpt/step-*",
                    relaunch=f"{shlex.quote(PY)} {TRAIN} --resume {{latest_checkpoint}}",
                    detach="setsid", restart="on-failure", restart_delay_s=0.0,
                    **policy)  # type: ignore[arg-type]
    return run, work


async def first_launch(rig: Rig, host: HostConfig, run: RunConfig, work: Path,
                       store: Store) -> int:
    """Start the run as the `r` key does (so its launch wrapper records how it ends)."""
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, run.name, history)
    assert plan.refusal is None, plan.refusal
    assert (await actions.execute(plan, host, store=store, readonly=False)).ok is None
    wait_for(lambda: len(launches(work)) == 1, what="the first launch")
    pid = launches(work)[0]["pid"]
    wait_for(lambda: len(list((work / "ckpt").glob("step-*[1-9]"))) >= 2, what="checkpoints")
    return pid


async def rounds_until(watcher: FleetWatch, host: HostConfig, test,  # type: ignore[no-untyped-def]
                       limit: int = 20) -> int:
    """Rounds of the watcher until test() holds; how many it took."""
    for n in range(1, limit + 1):
        await watcher.cycle(host.name)
        if test():
            return n
    raise AssertionError(f"not within {limit} rounds")


async def test_a_killed_run_is_restarted_from_its_latest_checkpoint_up_to_the_limit(
        rig: Rig) -> None:
    run, work = trainer(rig, max_restarts=2)
    host = rig.host(run)
    log: list[str] = []
    watcher = FleetWatch(Config(interval=1.0, hosts=(host,)), rig.store, role="watch",
                         log=log.append, verify_s=60)
    pid = await first_launch(rig, host, run, work, rig.store)
    await rounds_until(watcher, host, lambda: watcher.history("box1").runs["llama"].status
                       == "running")
    history = watcher.history("box1")
    for attempt in (1, 2):
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda pid=pid: not alive(pid), what="the kill")
        await rounds_until(watcher, host, lambda: history.runs["llama"].status == "dead")
        latest = history.runs["llama"].latest_checkpoint
        assert latest is not None and history.deaths["llama"].cause == "killed"
        n = await rounds_until(watcher, host, lambda n=attempt: len(launches(work)) == n + 1,
                               limit=ROUNDS_TO_RESTART)
        assert n <= ROUNDS_TO_RESTART
        new = launches(work)[-1]
        assert new["resume"] == latest.path  # from the latest checkpoint the poll saw
        pid = new["pid"]
        await rounds_until(watcher, host, lambda: any("running again" in x for x in log[-3:]))
        assert alive(pid) and history.runs["llama"].status == "running"
        records = rig.store.restarts("box1", "llama")
        assert [r.outcome for r in records] == ["verified"] * attempt
    # The third death: the limit (2 in the window) is used, so it stays dead, said critically.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="the kill")
    await rounds_until(watcher, host, lambda: any("giving up" in x for x in log))
    report = await watcher.cycle(host.name)
    for _ in range(3):
        report = await watcher.cycle(host.name)
    assert len(launches(work)) == 3 and history.runs["llama"].status == "dead"
    codes = {f.code: f for f in report.findings}
    assert codes["run.restart_limit"].severity.label == "critical"
    assert "2 restarts" in codes["run.restart_limit"].message
    assert [r.outcome for r in rig.store.restarts("box1", "llama")] == [
        "verified", "verified", "gave_up"]
    relaunches = [(e.phase, e.outcome) for e in rig.store.audit_log("box1")
                  if e.action == "relaunch"]
    assert relaunches == [("execute", "sent"), ("execute", "sent"), ("verify", "verified"),
                          ("execute", "sent"), ("verify", "verified")]
    watcher.close(0)


WORKER = """import os, sys, time
open("started", "w").write(str(os.getpid()))
while not os.path.exists("finish"):
    time.sleep(0.05)
how = open("finish").read()
if how == "oom":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
sys.exit(int(how or 0))
"""


@pytest.mark.parametrize("how", ["oom", "0"])
async def test_a_run_dead_of_cuda_oom_or_finished_is_not_restarted(rig: Rig, how: str) -> None:
    work = rig.root / "w"
    work.mkdir()
    script = f"w_{os.getpid()}.py"
    (work / script).write_text(WORKER)
    run = RunConfig("w", process=script, workdir=str(work), log="train.log",
                    relaunch=f"{shlex.quote(PY)} {script}", detach="setsid",
                    restart="on-failure", restart_delay_s=0.0)
    host = rig.host(run)
    log: list[str] = []
    watcher = FleetWatch(Config(interval=1.0, hosts=(host,)), rig.store, role="watch",
                         log=log.append)
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "w", history)
    assert (await actions.execute(plan, host, store=rig.store, readonly=False)).ok is None
    wait_for(lambda: (work / "started").exists(), what="the worker")
    await rounds_until(watcher, host, lambda: watcher.history("box1").runs["w"].status
                       == "running")
    (work / "finish").write_text(how)
    wait_for(lambda: (work / ".gpuwatch" / "exit-w.json").exists(), what="its exit record")
    status = "dead" if how == "oom" else "finished"
    await rounds_until(watcher, host, lambda: watcher.history("box1").runs["w"].status
                       == status)
    for _ in range(3):
        await watcher.cycle(host.name)
    assert rig.store.restarts("box1", "w") == []
    assert [e.phase for e in rig.store.audit_log("box1") if e.action == "relaunch"] == [
        "execute"]  # the test's own launch only
    if how == "oom":
        death = watcher.history("box1").deaths["w"]
        assert death.cause == "exception" and death.evidence["kind"] == "cuda_oom"
        held = [x for x in log if "not restarted" in x]
        assert len(held) == 1 and "exception:cuda_oom is not in its restart_on" in held[0]
    watcher.close(0)


def watch_config(rig: Rig, run: RunConfig, path: Path) -> None:
    ssh = rig.sshd.ssh_config
    path.write_text(f"""interval = 1
[hosts.box1]
ssh = "box1"
python = {json.dumps(PY)}
config_file = {json.dumps(str(ssh))}
[hosts.box1.runs.llama]
process = {json.dumps(run.process)}
workdir = {json.dumps(run.workdir)}
log = "train.log"
checkpoints = "ckpt/step-*"
relaunch = {json.dumps(run.relaunch)}
detach = "setsid"
restart = "on-failure"
restart_delay_s = 0
max_restarts = 5
""")


def test_two_watchers_on_one_store_restart_each_death_once(rig: Rig) -> None:
    run, work = trainer(rig)
    host = rig.host(run)
    state = rig.root / "state"
    conf = rig.root / "config.toml"
    watch_config(rig, run, conf)
    env = {**os.environ, "XDG_STATE_HOME": str(state), "PYTHONUNBUFFERED": "1"}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    with Store.open(state / "gpuwatch" / "gpuwatch.sqlite3") as store:
        pid = asyncio.run(first_launch(rig, host, run, work, store))

    def polls_since(since: float) -> int:
        """Good polls of box1 the watchers saved since then (each saves its GPUs' samples)."""
        with Store.open(state / "gpuwatch" / "gpuwatch.sqlite3") as store:
            return len({row.t for row in store.gpu_history("box1", since=since)})

    def restarts() -> int:
        with Store.open(state / "gpuwatch" / "gpuwatch.sqlite3") as store:
            return len(store.restarts("box1", "llama"))

    before_watchers = time.time()
    logs = [rig.root / f"watch{i}.log" for i in (1, 2)]
    watchers = []
    for out in logs:
        with open(out, "wb") as fh:
            watchers.append(subprocess.Popen(
                [sys.executable, "-c", "from gpuwatch.tui.cli import main; main()", "watch",
                 "--config", str(conf)], stdout=fh, stderr=subprocess.STDOUT, env=env))
    try:
        def seen(text: str) -> int:
            return sum(p.read_text().count(text) for p in logs)

        try:
            wait_for(lambda: all("watching 1 host" in p.read_text() for p in logs),
                     timeout=30, what="both watchers")
        except AssertionError:
            raise AssertionError([p.read_text()[-2000:] for p in logs]) from None
        wait_for(lambda: polls_since(before_watchers) >= 4, timeout=60,
                 what="both watchers polling the run alive (4 polls saved)")
        for death in (1, 2):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: len(launches(work)) == death + 1, timeout=60,  # noqa: B023
                     what=f"the restart after death {death}")
            pid = launches(work)[-1]["pid"]
            wait_for(lambda: seen("running again") == death, timeout=30,  # noqa: B023
                     what="the restart verified")
            # Several more rounds of both (8 polls saved, as many as 4 s of both watchers):
            # each had its chance at the same death, and neither restarted it again.
            verified = time.time()
            wait_for(lambda: polls_since(verified) >= 8, timeout=60,  # noqa: B023
                     what="8 more polls saved after the restart")
            assert restarts() == death
            assert len(launches(work)) == death + 1
            assert seen("↻") == death
        with Store.open(state / "gpuwatch" / "gpuwatch.sqlite3") as store:
            records = store.restarts("box1", "llama")
        assert [r.outcome for r in records] == ["verified", "verified"]
        assert len({r.death for r in records}) == 2
    finally:
        for w in watchers:
            w.send_signal(signal.SIGTERM)
        for w in watchers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
    assert [w.returncode for w in watchers] == [0, 0], [p.read_text() for p in logs]
    assert all("stopped" in p.read_text() for p in logs)


def test_a_lease_has_one_holder_until_it_expires(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "s.sqlite3")
    b = Store.open(tmp_path / "s.sqlite3")
    assert a.take_lease("h", "r", "A", 10, now=100)
    assert not b.take_lease("h", "r", "B", 10, now=105)
    assert a.take_lease("h", "r", "A", 10, now=108)  # renewed
    assert not b.take_lease("h", "r", "B", 10, now=117)
    assert b.take_lease("h", "r", "B", 10, now=118.5)  # A stopped renewing: it expired
    assert b.lease("h", "r") == ("B", 128.5)
    b.release_leases("B")
    assert a.lease("h", "r") is None
    a.close()
    b.close()


def test_policy_keys_are_validated_with_their_line(tmp_path: Path) -> None:
    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.config.schema import ConfigError

    path = tmp_path / "c.toml"
    path.write_text('[hosts.a.runs.r]\nrestart = "always"\nmax_restarts = 1.5\n'
                    'restart_on = ["killed", "xid:abc"]\n[notify]\nmin_severity = "loud"\n')
    with pytest.raises(ConfigError) as err:
        load_file(path)
    lines = err.value.lines
    assert lines[0].startswith(f"{path}:2: hosts.a.runs.r.restart: expected one of never")
    assert lines[1].startswith(f"{path}:3: hosts.a.runs.r.max_restarts: expected an integer")
    assert lines[2].startswith(f"{path}:4: hosts.a.runs.r.restart_on: 'xid:abc' is no cause")
    assert lines[3].startswith(f"{path}:6: notify.min_severity: expected one of info")
    path.write_text('[hosts.a.runs.r]\nrestart = "on-failure"\n')
    (r,) = load_file(path).hosts[0].runs
    assert (r.max_restarts, r.restart_window_s, r.restart_delay_s) == (3, 21600, 60)
    assert "exception:cuda_oom" not in r.restart_on and "killed" in r.restart_on
    assert replace(r, restart="never").restart == "never"


async def test_a_hung_run_is_killed_whole_then_restarted(rig: Rig) -> None:
    """run.hung (a curve finding: all alive, no step for far longer than its step interval)
    is stood in for here, as the rules would put it in the history; the kill, the death it
    makes and the restart are real. Only `run.hung` is in restart_on: a plain kill is not."""
    from gpuwatch.remote.model.finding import Finding, Severity

    run, work = trainer(rig, restart_on=("run.hung",))
    host = rig.host(run)
    log: list[str] = []
    watcher = FleetWatch(Config(interval=1.0, hosts=(host,)), rig.store, role="watch",
                         log=log.append)
    pid = await first_launch(rig, host, run, work, rig.store)
    history = watcher.history(host.name)
    await rounds_until(watcher, host, lambda: history.runs["llama"].status == "running")
    history.findings = [Finding("run.hung", Severity.CRITICAL, "no step for 40 min",
                                run="llama", evidence={"idle_s": 2400})]
    assert watcher.watchdog is not None
    events = await watcher.watchdog.act(host, history)
    assert [e.kind for e in events] == ["restart"] and "killed the whole run" in events[0].message
    wait_for(lambda: not alive(pid), what="the hung run's end")
    await rounds_until(watcher, host, lambda: len(launches(work)) == 2)
    assert launches(work)[-1]["resume"] is not None
    assert [r.outcome for r in rig.store.restarts("box1", "llama")][:2] == [
        "hung_killed", "sent"]
    kills = [e.outcome for e in rig.store.audit_log("box1") if e.action == "kill"]
    assert kills and kills[0] == "sent"
    watcher.close(0)


async def test_cron_rounds_each_a_new_watcher_restart_once_and_verify(rig: Rig) -> None:
    """`watch --once` from cron: every round a new watcher (its own lease holder, its history
    from the store), so the death, the restart and its verification are carried by the store."""
    run, work = trainer(rig)
    host = rig.host(run)
    log: list[str] = []
    cfg = Config(interval=300.0, hosts=(host,))

    async def cron_round() -> None:
        watcher = FleetWatch(cfg, rig.store, role="cron", log=log.append)
        await watcher.round()
        watcher.close(0)

    pid = await first_launch(rig, host, run, work, rig.store)
    await cron_round()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="the kill")
    for _ in range(4):
        await cron_round()
    assert len(launches(work)) == 2
    assert [r.outcome for r in rig.store.restarts("box1", "llama")] == ["verified"]
    assert sum("↻" in x for x in log) == 1 and sum("running again" in x for x in log) == 1
    assert rig.store.lease("box1", "llama") is None  # each round handed its lease back


def test_the_disk_the_checkpoints_live_on_is_what_counts() -> None:
    """U6: a full disk under the checkpoints holds the restart back; a full other disk does
    not (the longest mount that holds the checkpoint path is theirs)."""
    import tui_fixtures as fx
    from gpuwatch.remote.actions.restart import _checkpoint_disk_full

    run = RunConfig("r", workdir="/data/run", checkpoints="ckpt/step-*")
    tib = 2**40
    for disks, full in (([fx.disk("/", tib, tib // 2), fx.disk("/data", tib, 2**20)], True),
                        ([fx.disk("/", tib, 2**20), fx.disk("/data", tib, tib // 2)], False),
                        ([fx.disk("/", tib, 2**20)], True)):
        history = HostHistory("h")
        history.record(fx.snapshot("h", t=fx.NOW, gpus=[], disks=disks), fx.NOW)
        why = _checkpoint_disk_full(run, history)
        assert (why is not None) is full, (disks, why)
        if why:
            assert "free space first" in why


def test_which_deaths_the_default_policy_restarts() -> None:
    from gpuwatch.remote.actions.restart import allowed
    from gpuwatch.remote.findings.diagnosis import Diagnosis

    run = RunConfig("r", restart="on-failure")
    # on-failure as a person means it (systemd's too): a death with no cause gpuwatch can name
    # (kill -9 of a run started by hand) and a non-zero exit come back
    yes = [Diagnosis("killed"), Diagnosis("sighup"), Diagnosis("reboot"),
           Diagnosis("xid", {"xid": 31}), Diagnosis("exception", {"kind": "nccl_timeout"}),
           Diagnosis("unknown"), Diagnosis("exited")]
    no = [Diagnosis("oom_cgroup"), Diagnosis("oom_kernel"), Diagnosis("xid", {"xid": 79}),
          Diagnosis("xid", {"xid": 48}), Diagnosis("exception", {"kind": "cuda_oom"}),
          Diagnosis("exception", {"kind": "exception"}), Diagnosis("gpu_lost")]
    assert all(allowed(run, d) for d in yes) and not any(allowed(run, d) for d in no)
    wide = replace(run, restart_on=("exception", "xid:79"))
    assert allowed(wide, Diagnosis("exception", {"kind": "cuda_error"}))
    assert not allowed(wide, Diagnosis("exception", {"kind": "cuda_oom"}))  # named only
    assert allowed(wide, Diagnosis("xid", {"xid": 79}))
    assert not allowed(wide, Diagnosis("xid", {"xid": 31}))
    assert allowed(replace(run, restart_on=("exception:cuda_oom",)),
                   Diagnosis("exception", {"kind": "cuda_oom"}))
