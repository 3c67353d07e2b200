"""No process outlives its poll on the box (case 8), over a real OpenSSH sshd.

sshd signals no non-tty command when its client goes: a probe that hangs, or a command of it
that hangs, stays on the box after the client's command_timeout, one more every poll. Each
test polls a simulated box once with a small command_timeout, then counts the processes left
on the box that came from that poll: every process of the poll's session carries a marker in
its environment (the sshd harness sets it, and the probe passes its environment on to what it
runs), so the count is every process whose /proc/PID/environ holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpuwatch.remote.config.schema import HostConfig, SshSettings
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from gpuwatch.remote.wire.collect import Collector, PollOutcome
from harness.sshd import SshdBox
from harness.waiting import wait_for

BOX_PATH = "/usr/bin:/bin"
COMMAND_TIMEOUT_S = 2.0


class Marked:
    """A box behind its own sshd whose sessions carry a unique marker in their environment."""

    def __init__(self, factory: Callable[..., SshdBox], box: Box) -> None:
        self.box = box
        self.marker = f"GPUWATCH_TEST_POLL={uuid.uuid4().hex}".encode()
        name, value = self.marker.decode().split("=")
        self.sshd = factory(env={**box.env(base_path=BOX_PATH), name: value})

    def host(self, python: str = "python3") -> HostConfig:
        settings = SshSettings(connect_timeout=5, server_alive_interval=1,
                               server_alive_count_max=3, command_timeout=COMMAND_TIMEOUT_S,
                               config_file=str(self.sshd.ssh_config),
                               known_hosts=str(self.sshd.known_hosts))
        return HostConfig(name="box1", ssh="box1", python=python, disks=("/",),
                          settings=settings)

    def poll(self, host: HostConfig) -> PollOutcome:
        return asyncio.run(Collector().poll(host))

    def left(self) -> dict[int, str]:
        """pid -> command line of every live process of this box's sessions."""
        found: dict[int, str] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone, or not ours to read
            if self.marker in environ:  # a zombie's environ is empty: it is not counted
                found[int(entry.name)] = cmd[:120]
        return found

    def left_after_settling(self) -> dict[int, str]:
        """What is still there once the processes had time to go (an assertion shows it)."""
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not self.left(), what="every process of the session gone")
        return self.left()

    def sweep(self) -> None:
        """Kill what a failing test left behind, so that no test leaks processes."""
        for pid in self.left():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def marked(sshd_factory: Callable[..., SshdBox]) -> Iterator[Callable[[Box], Marked]]:
    made: list[Marked] = []

    def make(box: Box) -> Marked:
        made.append(Marked(sshd_factory, box))
        return made[-1]

    yield make
    for one in made:
        one.sweep()


def hanging_tool(path: Path) -> None:
    """A stand-in that never answers and, like a real tool wedged in a driver, does not notice
    that its caller has gone (unlike harness.faults.hanging_standin, which leaves then)."""
    path.write_text("#!/bin/sh\nexec sleep 300\n")
    path.chmod(0o755)


def test_a_wedged_nvidia_smi_and_dmesg_leave_nothing_behind(
        tmp_path: Path, marked: Callable[[Box], Marked]) -> None:
    """nvidia-smi hangs (the simulator's wedged driver) and so does dmesg: together they take
    longer than command_timeout. The probe stops at its deadline, kills both and prints what
    it read; nothing from the poll is left on the box."""
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(hang=True)
    hanging_tool(box.bin / "dmesg")
    rig = marked(box)

    outcome = rig.poll(rig.host())

    assert rig.left_after_settling() == {}
    assert outcome.snapshot is not None, outcome.error_message
    errors = outcome.snapshot.section_errors
    assert errors["gpus"].startswith("nvidia-smi timed out"), errors
    assert "kernel" in errors and "processes" not in errors, errors


def test_a_probe_blocked_in_a_read_leaves_nothing_behind(
        tmp_path: Path, marked: Callable[[Box], Marked]) -> None:
    """A /proc read that never returns (as reading the command line of a process whose memory
    map is locked does): here a FIFO with no writer in the simulated /proc. The probe is
    interrupted at its deadline and still answers, the process table marked as cut short."""
    box = Box(tmp_path / "box", h100_sxm(1))
    trainer = box.add_process(training_process(4242))
    box.add_compute_app(0, trainer.pid, "python", 1024)
    cmdline = box.proc / "4242" / "cmdline"
    cmdline.unlink()
    os.mkfifo(cmdline)
    rig = marked(box)

    outcome = rig.poll(rig.host())

    assert rig.left_after_settling() == {}
    assert outcome.snapshot is not None, outcome.error_message
    snap = outcome.snapshot
    assert "deadline" in snap.section_errors["processes"], snap.section_errors
    assert "not read" in snap.section_errors["kernel"], snap.section_errors
    assert len(snap.gpus) == 1 and snap.boot_id == box.boot_id  # what it read stands


def test_a_command_that_hangs_before_the_probe_starts_gets_sigterm_from_the_client(
        tmp_path: Path, marked: Callable[[Box], Marked]) -> None:
    """An interpreter that never starts the probe (a hung filesystem under it, a login script
    that blocks): no deadline of the probe's can help. When its command_timeout fires the
    client asks sshd to send SIGTERM (OpenSSH >= 7.9), which ends it. sshd grants that only
    under post-auth privilege separation, which it skips for a root login: as root, the test
    checks that the request reached sshd (which logs its refusal)."""
    box = Box(tmp_path / "box", h100_sxm(1))
    hung = box.bin / "hung-python"
    hanging_tool(hung)
    rig = marked(box)

    outcome = rig.poll(rig.host(python=str(hung)))

    assert outcome.error_kind == "timeout", outcome.error_message
    if os.getuid() == 0:
        wait_for(lambda: "session_signal_req: session signalling requires privilege separation"
                 in rig.sshd.log_text(), what="sshd saying it cannot signal the session")
    else:
        assert rig.left_after_settling() == {}


def test_the_marker_finds_a_live_poll(tmp_path: Path, marked: Callable[[Box], Marked]) -> None:
    """The count above is not vacuous: while a poll hangs, its processes carry the marker."""
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(hang=True)
    rig = marked(box)
    host = rig.host()
    seen: list[dict[int, str]] = []

    async def poll_and_look() -> None:
        task = asyncio.ensure_future(Collector().poll(host))
        for _ in range(200):
            await asyncio.sleep(0.02)
            left = rig.left()
            if any("nvidia-smi" in cmd for cmd in left.values()):
                seen.append(left)
                break
        await task

    asyncio.run(poll_and_look())
    assert seen and any("python" in cmd for cmd in seen[0].values()), seen  # the probe too
