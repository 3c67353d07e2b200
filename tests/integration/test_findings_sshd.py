"""Findings and death diagnosis end to end over a real OpenSSH sshd, with real processes.

`gpuwatch --once --json` runs as a user runs it (a subprocess, HOME and the store in a temporary
folder), polling a host reached through the harness's sshd. The box reads this machine's real
/proc (real processes this test starts, kills and puts under a terminal); only the GPUs, the
cgroup counters and the kernel log are simulated (Box(real_proc=True)).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from harness.sshd import SshdBox
from harness.sshd_cli import gpuwatch, ssh_config, start_box
from harness.waiting import wait_for

SCRIPT = """\
import sys, time
print("step 0", flush=True)
while True:
    time.sleep(0.5)
"""


def mirror_cgroup_v1(box: Box) -> None:
    """The simulated cgroup counters in the v1 layout too: on a hybrid-v1 machine the probe
    follows this machine's /proc/self/cgroup to the v1 memory controller."""
    events = box.cgroup["events"]
    path = box.sys / "fs" / "cgroup" / "memory" / "memory.oom_control"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {events['oom_kill']}\n")


class Trainer:
    """Real `python gw_train_<n>.py` processes started the ways people start them."""

    def __init__(self, work: Path) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.name = f"gw_train_{os.getpid()}_{time.monotonic_ns()}.py"
        (work / self.name).write_text(SCRIPT)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.fds: list[int] = []

    def run_config(self) -> dict[str, Any]:
        return {"process": self.name, "workdir": str(self.work), "log": "train.log"}

    def setsid_nohup(self) -> subprocess.Popen[bytes]:
        """`setsid nohup python train.py >> train.log 2>&1 < /dev/null &` (seed 000's fix)."""
        log = open(self.work / "train.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(["setsid", "nohup", sys.executable, self.name], cwd=self.work,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def in_terminal(self) -> subprocess.Popen[bytes]:
        """`python train.py` typed at an interactive shell: a new session whose controlling
        terminal is a pty, SIGHUP at its default (what an SSH login gives a foreground job)."""
        master, slave = os.openpty()
        self.fds += [master, slave]

        def take_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)

        proc = subprocess.Popen([sys.executable, self.name], cwd=self.work, stdin=slave,
                                stdout=slave, stderr=slave, preexec_fn=take_terminal)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)  # reaped: gone from /proc, as under init

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for fd in self.fds:
            os.close(fd)


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Trainer]:
    t = Trainer(tmp_path / "work")
    yield t
    t.close()


def wait_for_pid(proc: subprocess.Popen[bytes], name: str) -> None:
    """Until /proc shows the exec'd script (setsid/nohup exec in turn)."""
    def cmdline() -> bytes:
        try:
            return Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        except OSError:
            return b""

    wait_for(lambda: name.encode() in cmdline(), what=f"{name} to start")


def setup(tmp_path: Path, sshd_factory: Callable[..., SshdBox], trainer: Trainer
          ) -> tuple[Box, dict[str, Any]]:
    box = Box(tmp_path / "box", h100_sxm(2), real_proc=True, memory_max=64 * 2**30)
    mirror_cgroup_v1(box)
    sshd = start_box(sshd_factory, box)
    config = ssh_config(sshd, {"gpu1": {"ssh": "box1", "runs": {"llama": trainer.run_config()}}})
    return box, config


def once(tmp_path: Path, config: dict[str, Any], *args: str) -> tuple[int, dict[str, Any]]:
    run = gpuwatch(tmp_path / "me", "--once", "--json", *args, config=config)
    assert run.returncode in (0, 1), run.stderr
    (host,) = run.json()["hosts"]
    assert host["ok"], host["error"]
    return run.returncode, host


def findings(host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in host["findings"]}


def test_sigkill_is_diagnosed_killed(tmp_path: Path, sshd_factory: Callable[..., SshdBox],
                                     trainer: Trainer) -> None:
    _box, config = setup(tmp_path, sshd_factory, trainer)
    proc = trainer.setsid_nohup()
    wait_for_pid(proc, trainer.name)
    code, host = once(tmp_path, config)
    assert code == 0 and host["runs"][0]["status"] == "running"
    assert host["runs"][0]["pids"] == [proc.pid] and "run.sighup_risk" not in findings(host)
    trainer.kill(proc)
    code, host = once(tmp_path, config)
    assert code == 1
    (run,) = host["runs"]
    assert run["status"] == "dead" and run["diagnosis"]["cause"] == "killed", run
    dead = findings(host)["run.dead"]
    assert dead["severity"] == "critical" and dead["evidence"]["pids"] == [proc.pid]


def test_reboot_is_diagnosed_reboot(tmp_path: Path, sshd_factory: Callable[..., SshdBox]
                                    ) -> None:
    """A reboot changes the fixture's boot id: a box with its own /proc tree this time (this
    machine's boot id cannot change), the run a simulated process in it."""
    box = Box(tmp_path / "box", h100_sxm(2), memory_max=64 * 2**30)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.log").write_text("step 0\n")
    box.add_process(training_process(4242, workdir=str(work), nohup=True))
    sshd = start_box(sshd_factory, box)
    config = ssh_config(sshd, {"gpu1": {"ssh": "box1", "runs": {"llama": {
        "process": "train.py", "workdir": str(work), "log": "train.log"}}}})
    code, host = once(tmp_path, config)
    assert code == 0 and host["runs"][0]["pids"] == [4242]
    before = box.boot_id
    box.reboot()
    code, host = once(tmp_path, config)
    assert code == 1 and host["boot_id"] == box.boot_id != before
    (run,) = host["runs"]
    assert run["diagnosis"] == {"cause": "reboot", "evidence": {
        "boot_id_before": before, "boot_id_now": box.boot_id, "uptime_s": 30.0,
        "pids": [4242]}}
    assert findings(host)["run.dead"]["severity"] == "critical"
    assert "host.rebooted" in findings(host)


def test_cgroup_oom_counter_is_diagnosed_oom_cgroup(
        tmp_path: Path, sshd_factory: Callable[..., SshdBox], trainer: Trainer) -> None:
    box, config = setup(tmp_path, sshd_factory, trainer)
    proc = trainer.setsid_nohup()
    wait_for_pid(proc, trainer.name)
    once(tmp_path, config)
    trainer.kill(proc)  # what the OOM killer does: SIGKILL
    box.oom_kill()  # ... and the cgroup counts it (U41)
    mirror_cgroup_v1(box)
    code, host = once(tmp_path, config)
    assert code == 1
    (run,) = host["runs"]
    assert run["diagnosis"]["cause"] == "oom_cgroup"
    assert run["diagnosis"]["evidence"]["oom_kill_now"] == 1
    assert findings(host)["host.cgroup_oom"]["severity"] == "critical"


def test_xid_79_is_critical(tmp_path: Path, sshd_factory: Callable[..., SshdBox],
                            trainer: Trainer) -> None:
    box, config = setup(tmp_path, sshd_factory, trainer)
    code, host = once(tmp_path, config)
    assert code == 0 and host["findings"] == []
    box.xid(1, 79)
    code, host = once(tmp_path, config)
    xid = findings(host)["gpu.xid"]
    assert code == 1 and xid["severity"] == "critical" and xid["gpu"] == 1
    assert "re-rent" in xid["message"]
    code, host = once(tmp_path, config, "--fail-on", "warning")
    assert code == 0 and "gpu.xid" not in findings(host)  # reported once


def test_terminal_run_is_a_sighup_risk_and_setsid_nohup_is_not(
        tmp_path: Path, sshd_factory: Callable[..., SshdBox], trainer: Trainer) -> None:
    _box, config = setup(tmp_path, sshd_factory, trainer)
    tty_proc = trainer.in_terminal()
    wait_for_pid(tty_proc, trainer.name)
    code, host = once(tmp_path, config, "--fail-on", "warning")
    risk = findings(host)["run.sighup_risk"]
    assert code == 1 and risk["severity"] == "warning" and risk["run"] == "llama"
    assert risk["evidence"]["pids"] == [tty_proc.pid] and risk["evidence"]["tty_nr"] != 0
    assert code == 1
    trainer.kill(tty_proc)
    detached = trainer.setsid_nohup()
    wait_for_pid(detached, trainer.name)
    code, host = once(tmp_path, config)
    assert host["runs"][0]["pids"] == [detached.pid]
    assert "run.sighup_risk" not in findings(host)
