"""What gpuwatch keeps on the box about its launches (the run's private .gpuwatch folder: the
exit record, the launch marker, the lock), read and written only when nothing another user could
have put there is followed or believed. The box scripts run as on a box: the probe and the
action script from their stdin, under Python 3.6 where it is installed (the oldest the box
code supports), on this machine's real processes."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import uuid
from pathlib import Path

import pytest
from gpuwatch.remote.actions.execute import execute
from gpuwatch.remote.actions.types import ActionPlan, LaunchSpec
from gpuwatch.remote.box import act_launch, act_proc, checkpoints
from gpuwatch.remote.box.base import ProbeFailure
from gpuwatch.remote.config.schema import HostConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_probe import python36

OTHER_UID = 4242
"""Any uid that is not this login's: files are handed to it with chown (the tests that need it
run as root; a name for it need not exist)."""
RECORD = '{"v": 1, "run": "w", "code": 3}\n'


def private(tmp_path: Path, mode: int = 0o700) -> Path:
    folder = tmp_path / ".gpuwatch"
    folder.mkdir()
    folder.chmod(mode)
    return folder


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")


def test_a_record_of_this_login_in_its_own_folder_is_read(tmp_path: Path) -> None:
    (private(tmp_path) / "exit-w.json").write_text(RECORD)
    got = checkpoints.collect_exit(str(tmp_path / ".gpuwatch" / "exit-w.json"))
    assert got["exists"] and got["code"] == 3


@pytest.mark.parametrize("plant", ["link", "other_owner", "hard_link", "group_writable_folder",
                                   "folder_link", "other_folder"])
def test_a_record_another_user_could_have_made_is_ignored_saying_why(tmp_path: Path,
                                                                     plant: str) -> None:
    folder = private(tmp_path)
    record = folder / "exit-w.json"
    real = tmp_path / "real.json"
    real.write_text(RECORD)
    said = {"link": "it is a symbolic link", "other_owner": "it is uid 4242's",
            "hard_link": "with 2 links", "group_writable_folder": "with mode 40770",
            "folder_link": "with mode 120777", "other_folder": "its folder uid 4242's"}[plant]
    if plant == "link":
        record.symlink_to(real)
    elif plant == "other_owner":
        needs_root()
        record.write_text(RECORD)
        os.chown(record, OTHER_UID, OTHER_UID)
    elif plant == "hard_link":
        os.link(real, record)
    elif plant == "group_writable_folder":
        record.write_text(RECORD)
        folder.chmod(0o770)
    elif plant == "folder_link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "exit-w.json").write_text(RECORD)
        folder.rmdir()
        folder.symlink_to(elsewhere)
    elif plant == "other_folder":
        needs_root()
        record.write_text(RECORD)
        os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(ProbeFailure) as err:
        checkpoints.collect_exit(str(record))
    assert said in str(err.value) and "ignored" in str(err.value)


def test_private_files_are_written_whole_and_never_through_a_link(tmp_path: Path) -> None:
    folder = private(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (folder / "launch-w.json").symlink_to(victim)
    fd = act_launch.private_dir(os.fsencode(tmp_path), create=False)
    try:
        with pytest.raises(act_launch.Untrusted, match="symbolic link"):
            act_launch.read_private(fd, "launch-w.json")
        act_launch.write_private(fd, "launch-w.json", b'{"v": 1}')
        assert act_launch.read_private(fd, "launch-w.json") == b'{"v": 1}'
    finally:
        os.close(fd)
    assert victim.read_text() == "mine" and not (folder / "launch-w.json").is_symlink()
    assert (folder / "launch-w.json").stat().st_mode & 0o777 == 0o600


def test_a_folder_of_another_user_or_a_link_is_refused_never_entered(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".gpuwatch").symlink_to(elsewhere)
    with pytest.raises(act_launch.Untrusted, match="symbolic link"):
        act_launch.private_dir(os.fsencode(tmp_path), create=True)
    assert list(elsewhere.iterdir()) == []


def python_for_the_box() -> str:
    """Python 3.6 (the oldest box) where installed, else this one (vermin checks the box code's
    syntax for 3.6 either way)."""
    try:
        return python36()
    except pytest.skip.Exception:
        return sys.executable


def test_the_launch_ops_run_on_the_oldest_python(tmp_path: Path) -> None:
    """relaunch and launched, through the action script on the box's python (3.6 here): a
    launch still in its setup step is found alive and refuses a second; once it ends, nothing
    lives and its exit status is read back from the record its wrapper wrote."""
    from gpuwatch.remote.actions.execute import launch_state

    python = python_for_the_box()
    work = tmp_path / "w"
    work.mkdir()
    script = f"w_{uuid.uuid4().hex[:8]}.py"
    (work / script).write_text("import sys; sys.exit(3)\n")
    gate = shlex.quote(str(work / "gate"))
    command = (f"while [ ! -e {gate} ]; do sleep 0.05; done; exec {shlex.quote(python)} "
               f"{script}")
    host = HostConfig(name="local", ssh="local", python=python)
    spec = LaunchSpec(run="w", workdir=str(work), log=str(work / "train.log"), detach="setsid",
                      env=(), process=script, scripts=())
    plan = ActionPlan("relaunch", "local", (), command, "", None, (), spec)

    async def scenario() -> None:
        first = await execute(plan, host, store=None, readonly=False, token="first")
        assert first.ok is None, first.message
        assert first.launch is not None and first.launch["token"] == "first"
        state = await launch_state(host, "w", str(work), token="first", launch=None,
                                   process=script)
        assert state.mine and state.live and state.exit_code is None and not state.locked
        second = await execute(plan, host, store=None, readonly=False, token="second")
        assert second.ok is False and "still starting" in second.message
        (work / "gate").write_text("open")
        for _ in range(200):
            state = await launch_state(host, "w", str(work), token="first", launch=None,
                                       process=script)
            if not state.live:
                break
            await asyncio.sleep(0.05)
        assert state.mine and not state.live and state.exit_code == 3
        assert state.running is None and state.ignored is None

    asyncio.run(scenario())
    record = work / ".gpuwatch" / "exit-w.json"
    assert checkpoints.collect_exit(str(record))["code"] == 3
    assert (work / ".gpuwatch").stat().st_mode & 0o777 == 0o700


MARKER_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300) | st.builds(
    lambda d: json.dumps(d).encode(), st.dictionaries(st.sampled_from(
        ["v", "pid", "start_ticks", "boot_id", "session", "token", "at"]), MARKER_VALUES)))
def test_a_marker_of_any_bytes_is_read_or_ignored_never_a_crash(tmp_path: Path,
                                                                  raw: bytes) -> None:
    """The launch marker is box data: whatever its bytes, reading it gives a marker or says
    why it was ignored, and asking whether its launch lives gives pids or nothing."""
    folder = tmp_path / ".gpuwatch"
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / "launch-w.json").write_bytes(raw)
    fd = act_launch.private_dir(os.fsencode(tmp_path), create=False)
    try:
        marker, ignored = act_launch.read_marker(fd, "w")
    finally:
        os.close(fd)
    assert (marker is None) or isinstance(marker, dict)
    assert ignored is None or "ignored" in ignored
    if marker is not None:  # as if of this boot: its pid and start time are what decide
        marker = dict(marker, boot_id=act_proc.boot_id())
    live = act_launch.launch_alive(marker, act_proc.all_stats(), act_proc.own_family())
    assert all(isinstance(pid, int) for pid in live)
