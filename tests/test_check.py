"""`gpuwatch check` over a real sshd: what works is described, each failure is one sentence with
the fix, a slow shell startup file is called out, and the exit codes follow the contract."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.tui.cli.command import EXIT_CONFIG, EXIT_OK, EXIT_UNPOLLED
from harness.sshd import SshdBox, free_port

BOUNDS = {"connect_timeout": 2, "server_alive_interval": 1, "server_alive_count_max": 2,
          "command_timeout": 6}


def check(home: Path, config: dict[str, Any] | str,
          *hosts: str) -> subprocess.CompletedProcess[str]:
    """`python -m gpuwatch.tui.cli check --config C [HOST ...]` with HOME in ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(config if isinstance(config, str) else tomli_w.dumps(config))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_STATE_HOME": str(home / "state")}
    return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "check", "--config",
                           str(path), *hosts], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def box(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> tuple[Box, SshdBox]:
    sim = Box(tmp_path / "box", h100_sxm(2))
    return sim, sshd_factory(env=sim.env(base_path="/usr/bin:/bin"))


def config_for(sshd: SshdBox, hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"ssh": {**BOUNDS, "config_file": str(sshd.ssh_config),
                    "known_hosts": str(sshd.known_hosts)}, "hosts": hosts}


def host_lines(out: str, name: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"{name}: ")]


def test_a_healthy_box_says_what_works(tmp_path: Path, box: tuple[Box, SshdBox]) -> None:
    _sim, sshd = box
    out = check(tmp_path / "me", config_for(sshd, {"gpu1": {"ssh": "box1"}}))
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert out.stdout.startswith("config OK: ")
    (line,) = host_lines(out.stdout, "gpu1")
    assert line.startswith("gpu1: ok via ssh box1: polled in ")
    assert re.search(r"the probe ran \d+ ms on the box", line)
    assert "2 GPUs (NVIDIA H100 80GB HBM3) seen" in line
    assert re.search(r"Python 3\.\d+\.\d+ \(`python3`\)", line)
    assert out.stdout.rstrip().endswith("1 host checked: 1 ok, 0 failed")


def test_a_refused_port_is_one_sentence_with_the_fix_and_exits_2(
        tmp_path: Path, box: tuple[Box, SshdBox]) -> None:
    _sim, sshd = box
    sshd.add_host("closed", Port=str(free_port()))
    out = check(tmp_path / "me", config_for(sshd, {"gpu1": {"ssh": "box1"},
                                                   "gpu2": {"ssh": "closed"}}))
    assert out.returncode == EXIT_UNPOLLED, out.stdout + out.stderr
    assert host_lines(out.stdout, "gpu1")[0].startswith("gpu1: ok via ssh box1")
    (line,) = host_lines(out.stdout, "gpu2")
    assert "refused the connection" in line and "check the host and port" in line
    assert line.count(". ") == 0 and line.endswith(".")  # one sentence
    assert "2 hosts checked: 1 ok, 1 failed" in out.stdout
    # Naming hosts checks only those.
    only = check(tmp_path / "me", config_for(sshd, {"gpu1": {"ssh": "box1"},
                                                    "gpu2": {"ssh": "closed"}}), "gpu1")
    assert only.returncode == EXIT_OK and not host_lines(only.stdout, "gpu2")


def test_a_slow_shell_startup_file_is_called_out(tmp_path: Path,
                                                 box: tuple[Box, SshdBox]) -> None:
    _sim, sshd = box
    # bash reads ~/.bashrc for sshd commands (Debian's SSH_SOURCE_BASHRC); the harness's HOME
    # is the box's home folder: a startup file that costs 200 ms, like a `pyenv init`.
    (sshd.home / ".bashrc").write_text("sleep 0.2\n")
    out = check(tmp_path / "me", config_for(sshd, {"gpu1": {"ssh": "box1"}}))
    assert out.returncode == EXIT_OK, out.stdout + out.stderr  # a warning, not a failure
    ok, warning = host_lines(out.stdout, "gpu1")
    assert ok.startswith("gpu1: ok via ssh box1")
    match = re.search(r"every SSH command pays (\d+) ms before it starts", warning)
    assert match and 200 <= int(match.group(1)) < 2000, warning
    assert "~/.bashrc" in warning and re.search(r"the probe itself takes \d+ ms", warning)
    assert "1 host checked: 1 ok (1 with warnings), 0 failed" in out.stdout


def test_a_config_error_exits_78_before_any_poll(tmp_path: Path) -> None:
    out = check(tmp_path / "me", "[hosts.a]\nssh = 'box1'\ncommand_timeout = 'soon'\n")
    assert out.returncode == EXIT_CONFIG
    assert "hosts.a.command_timeout" in out.stderr and "config OK" not in out.stdout
