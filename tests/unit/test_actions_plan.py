"""Action plans and verdicts on plain data (no SSH): placeholders, quoting, refusals, describe(),
and what verify() calls done."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.actions.plan import (
    ActionPlan,
    LaunchSpec,
    ProcessTarget,
    fill_command,
    plan_kill,
    plan_relaunch,
)
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.history import HostHistory, PollFailure
from gpuwatch.remote.model.snapshot import Checkpoint, GpuProcess, ProcessCounts, RunSample
from harness.captures import missing
from harness.plan_data import BOOT, HOST, history, proc, snapshot

# ---------------------------------------------------------------- placeholders

def test_fill_quotes_every_value_and_leaves_other_braces_alone() -> None:
    cmd = fill_command(
        "python train.py --resume {latest_checkpoint} --name {run} --out {workdir}/x "
        "--tag ${USER} && awk '{print $1}' log {unknown}",
        run="r; rm -rf /", workdir="/data/my run", latest_checkpoint="/ck/$(reboot)`id`'q")
    words = shlex.split(cmd)
    assert words[:8] == ["python", "train.py", "--resume", "/ck/$(reboot)`id`'q", "--name",
                         "r; rm -rf /", "--out", "/data/my run/x"]
    assert "${USER}" in cmd and "awk '{print $1}'" in cmd and "{unknown}" in cmd


def test_fill_keeps_a_home_relative_path_expandable() -> None:
    cmd = fill_command("cd {workdir} && ls {latest_checkpoint}", run="r", workdir="~/runs/a b",
                       latest_checkpoint="~")
    assert cmd == "cd ~/'runs/a b' && ls ~"
    filled = fill_command("{workdir}", run="r", workdir="~/x", latest_checkpoint=None)
    out = subprocess.run(["sh", "-c", f"echo {filled}"], capture_output=True, text=True,
                         env={"HOME": "/home/h"}).stdout
    assert out == "/home/h/x\n"


def test_fill_without_a_checkpoint_raises_only_when_needed() -> None:
    assert fill_command("python t.py", run="r", workdir="/w", latest_checkpoint=None) == \
        "python t.py"
    with pytest.raises(ValueError):
        fill_command("python t.py --resume {latest_checkpoint}", run="r", workdir="/w",
                     latest_checkpoint=None)


# ---------------------------------------------------------------- plans

def test_kill_plan_lists_the_process_and_its_session_children_only() -> None:
    tmux = proc(50, comm="tmux: server", cmd="tmux new -s x")
    parent = proc(100, ppid=50, gpu=0, mem=40960, run="llama")
    worker = proc(101, ppid=100, session=100, cmd="python train.py")
    other = proc(102, ppid=50, cmd="bash")  # tmux's other shell: another session
    plan = plan_kill(HOST, history(snapshot(tmux, parent, worker, other)), 100)
    assert plan.refusal is None
    assert [t.pid for t in plan.targets] == [100, 101]
    assert plan.targets[0] == ProcessTarget(100, 1000, BOOT, "alice", "python train.py", 0,
                                            40960)
    text = plan.describe()
    assert "kill on gpu1: send TERM to 2 processes, then KILL" in text
    assert "pid 100  user alice  GPU 0 40.0 GiB  python train.py" in text
    assert "belongs to run llama" in text
    server = plan_kill(HOST, history(snapshot(tmux, parent, worker, other)), 50)
    assert any("tmux: server server" in n for n in server.notes)
    assert [t.pid for t in server.targets] == [50]  # its shells lead their own sessions


def test_kill_plan_refusals() -> None:
    h = history(snapshot(proc(7, state="Z", ppid=3), proc(3)))
    assert "defunct" in (plan_kill(HOST, h, 7).refusal or "")
    assert "not in the latest poll" in (plan_kill(HOST, h, 8).refusal or "")
    assert plan_kill(HOST, h, 1).refusal is not None
    assert plan_kill(HOST, history(snapshot(proc(3), boot="")), 3).refusal is not None
    failed = history(snapshot(proc(3)))
    failed.record_failure(PollFailure("timeout", "no answer", 2000.0))
    assert "failed" in (plan_kill(HOST, failed, 3).refusal or "")
    assert "not been polled" in (plan_kill(HOST, HostHistory("gpu1"), 3).refusal or "")


def test_relaunch_plan_refusals_and_describe() -> None:
    run = RunConfig("llama", process="train.py", workdir="/data/llama", log="train.log",
                    relaunch="bash run.sh --resume {latest_checkpoint}", detach="setsid",
                    checkpoints="ck/*", env={"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "hf_x"})
    host = replace(HOST, runs=(run, RunConfig("bare", process="x.py", workdir="/w",
                                              relaunch="python x.py")))
    alive = history(snapshot(proc(10, run="llama")))
    assert "is running (pid 10)" in (plan_relaunch(host, "llama", alive).refusal or "")
    shell = history(snapshot(proc(11, comm="bash", cmd="bash /data/llama/run.sh")))
    refusal = plan_relaunch(host, "llama", shell).refusal or ""
    assert "run.sh is being executed by pid 11" in refusal
    assert "no checkpoint" in (plan_relaunch(host, "llama", history(snapshot())).refusal or "")
    plan = plan_relaunch(host, "bare", history(snapshot()))
    assert plan.refusal is None and plan.command == "python x.py"
    assert plan.launch is not None and plan.launch.log == "/w/gpuwatch-relaunch.log"
    text = plan.describe()
    assert "relaunch run bare on gpu1, detached under setsid nohup:" not in text  # tmux default
    assert "in a new tmux session" in text and "cd /w" in text and "python x.py" in text
    spec = LaunchSpec("llama", "/data/llama", "/data/llama/train.log", "setsid",
                      (("CUDA_VISIBLE_DEVICES", "0"), ("HF_TOKEN", "hf_x")), "train.py", ())
    shown = ActionPlan("relaunch", "gpu1", (), "bash run.sh", "", None, (), spec).describe()
    assert "CUDA_VISIBLE_DEVICES=0 HF_TOKEN=*** PYTHONUNBUFFERED=1" in shown
    assert "hf_x" not in shown and "under setsid nohup" in shown


def test_the_resume_note_only_when_the_command_names_the_checkpoint() -> None:
    """`relaunch` said "resumes from .../checkpoint-20" for a command without
    {latest_checkpoint}: the note is said only where the command resumes, and a command that
    starts as written says so."""
    ckpt = Checkpoint("/data/llama/ck/checkpoint-20", 990.0, 1 << 20)
    sample = RunSample(name="llama", pids=(), log=None, events_path=None, event_files=(),
                       events_capped=False, metrics=(), checkpoints=(ckpt,),
                       checkpoints_total=1, leftovers=(), done=None, done_mtime=None,
                       errors=MappingProxyType({}))
    dead = history(replace(snapshot(), runs=(sample,)))
    for relaunch, resumes in (("python train.py --resume {latest_checkpoint}", True),
                              ("python train.py", False)):
        run = RunConfig("llama", process="train.py", workdir="/data/llama", log="train.log",
                        relaunch=relaunch, checkpoints="ck/*")
        plan = plan_relaunch(replace(HOST, runs=(run,)), "llama", dead)
        assert plan.refusal is None, plan.refusal
        said = plan.describe()
        assert ("resumes from /data/llama/ck/checkpoint-20" in said) is resumes, said
        assert ("starts as written" in said) is not resumes, said


def test_relaunch_plan_of_a_discovered_run_from_its_launch_record() -> None:
    """Not configured: the store's record of how it was started is the plan."""
    from gpuwatch.remote.model.launches import LaunchRecord

    record = LaunchRecord(
        host="gpu1", run="train", recorded_at=0.0, boot_id=BOOT, pid=500, start_ticks=9,
        cwd="/data/my proj", argv=("python", "train.py", "--output_dir", "out"),
        env=(("FOO", "bar"), ("PYTHONUNBUFFERED", "1")), dropped_secret=("WANDB_API_KEY",),
        dropped_session=("SSH_CONNECTION",), env_error=None, process="train.py",
        script="train.py", kind="python", framework=None, log=None, detach="setsid")
    refusal = plan_relaunch(HOST, "train", history(snapshot())).refusal or ""
    assert "no run named 'train'" in refusal and "never saw how" in refusal
    busy = plan_relaunch(HOST, "train", history(snapshot(proc(501, run="train"))), record)
    assert "is running (pid 501)" in (busy.refusal or "")
    plan = plan_relaunch(HOST, "train", history(snapshot()), record)
    assert plan.refusal is None
    assert plan.command == "python train.py --output_dir out"
    assert plan.launch is not None
    assert plan.launch.workdir == "/data/my proj" and plan.launch.process == "train.py"
    assert plan.launch.log == "/data/my proj/gpuwatch-relaunch.log"
    assert plan.launch.env == (("FOO", "bar"), ("PYTHONUNBUFFERED", "1"))
    text = plan.describe()
    assert "env: FOO=bar PYTHONUNBUFFERED=1" in text  # said once
    assert "not passed: WANDB_API_KEY" in text and "not in the config" in text
    assert "nothing that says this run finished" in text and "check the log's end" in text
    other = plan_relaunch(HOST, "train", history(snapshot()), replace(record, run="other"))
    assert "no run named 'train'" in (other.refusal or "")  # a record of another run: not used


# ---------------------------------------------------------------- verdicts

async def test_verify_kill_needs_the_process_gone_and_the_vram_back() -> None:
    target = ProcessTarget(100, 1000, BOOT, "alice", "python train.py", 0, 20000)
    plan = ActionPlan("kill", "gpu1", (target,), None, "TERM", None, ())
    app = GpuProcess(0, "GPU-0", 100, 20000, "python")
    still = await actions.verify(plan, HOST, history(snapshot(proc(100))))
    assert still.ok is False and "still alive: pid 100" in still.message
    holding = await actions.verify(plan, HOST, history(snapshot(apps=(app,))))
    assert holding.ok is False and "still holding GPU memory" in holding.message
    reused = await actions.verify(plan, HOST, history(snapshot(proc(100, start=5))))
    assert reused.ok is True  # another process under that pid now: ours is gone
    defunct = await actions.verify(plan, HOST, history(snapshot(proc(100, state="Z"))))
    assert defunct.ok is True and "reaping" in defunct.message
    rebooted = await actions.verify(plan, HOST, history(snapshot(proc(100), boot="other")))
    assert rebooted.ok is True and "rebooted" in rebooted.message
    assert (await actions.verify(plan, HOST, HostHistory("gpu1"))).ok is None


async def test_verify_relaunch_refuses_a_tty_bound_run() -> None:
    spec = LaunchSpec("llama", "/w", "/w/log", "setsid", (), "train.py", ())
    plan = ActionPlan("relaunch", "gpu1", (), "python train.py", "", None, (), spec)
    bound = history(snapshot(proc(5, comm="bash", cmd="-bash", tty=34816),
                             proc(6, ppid=5, run="llama", tty=34816, session=5)))
    verdict = await actions.verify(plan, HOST, bound)
    assert verdict.ok is False and "tied to a terminal" in verdict.message
    nohup = history(snapshot(proc(6, ppid=5, run="llama", tty=34816, hup_ignored=True)))
    assert (await actions.verify(plan, HOST, nohup)).ok is True
    tmux = history(snapshot(proc(4, comm="tmux: server"), proc(5, ppid=4, comm="sh"),
                            proc(6, ppid=5, run="llama", tty=34817, session=5)))
    assert (await actions.verify(plan, HOST, tmux)).ok is True
    gone = await actions.verify(plan, HOST, history(snapshot()))
    assert gone.ok is False and "not running" in gone.message


def test_box_script_is_python_36_syntax() -> None:
    """Every file of the action script (sent as one, types.BOX_SCRIPTS), act.py among them."""
    paths = actions.BOX_SCRIPTS
    assert {p.name for p in paths} >= {"act.py", "act_launch.py", "act_proc.py"}
    for path in paths:
        compile(path.read_text(), path.name, "exec")
    vermin = Path(sys.executable).with_name("vermin")
    if not vermin.exists():
        missing("vermin is not installed (pip install -e .[test])")
    done = subprocess.run([str(vermin), "-t=3.6-", "--no-tips", "--violations",
                           *map(str, paths)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_kill_plan_tells_only_a_non_root_login_that_it_signals_only_its_own() -> None:
    """Root was told "only your own processes can be signalled unless you log in as root"."""
    parent = proc(100, ppid=1, gpu=0, mem=40960, run="llama")
    note = "only your own processes can be signalled unless you log in as root"

    def notes(euid: int | None) -> tuple[str, ...]:
        counts = ProcessCounts(total=1, kernel_threads=0, zombies=0, not_listed=0,
                               fd_unreadable=0, fd_skipped=(), euid=euid)
        snap = replace(snapshot(parent), process_counts=counts)
        return plan_kill(HOST, history(snap), 100).notes

    assert note not in notes(0)
    assert note in notes(1000)
    assert note in notes(None)  # an older probe did not say: the note stays


def test_a_target_stuck_in_state_d_is_said_and_still_asked() -> None:
    """A rank waiting in the kernel on a wedged GPU (state D) outlives SIGKILL: after three
    polls in D the plan says so, and still asks (the person decides)."""
    stuck = proc(100, gpu=0, mem=40960, run="llama", state="D")
    awake = proc(100, gpu=0, mem=40960, run="llama", state="R")
    plan = plan_kill(HOST, history(snapshot(stuck), snapshot(stuck), snapshot(stuck)), 100)
    assert plan.refusal is None and [t.pid for t in plan.targets] == [100]
    (note,) = [n for n in plan.notes if "state D" in n]
    assert "SIGKILL will not free it" in note and "the GPU may need a reset" in note
    assert "state D" in plan.describe()
    for polls in ((snapshot(awake), snapshot(stuck), snapshot(stuck)),  # D for two polls only
                  (snapshot(proc(100, state="D", start=7)), snapshot(stuck), snapshot(stuck))):
        plan = plan_kill(HOST, history(*polls), 100)  # ... or a pid another process had
        assert not [n for n in plan.notes if "state D" in n]
