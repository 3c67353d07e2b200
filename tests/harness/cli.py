"""gpuwatch's command line run as a person runs it, in a subprocess with HOME and the XDG folders
in the test's temporary folder, on this machine (`local`) or on a simulated box."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuwatch.remote.sim import Box


def gpuwatch(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
             config: str | None = None) -> subprocess.CompletedProcess[str]:
    """`gpuwatch ARGS` with only the system's PATH, `env` added, and `config` (TOML text) as
    its --config when given."""
    full_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                "XDG_STATE_HOME": str(tmp_path / "state"),
                "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    full_env.update(env or {})
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        args = ("--config", str(tmp_path / "c.toml"), *args)
    return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", *args], env=full_env,
                          capture_output=True, text=True, timeout=60)


def box_env(box: Box) -> dict[str, str]:
    """The environment that points a `local` host's probe at the simulated box."""
    env = box.env(base_path="/usr/bin:/bin")
    env["PATH"] = f"{env['PATH']}:{Path(sys.executable).parent}"  # the box's python3
    return env


def gpuwatch_on_box(tmp_path: Path, box: Box, *args: str, config: str
                    ) -> subprocess.CompletedProcess[str]:
    """`gpuwatch --config C ARGS` whose `local` host is the simulated box."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "st"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **box.env(base_path="/usr/bin:/bin")}
    env["PATH"] += f":{Path(sys.executable).parent}"
    (tmp_path / "c.toml").write_text(config)
    return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "--config",
                           str(tmp_path / "c.toml"), *args], env=env, capture_output=True,
                          text=True, timeout=60)
