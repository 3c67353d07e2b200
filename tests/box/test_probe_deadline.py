"""The probe bounds itself (case 8): at the request's deadline_s it kills what it
started and prints what it read, whatever it was doing; on SIGTERM it kills what it started.

Each probe runs as the client runs it (build_command, build_stdin) in a session of its own, so
that a probe that does not stop (today's main) is killed by the test, never leaked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.config.schema import HostConfig, SshSettings
from gpuwatch.remote.wire.bundle import build_command, build_stdin
from gpuwatch.remote.wire.collect import build_request
from harness.waiting import wait_for

WAIT_S = 20.0
"""What a test waits for a probe at most: far past every deadline it sets."""


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A PATH folder whose nvidia-smi and dmesg answer at once (nothing found, no lines)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool(folder, "nvidia-smi", "exit 0\n")
    tool(folder, "dmesg", "exit 0\n")
    return folder


def tool(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def hung_tool(folder: Path, name: str) -> Path:
    """A tool that records its pid and hangs, not noticing when its caller goes."""
    return tool(folder, name, f'echo $$ > "{folder}/{name}.pid"\nexec sleep 300\n')


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_if_alive(pid_file: Path) -> None:
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start(procs: list[subprocess.Popen[bytes]], request: dict, folder: Path
          ) -> subprocess.Popen[bytes]:
    stdin = folder / f"stdin-{len(procs)}"
    stdin.write_bytes(build_stdin({"want": {"nvml": False}, **request}))
    with open(stdin, "rb") as fh:
        proc = subprocess.Popen(["sh", "-c", build_command(sys.executable)], stdin=fh,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={"PATH": f"{folder}:/usr/bin:/bin"})
    procs.append(proc)
    return proc


def document(proc: subprocess.Popen[bytes]) -> dict:
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err.decode()
    doc: dict = json.loads(out)
    return doc


def test_a_probe_blocked_opening_a_fifo_prints_what_it_read_at_its_deadline(
        tmp_path: Path, tools: Path, started: list[subprocess.Popen[bytes]]) -> None:
    """A run's log that is a FIFO nobody writes: opening it blocks for ever (U17). At the
    deadline the probe answers: the sections it read, the one it was reading cut short, and
    each one after it not read (absent, a section would read as not asked for)."""
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    request = {"v": 1, "disks": ["/"], "deadline_s": 1.0,
               "runs": [{"name": "r", "process": "no-such-process-here", "log": str(fifo)}],
               "want": {"nvml": False, "discover": False}}
    doc = document(start(started, request, tools))
    assert doc["runs"] == {"error": "the probe's deadline (1.0 s, a little under "
                                    "command_timeout) passed while reading this; something "
                                    "on the box hangs", "timeout": True}
    later = {"error": "not read: the probe's deadline passed while it read runs",
             "not_read": True}
    assert [doc[name] for name in ("cgroup", "logind", "kernel")] == [later] * 3
    assert set(doc["errors"]) == {"runs", "cgroup", "logind", "kernel"}
    assert doc["host"]["boot_id"] and "procs" in doc["processes"]  # read before the run
    assert "discovered" not in doc  # not asked for


def test_a_hung_command_is_killed_at_the_deadline(
        tools: Path, started: list[subprocess.Popen[bytes]]) -> None:
    """nvidia-smi's own timeout is longer than the probe's deadline: the deadline wins, and
    the hung nvidia-smi does not outlive the probe."""
    hung_tool(tools, "nvidia-smi")
    request = {"v": 1, "disks": [], "deadline_s": 1.0, "nvidia_smi_timeout_s": 60}
    try:
        doc = document(start(started, request, tools))
        assert doc["gpus"]["error"].startswith("nvidia-smi timed out after 0.")
        assert "kernel" in doc["errors"]  # "not run: no time left", or cut by the alarm
        assert not alive(int((tools / "nvidia-smi.pid").read_text()))
    finally:
        kill_if_alive(tools / "nvidia-smi.pid")


def test_sigterm_ends_the_probe_with_what_it_started(
        tools: Path, started: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (what the client asks sshd to send when it gives up) ends the probe and the
    command it is waiting for, which leads a process group of its own."""
    hung_tool(tools, "nvidia-smi")
    pid_file = tools / "nvidia-smi.pid"
    proc = start(started, {"v": 1, "disks": [], "nvidia_smi_timeout_s": 60}, tools)
    try:
        wait_for(pid_file.exists, WAIT_S, "nvidia-smi to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
        wait_for(lambda: not alive(int(pid_file.read_text())), WAIT_S, "nvidia-smi killed")
    finally:
        kill_if_alive(pid_file)


def test_cut_short_names_the_section_under_way_and_those_after_it() -> None:
    request = {"runs": [{"name": "r"}], "want": {"discover": False, "logind": False}}
    doc: dict = {"v": 1, "errors": {}, "host": {"hostname": "b"}, "gpus": {"error": "x"}}
    probe.cut_short(doc, request, "the probe's deadline (9.0 s) passed")
    cut = "the probe's deadline (9.0 s) passed while reading this; something on the box hangs"
    later = "not read: the probe's deadline passed while it read processes"
    assert doc["errors"] == {"processes": cut, "disks": later, "runs": later,
                             "cgroup": later, "kernel": later}
    assert doc["host"] == {"hostname": "b"} and doc["gpus"] == {"error": "x"}
    assert "discovered" not in doc and "logind" not in doc


@pytest.mark.parametrize("timeout", [1.0, 2.0, 6.0, 30.0, 600.0])
def test_the_request_deadline_is_a_little_under_command_timeout(timeout: float) -> None:
    """At least a second (a tenth of longer ones) is left for opening the session, the upload
    and the document's way back; never less than half of command_timeout for the probe."""
    host = HostConfig("b", "b", settings=SshSettings(command_timeout=timeout))
    deadline = build_request(host)["deadline_s"]
    assert timeout / 2 <= deadline <= timeout - min(1.0, timeout / 2)
    assert deadline <= timeout * 0.9
