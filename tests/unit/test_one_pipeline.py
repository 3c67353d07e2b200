"""One pipeline (remote/watch/fleet.py) for every way gpuwatch looks at a host: the TUI's polling
(FleetWatch's poller -> land -> tui/app.py), `--once`, `check` and the action verbs. The
proof: a config's `[thresholds]` changes the same finding the same way in each. A run quiet
for 10 minutes is `run.stalled` with `stalled_s = 60` and is not with the default (30 min)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import Config
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from gpuwatch.remote.store import Store
from gpuwatch.tui.app import build_app
from gpuwatch.tui.cli.actions import run_action
from gpuwatch.tui.cli.check import check_hosts
from gpuwatch.tui.cli.once import run_once

QUIET_S = 600.0


def _config_text(work: Path, stalled_s: float | None) -> str:
    thresholds = f"[thresholds]\nstalled_s = {stalled_s}\n\n" if stalled_s is not None else ""
    return (f'{thresholds}[hosts.local]\nssh = "local"\ndisks = ["/"]\n\n'
            f'[hosts.local.runs.llama]\nprocess = "train.py"\nworkdir = "{work}"\n'
            f'log = "train.log"\ncheckpoints = "ckpt/*.pt"\n')


@pytest.fixture
def quiet_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A box whose one run has written nothing (log, checkpoint) for QUIET_S; the local
    probe (a subprocess of this process) reads it through the environment."""
    box = Box(tmp_path / "box", h100_sxm(1), btime=int(time.time()) - 86_400,
              uptime_s=86_400.0)
    work = tmp_path / "run"
    box.add_process(training_process(600, workdir=str(work), nohup=True, start_s=3600.0))
    quiet = time.time() - QUIET_S
    for path in (work / "train.log", work / "ckpt" / "step-100.pt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"step 100\n")
        os.utime(path, (quiet, quiet))
    env = box.env(base_path=f"/usr/bin:/bin:{Path(sys.executable).parent}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return work


def _config(work: Path, stalled_s: float | None) -> Config:
    return parse_config(_config_text(work, stalled_s))


def once(work: Path, stalled_s: float | None, tmp: Path) -> set[str]:
    with Store.open(tmp / "once.db") as store:
        result = run_once(_config(work, stalled_s), store)
    (report,) = result.reports
    assert report.outcome.ok, report.outcome.error_message
    return {f.code for f in report.findings}


def tui(work: Path, stalled_s: float | None, tmp: Path) -> set[str]:
    """The app polling for real: FleetWatch's Poller -> land -> HostReported."""
    async def go() -> set[str]:
        with Store.open(tmp / "tui.db") as store:
            app = build_app(_config(work, stalled_s), store=store, poll=True)
            async with app.run_test(size=(120, 40)) as pilot:
                data = app.hosts["local"]
                for _ in range(300):
                    if data.outcome is not None:
                        break
                    await pilot.pause(0.1)
                assert data.outcome is not None and data.outcome.ok
                return {f.code for f in data.findings}
    return asyncio.run(go())


def verbs(work: Path, stalled_s: float | None, tmp: Path) -> set[str]:
    """An action verb (read-only: it polls, judges and plans, and sends nothing): what its
    poll found is in the store, as the pipeline's `remember` left it."""
    (tmp / "verb.toml").write_text(_config_text(work, stalled_s))
    run_action("relaunch", host_name="local", config_path=str(tmp / "verb.toml"),
               run="llama", readonly=True, store_path=str(tmp / "verb.db"))
    with Store.open(tmp / "verb.db") as store:
        return {f.code for f in store.findings("local", active=True)}


def check(work: Path, stalled_s: float | None, tmp: Path) -> set[str]:
    config = _config(work, stalled_s)
    with Store.open(tmp / "check.db") as store:
        (result,) = asyncio.run(check_hosts(config, store))
    assert result.ok and result.report is not None
    return {f.code for f in result.report.findings}


@pytest.mark.parametrize("path", [
    once, tui, verbs,
    check,
], ids=["once", "tui", "verbs", "check"])
def test_thresholds_change_the_same_finding_the_same_way(
        quiet_box: Path, tmp_path: Path, path) -> None:  # type: ignore[no-untyped-def]
    strict, default = tmp_path / "strict", tmp_path / "default"
    strict.mkdir()
    default.mkdir()
    assert "run.stalled" in path(quiet_box, 60.0, strict)
    assert "run.stalled" not in path(quiet_box, None, default)
