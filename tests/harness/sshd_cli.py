"""gpuwatch's command line run as users run it, against simulated boxes behind real sshd servers:
`python -m gpuwatch.tui.cli ... --config C` in a subprocess, HOME and XDG_STATE_HOME in a
temporary folder, hosts named by ssh aliases of the harness's ssh_config, small bounds so that
every fault ends in a few seconds (connect 2 s, keepalive 1 s x (2 + 1), command 6 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from gpuwatch.remote.sim import Box

from .sshd import SshdBox

BOUNDS = {"connect_timeout": 2, "server_alive_interval": 1, "server_alive_count_max": 2,
          "command_timeout": 6}
BOX_PATH = "/usr/bin:/bin"
"""The rest of a simulated box's PATH: its python3 is this machine's /usr/bin/python3."""


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    max_rss_mb: float
    """Peak resident memory of the gpuwatch process, as it read its own VmHWM at exit (a
    child's ru_maxrss starts from its parent's at the fork: pytest's, hundreds of tests in)."""

    def json(self) -> dict[str, Any]:
        assert self.stdout, self.stderr
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc

    def hosts(self) -> dict[str, dict[str, Any]]:
        return {h["name"]: h for h in self.json()["hosts"]}


PEAK = ("import os, sys\nfrom gpuwatch.tui.cli import main\ntry:\n    main(sys.argv[1:])\n"
        "finally:\n    with open(os.environ['GPUWATCH_TEST_PEAK'], 'w') as f:\n"
        "        f.write(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))"
        ".split()[1])\n")
"""`gpuwatch ARGS` as the console script runs it (cli.main), writing its peak RSS (KiB) last."""


def gpuwatch(home: Path, *args: str, config: dict[str, Any] | None = None,
             timeout: float = 90) -> Run:
    """Run `gpuwatch ARGS` (cli.main) with HOME and XDG_STATE_HOME under ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    peak = home / "peak-kib"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "GPUWATCH_TEST_PEAK": str(peak),
           "XDG_STATE_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "xdg")}
    if config is not None:
        path = home / "config.toml"
        path.write_text(tomli_w.dumps(config))
        args = ("--config", str(path), *args)
    out_path, err_path = home / "stdout", home / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", PEAK, *args],
                                stdout=out, stderr=err, env=env)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        proc.wait()
    finally:
        timer.cancel()
    wall = time.monotonic() - t0
    kib = float(peak.read_text()) if peak.exists() else float("nan")  # killed: no figure
    return Run(proc.returncode, out_path.read_text(), err_path.read_text(), wall, kib / 1024)


def ssh_config(box: SshdBox, hosts: dict[str, dict[str, Any]], **ssh: Any) -> dict[str, Any]:
    """A gpuwatch config whose hosts reach ``box`` through its ssh_config and known_hosts."""
    return {"ssh": {**BOUNDS, "config_file": str(box.ssh_config),
                    "known_hosts": str(box.known_hosts), **ssh},
            "hosts": hosts}


def start_box(factory: Callable[..., SshdBox], box: Box, **kwargs: Any) -> SshdBox:
    """A real sshd whose sessions see the simulated box (its stand-ins first on PATH)."""
    return factory(env=box.env(base_path=BOX_PATH), **kwargs)
