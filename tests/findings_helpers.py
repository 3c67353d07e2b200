"""A simulated box polled by the real probe, folded into a HostHistory: what the findings
tests judge. Each `poll()` runs the probe (stdlib, as on a box) against the Box's fixture
/proc, /sys and stand-in tools, parses its document and records it, like `--once` does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.findings.rules import evaluate
from gpuwatch.remote.model.finding import Finding
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import HostSnapshot
from gpuwatch.remote.sim import Box
from gpuwatch.remote.wire.bundle import build_command, build_stdin
from gpuwatch.remote.wire.collect import build_request, run_cgroups
from gpuwatch.remote.wire.document import parse_probe_output


def host_config(toml_runs: str = "", disks: tuple[str, ...] = ("/",)) -> HostConfig:
    disk_list = ", ".join(f'"{d}"' for d in disks)
    text = f'[hosts.gpu1]\nssh = "local"\ndisks = [{disk_list}]\n{toml_runs}'
    host = parse_config(text).host("gpu1")
    assert host is not None
    return host


class Watched:
    """One host: a Box, its config, and the history the rules read."""

    def __init__(self, box: Box, host: HostConfig | None = None, *,
                 thresholds: Thresholds | None = None, env: dict[str, str] | None = None,
                 python: str = sys.executable) -> None:
        self.box, self.host = box, host or host_config()
        self.history = HostHistory("gpu1", thresholds=thresholds or Thresholds())
        self.env = {**box.env(base_path="/usr/bin:/bin"), **(env or {})}
        self.python = python
        self.findings: list[Finding] = []

    def snapshot(self) -> HostSnapshot:
        last = self.history.snapshots[-1] if self.history.snapshots else None
        hints = {"run_cgroups": run_cgroups(last)} if last is not None else None
        request: dict[str, Any] = build_request(self.host, hints, self.history.runs)
        request["want"] = {"nvml": False}  # a machine with a driver must still read the stand-in
        result = subprocess.run(["sh", "-c", build_command(self.python)],
                                input=build_stdin(request), env=self.env, capture_output=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr.decode()
        return parse_probe_output(result.stdout, "gpu1")

    def poll(self, at: float | None = None, **changes: Any) -> list[Finding]:
        """One poll; `at` overrides the box's clock (taken_at) for time-window rules."""
        snap = self.snapshot()
        if at is not None:
            changes["taken_at"] = at
        if changes:
            snap = replace(snap, **changes)
        self.history.record(snap, time.time())
        self.findings = evaluate(self.history)
        return self.findings

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def one(self, code: str) -> Finding:
        found = [f for f in self.findings if f.code == code]
        assert len(found) == 1, (code, self.findings)
        return found[0]


def touch(path: Path, mtime: float, data: bytes | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is not None or not path.exists():
        path.write_bytes(data or b"x")
    os.utime(path, (mtime, mtime))
    return path
