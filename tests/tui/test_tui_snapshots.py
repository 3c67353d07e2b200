"""Snapshot tests (pytest-textual-snapshot): the fleet view and the host view of every host of
the deterministic fleet of tests/tui_fixtures.py (healthy, capped, zombie with /data filling,
could not be polled, never polled, a run OOM-killed, a driver upgraded under the running one:
each of the demo's troubles), at 80×24 and 160×48, in the default (dark) and light themes, with
a frozen clock and the clock times in UTC. 32 snapshots, about a minute and a half on a 2-core
machine. Update after a deliberate change with `pytest tests/tui/test_tui_snapshots.py
--snapshot-update` and look at the report before committing the SVGs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.tui.app import build_app
from textual.pilot import Pilot

SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
THEMES = ("gpuwatch-dark", "gpuwatch-light")
HOSTS = ("gpu-healthy", "gpu-capped", "gpu-zombie", "gpu-down", "gpu-new", "gpu-oom",
         "gpu-driver", "gpu-mig")


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Clock times on screen (a finding's evidence) the same on every machine."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def snapshot_app(theme: str) -> Any:
    cfg = fx.config(more=True)
    return build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False, theme=theme)


def before(host: str | None) -> Any:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        fx.prime(app)  # the store's last poll: the processes' CPU% shows
        for o in fx.latest(app.config):  # type: ignore[attr-defined]
            app.fleet.land(o)  # type: ignore[attr-defined]
        await pilot.pause()
        if host is not None:  # its row in the fleet's order (worst first)
            table = app.screen.query_one("#fleet-table")
            await pilot.press("g")
            for _ in range(table.shown.index(host)):  # type: ignore[attr-defined]
                await pilot.press("down")
            await pilot.press("enter")
            await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES)
def test_fleet_view(snap_compare: Any, size: str, theme: str) -> None:
    assert snap_compare(snapshot_app(theme), terminal_size=SIZES[size],
                        run_before=before(None))


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("host", HOSTS)
def test_host_view(snap_compare: Any, host: str, size: str, theme: str) -> None:
    # gpu-capped: U21 (util 100 % at 37 % clock), a throttle reason, box text that looks like
    # markup in a command line and a log line; gpu-zombie: VRAM a dead run left behind;
    # gpu-down: could not be polled; gpu-new: never polled; gpu-oom: a run its memory cgroup
    # OOM-killed; gpu-driver: the GPUs unreadable after a driver upgrade, its run going on;
    # gpu-mig: a MIG GPU's instances as rows, and a GPU whose health fields all say something.
    assert snap_compare(snapshot_app(theme), terminal_size=SIZES[size],
                        run_before=before(host))
