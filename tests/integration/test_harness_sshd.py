"""The sshd harness: a command runs over a real sshd with both clients, the box env is set."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import asyncssh
import pytest
from harness import sshd as sshd_mod
from harness.sshd import SshdBox, box_env, descendants


def _write_standin(bin_dir: Path, name: str, text: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\necho '{text}'\n")
    path.chmod(0o755)


def test_openssh_client_runs_a_command_with_stdin(sshd_box: SshdBox) -> None:
    done = sshd_box.ssh("cat; echo done", stdin=b"hello\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hello\ndone\n"


@pytest.mark.asyncio
async def test_asyncssh_runs_a_command_direct_and_through_the_alias(sshd_box: SshdBox) -> None:
    async with asyncssh.connect(**sshd_box.asyncssh_options()) as conn:
        result = await conn.run("cat; exit 3", input="ping", check=False)
    assert (result.stdout, result.exit_status) == ("ping", 3)
    # The generated ssh_config is read by asyncssh too (Host alias, Port, User, IdentityFile,
    # UserKnownHostsFile), as gpuwatch will read it.
    async with asyncssh.connect(
        sshd_box.alias, config=[str(sshd_box.ssh_config)], agent_path=None, connect_timeout=5
    ) as conn:
        result = await conn.run("echo via-alias", check=True)
    assert result.stdout == "via-alias\n"


@pytest.fixture
def sim_box(
    tmp_path_factory: pytest.TempPathFactory, sshd_factory: Callable[..., SshdBox]
) -> SshdBox:
    """A box whose env is a simulated box root's (PATH with root/bin first, GPUWATCH_*)."""
    root = tmp_path_factory.mktemp("boxroot")
    return sshd_factory(env=box_env(root), bin_dir=root / "bin")


_ENV_CMD = (
    'printf "%s\\n" "$PATH" "$GPUWATCH_PROCFS" "$GPUWATCH_SYSFS" "$GPUWATCH_SIM_DIR" "$HOME";'
    " command -v nvidia-smi; nvidia-smi"
)


def _check_env(box: SshdBox, out: str) -> None:
    path, procfs, sysfs, sim, home, where, said = out.splitlines()
    assert path.split(":")[0] == str(box.bin_dir)
    assert (procfs, sysfs, sim) == (box.env["GPUWATCH_PROCFS"], box.env["GPUWATCH_SYSFS"],
                                    box.env["GPUWATCH_SIM_DIR"])
    # HOME is the box's own empty folder: no ~/.bashrc of this machine's user (root's here
    # prepends pyenv to PATH) runs in the session's `bash -c`.
    assert home == str(box.home)
    assert where == str(box.bin_dir / "nvidia-smi")
    assert said == "stand-in"


@pytest.mark.asyncio
async def test_box_env_is_set_in_every_session(sim_box: SshdBox) -> None:
    _write_standin(sim_box.bin_dir, "nvidia-smi", "stand-in")
    done = sim_box.ssh(_ENV_CMD)
    assert done.returncode == 0, done.stderr
    _check_env(sim_box, done.stdout.decode())
    async with asyncssh.connect(**sim_box.asyncssh_options()) as conn:
        result = await conn.run(_ENV_CMD, check=True)
    _check_env(sim_box, str(result.stdout))


def test_setenv_overrides_path_even_with_a_bashrc_in_home(sshd_box: SshdBox) -> None:
    # Shows why HOME is moved: bash (run by sshd) reads $HOME/.bashrc. With the box's HOME the
    # only .bashrc that could run is the box's own, which the harness never writes.
    (sshd_box.home / ".bashrc").write_text('export PATH="/prepended:$PATH"\n')
    try:
        shell = sshd_box.ssh("echo $0").stdout.decode().strip()
        first = sshd_box.ssh('echo "$PATH"').stdout.decode().split(":")[0]
    finally:
        (sshd_box.home / ".bashrc").unlink()
    if "bash" in shell:
        assert first == "/prepended"  # the mechanism is real ...
    assert sshd_box.ssh('echo "$PATH"').stdout.decode().split(":")[0] == str(sshd_box.bin_dir)


def test_fleet_aliases_reach_the_same_sshd(sshd_box: SshdBox) -> None:
    aliases = sshd_box.fleet(3)
    assert aliases == ["gpu1", "gpu2", "gpu3"]
    for alias in [sshd_box.alias, *aliases]:
        done = sshd_box.ssh("echo $SSH_CONNECTION", alias=alias)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == str(sshd_box.port).encode()


def test_max_startups_is_openssh_default_and_configurable(
    sshd_factory: Callable[..., SshdBox],
) -> None:
    box = sshd_factory()
    tuned = sshd_factory(max_startups="3:50:6")
    for b, want in ((box, "10:30:100"), (tuned, "3:50:6")):
        dump = subprocess.run(
            [b.sshd, "-T", "-f", str(b.sshd_config)], capture_output=True, text=True, check=False
        )
        assert dump.returncode == 0, dump.stderr
        assert f"maxstartups {want}" in dump.stdout


def test_restart_keeps_the_port_and_stop_cleans_up(sshd_box: SshdBox) -> None:
    port = sshd_box.port
    sshd_box.restart()
    assert sshd_box.port == port
    session = subprocess.Popen(
        [sshd_mod.require_ssh(), "-F", str(sshd_box.ssh_config), sshd_box.alias, "sleep 60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        listener = sshd_box.pid
        deadline = time.monotonic() + 10
        while session.poll() is None and time.monotonic() < deadline:
            if any("sleep" in _cmdline(p) for p in descendants(listener)):
                break
            time.sleep(0.01)
        assert session.poll() is None, session.stderr.read() if session.stderr else ""
        below = descendants(listener)
        assert below, "no session process appeared"
        sshd_box.stop()
        assert not sshd_box.running
        alive = [p for p in [listener, *below] if Path(f"/proc/{p}").exists()
                 and not sshd_mod._is_zombie(p)]
        assert alive == []
    finally:
        session.kill()
        session.communicate()  # reaps it and closes its stderr pipe


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize(("ci", "outcome"), [("true", "fail"), ("", "skip")])
def test_missing_sshd_fails_under_ci_else_skips(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    monkeypatch.setattr(sshd_mod, "_find", lambda name, candidates: None)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match="sshd is not installed"):
        sshd_mod.require_sshd()


def test_harness_runs_as_the_current_user(sshd_box: SshdBox) -> None:
    done = sshd_box.ssh("id -u")
    assert done.stdout.decode().strip() == str(os.getuid())
