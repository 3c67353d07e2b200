"""A simulated-GPU box whose /proc is this machine's, behind a real sshd on loopback: real
processes for actions and the watchdog to act on (Box(real_proc=True): the stand-in nvidia-smi
lists REAL pids as VRAM holders, and drops them once they exit). The `rig` fixture builds one;
a test module that uses it imports it from here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from gpuwatch.remote.config.schema import HostConfig, RunConfig, SshSettings
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import HostSnapshot
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.store import Store
from gpuwatch.remote.wire.collect import Collector

from .sshd import STD_PATH, SshdBox

PY = sys.executable
# Script names no other process on this machine has: the box here is this machine's real /proc,
# shared with whatever else runs (other tests' trainers, another pytest running this file).
TOKEN = uuid.uuid4().hex[:8]
TRAIN = f"gwt_train_{TOKEN}.py"


# A small training script: logs a step line (no flush: U43 is PYTHONUNBUFFERED's job), appends
# metrics, checkpoints every 3 steps (written aside, renamed whole), and records how it was
# started (argv, cwd, env, stdin/stdout) so a test can check what a relaunch did.
TRAINER = r'''
import json, os, sys, time
args = sys.argv[1:]
resume = args[args.index("--resume") + 1] if "--resume" in args else None
with open("launches.jsonl", "a") as fh:
    fh.write(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "resume": resume, "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in
                ("PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "WANDB_API_KEY")},
        "stdin": os.readlink("/proc/self/fd/0"), "stdout": os.readlink("/proc/self/fd/1"),
    }) + "\n")
step = int(resume.rsplit("-", 1)[-1]) if resume else 0
os.makedirs("ckpt", exist_ok=True)
while True:
    step += 1
    print("step %d loss %.4f" % (step, 1.0 / step))
    with open("metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
    if step % 3 == 0:
        final = os.path.join("ckpt", "step-%05d" % step)
        os.makedirs(final + ".tmp")
        with open(os.path.join(final + ".tmp", "model.pt"), "w") as out:
            out.write("weights")
        os.rename(final + ".tmp", final)
    time.sleep(0.1)
'''


@dataclass
class Rig:
    """A simulated-GPU box with real processes behind a real sshd, and what a test started."""

    root: Path
    box: Box
    sshd: SshdBox
    store: Store
    tmux_dir: Path
    started: list[subprocess.Popen[bytes]]

    @property
    def box_tmp(self) -> Path:
        """The box's TMPDIR: where the action script writes its launch scripts."""
        return self.root / "box-tmp"

    def host(self, *runs: RunConfig, **settings: float) -> HostConfig:
        return HostConfig(name="box1", ssh="box1", python=PY, runs=runs,
                          settings=SshSettings(config_file=str(self.sshd.ssh_config),
                                               **settings))  # type: ignore[arg-type]

    def spawn(self, argv: list[str], cwd: Path | None = None, log: Path | None = None,
              pipe: bool = False) -> subprocess.Popen[bytes]:
        """A process of this test in its own session (as a detached launch leaves one)."""
        out: int | IO[bytes] = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if pipe else out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        if not isinstance(out, int):
            out.close()
        self.started.append(proc)
        return proc


def kill_leftovers(root: Path) -> None:
    """Every process this test left running: its cwd or command line is under the test's root."""
    mine = {os.getpid()}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine:
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(root)) or str(root) in cmd:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def rig(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> Iterator[Rig]:
    box = Box(tmp_path / "box", h100_sxm(3), real_proc=True)
    for gpu in range(3):
        box.set_gpu(gpu, util_pct=0, mem_used_mib=0)
    tmux_dir = tmp_path / "tmux"
    tmux_dir.mkdir()
    env = box.env(base_path=STD_PATH)
    env["TMUX_TMPDIR"] = str(tmux_dir)  # this test's own tmux server
    (tmp_path / "box-tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "box-tmp")  # Rig.box_tmp
    sshd = sshd_factory(env=env, bin_dir=box.bin)
    store = Store.open(tmp_path / "state.sqlite3")
    rig = Rig(tmp_path, box, sshd, store, tmux_dir, [])
    try:
        yield rig
    finally:
        subprocess.run(["tmux", "kill-server"], env={**os.environ, "TMUX_TMPDIR": str(tmux_dir)},
                       capture_output=True, check=False)
        for proc in rig.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        kill_leftovers(tmp_path)
        store.close()


async def poll(host: HostConfig, history: HostHistory) -> HostSnapshot:
    """One poll recorded and judged into `history` (the rules applied: why a run that went
    died, the zombies), as the pipeline does with every poll."""
    from gpuwatch.remote.findings.rules import evaluate

    outcome = await Collector().poll(host, history.runs)
    assert outcome.snapshot is not None, outcome.error_message
    history.record(outcome.snapshot, outcome.ended_at)
    evaluate(history)
    return outcome.snapshot


def proc_state(pid: int) -> str | None:
    """The pid's state letter, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")
