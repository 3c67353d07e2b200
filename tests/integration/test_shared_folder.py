"""Nothing in a folder another user can write is trusted or followed: a run's workdir shared with
a second, real local user (created here when the tests run as root), a real sshd on loopback as
the box, real processes, `gpuwatch --once` as cron runs it.

The other user's files are made by root and given to that user (chown): the kernel's checks
then treat them exactly as files that user wrote."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import test_actions
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.history import HostHistory
from harness.captures import missing
from test_actions import PY, Rig, poll, wait_for

rig = test_actions.rig  # a real sshd on loopback over a box whose /proc is this machine's

OTHER = "gwt-other"
WORKER = """import os, sys, time
open("started", "w").write(str(os.getpid()))
while not os.path.exists("finish"):
    time.sleep(0.05)
sys.exit(int(open("finish").read() or 0))
"""


def other_user() -> tuple[int, int]:
    """(uid, gid) of a second local user; created (a system user, no home, no shell) when this
    runs as root. Without root there is no way to give files to another user: skipped, or under
    CI=true failed."""
    if os.geteuid() != 0:
        missing("the shared-folder tests give files to a second user: they need root")
    try:
        pw = pwd.getpwnam(OTHER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", OTHER], capture_output=True, text=True,
                              check=False)
        try:
            pw = pwd.getpwnam(OTHER)  # another test run may have made it meanwhile
        except KeyError:
            missing(f"no second local user: useradd said {made.stderr.strip()!r}")
            raise
    return pw.pw_uid, pw.pw_gid


@pytest.fixture
def other() -> tuple[int, int]:
    return other_user()


def shared_run(rig: Rig, other: tuple[int, int], name: str,
               plant_private: bool = True) -> tuple[RunConfig, Path]:
    """A run in a folder every user may write (a team folder), whose .gpuwatch folder the other
    user made first, writable by all (unless plant_private is False)."""
    work = rig.root / name
    work.mkdir()
    work.chmod(0o777)
    script = f"{name}_{uuid.uuid4().hex[:8]}.py"
    (work / script).write_text(WORKER)
    if plant_private:
        planted = work / ".gpuwatch"
        planted.mkdir()
        planted.chmod(0o777)
        os.chown(planted, *other)
    run = RunConfig(name, process=script, workdir=str(work), log="train.log",
                    relaunch=f"{shlex.quote(PY)} {script}", detach="setsid")
    return run, work


def once(rig: Rig, config: Path, state: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    done = subprocess.run([sys.executable, "-c", "from gpuwatch.tui.cli import main; main()",
                           "--once", "--json", "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_an_exit_record_another_user_wrote_is_ignored_and_said(rig: Rig,
                                                                other: tuple[int, int]) -> None:
    """The other user forges `exit-RUN.json` with code 0 in the shared folder; the run exits 3.
    It reads dead (a finding, `--once` exits 1), not finished, and the finding says which
    record was ignored and why."""
    run, work = shared_run(rig, other, "w")
    config = rig.root / "config.toml"
    config.write_text(f"""[hosts.box1]
ssh = "box1"
python = {json.dumps(PY)}
config_file = {json.dumps(str(rig.sshd.ssh_config))}
[hosts.box1.runs.w]
process = {json.dumps(run.process)}
workdir = {json.dumps(str(work))}
log = "train.log"
""")
    state = rig.root / "state"
    rig.spawn([PY, str(run.process)], cwd=work, log=work / "train.log")  # started by hand
    wait_for(lambda: (work / "started").exists(), what="the run")
    code, doc = once(rig, config, state)
    (seen,) = doc["hosts"][0]["runs"]
    assert seen["status"] == "running", doc
    forged = work / ".gpuwatch" / "exit-w.json"
    forged.write_text('{"v": 1, "run": "w", "code": 0}\n')
    os.chown(forged, *other)
    (work / "finish").write_text("3")
    wait_for(lambda: not any(p.poll() is None for p in rig.started), what="the run's exit")
    code, doc = once(rig, config, state)
    (seen,) = doc["hosts"][0]["runs"]
    assert seen["status"] == "dead" and code == 1, (code, seen)
    (dead,) = [f for f in doc["hosts"][0]["findings"] if f["code"] == "run.dead"]
    said = dead["evidence"]["exit_record_ignored"]
    assert f"{forged} is ignored" in said and f"it is uid {other[0]}'s" in said


async def test_a_link_planted_in_the_run_folder_is_never_followed(rig: Rig,
                                                                  other: tuple[int, int]) -> None:
    """The other user plants links where the launch wrapper writes the exit record, pointing at
    a private file of the run's user. The relaunch refuses to keep anything in a folder of
    another user's (saying whose and what to do), nothing starts, and the file is untouched."""
    run, work = shared_run(rig, other, "w")
    secret = rig.root / "secret"
    secret.write_text("the run user's own\n")
    secret.chmod(0o600)
    for name in ("exit-w.json.tmp", "exit-w.json"):
        link = work / ".gpuwatch" / name
        link.symlink_to(secret)
        os.lchown(link, *other)
    (work / "finish").write_text("3")  # the run, if started, ends at once with status 3
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, "w", history)
    assert plan.refusal is None, plan.refusal
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    if outcome.ok is None:  # started: give its wrapper the time to write the record
        wait_for(lambda: (work / "started").exists(), what="the run")
        wait_for(lambda: secret.read_text() != "the run user's own\n", timeout=10,
                 what="the wrapper's write through the link")
    assert secret.read_text() == "the run user's own\n"
    assert outcome.ok is False and not (work / "started").exists()
    assert f"belongs to user {OTHER}" in outcome.message and "remove it" in outcome.message
    assert (work / ".gpuwatch" / "exit-w.json.tmp").is_symlink()  # not ours to touch either


async def test_a_private_folder_others_could_write_is_made_private_first(rig: Rig) -> None:
    """The run user's own .gpuwatch folder, left writable by its group (umask 002): the launch
    takes that away (0700) before it keeps anything there, and the record is trusted."""
    work = rig.root / "w"
    work.mkdir()
    (work / ".gpuwatch").mkdir()
    (work / ".gpuwatch").chmod(0o775)
    script = f"w_{uuid.uuid4().hex[:8]}.py"
    (work / script).write_text(WORKER)
    (work / "finish").write_text("3")
    run = RunConfig("w", process=script, workdir=str(work), log="train.log",
                    relaunch=f"{shlex.quote(PY)} {script}", detach="setsid")
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    outcome = await actions.execute(actions.plan_relaunch(host, "w", history), host,
                                    store=rig.store, readonly=False)
    assert outcome.ok is not True, outcome.message
    assert (work / ".gpuwatch").stat().st_mode & 0o777 == 0o700
    wait_for(lambda: (work / ".gpuwatch" / "exit-w.json").exists(), what="the exit record")
    await poll(host, history)
    assert history.runs["w"].exit_code() == 3 and "exit" not in history.runs["w"].errors


async def test_a_log_another_user_put_in_the_run_folder_is_not_written_through(
        rig: Rig, other: tuple[int, int]) -> None:
    """The run's log in a shared folder is a link the other user planted to a private file of
    the run's user: the relaunch refuses (naming whose it is) rather than append the run's
    output to whatever it names."""
    run, work = shared_run(rig, other, "w", plant_private=False)
    secret = rig.root / "secret"
    secret.write_text("the run user's own\n")
    secret.chmod(0o600)
    (work / "train.log").symlink_to(secret)
    os.lchown(work / "train.log", *other)
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    outcome = await actions.execute(actions.plan_relaunch(host, "w", history), host,
                                    store=rig.store, readonly=False)
    if outcome.ok is None:
        wait_for(lambda: (work / "started").exists(), what="the run")
    assert outcome.ok is False and f"symbolic link of user {OTHER}" in outcome.message
    assert secret.read_text() == "the run user's own\n" and not (work / "started").exists()
