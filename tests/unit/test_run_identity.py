"""A run is its own processes, not every command line that holds a word.

Real processes on this machine (its real /proc; only the GPUs are stood in for, Box(real_proc=
True), the stand-in nvidia-smi listing the real pids while they live), polled by the real probe
as a poll runs it. The scripts are all called `train.py`, as a new user's are: this machine runs
other tests' and other people's `train.py` too, which is the very case. A configured run with a
`workdir` must count only the processes working there and their descendants; a run without one
is loose, and `gpuwatch check` says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from findings_helpers import Watched, host_config
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.box import act as actions_box
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.tui.cli.check import loose_runs
from harness.captures import missing
from harness.waiting import wait_for

PY = sys.executable
SLEEPER = "import time\nprint('step 0', flush=True)\nwhile True:\n    time.sleep(0.5)\n"

# torchrun's shape: the launcher starts each rank in a session of its own, with
# TORCHELASTIC_RUN_ID set; a rank's command line does not name the launcher's script. Rank 0
# forks a dataloader-like worker (same command line, its parent's open files).
LAUNCHER = r'''
import os, subprocess, sys, time
RANK = ("import os, sys, time\nif sys.argv[1] == '0' and os.fork() == 0:\n"
        "    time.sleep(600)\nprint('ready', flush=True)\ntime.sleep(600)\n")
env = dict(os.environ, TORCHELASTIC_RUN_ID="gw-" + str(os.getpid()))
ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], cwd="/", env=env,
                          stdout=subprocess.PIPE, start_new_session=True) for r in range(2)]
for r in ranks:
    r.stdout.readline()
print(" ".join(str(r.pid) for r in ranks), flush=True)
time.sleep(600)
'''


class Procs:
    """Processes a test starts, each in a session of its own (as a detached launch leaves
    it); all killed at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.said: dict[int, str] = {}
        """Each process's first line of output."""

    def start(self, argv: list[str], cwd: Path, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.started.append(proc)
        assert proc.stdout is not None
        # it printed: its command line and cwd are in /proc now
        self.said[proc.pid] = proc.stdout.readline().decode()
        return proc

    def close(self) -> None:
        for proc in self.started:
            with_children = [proc.pid, *descendants(proc.pid)]
            for pid in with_children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait(timeout=10)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for kid in map(int, kids):
        out += [kid, *descendants(kid)]
    return out


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.close()


def folder(root: Path, name: str, script: str = SLEEPER, file: str = "train.py") -> Path:
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    (work / file).write_text(script)
    return work


def watched(tmp_path: Path, runs: str, gpus: int = 3) -> Watched:
    box = Box(tmp_path / "box", h100_sxm(gpus), real_proc=True)
    return Watched(box, host_config(runs))


def run_toml(name: str, process: str, workdir: Path | None = None) -> str:
    lines = [f"[hosts.gpu1.runs.{name}]", f'process = "{process}"']
    if workdir is not None:
        lines.append(f'workdir = "{workdir}"')
    return "\n".join(lines) + "\n"


def run_pids(w: Watched, name: str) -> list[int]:
    now = w.history.current
    assert now is not None
    (sample,) = [r for r in now.runs if r.name == name]
    return sorted(sample.pids)


def tagged(w: Watched, name: str) -> list[int]:
    """The pids the process table gives to run `name`."""
    now = w.history.current
    assert now is not None
    return sorted(p.pid for p in now.processes if p.run == name)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """A clean end: SIGTERM's default, then reaped (gone from /proc as under init)."""
    proc.terminate()
    proc.wait(timeout=10)


def wait_dead(pid: int) -> None:
    def dead() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat[stat.rindex(")") + 2] in "ZX"

    wait_for(dead, what=f"pid {pid} to die")


def run_findings(w: Watched, name: str) -> list[str]:
    return [f.code for f in w.findings if f.run == name]


# ---------------------------------------------------------------- two folders, one train.py each

def test_another_folders_train_py_is_not_the_run_and_its_end_is_no_alarm(
        tmp_path: Path, procs: Procs) -> None:
    """The issue's first report: another folder's clean 12-second `python3 train.py` made
    gpuwatch say `critical run.rank_dead ... kill the whole run` about the user's healthy
    run. Both hold a GPU; the other one ends; nothing is said about the user's run, whose
    processes were only ever its own."""
    mine_dir, other_dir = folder(tmp_path, "mine"), folder(tmp_path, "other")
    w = watched(tmp_path, run_toml("mine", "train.py", mine_dir))
    mine = procs.start([PY, "train.py"], mine_dir)
    other = procs.start([PY, "train.py"], other_dir)
    w.box.add_compute_app(0, mine.pid, "python", 30_000, follows_pid=True)
    w.box.add_compute_app(1, other.pid, "python", 30_000, follows_pid=True)
    w.poll()
    assert run_pids(w, "mine") == [mine.pid] and tagged(w, "mine") == [mine.pid]
    assert w.history.runs["mine"].status == "running"
    # the person picks the other process in the TUI: it is not said to be the run's
    plan = actions.plan_kill(w.host, w.history, other.pid)
    assert plan.refusal is None and not any("belongs to run mine" in n for n in plan.notes)
    assert any("belongs to run mine" in n
               for n in actions.plan_kill(w.host, w.history, mine.pid).notes)
    stop(other)
    w.poll()
    assert "run.rank_dead" not in w.codes() and run_findings(w, "mine") == []
    assert w.history.runs["mine"].status == "running" and run_pids(w, "mine") == [mine.pid]
    assert not [f for f in w.findings if f.severity == Severity.CRITICAL], w.findings


def test_two_configured_runs_in_two_folders_each_dies_alone(tmp_path: Path,
                                                            procs: Procs) -> None:
    """The same script name configured twice: the one killed is dead, the other untouched."""
    a_dir, b_dir = folder(tmp_path, "a"), folder(tmp_path, "b")
    w = watched(tmp_path, run_toml("a", "train.py", a_dir) + run_toml("b", "train.py", b_dir))
    a = procs.start([PY, "train.py", "--lr", "3e-4"], a_dir)
    b = procs.start([PY, str(b_dir / "train.py")], b_dir)
    w.box.add_compute_app(0, a.pid, "python", 30_000, follows_pid=True)
    w.box.add_compute_app(1, b.pid, "python", 30_000, follows_pid=True)
    w.poll()
    assert (run_pids(w, "a"), run_pids(w, "b")) == ([a.pid], [b.pid])
    a.kill()
    a.wait(timeout=10)
    w.poll()
    dead = w.one("run.dead")
    assert dead.run == "a" and dead.severity == Severity.CRITICAL
    assert dead.evidence["pids"] == [a.pid] and "run.rank_dead" not in w.codes()
    assert run_findings(w, "b") == [] and w.history.runs["b"].status == "running"


def test_a_script_started_by_path_from_another_folder_is_the_run(tmp_path: Path,
                                                                 procs: Procs) -> None:
    """`python /w/train.py` typed in the home folder: its cwd is elsewhere, but the argument
    that matched is the run's file, so it is the run; `python train.py` elsewhere is not."""
    work, elsewhere = folder(tmp_path, "work"), folder(tmp_path, "home")
    w = watched(tmp_path, run_toml("mine", "train.py", work))
    by_path = procs.start([PY, str(work / "train.py")], elsewhere)
    procs.start([PY, "train.py"], elsewhere)
    w.poll()
    assert run_pids(w, "mine") == [by_path.pid]


# ---------------------------------------------------------------- another user's processes

def as_nobody() -> dict[str, object]:
    """Popen arguments that run a process as `nobody` (needs root), and a python it can run."""
    if os.geteuid() != 0:
        missing("needs root to start a process as another user")
    if not os.access("/usr/bin/python3", os.X_OK):
        missing("no system python3 that another user can run")
    return {"user": 65534, "group": 65534, "extra_groups": []}


def test_another_users_train_py_is_not_counted_nor_named_in_a_refusal(
        tmp_path: Path, procs: Procs) -> None:
    """The issue's second report: another user's processes counted into the run ("running 5
    processes"), and a relaunch refused naming a pid that was not the run's. `nobody` runs
    `python3 train.py` in its own folder (and, the probe running as root, its cwd is
    readable: what keeps it out is the folder, not the permission)."""
    kwargs = as_nobody()
    theirs = Path(tempfile.mkdtemp(prefix="gw-nobody-"))
    try:
        theirs.chmod(0o755)
        folder(theirs, "proj").chmod(0o755)
        mine_dir = folder(tmp_path, "mine")
        w = watched(tmp_path, run_toml("mine", "train.py", mine_dir))
        nobody = procs.start(["/usr/bin/python3", "train.py"], theirs / "proj", **kwargs)
        w.box.add_compute_app(1, nobody.pid, "python3", 30_000, follows_pid=True)
        mine = procs.start([PY, "train.py"], mine_dir)
        w.poll()
        now = w.history.current
        assert now is not None
        (row,) = [p for p in now.processes if p.pid == nobody.pid]
        assert row.user == "nobody" and row.run != "mine"  # (discovery may name it)
        assert run_pids(w, "mine") == [mine.pid]
        # The run ends; nobody's train.py lives on: a relaunch is not refused because of it,
        # by the plan (the poll's processes) nor on the box (its own look at /proc).
        stop(mine)
        w.poll()
        run = RunConfig("mine", process="train.py", workdir=str(mine_dir),
                                relaunch="python train.py")
        host = HostConfig("gpu1", "local", runs=(run,))
        plan = actions.plan_relaunch(host, "mine", w.history)
        assert plan.refusal is None, plan.refusal
        request = {"run": "mine", "process": "train.py", "scripts": ["train.py"]}
        assert actions_box.still_running(request, bytes(mine_dir)) is None
        # ... and while the run's own process lives, that one (and only it) is named
        again = procs.start([PY, "train.py"], mine_dir)
        why = actions_box.still_running(request, bytes(mine_dir))
        assert why is not None and f"pid {again.pid} " in why
        w.poll()
        refused = actions.plan_relaunch(host, "mine", w.history).refusal
        assert refused == (f"run mine is running (pid {again.pid}); kill it first — a kill and "
                           "a relaunch are never one step")
    finally:
        subprocess.run(["rm", "-rf", str(theirs)], check=False)


def test_a_shell_running_another_folders_launch_script_blocks_nothing(
        tmp_path: Path, procs: Procs) -> None:
    """U2's guard (a shell mid-script) counts a shell running the run's own script file, not
    another folder's script of the same name."""
    mine_dir, other_dir = folder(tmp_path, "mine"), folder(tmp_path, "other")
    for d in (mine_dir, other_dir):
        (d / "run.sh").write_text("echo started\nsleep 600\n")
    w = watched(tmp_path, run_toml("mine", "train.py", mine_dir))
    other = procs.start(["sh", "run.sh"], other_dir)
    w.box.add_compute_app(0, other.pid, "sh", 100, follows_pid=True)  # listed in the table
    w.poll()
    run = RunConfig("mine", process="train.py", workdir=str(mine_dir),
                            relaunch="sh run.sh")
    host = HostConfig("gpu1", "local", runs=(run,))
    assert actions.plan_relaunch(host, "mine", w.history).refusal is None
    request = {"run": "mine", "process": "train.py", "scripts": ["run.sh"]}
    assert actions_box.still_running(request, bytes(mine_dir)) is None
    own = procs.start(["sh", "run.sh"], mine_dir)
    w.box.add_compute_app(1, own.pid, "sh", 100, follows_pid=True)
    w.poll()
    refusal = actions.plan_relaunch(host, "mine", w.history).refusal
    assert refusal is not None and f"pid {own.pid} " in refusal
    why = actions_box.still_running(request, bytes(mine_dir))
    assert why is not None and f"pid {own.pid} " in why


# ---------------------------------------------------------------- a launcher and its ranks

def test_ranks_belong_to_the_run_through_their_launcher(tmp_path: Path, procs: Procs) -> None:
    """A torchrun-like launcher (`python launcher.py --nproc 2 train.py`) starts two ranks,
    each in a session of its own, in another folder, under a command line that names neither
    the launcher nor train.py; rank 0 forks a worker. The run is all of them, through the
    process tree. A rank killed while the other lives is run.rank_dead; another folder's
    train.py ending beside it is not."""
    work, other_dir = folder(tmp_path, "work"), folder(tmp_path, "other")
    (work / "launcher.py").write_text(LAUNCHER)
    w = watched(tmp_path, run_toml("llama", "train.py", work))
    launcher = procs.start([PY, "launcher.py", "--nproc", "2", "train.py"], work)
    rank0, rank1 = map(int, procs.said[launcher.pid].split())
    (worker,) = descendants(rank0)
    other = procs.start([PY, "train.py"], other_dir)
    for gpu, pid in enumerate((rank0, rank1, other.pid)):
        w.box.add_compute_app(gpu, pid, "python", 30_000, follows_pid=True)
    w.poll()
    assert run_pids(w, "llama") == sorted([launcher.pid, rank0, rank1, worker])
    assert tagged(w, "llama") == run_pids(w, "llama")
    stop(other)
    w.poll()
    assert "run.rank_dead" not in w.codes() and run_findings(w, "llama") == []
    os.kill(rank1, signal.SIGKILL)  # left defunct: this launcher does not reap it
    wait_dead(rank1)
    w.poll()
    f = w.one("run.rank_dead")
    assert f.run == "llama" and f.severity == Severity.CRITICAL
    assert f.evidence["dead_pids"] == [rank1] and f.evidence["survivors"] == [rank0]
    assert "run.dead" not in w.codes()


# ---------------------------------------------------------------- a run without a workdir

def test_a_loose_run_counts_any_folder_says_so_and_two_jobs_are_not_one(
        tmp_path: Path, procs: Procs) -> None:
    """Without a workdir the match stays loose (any folder's, any user's command line), and
    `gpuwatch check` says so with the folders it matches now and the fix. Two processes it
    matched in two folders are two jobs, not two ranks of one: one ending is no rank death
    (seed 002 needs a launcher or a session in common)."""
    script = f"gw_loose_{uuid.uuid4().hex[:8]}.py"  # loose: no other process may match it
    a_dir, b_dir = folder(tmp_path, "a", file=script), folder(tmp_path, "b", file=script)
    w = watched(tmp_path, run_toml("loose", script))
    a = procs.start([PY, script], a_dir)
    b = procs.start([PY, script], b_dir)
    w.box.add_compute_app(0, a.pid, "python", 30_000, follows_pid=True)
    w.box.add_compute_app(1, b.pid, "python", 30_000, follows_pid=True)
    w.poll()
    assert run_pids(w, "loose") == sorted([a.pid, b.pid])
    now = w.history.current
    assert now is not None
    (said,) = loose_runs(w.host, now)
    assert f'run loose has `process = "{script}"` but no `workdir`' in said
    assert "matching is loose" in said and "Set `workdir` to the run's folder" in said
    assert f"in 2 folders ({a_dir}, {b_dir})" in said
    structural = host_config(run_toml("mine", script, a_dir))
    assert loose_runs(structural, now) == []
    stop(b)
    w.poll()
    assert "run.rank_dead" not in w.codes(), w.findings
    assert w.history.runs["loose"].status == "running"


def test_loose_matching_is_the_words_of_the_command_line() -> None:
    """What a run without a workdir matches: whole words anywhere in the command line, a path
    before it allowed, an argument with spaces (`bash -c "..."`) too."""
    from gpuwatch.remote.box import names as probe

    def loose(argv: list[str], text: str) -> bool:
        return probe.argv_match(" ".join(argv).split(), text.split()) is not None

    assert loose(["bash", "-c", "cd /x && python train.py"], "train.py")
    assert loose(["python", "/x/train.py", "--resume"], "train.py")
    assert not loose(["python", "pretrain.py"], "train.py")
    assert not probe.argv_match(["bash", "-c", "cd /x && python train.py", "y"],
                                ["train.py"])  # a structural run: arguments, not words


def test_symlinked_workdir_matches_the_cwd_proc_shows(tmp_path: Path, procs: Procs,
                                                      ) -> None:
    """/proc shows a cwd with its symlinks resolved; a workdir written through a symlink
    (/data -> /mnt/data) still holds the run."""
    real = folder(tmp_path, "real")
    (tmp_path / "link").symlink_to(real)
    w = watched(tmp_path, run_toml("mine", "train.py", tmp_path / "link"))
    proc = procs.start([PY, "train.py"], tmp_path / "link")
    w.poll()
    assert run_pids(w, "mine") == [proc.pid]


