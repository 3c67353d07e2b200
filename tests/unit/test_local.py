"""remote/local: a command on this machine under the bounds of an SSH exec (caps, deadline,
process group killed), blocking for `--once` and in a thread for the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpuwatch.remote.wire import local
from harness.waiting import wait_for

CAPS = {"max_stdout": 1 << 20, "max_stderr": 4096}


def group_gone(pgid: int) -> bool:
    """Once no process of the group is left (killed ones are reaped by their new parent)."""
    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    return wait_for(gone, what=f"process group {pgid} gone")


def test_stdin_bigger_than_a_pipe_goes_through_whole() -> None:
    data = os.urandom(1 << 20)  # 16 pipe buffers: written as the command reads
    result = local.run("cat", data, 30, **CAPS | {"max_stdout": 2 << 20})
    assert result.exit_status == 0 and not result.stdout_truncated
    assert result.stdout == data and result.bytes_received == len(data)


def test_stdout_and_stderr_come_back_apart_with_the_exit_status() -> None:
    result = local.run("cat; echo to-err >&2; exit 3", b"in", 30, **CAPS)
    assert (result.exit_status, result.stdout, result.stderr) == (3, b"in", b"to-err\n")


def test_a_command_that_reads_no_stdin_does_not_hang_the_writer() -> None:
    result = local.run("exit 5", os.urandom(1 << 20), 30, **CAPS)
    assert result.exit_status == 5


def test_output_over_the_cap_is_cut_and_the_group_killed() -> None:
    """10 MB of garbage (the fault matrix, here for `local`): at most the cap is kept,
    reading stops past it, and nothing of the command is left running (`yes` never ends)."""
    result = local.run("echo $$ >&2; yes garbage-garbage-garbage", b"", 30, **CAPS)
    assert result.stdout_truncated and result.exit_status is None
    assert len(result.stdout) == CAPS["max_stdout"]
    assert result.stdout.startswith(b"garbage-garbage-garbage\n")
    assert group_gone(int(result.stderr.split()[0]))


def test_stderr_over_its_cap_is_kept_to_the_cap_and_read_to_the_end() -> None:
    result = local.run("head -c 100000 /dev/zero >&2; echo done", b"", 30, **CAPS)
    assert result.exit_status == 0 and result.stdout == b"done\n"
    assert result.stderr == bytes(CAPS["max_stderr"])
    assert result.bytes_received == 100000 + 5


def test_the_deadline_kills_the_command_and_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pgid"
    t0 = time.monotonic()
    with pytest.raises(local.LocalTimeout):
        local.run(f"echo $$ > {pid_file}; sleep 60 & sleep 60", b"", 0.5, **CAPS)
    assert time.monotonic() - t0 < 30  # the deadline held, not the sleeps
    assert group_gone(int(pid_file.read_text()))


def test_closed_output_that_goes_on_is_a_timeout(tmp_path: Path) -> None:
    """A command that closes stdout and stderr but does not exit (a daemonising probe) must
    not be waited for past the deadline."""
    pid_file = tmp_path / "pgid"
    with pytest.raises(local.LocalTimeout):
        local.run(f"echo $$ > {pid_file}; exec >&- 2>&-; sleep 60", b"", 0.5, **CAPS)
    assert group_gone(int(pid_file.read_text()))


def test_cancelling_run_async_kills_the_command_at_once(tmp_path: Path) -> None:
    """The TUI cancels a poll (quit, host removed): the command's group dies now, so the
    worker thread ends and the event loop's shutdown does not wait for the deadline."""
    pid_file = tmp_path / "pgid"

    async def main() -> None:
        task = asyncio.create_task(local.run_async(
            f"echo $$ > {pid_file}; sleep 60", b"", 60, **CAPS))
        for _ in range(3000):  # the command has started (at most 30 s)
            if pid_file.exists() and pid_file.read_text().strip():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    t0 = time.monotonic()
    asyncio.run(main())  # returns once the default executor's thread has ended
    assert time.monotonic() - t0 < 30
    assert group_gone(int(pid_file.read_text()))


def test_run_async_gives_what_run_gives() -> None:
    result = asyncio.run(local.run_async("cat; exit 4", b"abc", 30, **CAPS))
    assert result == local.run("cat; exit 4", b"abc", 30, **CAPS)
    assert result.exit_status == 4 and result.stdout == b"abc"


def test_a_command_that_outlives_its_kill_does_not_hold_the_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process in uninterruptible sleep (a driver call on a GPU that fell off the bus)
    survives SIGKILL; here the kill is withheld to stand in for that. run() gives up on it
    after KILL_WAIT_S instead of waiting for it forever (and the TUI's exit with it)."""
    pid_file = tmp_path / "pgid"
    monkeypatch.setattr(local, "kill_group", lambda proc: None)
    monkeypatch.setattr(local, "KILL_WAIT_S", 0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(local.LocalTimeout):
            local.run(f"echo $$ > {pid_file}; sleep 60", b"", 0.5, **CAPS)
        assert time.monotonic() - t0 < 30  # not the sleep's 60 s
    finally:
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def test_out_of_file_descriptors_is_a_probe_error_of_this_machine(tmp_path: Path) -> None:
    """A real fault: the poll cannot even create its pipes (EMFILE). The poll says so, as an
    error of the schema's `probe` kind, instead of raising out of `--once` (whose exit code 1
    would read as a finding)."""
    code = """
import os, resource, sys
from gpuwatch.remote.wire.collect import Collector, build_request
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.wire.bundle import build_stdin
host = HostConfig("here", "local")
build_stdin(build_request(host), trim=True)  # the payload, read while files can be opened
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 1, resource.getrlimit(
    resource.RLIMIT_NOFILE)[1]))
outcome = Collector().poll_local(host)
print("OUTCOME", outcome.error_kind, outcome.error_message)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, timeout=60)
    assert "OUTCOME probe the probe could not be started on this machine" in out.stdout, \
        out.stdout + out.stderr
    assert "Too many open files" in out.stdout


def test_a_hung_local_probe_is_a_timeout_of_the_poll_both_ways(tmp_path: Path) -> None:
    """Through the Collector, blocking (`--once`) and on the event loop (the TUI): a probe that
    hangs is the poll's `timeout`, within command_timeout, and leaves nothing running."""
    from gpuwatch.remote.config.schema import HostConfig, SshSettings
    from gpuwatch.remote.wire.collect import Collector

    pid_file = tmp_path / "pgid"
    hung = tmp_path / "hung-python3"
    hung.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    hung.chmod(0o755)
    host = HostConfig("here", "local", python=str(hung),
                      settings=SshSettings(command_timeout=1.0))
    for outcome in (Collector().poll_local(host), asyncio.run(Collector().poll(host))):
        assert outcome.error_kind == "timeout" and outcome.poll_s < 30
        assert outcome.error_message == ("the probe did not finish within command_timeout "
                                         "(1 s) on this machine")
        assert group_gone(int(pid_file.read_text()))
