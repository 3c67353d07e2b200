"""Replay (tui/screens/replay.py) on the simulated night of tests/unit/test_night.py: the screen
opens at the last thing that happened, steps by poll, jumps between events, goes to a typed
time, says it is the past, and returns to live on Esc; nothing is polled or written meanwhile
(the store's events are counted before and after)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.store import Store
from gpuwatch.tui.screens.replay import ReplayScreen, parse_moment
from gpuwatch.tui.state import HostData
from gpuwatch.tui.view import FleetView
from test_night import DOWN, END, STALL, at, run_night
from textual.app import App
from textual.widgets import DataTable, Static


class ReplayApp(App[None]):
    """Just enough of an app to hold the screen (the real one pushes it on `T`)."""

    def __init__(self, store: Store, view: FleetView) -> None:
        super().__init__()
        self.store, self.view = store, view

    def on_mount(self) -> None:
        self.push_screen(ReplayScreen(self.view, self.store))


@pytest.fixture(scope="module")
def night() -> Any:
    store, host = run_night()
    view = FleetView(MappingProxyType({"gpu1": HostData(host, HostHistory("gpu1"))}), 60.0,
                     False, None, lambda: at(END), lambda: False)
    yield store, view
    store.close()


def row(app: ReplayApp) -> list[str]:
    table = app.screen.query_one(DataTable)
    return [str(c) for c in table.get_row_at(0)]


async def test_replay_steps_jumps_and_goes_back_to_live(night: Any) -> None:
    store, view = night
    events_before = len(store.events())
    app = ReplayApp(store, view)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        # it opens at the last thing that happened: the host answering again
        assert screen.at == at(DOWN[1])
        banner = str(screen.query_one("#replay-banner", Static).render())
        assert banner.startswith("REPLAY — the past:") and "30 min ago" in banner
        assert row(app)[1] == "● ok" and row(app)[3] == "llama:running"
        await pilot.press("left_square_bracket")  # the event before: it stopped answering
        assert screen.at == at(DOWN[0]) and row(app)[1] == "✖ unreachable"
        await pilot.press("g", *"-7h", "enter")  # 23:00, before the hang
        assert screen.at == at(END) - 7 * 3600 == at(STALL[0])
        assert row(app)[1] == "● ok" and row(app)[2].startswith("0:97%/600W 1:97%/650W")
        for _ in range(10):  # ten polls on: hung
            await pilot.press("right")
        assert screen.at == at(STALL[0] + 10) and row(app)[1] == "✖ run.hung"
        detail = str(screen.query_one("#replay-detail", Static).render())
        assert "run llama: running pids 100, 101 on GPUs 0, 1" in detail
        await pilot.press("g", *"25:99", "enter")  # no time: said, and nothing moves
        assert screen.at == at(STALL[0] + 10)
        await pilot.press("R", "p")  # the live views' keys do nothing to the past
        assert screen.at == at(STALL[0] + 10) and app.screen is screen
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReplayScreen)
    assert len(store.events()) == events_before


def test_a_typed_moment() -> None:
    now = at(END)
    assert parse_moment("-2h", now) == now - 7200
    assert parse_moment("-30m", now) == now - 1800
    moment = parse_moment("00:00", now)
    assert moment is not None and 0 <= now - moment < 86_400
    assert parse_moment("24:00", now) is None and parse_moment("soon", now) is None
