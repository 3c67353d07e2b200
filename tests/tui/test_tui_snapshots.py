"""Snapshot tests (pytest-textual-snapshot): the fleet and host views at 80×24 and 200×50 in
the default (dark) and light themes, on the deterministic fleet of tests/tui_fixtures.py with a
frozen clock. Update after a deliberate change with `pytest tests/test_tui_snapshots.py
--snapshot-update` and look at the report before committing the SVGs."""

from __future__ import annotations

from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.tui.app import build_app
from gpuwatch.tui.messages import SnapshotReady
from textual.pilot import Pilot

SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
THEMES = ("gpuwatch-dark", "gpuwatch-light")


def snapshot_app(theme: str) -> Any:
    cfg = fx.config()
    return build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False, theme=theme)


def before(host: str | None) -> Any:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        for o in fx.latest(app.config):  # type: ignore[attr-defined]
            app.post_message(SnapshotReady(o.host.name, o))
        await pilot.pause()
        if host is not None:
            for _ in range(list(app.hosts).index(host)):  # type: ignore[attr-defined]
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
def test_host_view(snap_compare: Any, size: str, theme: str) -> None:
    # gpu-capped: U21 (util 100 % at 37 % clock), a throttle reason, box text that looks like
    # markup in a command line and a log line.
    assert snap_compare(snapshot_app(theme), terminal_size=SIZES[size],
                        run_before=before("gpu-capped"))
