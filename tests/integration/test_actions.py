"""Actions end to end: a real sshd on loopback, real processes, the probe and the action script
sent over SSH exactly as for a real box. Only the GPUs are stood in for (Box(real_proc=True):
the stand-in nvidia-smi lists REAL pids as VRAM holders, and drops them once they exit, as a
driver frees a context when its process ends)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.store import Store
from harness import real_box
from harness.real_box import PY, TOKEN, TRAIN, TRAINER, Rig, alive, poll
from harness.sshd import STD_PATH
from harness.waiting import wait_for

rig = real_box.rig  # the fixture: a real sshd on loopback over a box whose /proc is this machine's
OLD_RANK = f"gwt_old_rank_{TOKEN}.py"
LIVE = f"gwt_live_{TOKEN}.py"
SIGHUP_BIT, SIGINT_BIT, SIGTERM_BIT = 1 << 0, 1 << 1, 1 << 14


# A dead DDP job's rank 0: it starts two more ranks (one traps SIGTERM, as a stuck NCCL rank
# does) and a dataloader-like worker under rank 1, prints their pids, then waits to be killed.
RANKS = r'''
import subprocess, sys, time
if len(sys.argv) > 1:  # a rank
    import signal
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, lambda *a: None)
    if sys.argv[1] == "rank1":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("ready", flush=True)
    time.sleep(600)
me, out = sys.argv[0], subprocess.PIPE
r1 = subprocess.Popen([sys.executable, me, "rank1"], stdout=out)
r2 = subprocess.Popen([sys.executable, me, "stubborn"], stdout=out)
r1.stdout.readline(); r2.stdout.readline()
print(r1.pid, r2.pid, flush=True)
time.sleep(600)
'''


# ---------------------------------------------------------------- processes, the audit


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def in_any_argv(text: bytes) -> list[int]:
    """Pids whose command line holds text."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if text in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                pass
    return found


def environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def tty_nr(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[4])


def audit(rig: Rig) -> list[tuple[str, str, str]]:
    return [(e.action, e.phase, e.outcome) for e in rig.store.audit_log("box1")]


# ---------------------------------------------------------------- reap

async def test_reap_ends_a_dead_runs_orphans_and_spares_the_live_run(rig: Rig) -> None:
    old = rig.root / "old"
    old.mkdir()
    (old / OLD_RANK).write_text(RANKS)
    live_dir = rig.root / "live"
    live_dir.mkdir()
    (live_dir / LIVE).write_text("import time\ntime.sleep(600)\n")
    live = rig.spawn([PY, LIVE], cwd=live_dir)
    rank0 = rig.spawn([PY, OLD_RANK], cwd=old, pipe=True)
    assert rank0.stdout is not None
    rank1, rank2 = map(int, rank0.stdout.readline().split())
    (worker,) = children(rank1)
    rig.box.add_compute_app(0, rank1, "python", 20000, follows_pid=True)
    rig.box.add_compute_app(0, rank2, "python", 20000, follows_pid=True)
    rig.box.add_compute_app(1, live.pid, "python", 30000, follows_pid=True)
    rig.box.set_gpu(1, util_pct=96)
    rig.box.add_compute_app(2, 4_000_000, "python", 8000)  # another PID namespace (U11)
    host = rig.host(RunConfig("old", process=OLD_RANK, workdir=str(old)),
                    RunConfig("live", process=LIVE, workdir=str(live_dir)))
    history = HostHistory(host.name)
    await poll(host, history)

    rank0.kill()  # the run dies; its ranks are left behind, re-parented, holding VRAM
    rank0.wait()
    wait_for(lambda: ppid(rank1) != rank0.pid, what="rank 1 re-parented")
    await poll(host, history)

    plan = actions.plan_reap(host, history)
    assert plan.refusal is None, plan.describe()
    assert [t.pid for t in plan.targets] == [rank1, rank2, worker]
    assert live.pid not in {t.pid for t in plan.targets}
    assert any("4000000" in note and "container" in note for note in plan.notes)
    text = plan.describe()
    assert f"pid {rank1}  user root  GPU 0 19.5 GiB" in text and "box1" in text

    t0 = time.monotonic()
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False, grace_s=2.0)
    assert outcome.ok is None, outcome.message
    assert f"KILL sent to {rank2}" in outcome.message  # it trapped TERM
    assert time.monotonic() - t0 >= 1.9  # the grace period was given
    assert not alive(rank1) and not alive(rank2) and not alive(worker)
    assert alive(live.pid)

    await poll(host, history)
    verdict = await actions.verify(plan, host, history, store=rig.store)
    assert verdict.ok is True, verdict.message
    snap = history.current
    assert snap is not None
    assert {a.pid for a in snap.gpu_processes} == {live.pid, 4_000_000}
    assert actions.plan_reap(host, history).refusal is not None  # nothing left to reap
    assert audit(rig) == [("reap", "execute", "sent"), ("reap", "verify", "verified")]
    entry = rig.store.audit_log("box1")[0]
    assert [t["pid"] for t in entry.targets] == [rank1, rank2, worker]
    assert entry.targets[0]["boot_id"] == snap.boot_id and "@" in entry.who


# ---------------------------------------------------------------- identity

async def test_a_changed_start_time_or_boot_id_signals_nothing(rig: Rig) -> None:
    holder = rig.spawn([PY, "-c", "import time; time.sleep(600)"])
    rig.box.add_compute_app(0, holder.pid, "python", 1000, follows_pid=True)
    host = rig.host()
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_kill(host, history, holder.pid)
    assert plan.refusal is None and [t.pid for t in plan.targets] == [holder.pid]

    (target,) = plan.targets
    reused = replace(plan, targets=(replace(target, start_ticks=target.start_ticks + 7),))
    outcome = await actions.execute(reused, host, store=rig.store, readonly=False, grace_s=0.5)
    assert outcome.ok is False
    assert "start time changed" in outcome.message and str(holder.pid) in outcome.message
    rebooted = replace(plan, targets=(replace(target, boot_id="0" * 8),))
    outcome = await actions.execute(rebooted, host, store=rig.store, readonly=False)
    assert outcome.ok is False and "rebooted" in outcome.message
    await asyncio.sleep(0.3)
    assert alive(holder.pid)
    assert audit(rig) == [("kill", "execute", "refused")] * 2

    outcome = await actions.execute(plan, host, store=rig.store, readonly=False, grace_s=2.0)
    assert outcome.ok is None and f"pid {holder.pid} (root): TERM sent" in outcome.message
    assert "1 exited after TERM" in outcome.message and "KILL" not in outcome.message.split(
        "TERM sent")[1].split(";")[0]
    holder.wait(5)
    await poll(host, history)
    verdict = await actions.verify(plan, host, history)
    assert verdict.ok is True, verdict.message


async def test_kill_with_kill_and_a_missing_pid(rig: Rig) -> None:
    holder = rig.spawn([PY, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, "
                            "signal.SIG_IGN)\ntime.sleep(600)"])
    rig.box.add_compute_app(1, holder.pid, "python", 5000, follows_pid=True)
    host = rig.host()
    history = HostHistory(host.name)
    await asyncio.sleep(0.2)
    await poll(host, history)
    assert actions.plan_kill(host, history, 999_999_9).refusal is not None
    assert "unknown signal" in (actions.plan_kill(host, history, holder.pid, "HUP").refusal or "")
    plan = actions.plan_kill(host, history, holder.pid, "KILL")
    assert "send KILL to 1 process:" in plan.describe()
    outcome = await actions.execute(plan, host, store=None, readonly=False)
    assert outcome.ok is None, outcome.message
    holder.wait(5)
    await poll(host, history)
    assert (await actions.verify(plan, host, history)).ok is True


# ---------------------------------------------------------------- relaunch

def _trainer_run(workdir: Path, detach: str, name: str = "llama") -> RunConfig:
    return RunConfig(
        name, process=TRAIN, workdir=str(workdir), log="train.log",
        checkpoints="ckpt/step-*",
        relaunch=f"{shlex.quote(PY)} {TRAIN} --resume {{latest_checkpoint}}", detach=detach,
        env={"CUDA_VISIBLE_DEVICES": "0", "WANDB_API_KEY": "sekrit-value"})


def _launches(workdir: Path) -> list[dict]:
    path = workdir / "launches.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("detach", ["setsid", "tmux"])
async def test_relaunch_resumes_from_the_latest_checkpoint_detached(rig: Rig,
                                                                    detach: str) -> None:
    workdir = rig.root / "llama"
    workdir.mkdir()
    (workdir / TRAIN).write_text(TRAINER)
    first = rig.spawn([PY, TRAIN], cwd=workdir, log=workdir / "train.log")
    wait_for(lambda: len(list((workdir / "ckpt").glob("step-*[0-9]"))) >= 2, what="checkpoints")
    run = _trainer_run(workdir, detach)
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    assert history.runs["llama"].status == "running"

    busy = actions.plan_relaunch(host, "llama", history)
    assert busy.refusal is not None and str(first.pid) in busy.refusal
    refused = await actions.execute(busy, host, store=rig.store, readonly=False)
    assert refused.ok is False

    kill = actions.plan_kill(host, history, first.pid)
    assert (await actions.execute(kill, host, store=rig.store, readonly=False)).ok is None
    first.wait(5)
    await poll(host, history)
    assert (await actions.verify(kill, host, history, store=rig.store)).ok is True
    assert history.runs["llama"].status == "dead"
    latest = history.runs["llama"].latest_checkpoint
    assert latest is not None

    plan = actions.plan_relaunch(host, "llama", history)
    assert plan.refusal is None, plan.refusal
    assert plan.command == f"{shlex.quote(PY)} {TRAIN} --resume {shlex.quote(latest.path)}"
    text = plan.describe()
    assert f"cd {workdir}" in text and plan.command in text and "WANDB_API_KEY=***" in text
    assert "sekrit" not in text and "PYTHONUNBUFFERED=1" in text
    log_before = (workdir / "train.log").read_bytes()
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert outcome.ok is None, outcome.message
    assert ("tmux session gpuwatch-llama" if detach == "tmux" else "setsid") in outcome.message

    # Survives the SSH session that started it, and sshd itself going away.
    rig.sshd.restart()
    await poll(host, history)
    verdict = await actions.verify(plan, host, history, store=rig.store)
    assert verdict.ok is True, verdict.message
    assert history.runs["llama"].status == "running"

    (second,) = [r for r in _launches(workdir) if r["resume"] is not None]
    pid = second["pid"]
    assert alive(pid)
    assert second["resume"] == latest.path
    assert second["cwd"] == str(workdir)
    assert second["env"] == {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "0",
                             "WANDB_API_KEY": "sekrit-value"}
    assert second["stdin"] == "/dev/null" and second["stdout"] == str(workdir / "train.log")
    # U43: unbuffered, so the log moves at once; appended, so the old run's lines stay.
    wait_for(lambda: b"step" in (workdir / "train.log").read_bytes()[len(log_before):],
             what="new log lines")
    assert (workdir / "train.log").read_bytes().startswith(log_before)
    assert in_any_argv(b"sekrit") == []  # U34: the env is in no process's argv
    sig_ign = int(proc_status(pid)["SigIgn"], 16)
    assert not sig_ign & (SIGTERM_BIT | SIGINT_BIT)  # it can still be stopped
    snap = history.current
    assert snap is not None
    table = {p.pid: p for p in snap.processes}
    if detach == "setsid":
        assert tty_nr(pid) == 0  # no controlling terminal at all
        assert sig_ign & SIGHUP_BIT  # nohup ignores SIGHUP, always (coreutils)
        leader = table[table[pid].ppid]  # the launch shell: setsid made it a session leader
        assert leader.session == leader.pid == table[pid].session and not leader.has_tty
    else:
        # Under tmux the run's terminal is tmux's pane, which no SSH session owns; SIGHUP keeps
        # its default (only nohup ignores it).
        assert not sig_ign & SIGHUP_BIT
        chain, parent = [], table.get(table[pid].ppid)
        while parent is not None:
            chain.append(parent.comm)
            parent = table.get(parent.ppid)
        assert any(c.startswith("tmux") for c in chain), chain

    again = actions.plan_relaunch(host, "llama", history)
    assert again.refusal is not None and "running" in again.refusal
    # A stale plan (made while it was dead) is refused on the box itself.
    stale = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert stale.ok is False and "still running" in stale.message
    assert len(_launches(workdir)) == 2
    assert audit(rig) == [
        ("relaunch", "execute", "refused"), ("kill", "execute", "sent"),
        ("kill", "verify", "verified"), ("relaunch", "execute", "sent"),
        ("relaunch", "verify", "verified"), ("relaunch", "execute", "refused")]
    entry = rig.store.audit_log("box1")[3]
    assert entry.targets == ({"run": "llama"},) and "sekrit" not in (entry.command or "")
    assert plan.command in (entry.command or "")


async def test_relaunch_refused_while_a_shell_runs_the_launch_script(rig: Rig) -> None:
    workdir = rig.root / "job"
    workdir.mkdir()
    (workdir / "run.sh").write_text("sleep 600\necho done\n")
    shell = rig.spawn(["bash", "run.sh"], cwd=workdir)
    (workdir / "ckpt").mkdir()
    (workdir / "ckpt" / "step-1").mkdir()
    run = RunConfig("job", process=TRAIN, workdir=str(workdir), checkpoints="ckpt/step-*",
                    relaunch="bash run.sh --resume {latest_checkpoint}", detach="setsid")
    host = rig.host(run)
    history = HostHistory(host.name)
    await asyncio.sleep(0.2)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "job", history)
    assert plan.refusal is None, plan.refusal  # the probe does not list that shell: the box sees it
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert outcome.ok is False
    assert "run.sh is being executed by pid" in outcome.message and str(shell.pid) in \
        outcome.message and "duplicate run" in outcome.message
    assert audit(rig) == [("relaunch", "execute", "refused")]


async def test_relaunch_needs_a_checkpoint_when_the_template_does(rig: Rig) -> None:
    workdir = rig.root / "fresh"
    workdir.mkdir()
    host = rig.host(_trainer_run(workdir, "setsid", "fresh"),
                    RunConfig("nopattern", workdir=str(workdir), relaunch="true"))
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "fresh", history)
    assert plan.refusal is not None and "no checkpoint" in plan.refusal
    assert "ckpt/step-*" in plan.refusal
    assert "process" in (actions.plan_relaunch(host, "nopattern", history).refusal or "")
    assert "no run named" in (actions.plan_relaunch(host, "nope", history).refusal or "")


# ---------------------------------------------------------------- injection

WEIRD = "w; touch pwned $(touch pwned2) `touch pwned3` \"q' \n&& echo"


@pytest.mark.parametrize("detach", ["setsid", "tmux"])
async def test_hostile_names_and_paths_do_only_what_they_say(rig: Rig, detach: str) -> None:
    workdir = rig.root / WEIRD
    workdir.mkdir()
    (workdir / TRAIN).write_text(TRAINER)
    (workdir / "ckpt" / "step-00003").mkdir(parents=True)
    name = "r;$(touch pwned4)\n'x"
    run = RunConfig(name, process=TRAIN, workdir=str(workdir), log="l; touch pwned5.log",
                    checkpoints="ckpt/step-*", detach=detach,
                    relaunch=f"{shlex.quote(PY)} {TRAIN} --resume {{latest_checkpoint}} "
                             "--run {run} --wd {workdir}",
                    env={"NOTE": "$(touch pwned6); `touch pwned7`"})
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, name, history)
    assert plan.refusal is None, plan.refusal
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert outcome.ok is None, outcome.message
    wait_for(lambda: _launches(workdir), what="the trainer to start")
    (launch,) = _launches(workdir)
    ckpt = str(workdir / "ckpt" / "step-00003")
    assert launch["argv"] == [TRAIN, "--resume", ckpt, "--run", name, "--wd",
                                  str(workdir)]
    assert launch["cwd"] == str(workdir)
    assert launch["stdout"] == str(workdir / "l; touch pwned5.log")
    await poll(host, history)
    assert (await actions.verify(plan, host, history)).ok is True
    env = environ(launch["pid"])
    assert b"NOTE=$(touch pwned6); `touch pwned7`" in env
    for where in (rig.root, workdir, rig.sshd.home, Path("/tmp"), Path.cwd()):
        assert not list(where.glob("pwned*")), where


# ---------------------------------------------------------------- read-only and the CLI

async def test_readonly_refuses_every_action(rig: Rig) -> None:
    holder = rig.spawn([PY, "-c", "import time; time.sleep(600)"])
    rig.box.add_compute_app(0, holder.pid, "python", 1000, follows_pid=True)
    workdir = rig.root / "ro"
    workdir.mkdir()
    (workdir / "ckpt" / "step-3").mkdir(parents=True)
    host = rig.host(_trainer_run(workdir, "setsid", "ro"))
    history = HostHistory(host.name)
    await poll(host, history)
    plans = [actions.plan_kill(host, history, holder.pid), actions.plan_reap(host, history),
             actions.plan_relaunch(host, "ro", history)]
    for plan in plans:
        outcome = await actions.execute(plan, host, store=rig.store, readonly=True)
        assert outcome.ok is False and "read-only" in outcome.message
    assert alive(holder.pid) and not _launches(workdir)
    assert audit(rig) == [("kill", "execute", "refused"), ("reap", "execute", "refused"),
                          ("relaunch", "execute", "refused")]


def _cli(rig: Rig, *args: str, config: str = "", input_: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    path = rig.root / "config.toml"
    path.write_text(f'{config}\n[ssh]\nconfig_file = "{rig.sshd.ssh_config}"\n\n'
                    f'[hosts.box1]\nssh = "box1"\npython = "{PY}"\n')
    env = {"PATH": os.environ["PATH"], "HOME": str(rig.root), "XDG_STATE_HOME":
           str(rig.root / "xdg-state"), "GPUWATCH_CONFIG": str(path)}
    return subprocess.run([PY, "-m", "gpuwatch.tui.cli", *args], env=env, text=True,
                          capture_output=True, timeout=120, input=input_)


def test_cli_kill_reap_and_their_refusals(rig: Rig) -> None:
    holder = rig.spawn([PY, "-c", "import time; time.sleep(600)"])
    rig.box.add_compute_app(0, holder.pid, "python", 1000, follows_pid=True)
    time.sleep(0.2)

    no_tty = _cli(rig, "kill", "box1", str(holder.pid))
    assert no_tty.returncode == 1 and "--yes" in no_tty.stderr
    assert f"pid {holder.pid}  user root  GPU 0 1000.0 MiB" in no_tty.stdout
    ro = _cli(rig, "kill", "box1", str(holder.pid), "--yes", "--readonly")
    assert ro.returncode == 1 and "read-only" in ro.stdout
    ro_config = _cli(rig, "kill", "box1", str(holder.pid), "--yes", config="readonly = true")
    assert ro_config.returncode == 1 and "read-only" in ro_config.stdout
    ro_reap = _cli(rig, "reap", "box1", "--yes", "--readonly")
    assert ro_reap.returncode == 1
    ro_relaunch = _cli(rig, "relaunch", "box1", "nope", "--yes", "--readonly")
    assert ro_relaunch.returncode == 1 and "nope" in ro_relaunch.stdout
    assert alive(holder.pid)

    done = _cli(rig, "kill", "box1", str(holder.pid), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TERM sent" in done.stdout and "verified:" in done.stdout
    holder.wait(5)
    nothing = _cli(rig, "reap", "box1", "--yes")
    assert nothing.returncode == 1 and "no VRAM zombie" in nothing.stdout

    with Store.open(rig.root / "xdg-state" / "gpuwatch" / "gpuwatch.sqlite3") as store:
        rows = [(e.action, e.phase, e.outcome) for e in store.audit_log("box1")]
    assert rows == [("kill", "execute", "refused"), ("kill", "execute", "refused"),
                    ("reap", "execute", "refused"), ("relaunch", "execute", "refused"),
                    ("kill", "execute", "sent"), ("kill", "verify", "verified"),
                    ("reap", "execute", "refused")]

    rig.sshd.stop()
    down = _cli(rig, "kill", "box1", "1234", "--yes")
    assert down.returncode == 2 and "could not be polled" in down.stderr
    bad = _cli(rig, "kill", "box1", "1234", "--yes", config="interval = -1")
    assert bad.returncode == 78


# ---------------------------------------------------------------- local host

async def test_local_host_kill(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in rig.box.env(base_path=os.environ.get("PATH", STD_PATH)).items():
        monkeypatch.setenv(key, value)
    holder = rig.spawn([PY, "-c", "import time; time.sleep(600)"])
    rig.box.add_compute_app(0, holder.pid, "python", 1000, follows_pid=True)
    host = HostConfig(name="local", ssh="local", python=PY)
    history = HostHistory(host.name)
    await asyncio.sleep(0.2)
    await poll(host, history)
    plan = actions.plan_kill(host, history, holder.pid)
    outcome = await actions.execute(plan, host, store=None, readonly=False, grace_s=1.0)
    assert outcome.ok is None, outcome.message
    holder.wait(5)
    await poll(host, history)
    assert (await actions.verify(plan, host, history)).ok is True


def test_simulated_procfs_is_never_signalled(tmp_path: Path) -> None:
    """A fixture /proc names pids that are not real processes: the box script refuses."""
    from gpuwatch.remote.actions.plan import build_stdin
    from gpuwatch.remote.wire.bundle import build_command

    request = {"v": 1, "op": "signal", "boot_id": "x", "signal": "KILL", "wait_s": 0,
               "targets": [{"pid": os.getpid(), "start_ticks": 0}]}
    env = {"PATH": STD_PATH, "GPUWATCH_PROCFS": str(tmp_path)}
    done = subprocess.run(["/bin/sh", "-c", build_command(PY)], input=build_stdin(request),
                          env=env, capture_output=True, timeout=30)
    doc = json.loads(done.stdout)
    assert "simulated" in doc["refused"] and doc["results"] == []


def test_box_script_runs_under_python_36(tmp_path: Path) -> None:
    installs = sorted(Path.home().glob(".pyenv/versions/3.6*/bin/python"))
    if not installs:
        pytest.skip("no Python 3.6 interpreter here")
    from gpuwatch.remote.actions.plan import build_stdin
    from gpuwatch.remote.wire.bundle import build_command

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{sleeper.pid}/stat").read_text()
        start = int(stat[stat.rindex(")") + 2:].split()[19])
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        request = {"v": 1, "op": "signal", "boot_id": boot, "signal": "TERM", "wait_s": 5,
                   "tree": True, "targets": [{"pid": sleeper.pid, "start_ticks": start}]}
        done = subprocess.run(["/bin/sh", "-c", build_command(str(installs[0]))],
                              input=build_stdin(request), capture_output=True, timeout=30)
        doc = json.loads(done.stdout)
        assert doc["results"][0]["status"] == "signalled", doc
        assert doc["via"] == "kill" and "Python 3.6 has no os.pidfd_open" in doc["via_why"]
        assert sleeper.wait(5) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


def test_not_your_process_is_said_plainly() -> None:
    from gpuwatch.remote.box import act as actions_box

    status, _ = actions_box.check_target(
        {"pid": os.getpid(), "start_ticks": actions_box.proc_stat(os.getpid())["start_ticks"]},
        euid=os.geteuid() + 4242)
    assert status == "not_yours"
    assert "not your process" in actions.STATUS_TEXT["not_yours"]


def test_a_login_that_is_not_root_may_not_signal_others(tmp_path: Path) -> None:
    """The box script run as `nobody` against a root process: refused, and said plainly."""
    import pwd

    from gpuwatch.remote.actions.plan import build_stdin
    from gpuwatch.remote.wire.bundle import build_command

    if os.geteuid() != 0:
        pytest.skip("needs root to run the script as another user")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no system python3 that another user can run")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{sleeper.pid}/stat").read_text()
        start = int(stat[stat.rindex(")") + 2:].split()[19])
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        request = {"v": 1, "op": "signal", "boot_id": boot, "signal": "KILL", "wait_s": 0,
                   "tree": True, "targets": [{"pid": sleeper.pid, "start_ticks": start}]}
        done = subprocess.run(["/bin/sh", "-c", build_command(python)], cwd="/",
                              input=build_stdin(request), capture_output=True, timeout=30,
                              user=pwd.getpwnam("nobody").pw_uid, env={"PATH": STD_PATH})
        doc = json.loads(done.stdout)
        (row,) = doc["results"]
        assert row["status"] == "not_yours" and row["user"] == "root"
        assert "not your process" in actions.result_line(row, "KILL")
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


# On TERM this process kills the sshd session that carried the signal (as killing a run can tear
# down the PTY chain of the very SSH session, U1), then keeps running: only KILL ends it.
DROPPER = r'''
import os, signal, sys, time
LISTENER = int(sys.argv[1])

def stat(pid):
    raw = open("/proc/%d/stat" % pid).read()
    return raw[raw.rindex(")") + 2:].split()

def below_listener(pid):
    while pid > 1:
        pid = int(stat(pid)[1])
        if pid == LISTENER:
            return True
    return False

def on_term(*_):
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % name, "rb").read()
            if b"i=sys.stdin.buffer" in cmd and below_listener(int(name)):
                os.kill(int(stat(int(name))[1]), signal.SIGKILL)  # its sshd session
        except (OSError, ValueError):
            continue

signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(1)
'''


async def test_a_kill_that_drops_the_ssh_connection_is_not_a_failure(rig: Rig) -> None:
    (rig.root / "dropper.py").write_text(DROPPER)
    target = rig.spawn([PY, str(rig.root / "dropper.py"), str(rig.sshd.pid)])
    rig.box.add_compute_app(0, target.pid, "python", 3000, follows_pid=True)
    host = rig.host()
    history = HostHistory(host.name)
    await asyncio.sleep(0.3)
    await poll(host, history)
    plan = actions.plan_kill(host, history, target.pid)
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False, grace_s=1.0)
    assert outcome.ok is None, outcome.message
    assert "connection dropped" in outcome.message and "that is not a failure" in outcome.message
    assert f"KILL sent to {target.pid}" in outcome.message  # a call of its own, identity checked
    target.wait(5)
    await poll(host, history)
    assert (await actions.verify(plan, host, history, store=rig.store)).ok is True
    assert audit(rig) == [("kill", "execute", "sent"), ("kill", "verify", "verified")]


# ---------------------------------------------------------------- bytes, not text

# Records its argv exactly as the kernel holds it (bytes, hex), then waits to be killed.
ARGV_RECORDER = r'''
import os, time
with open(os.path.join(os.getcwd(), "argv.hex"), "w") as fh:
    fh.write(open("/proc/self/cmdline", "rb").read().hex())
time.sleep(600)
'''


@pytest.mark.parametrize("detach", ["setsid", "tmux"])
async def test_relaunch_from_a_checkpoint_whose_name_is_not_utf8(rig: Rig, detach: str) -> None:
    """The folder's name travels as bytes, probe to box, unchanged; the audit
    row is written (the name shown escaped); no launch script is left behind."""
    workdir = rig.root / "bytes"
    workdir.mkdir()
    script = f"gwt_argv_{TOKEN}.py"
    (workdir / script).write_text(ARGV_RECORDER)
    ckpt = os.path.join(os.fsencode(workdir), b"ckpt", b"step-\xff\xfe")
    os.makedirs(ckpt)
    run = RunConfig("raw", process=script, workdir=str(workdir), log="train.log",
                    checkpoints="ckpt/step-*", detach=detach,
                    relaunch=f"{shlex.quote(PY)} {script} --resume {{latest_checkpoint}}")
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    latest = history.runs["raw"].latest_checkpoint
    assert latest is not None and os.fsencode(latest.path) == ckpt

    plan = actions.plan_relaunch(host, "raw", history)
    assert plan.refusal is None, plan.refusal
    assert "step-\\xff\\xfe" in plan.describe()  # the confirmation shows the bytes, escaped
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert outcome.ok is None, outcome.message
    wait_for(lambda: (workdir / "argv.hex").exists() and (workdir / "argv.hex").read_text(),
             what="the relaunched run to start")
    argv = bytes.fromhex((workdir / "argv.hex").read_text()).rstrip(b"\0").split(b"\0")
    assert argv[1:] == [script.encode(), b"--resume", ckpt]

    (entry,) = rig.store.audit_log("box1")
    assert (entry.action, entry.phase, entry.outcome) == ("relaunch", "execute", "sent")
    assert "step-\\xff\\xfe" in (entry.command or ""), entry.command
    assert os.listdir(rig.box_tmp) == []  # the launch script was whole, and removed itself
    await poll(host, history)
    assert (await actions.verify(plan, host, history, store=rig.store)).ok is True


async def test_a_launch_script_cut_short_is_never_left_and_the_audit_says_why(rig: Rig) -> None:
    """A real fault mid-write: the box's interpreter may write files of at most 512 bytes
    (ulimit -f, SIGXFSZ ignored: the write fails with EFBIG after a partial write). No launch
    script is left, nothing runs, and the audit row names the step that failed."""
    workdir = rig.root / "full"
    workdir.mkdir()
    wrapper = rig.root / "python-fsize"
    wrapper.write_text(f"#!/bin/sh\ntrap '' XFSZ\nulimit -f 1\nexec {shlex.quote(PY)} \"$@\"\n")
    wrapper.chmod(0o755)
    padding = "#" + "x" * 2000  # the script is larger than the limit
    run = RunConfig("full", process=TRAIN, workdir=str(workdir), detach="setsid",
                    relaunch=f"touch started {padding}")
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "full", history)
    assert plan.refusal is None, plan.refusal
    limited = replace(host, python=str(wrapper))
    outcome = await actions.execute(plan, limited, store=rig.store, readonly=False)
    assert outcome.ok is False
    assert "writing the launch script" in outcome.message, outcome.message
    assert "File too large" in outcome.message, outcome.message
    assert os.listdir(rig.box_tmp) == []  # not an empty script, not half of one
    assert not (workdir / "started").exists()
    (entry,) = rig.store.audit_log("box1")
    assert entry.action == "relaunch" and entry.ok is False
    assert "writing the launch script" in entry.message


# ---------------------------------------------------------------- pidfds (case 10)

def _have_pidfds() -> None:
    """This machine must have pidfds (Linux 5.3+, Python 3.9+) for the pidfd tests."""
    from harness.captures import missing

    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        missing(f"no pidfds here ({exc})")


async def test_kill_goes_through_a_pidfd_and_the_audit_says_so(rig: Rig) -> None:
    _have_pidfds()
    holder = rig.spawn([PY, "-c", "import time; time.sleep(600)"])
    rig.box.add_compute_app(0, holder.pid, "python", 1000, follows_pid=True)
    host = rig.host()
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_kill(host, history, holder.pid)
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False, grace_s=2.0)
    assert outcome.ok is None, outcome.message
    assert f"pid {holder.pid} (root): TERM sent" in outcome.message
    # How it was signalled is the audit log's, not the toast's: a kill raised two 5-line toasts
    assert "through it (no pid-reuse window)" in outcome.detail, outcome
    assert "pidfd" not in outcome.message and len(outcome.message) <= 112, outcome.message
    holder.wait(5)
    (entry,) = rig.store.audit_log("box1")
    assert entry.outcome == "sent" and "opened as a pidfd" in entry.message, entry.message


def _box_answer(request: dict, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> dict:
    """The box script's main(), in this process (so a test can step into it), answering one
    request on the real /proc."""
    import io

    from gpuwatch.remote.box import act as actions_box

    monkeypatch.delenv("GPUWATCH_PROCFS", raising=False)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(request).encode())))
    capsys.readouterr()
    actions_box.main()
    return json.loads(capsys.readouterr().out)


def _identity(pid: int) -> dict:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return {"pid": pid, "start_ticks": int(stat[stat.rindex(")") + 2:].split()[19])}


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _fork_as(pid: int) -> int | None:
    """A child that gets exactly this (free) pid, by setting the kernel's last pid under it
    (root): it blocks SIGTERM, so a TERM sent to it stays pending where a test can see it.
    None when another process took the pid first."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    read, write = os.pipe()
    last.write_text(str(pid - 1))
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        os.write(write, b"r")
        time.sleep(120)
        os._exit(0)
    os.close(write)
    os.read(read, 1)
    os.close(read)
    if child == pid:
        return child
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return None


def _sigterm_pending(pid: int) -> bool:
    status = proc_status(pid)
    return any(int(status[key], 16) & SIGTERM_BIT for key in ("SigPnd", "ShdPnd"))


PID_REUSE_TRIES = 5
"""Tries at a forced pid reuse: on a busy machine another process can take the freed pid."""


def test_a_pid_reused_between_the_check_and_the_signal_is_not_hit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With a real pid reuse: the target dies and a new process takes its pid
    right after the box script checked the identity, before it signals. Through the pidfd
    opened before the check, the signal goes to the dead target (gone), not the newcomer."""
    from gpuwatch.remote.box import act as actions_box
    from harness.captures import missing

    _have_pidfds()
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        missing("forcing a pid reuse needs root (/proc/sys/kernel/ns_last_pid)")
    checked = actions_box.check_target
    for _ in range(PID_REUSE_TRIES):
        if _a_reused_pid_is_not_hit(checked, monkeypatch, capsys):
            return
    missing(f"could not get a freed pid again for a forced reuse in {PID_REUSE_TRIES} tries")


def _a_reused_pid_is_not_hit(checked: Callable[[dict, int], tuple],
                             monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> bool:
    """One try of the test above; False when another process took the freed pid first (the
    signal then went through the pidfd to the dead target all the same)."""
    from gpuwatch.remote.box import act as actions_box

    target = subprocess.Popen(["sleep", "120"])
    identity = _identity(target.pid)
    newcomer: list[int] = []
    taken: list[int] = []

    def check_then_reuse(t: dict, euid: int) -> tuple:
        verdict = checked(t, euid)
        if int(t["pid"]) == target.pid and not newcomer and not taken:
            target.kill()
            target.wait()
            for _ in range(200):  # another process may fork between the write and ours
                got = _fork_as(target.pid)
                if got is not None:
                    newcomer.append(got)
                    break
                if os.path.exists(f"/proc/{target.pid}"):
                    break  # taken by someone else's process: no reuse to be had
            if not newcomer:
                taken.append(target.pid)
        return verdict

    monkeypatch.setattr(actions_box, "check_target", check_then_reuse)
    try:
        doc = _box_answer({"v": 1, "op": "signal", "boot_id": _boot_id(), "signal": "TERM",
                           "wait_s": 0, "tree": True, "targets": [identity]},
                          monkeypatch, capsys)
        if taken:
            return False
        assert newcomer == [target.pid]
        (row,) = doc["results"]
        assert not _sigterm_pending(target.pid), "the newcomer under the reused pid was hit"
        assert row["status"] == "gone" and row["via"] == "pidfd", row
        assert doc["via"] == "pidfd"
        return True
    finally:
        for pid in newcomer:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if target.poll() is None:
            target.kill()
            target.wait()


def test_without_pidfds_the_check_is_followed_by_kill_and_the_answer_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A box without pidfds (Python < 3.9 or Linux < 5.3): today's check, then kill(2), and
    the answer names which was used, so the outcome and the audit row can say it."""
    from gpuwatch.remote.box import act as actions_box

    monkeypatch.setattr(actions_box, "PIDFD_OPEN", None)
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        doc = _box_answer({"v": 1, "op": "signal", "boot_id": _boot_id(), "signal": "TERM",
                           "wait_s": 5, "targets": [_identity(sleeper.pid)]},
                          monkeypatch, capsys)
        (row,) = doc["results"]
        assert row["status"] == "signalled" and row["via"] == "kill", row
        assert doc["via"] == "kill" and "no os.pidfd_open" in doc["via_why"]
        assert sleeper.wait(5) == -signal.SIGTERM
        assert "sent by pid with kill(2) (no pidfd: Python" in actions.via_line(doc)[0]
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_box_script_failure_is_an_answer_naming_the_step(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever goes wrong inside the box script is said in its answer (the client audits what
    it is told), never a bare traceback; an absurd pid is just gone, as before pidfds."""
    doc = _box_answer({"v": 1, "op": "signal", "boot_id": _boot_id(), "signal": "TERM",
                       "wait_s": 0, "targets": [{"pid": 2 ** 70, "start_ticks": 1},
                                                {"pid": "1x", "start_ticks": 1}]},
                      monkeypatch, capsys)
    assert doc["failed"].startswith("the action script failed while signalling: ValueError")
    assert doc["results"][0]["status"] == "gone"
    plan = actions.ActionPlan("kill", "box1", (), None, "TERM", None, ())
    assert actions.failed_on_box(plan, doc).message.startswith("failed on box1: the action")
