"""The TUI driven by Textual's Pilot: every key, the polling path, the overnight view, themes,
and box text that looks like markup. Data is tests/tui_fixtures.py's deterministic fleet."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.remote.actions import execute as execute_module
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.actions import verify as verify_module
from gpuwatch.remote.config.schema import Config, HostConfig
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.series import MAX_POINTS, MIN_POINTS, points_share
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.messages import Ticked
from gpuwatch.tui.screens.confirm import ConfirmAction
from gpuwatch.tui.screens.fleet import FleetScreen, summary
from gpuwatch.tui.screens.help import HelpScreen
from gpuwatch.tui.screens.host import PANES, HostScreen
from gpuwatch.tui.textual_compat import FooterKey
from gpuwatch.tui.widgets.fleet_table import FleetTable
from gpuwatch.tui.widgets.key_footer import KeyFooter
from gpuwatch.tui.widgets.log_tail import LogTail
from gpuwatch.tui.widgets.loss_pane import SMOOTHING, LossPane
from gpuwatch.tui.widgets.process_table import ProcessTable
from harness.toasts import record_toasts, toasts_of
from harness.waiting import wait_for_async
from textual.pilot import Pilot

SIZE = (200, 50)


class FakeCollector:
    """Answers polls with the fixture's outcomes at once, stamped with the real time (the app
    waits for a poll that began after an action ended), or with `stamp`'s."""

    def __init__(self, outcomes: list[PollOutcome],
                 stamp: Callable[[], float] = time.time) -> None:
        self.outcomes = {o.host.name: o for o in outcomes}
        self.calls: Counter[str] = Counter()
        self.stamp = stamp

    def memory(self, host: HostConfig) -> dict[str, Any]:  # what a Collector keeps in the store
        return {}

    def restore(self, host: HostConfig, memory: object) -> None:
        pass

    async def poll(self, host: HostConfig, runs: Any = None) -> PollOutcome:
        self.calls[host.name] += 1
        await asyncio.sleep(0)
        outcome = self.outcomes.get(host.name) or fx.failed(host, fx.NOW)
        return replace(outcome, started_at=self.stamp())


def make_app(cfg: Config | None = None, **kwargs: Any) -> GpuwatchApp:
    cfg = cfg or fx.config()
    kwargs.setdefault("poll", False)
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, **kwargs)
    record_toasts(app)
    return app


async def feed(pilot: Pilot[Any], outcomes: list[PollOutcome]) -> None:
    for o in outcomes:
        pilot.app.fleet.land(o)  # the pipeline, as a poll of its own lands
    await pilot.pause()


def bound(app: Any) -> set[str]:
    """The actions the screen shown binds to a key now (enabled or greyed; not hidden)."""
    return {b.binding.action for b in app.screen.active_bindings.values()}


async def open_host(pilot: Pilot[Any], name: str) -> HostScreen:
    """Open a host from the fleet as a person does: its row (the fleet's order, worst first),
    then Enter."""
    app = pilot.app
    assert isinstance(app, GpuwatchApp)
    fleet = app.screen
    assert isinstance(fleet, FleetScreen)
    await pilot.press("g")
    for _ in range(fleet.table.shown.index(name)):
        await pilot.press("down")
    await pilot.press("enter")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, HostScreen) and screen.host == name
    return screen


def screen_text(app: GpuwatchApp) -> str:
    return "\n".join(fx.svg_lines(app.export_screenshot()))


def notes(app: GpuwatchApp) -> list[str]:
    """Every toast the app said, in order, as it was asked to say it."""
    return toasts_of(app).messages


async def toast_saying(app: GpuwatchApp, text: str) -> str:
    """The first toast that says `text`, once there is one."""
    return await toasts_of(app).saying(text)


# ----------------------------------------------------------------------------- fleet view

async def test_fleet_shows_every_host_state_gpus_runs_and_findings() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        table = app.screen.query_one(FleetTable)
        assert table.row_count == len(fx.HOSTS)
        cell = lambda host, col: table.get_cell(host, col).plain  # noqa: E731
        assert cell("gpu-healthy", "state") == "● ok"
        # the kind in words first, then the reason (no "unreachable (unreachable)")
        assert cell("gpu-down", "state").startswith("✗ unreachable: connect to")
        assert cell("gpu-new", "state") == "… not polled yet"
        assert cell("gpu-healthy", "util").startswith("████")  # one cell per GPU
        assert cell("gpu-capped", "clock").endswith(" 37%")  # util 100 % at 37 % clock: U21
        assert cell("gpu-healthy", "vram") == "240/319 GiB"
        assert cell("gpu-healthy", "runs") == "llama-7b▶"
        assert cell("gpu-zombie", "runs") == "bert-ddp†"  # seen running overnight, gone now
        assert "✖" in cell("gpu-down", "findings")


async def test_fleet_scales_to_64_hosts_and_scrolls() -> None:
    app = make_app(fx.config(n_extra=64))
    async with app.run_test(size=(120, 30)) as pilot:
        await feed(pilot, fx.latest(app.config))
        table = app.screen.query_one(FleetTable)
        # grouped (more than 24 hosts): the gpu-* hosts, then the 64 fine nodes, folded
        assert table.row_count == 2 + 5 and len(table.shown) == 5
        await pilot.press("G", "space")  # the node group's row: unfolded
        await pilot.pause()
        assert table.row_count == 2 + 69 and len(table.shown) == 69
        await pilot.press("ctrl+end")
        await pilot.pause()
        assert table.selected_host == table.shown[-1] and table.scroll_y > 0


async def test_slash_filters_and_escape_clears() -> None:
    app = make_app(fx.config(n_extra=10))
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        table = app.screen.query_one(FleetTable)
        await pilot.press("slash")
        assert app.focused is not None and app.focused.id == "filter"
        await pilot.press(*"node-00")
        await pilot.pause()
        assert table.row_count == 10
        await pilot.press("enter")  # back to the table, filter kept
        assert app.focused is table and table.row_count == 10
        await pilot.press("slash", *"unreach")
        await pilot.pause()
        assert table.row_count == 0 or table.selected_host is not None
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert table.row_count == 15 and app.focused is table


async def test_keys_that_arrive_with_the_slash_go_into_the_filter_not_to_commands() -> None:
    """A paste or a laggy link delivers `/equip` in one read: the keys after `/` used to reach
    the table before the filter had the focus, so `q` quit the app and `z` offered a reap."""
    from textual import events

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        for char in "/equip":  # queued together, none handled before the next arrives
            app.post_message(events.Key("slash" if char == "/" else char, char))
        await pilot.pause()
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, FleetScreen)
        assert app.focused is not None and app.focused.id == "filter"
        assert app.focused.value == "equip"  # type: ignore[attr-defined]
        await pilot.press("slash", "x")  # a `/` typed into the filter is text
        assert app.focused.value == "equip/x"  # type: ignore[attr-defined]


async def test_the_tick_survives_a_fleet_screen_being_torn_down() -> None:
    """The app's 1 s tick can fire while the fleet screen's children are already gone (at exit:
    a CI run failed on NoMatches there). It must pass over such a screen, not raise."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await screen.query_one(FleetTable).remove()
        screen.on_ticked(Ticked())  # raised NoMatches before the guard
        screen.tick()
        await pilot.pause()
        assert screen.is_mounted and not screen.query(FleetTable)


async def test_enter_opens_a_host_with_every_pane_and_escape_goes_back() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = await open_host(pilot, "gpu-capped")
        titles = {str(screen.query_one(f"#{pane}").border_title) for pane, _ in PANES}
        assert titles == {"GPUs", "Loss", "Checkpoints", "Disks", "Findings", "Processes",
                          "Log"}
        text = screen_text(app)
        for word in ("power cap: at its power limit", "249/250 W", "train/loss",
                     "checkpoint-800", "/data", "mistral ▶ running"):
            assert word in text, word
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_screens_are_built_ahead_around_the_cursor_and_never_evict_an_opened_one(
        ) -> None:
    """Where the cursor rests, its host's screen is built ahead, then the rows around it,
    nearest first, while there is room among the kept screens; a guess never lets go of a screen
    the user opened, and nothing is built behind a host's view."""
    from gpuwatch.tui.screens.kept import BETWEEN_BUILDS_S, PREPARE_AFTER_S

    def built(app: GpuwatchApp) -> list[str]:
        return [h for h in app.hosts if app.is_screen_installed(f"host:{h}")]

    rest = PREPARE_AFTER_S + 10 * BETWEEN_BUILDS_S + 1.5
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        # five hosts: every first opening finds its own
        await wait_for_async(lambda: sorted(built(app)) == sorted(app.hosts),
                             what="every screen built")

    app = make_app()
    app.host_views.keep = 3
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        fleet = app.screen
        assert isinstance(fleet, FleetScreen)
        await wait_for_async(lambda: len(fleet.table.shown) == len(app.hosts), what="every row")
        names = list(fleet.table.shown)  # the rows' order (worst first)

        def in_rows(hosts: list[str]) -> list[str]:
            return sorted(hosts, key=names.index)

        # the cursor's row, the one below, the next below
        await wait_for_async(lambda: in_rows(built(app)) == names[:3], what="three screens built")
        await pilot.pause(rest)  # and no more, when a build could have let one go
        assert in_rows(built(app)) == names[:3]
        await open_host(pilot, names[-1])  # a far host, opened: the least recently built goes
        await pilot.pause(rest)
        assert in_rows(built(app)) == [*names[1:3], names[-1]]  # nothing more, behind its view
        await pilot.press("escape")
        await pilot.pause(rest)  # the rows around it: no room, nothing let go for them
        assert in_rows(built(app)) == [*names[1:3], names[-1]]


async def test_z_on_a_host_whose_gpus_cannot_be_read_says_it_cannot_tell() -> None:
    """A driver mismatch hides which processes hold VRAM: `z` used to answer "no process holds
    VRAM without a live run", a claim nobody could make."""
    app = make_app(fx.config(more=True))
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        table = app.screen.query_one(FleetTable)
        await pilot.press("g")
        for _ in range(table.shown.index("gpu-driver")):
            await pilot.press("down")
        said = await toast_after(pilot, "z")
        assert "cannot tell what holds VRAM on gpu-driver" in said and "driver mismatch" in said
        assert "nothing to reap" not in said


async def test_host_view_keys_on_the_fleet_say_where_they_act() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        for key, words in (("right_square_bracket", "[ ] change tag"), ("s", "s S smooth"),
                           ("l", "l turn log-y"), ("x", "x switch the x axis"),
                           ("3", "1-7 jump to a pane")):
            said = await toast_after(pilot, key)
            assert said.startswith(words), (key, said)
            assert "open a host (Enter) first" in said
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("slash", "s", "x")  # typed into the filter: text, no toast
        await pilot.pause()
        assert app.focused is not None and app.focused.value == "sx"  # type: ignore[attr-defined]


async def test_mouse_click_opens_a_host() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        table = app.screen.query_one(FleetTable)
        second = table.shown[1]  # row 0 is the header, then the two worst hosts
        await pilot.click(FleetTable, offset=(3, 2))
        await pilot.pause()
        if not isinstance(app.screen, HostScreen):  # first click highlights, second selects
            await pilot.click(FleetTable, offset=(3, 2))
            await pilot.pause()
        assert isinstance(app.screen, HostScreen) and app.screen.host == second, \
            table.cursor_row


# ----------------------------------------------------------------------------- host view keys

async def test_loss_keys_change_tag_smoothing_log_and_axis() -> None:
    app = make_app()
    app.points_budget = 10 * MIN_POINTS
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        runs = [r for d in app.hosts.values() for r in d.history.runs.values()]
        tags = sum(len(r.tags()) for r in runs)
        share = points_share(tags, app.points_budget)
        assert share < MAX_POINTS and all(r.max_points == share for r in runs)  # one budget
        screen = await open_host(pilot, "gpu-healthy")
        pane = screen.query_one(LossPane)
        assert pane.current_tag() == "train/loss"
        await pilot.press("right_square_bracket")
        assert pane.current_tag() == "train/learning_rate"
        await pilot.press("left_square_bracket")
        assert pane.current_tag() == "train/loss"
        start = pane.settings.smoothing
        await pilot.press("S")
        assert pane.settings.smoothing == start + 1
        await pilot.press("s", "s")
        assert pane.settings.smoothing == start - 1
        assert SMOOTHING[pane.settings.smoothing] < SMOOTHING[start]
        await pilot.press("l")
        assert pane.settings.logy
        await pilot.press("x")
        assert pane.settings.wall
        plot = pane.query_one("#loss-plot")
        assert plot.series.xlabel.startswith("time of day") and plot.series.logy  # type: ignore[attr-defined]
        assert [m for m in plot.series.marks if m.variable == "checkpoint"]  # type: ignore[attr-defined]
        assert "log-y  x: time" in screen_text(app)


async def test_log_y_and_wall_time_on_a_host_without_points_draw_an_empty_plot() -> None:
    """`l` on a run with no scalar yet crashed the app (plotext's log scale over no data)."""
    for host in ("gpu-down", "gpu-zombie"):
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await feed(pilot, fx.latest(app.config))
            screen = await open_host(pilot, host)
            pane = screen.query_one(LossPane)
            plot = pane.query_one("#loss-plot")
            await pilot.press("l")
            await pilot.pause()
            assert pane.settings.logy
            await pilot.press("x", "l", "l")
            await pilot.pause()
            plot.series = replace(plot.series, xs=[], raw=[], smooth=[], logy=True)  # type: ignore[attr-defined]
            plot.replot()  # type: ignore[attr-defined]
            plot.render()  # type: ignore[attr-defined]
        assert app.return_code in (0, None)


async def test_markup_in_cmdlines_and_log_lines_renders_literally() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = await open_host(pilot, "gpu-capped")
        procs = screen.query_one(ProcessTable)
        assert procs.get_cell("pid:777", "cmd").plain == f"python train.py --name {fx.HOSTILE}"
        log = screen.query_one(LogTail)
        assert any(fx.HOSTILE in line for line in log.lines)
        text = screen_text(app)
        assert f"--name {fx.HOSTILE}" in text
        assert f"{fx.HOSTILE} a log line that looks like markup" in text


# ----------------------------------------------------------------------------- actions

@pytest.fixture
def fake_execute(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """actions.execute and verify without SSH; records what was called."""
    calls: list[tuple[str, Any]] = []

    async def execute(plan: Any, host: Any, **kwargs: Any) -> actions.ActionOutcome:
        calls.append(("execute", plan))
        return actions.ActionOutcome(None, f"sent {plan.kind} to {plan.host}")

    async def verify(plan: Any, host: Any, history: Any, **kwargs: Any) -> actions.ActionOutcome:
        calls.append(("verify", plan))
        return actions.ActionOutcome(True, f"verified {plan.kind} on {plan.host}")

    def verdict(plan: Any, history: Any) -> actions.ActionOutcome:
        return actions.ActionOutcome(True, f"verified {plan.kind} on {plan.host}")

    monkeypatch.setattr(execute_module, "execute", execute)
    monkeypatch.setattr(actions, "verify", verify)
    # the one verify loop (actions/verify.py verify_until) judges each fresh poll with its
    # _verdict and audits the last one with its verify
    monkeypatch.setattr(verify_module, "plan_verdict", verdict)
    monkeypatch.setattr(verify_module, "verify", verify)
    return calls


async def test_k_is_greyed_until_a_process_is_selected_and_asks_with_cancel_default(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        assert "kill" not in bound(app)  # fleet view: a host-only key, hidden
        screen = await open_host(pilot, "gpu-healthy")
        assert screen.selected_pid is None  # the cursor is on the run's header row
        assert screen.check_action("kill", ()) is None
        await pilot.press("K")
        assert not isinstance(app.screen, ConfirmAction)
        await pilot.press("down")
        assert screen.selected_pid == 4121
        assert screen.check_action("kill", ()) is True
        await pilot.press("K")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmAction)
        assert app.focused is not None and app.focused.id == "cancel"
        assert "pid 4121" in modal.description and "llama.yaml --rank 0" in modal.description
        assert "kill" not in bound(app)  # no action keys inside the modal
        await pilot.press("escape")  # Escape cancels
        await pilot.pause()
        assert isinstance(app.screen, HostScreen) and fake_execute == []
        await pilot.press("K")
        await pilot.pause()
        await pilot.press("enter")  # Enter on the default button: Cancel
        await pilot.pause()
        assert isinstance(app.screen, HostScreen) and fake_execute == []
        await toast_saying(app, "cancelled")
        await pilot.press("K")
        await pilot.pause()
        await pilot.press("tab", "enter")  # a deliberate step to the Kill button
        await app.workers.wait_for_complete()
        assert [c[0] for c in fake_execute] == ["execute"]
        assert fake_execute[0][1].kind == "kill" and fake_execute[0][1].targets[0].pid == 4121
        await wait_for_async(lambda: "sent kill to gpu-healthy" in notes(app))


async def test_kill_confirmation_shows_box_text_literally(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        await open_host(pilot, "gpu-capped")
        await pilot.press("down", "K")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmAction)
        assert f"--name {fx.HOSTILE}" in screen_text(app)
        await pilot.press("y")  # `y` confirms too
        await app.workers.wait_for_complete()
        assert [c[0] for c in fake_execute] == ["execute"]


async def test_z_reaps_the_zombie_then_polls_and_reports_the_verified_outcome(
        fake_execute: list[tuple[str, Any]]) -> None:
    cfg = fx.config()
    outcomes = fx.latest(cfg)
    zombie = next(o for o in outcomes if o.host.name == "gpu-zombie")
    assert zombie.snapshot is not None
    # rank 3 left behind: re-parented to init, not a session leader (zombies.py, U11)
    procs = tuple(replace(p, session=4000, pgrp=4000) for p in zombie.snapshot.processes)
    zombie = replace(zombie, snapshot=replace(zombie.snapshot, processes=procs))
    collector = FakeCollector([zombie])
    app = make_app(cfg, poll=True, collector=collector)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(3):  # sustained: the GPU idle over several polls
            await feed(pilot, [zombie])
        data = app.hosts["gpu-zombie"]
        assert data.reap_targets == {5150}
        screen = await open_host(pilot, "gpu-zombie")
        assert screen.query_one(ProcessTable).get_cell("pid:5150", "flag").plain == \
            "zombie VRAM"
        assert screen.check_action("reap", ()) is True
        before = collector.calls["gpu-zombie"]
        await pilot.press("z")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmAction)
        assert "pid 5150" in app.screen.description
        await pilot.press("tab", "enter")
        await app.workers.wait_for_complete()
        assert [c[0] for c in fake_execute] == ["execute", "verify"]
        assert collector.calls["gpu-zombie"] > before  # poll_now after the action
        await wait_for_async(lambda: "verified reap on gpu-zombie" in notes(app))


async def test_z_on_the_fleet_view_and_greyed_without_zombies(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        fleet = app.screen
        assert isinstance(fleet, FleetScreen)
        await pilot.press("g", *["down"] * fleet.table.shown.index("gpu-healthy"))
        assert fleet.check_action("reap", ()) is None  # gpu-healthy: nothing to reap
        await pilot.press("z")
        assert isinstance(app.screen, FleetScreen)
        app.hosts["gpu-healthy"].reap_targets = frozenset({4121})
        assert app.screen.check_action("reap", ()) is True


async def test_r_relaunches_the_selected_dead_run_and_is_greyed_while_it_runs(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        healthy = await open_host(pilot, "gpu-healthy")
        assert healthy.check_action("relaunch", ()) is None  # llama-7b is running
        await pilot.press("escape")
        screen = await open_host(pilot, "gpu-zombie")
        assert screen.selected_run == "bert-ddp"
        assert screen.check_action("relaunch", ()) is True
        await pilot.press("r")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmAction)
        assert "bert-ddp" in modal.description
        if modal.refusal is None:
            await pilot.press("tab", "enter")
            await app.workers.wait_for_complete()
            assert fake_execute and fake_execute[0][1].kind == "relaunch"
        else:  # a refused plan offers only Cancel: y does nothing
            await pilot.press("y")
            assert isinstance(app.screen, ConfirmAction)
            await pilot.press("escape")
            assert fake_execute == []


async def test_readonly_greys_every_action(fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = await open_host(pilot, "gpu-healthy")
        await pilot.press("down")
        assert screen.selected_pid == 4121
        for action in ("kill", "reap", "relaunch", "ack"):
            assert screen.check_action(action, ()) is None, action
        await pilot.press("K", "z", "r")
        assert isinstance(app.screen, HostScreen) and fake_execute == []


# ----------------------------------------------------------------------------- app keys

async def test_p_pauses_and_R_polls_now() -> None:
    cfg = fx.config()
    collector = FakeCollector(fx.latest(cfg))
    app = make_app(cfg, poll=True, collector=collector)  # type: ignore[arg-type]
    def polled(times: int) -> bool:
        return all(collector.calls[h.name] == times for h in cfg.hosts)

    async with app.run_test(size=SIZE) as pilot:
        await wait_for_async(lambda: all(collector.calls[h.name] for h in cfg.hosts),
                             what="every host's first poll")
        assert polled(1)
        await pilot.press("R")  # fleet view: every host
        await wait_for_async(lambda: polled(2), what="every host polled again")
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.screen.query_one("#fleet-title").render())
        feed = app.fleet
        await wait_for_async(lambda: not feed.in_flight(), what="no poll under way")
        assert polled(2)  # paused: nothing goes out
        await pilot.press("R")  # paused: R polls once (htop, k9s), and the pause holds
        await wait_for_async(lambda: polled(3), what="every host polled once while paused")
        await wait_for_async(lambda: not feed.in_flight(), what="no poll under way")
        assert app.paused and polled(3)
        await pilot.press("p")
        await wait_for_async(lambda: polled(4), what="every host polled on resuming")
        assert not app.paused
        await open_host(pilot, "gpu-capped")
        await pilot.press("R")  # host view: that host only
        await wait_for_async(lambda: collector.calls["gpu-capped"] == 5, what="gpu-capped polled")
        assert collector.calls["gpu-healthy"] == 4
        assert app.hosts["gpu-capped"].status(fx.NOW, 10).kind == "ok"


async def test_t_cycles_themes_and_question_mark_shows_help() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "gpuwatch-dark"
        seen = [app.theme]
        for _ in range(4):
            await pilot.press("t")
            seen.append(app.theme)
        assert seen == ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-high-contrast",
                        "gpuwatch-okabe-ito", "gpuwatch-dark"]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "relaunch the selected run" in screen_text(app)
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_q_quits() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running


# ----------------------------------------------------------------------------- themes

async def test_theme_flag_and_unknown_theme_warns(tmp_path: Path) -> None:
    app = make_app(theme="gpuwatch-light", themes_dir=tmp_path)
    async with app.run_test(size=SIZE):
        assert app.theme == "gpuwatch-light"
        assert app.theme_variables["util"] == "#1A7F37"
    app = make_app(theme="no-such-theme", themes_dir=tmp_path)
    async with app.run_test(size=SIZE):
        assert app.theme == "gpuwatch-dark"
        assert any("No theme named 'no-such-theme'" in n for n in notes(app))  # said at start


async def test_user_themes_load_and_a_broken_one_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "solar.toml").write_text(
        'name = "solar"\nprimary = "#268bd2"\nbackground = "#002b36"\ndark = true\n'
        '[variables]\nutil = "#859900"\n')
    (tmp_path / "broken.toml").write_text('primary = "not a colour"\n')
    (tmp_path / "garbage.toml").write_text("this is = = not toml")
    app = make_app(theme="solar", themes_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        assert app.theme == "solar"
        assert app.theme_variables["util"] == "#859900"
        assert app.theme_variables["sm-clock"]  # defaulted: the plots still have colours
        # Said as the app started (before the test runs on): no waiting, which would let a
        # host's screen be built ahead and race the end of the test.
        warnings = [n for n in notes(app) if "not loaded" in n]
        assert len(warnings) == 2 and any("broken.toml" in w for w in warnings)
        assert "solar" in app.theme_names


async def test_textual_builtin_theme_still_renders_series() -> None:
    app = make_app(theme="textual-light")
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        await open_host(pilot, "gpu-healthy")
        assert app.theme == "textual-light" and "util" in app.theme_variables


# ----------------------------------------------------------------------------- data paths

async def test_modal_defers_rendering_until_it_closes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await feed(pilot, fx.latest(app.config))
        assert app.hosts["gpu-healthy"].outcome is not None  # judged while the modal is up
        await pilot.press("escape")
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        assert table.get_cell("gpu-healthy", "state").plain == "● ok"


async def test_polls_do_not_pile_up_footer_key_widgets() -> None:
    """The soak: every poll asks for a bindings refresh. Textual's Footer rebuilt its keys
    each time and kept every old key widget alive (Textual #6666): RSS grew ~3 MB a second.
    The footer is rebuilt only when its keys change, and dropped keys are released."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = await open_host(pilot, "gpu-healthy")
        footer = screen.query_one(KeyFooter)
        await pilot.pause()
        shown = list(footer.query(FooterKey))
        for _ in range(5):
            await feed(pilot, fx.latest(app.config))
            await pilot.pause()
        assert list(footer.query(FooterKey)) == shown  # nothing changed: not rebuilt
        await pilot.press("down")  # a process selected: `K` is enabled, its widget told so
        await pilot.pause()
        assert screen.check_action("kill", ()) is True
        assert list(footer.query(FooterKey)) == shown
        kill = next(k for k in footer.query(FooterKey) if k.action == "kill")
        assert not kill.has_class("-disabled")
        await pilot.resize_terminal(SIZE[0] - 40, SIZE[1])  # another width: rebuilt
        await pilot.pause()
        assert list(footer.query(FooterKey)) != shown
        del shown, kill
        for i in range(5):
            await pilot.resize_terminal(SIZE[0] - 40 * (i % 2), SIZE[1])
            await pilot.pause()
        gc.collect()
        alive = [k for k in gc.get_objects() if isinstance(k, FooterKey)]
        assert alive and all(k.is_attached for k in alive)


def box_env(box: Box) -> dict[str, str]:
    env = box.env(base_path="/usr/bin:/bin")
    env["PATH"] = f"{env['PATH']}:{Path(sys.executable).parent}"
    return env


async def test_overnight_the_store_is_shown_stale_before_the_first_poll(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real probe run (local, against a simulated box) as last night's gpuwatch left it."""
    box = Box(tmp_path / "box", h100_sxm(2))
    box.set_gpu(0, util_pct=97, sm_clock_mhz=1410, power_w=512.25, temp_c=66)
    for key, value in box_env(box).items():
        monkeypatch.setenv(key, value)
    host = HostConfig(name="local", ssh="local")
    with Store.open(tmp_path / "state.sqlite3") as store:
        outcome = (await FleetWatch(Config(hosts=(host,)), store, role="once").poll(
            "local")).outcome
        assert outcome.ok, outcome.error_message
    with Store.open(tmp_path / "state.sqlite3") as store:
        later = outcome.ended_at + 7 * 3600
        app = build_app(Config(hosts=(host,)), store=store, poll=False, clock=lambda: later)
        async with app.run_test(size=SIZE) as pilot:
            table = app.screen.query_one(FleetTable)
            assert table.get_cell("local", "state").plain == "◌ stale 7 h (from the store)"
            assert table.get_cell("local", "util").plain.startswith("█")
            screen = await open_host(pilot, "local")
            assert len(app.hosts["local"].gpu_history[0]) == 1
            text = screen_text(app)
            assert "stale 7 h (from the store)" in text and "512/" in text
            assert screen.host == "local"


async def test_relaunch_of_a_discovered_run_plans_from_the_stores_launch_record() -> None:
    """`r` on a run nobody configured: the plan comes from how the store recorded it
    was started; a configured run's never does."""
    from gpuwatch.remote.model.launches import LaunchRecord

    app = make_app()
    async with app.run_test(size=SIZE):
        host = app.hosts["gpu-zombie"].config
        record = {"cwd": "/data/x", "argv": ["python", "found.py"], "env": {"FOO": "bar"},
                  "process": "found.py", "script": "found.py", "detach": "setsid"}
        app.store.save_launch(host.name, "found", record, 1000.0)
        app.store.save_launch(host.name, "bert-ddp", record, 1000.0)
        got = app._launch_record(host.name, "found")
        assert isinstance(got, LaunchRecord) and got.argv == ("python", "found.py")
        assert app._launch_record(host.name, "bert-ddp") is None  # configured: the config rules
        assert app._launch_record(host.name, "never") is None


async def test_a_discovered_run_gets_a_tab_shows_what_was_found_and_p_pins_it(
        tmp_path: Path) -> None:
    """In the TUI, a run nobody configured is a tab like a configured one (added when
    it appears), the line under the tabs says what was found where (box text, never markup),
    and P writes it into the config."""
    from gpuwatch.remote.model.discovery import Discovery
    from gpuwatch.remote.model.series import RunSeries

    config_path = tmp_path / "config.toml"
    config_path.write_text("# mine\n[hosts.gpu-healthy]\nssh = \"gpu-healthy\"\n")
    app = make_app(replace(fx.config(), path=config_path))
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = await open_host(pilot, "gpu-healthy")
        configured = [r.name for r in app.hosts["gpu-healthy"].config.runs]
        assert screen.selected_run == configured[0]
        assert not screen.query_one("#run-found").display
        assert screen.check_action("pin", ()) is False  # P hidden for a configured run

        series = RunSeries("sft[bold]")
        series.discovery = Discovery(
            name="sft[bold]", key=("/data/sft", "/data/sft/sft.py"), alive=True,
            kind="torchrun", script="sft.py", process="sft.py", cwd="/data/sft",
            argv=("torchrun", "sft.py"), log="/data/sft/[red]train.log",
            events="/data/sft/runs", checkpoints="/data/sft/out/checkpoint-*")
        data = app.hosts["gpu-healthy"]
        data.history.runs["sft[bold]"] = series
        assert data.run_names() == [*configured, "sft[bold]"]
        screen.refresh_data()
        await pilot.pause()
        tabs = [t.label.plain for t in screen.query("#run-tabs Tab").results()]
        assert len(tabs) == len(configured) + 1 and tabs[-1].startswith("sft[bold]")
        fleet = next(s for s in app.screen_stack if isinstance(s, FleetScreen))
        assert "sft[bold]" in fleet.query_one(FleetTable).runs_cell(data).plain
        # the configured run's tab: its lines (kept so that n / N do not move the panes) say
        # what gpuwatch reads of it, no longer two blank rows
        found = screen.query_one("#run-found")
        assert found.display
        shown = str(found.render())
        assert "configured run llama-7b: process train.py in /data/llama-7b" in shown
        assert "reads: log train.log; events runs; checkpoints outputs/checkpoint-*" in shown

        assert screen.check_action("next_run", ()) is (len(tabs) > 1)
        await pilot.press("N")  # back from the first tab: the last one, the discovered run
        await pilot.pause()
        assert screen.selected_run == "sft[bold]"
        found = screen.query_one("#run-found")
        assert found.display
        shown = str(found.render())
        assert "discovered run sft[bold]: torchrun sft.py in /data/sft" in shown
        assert "found: log [red]train.log; events runs; checkpoints out/checkpoint-*" in shown
        assert "P pins it" in shown
        assert screen.check_action("pin", ()) is True
        await pilot.press("P")
        await pilot.pause()
        text = config_path.read_text()
        assert text.startswith("# mine\n")  # the person's file is kept
        assert "sft.py" in text
        await toast_saying(app, "pinned run sft[bold] of gpu-healthy")
        await pilot.press("P")  # again: already configured, said, file unchanged
        await toast_saying(app, "already configured")
        assert config_path.read_text() == text


def test_a_discovered_run_left_behind_as_a_zombie_is_shown_so_not_as_running() -> None:
    """U11 with discovered runs: findings mark a discovered run whose every process is a VRAM zombie
    as left behind (tests/test_findings.py); every place the TUI shows a run's status says
    so, with its own glyph, instead of the series' "running"."""
    from gpuwatch.remote.model.series import RunSeries
    from gpuwatch.tui.colours import RUN_GLYPH, RUN_VARIABLE
    from gpuwatch.tui.state import HostData

    history = HostHistory("box")
    history.runs["ddp_worker"] = RunSeries("ddp_worker")
    data = HostData(HostConfig("box", "box"), history)
    assert data.run_status("ddp_worker") == history.runs["ddp_worker"].status
    assert data.run_status("never-polled") == "unknown"
    history.left_behind = frozenset({"ddp_worker"})
    assert data.run_status("ddp_worker") == "left behind"
    assert RUN_GLYPH["left behind"] not in (RUN_GLYPH["running"], RUN_GLYPH["dead"])
    assert RUN_VARIABLE["left behind"] == "warning"


async def test_a_failed_relaunchs_log_line_is_shown_as_written_not_as_markup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The outcome toast quotes the run's log: `[/data/ckpt/step-100]` is a path, not a closing
    tag (Textual raised MarkupError and the TUI exited), and an escape sequence in the log is
    shown, not sent to the terminal."""
    line = "saving to [/data/ckpt/step-100] \x1b]2;PWNED\x07[@click=app.quit]x[/]"

    async def execute(plan: Any, host: Any, **kwargs: Any) -> actions.ActionOutcome:
        return actions.ActionOutcome(False, f"run {plan.launch.run} started but exited at once "
                                            f"with status 1; last lines of train.log: {line}")

    monkeypatch.setattr(execute_module, "execute", execute)
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts drawn, as live
        await feed(pilot, fx.latest(app.config))
        await open_host(pilot, "gpu-zombie")
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmAction) and app.screen.refusal is None
        await pilot.press("tab", "enter")
        await app.workers.wait_for_complete()
        assert await toast_saying(app, "exited at once") == (  # what the app was asked to say
            f"run bert-ddp started but exited at once with status 1; last lines of train.log: "
            f"{line}")

        def drawn() -> list[str]:  # and what the toast on the screen shows of it
            return [str(t.render()) for t in app.screen.query("ToastRack Toast")]

        await wait_for_async(lambda: any(
            n.endswith("saving to [/data/ckpt/step-100] \\x1b]2;PWNED\\x07[@click=app.quit]x[/]")
            for n in drawn()), what="the toast drawn, the box's text visible and not markup")
    assert app.return_code in (0, None)  # it did not die of the toast


async def test_the_tui_judges_with_the_configs_thresholds() -> None:
    """The TUI restored each host's history with the default thresholds whatever the config's
    `[thresholds]` said (a `stalled_s = 60` read 1800 there, while `--once` used 60)."""
    from gpuwatch.remote.config.thresholds import Thresholds

    cfg = replace(fx.config(), thresholds=Thresholds(stalled_s=60.0, sustain_polls=3))
    app = make_app(cfg)
    async with app.run_test(size=SIZE):
        for data in app.hosts.values():
            assert data.history.thresholds.stalled_s == 60.0
            assert data.history.thresholds.sustain_polls == 3


# ----------------------------------------------------------------------------- the log pane

def log_lines(first: int, last: int) -> str:
    return "".join(f"step {s} | loss {fx.loss_at(s):.4f}\n" for s in range(first, last + 1))


def with_tail(outcome: PollOutcome, tail: str) -> PollOutcome:
    """The outcome with its run's log tail replaced (the box's last lines at this poll)."""
    snap = outcome.snapshot
    assert snap is not None and snap.runs and snap.runs[0].log is not None
    run = snap.runs[0]
    run = replace(run, log=replace(run.log, tail=tail))
    return replace(outcome, snapshot=replace(snap, runs=(run, *snap.runs[1:])))


async def test_log_follows_the_tail_pauses_when_scrolled_up_and_end_or_G_follows_again(
        ) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        outcomes = fx.latest(app.config)
        capped = next(o for o in outcomes if o.host.name == "gpu-capped")
        await feed(pilot, [*outcomes, with_tail(capped, log_lines(1, 40))])
        screen = await open_host(pilot, "gpu-capped")
        log = screen.query_one(LogTail)
        pane = screen.query_one("#pane-log")
        await pilot.pause()
        assert log.scroll_y == log.max_scroll_y > 0 and "step 40 |" in screen_text(app)
        # The box's tail moves on (a window of its last lines): the pane shows the new end.
        await feed(pilot, [with_tail(capped, log_lines(11, 50))])
        await pilot.pause()
        assert log.scroll_y == log.max_scroll_y and "step 50 |" in screen_text(app)
        assert log.following and not str(pane.border_subtitle)

        # Keyboard scrolling (7 focuses the log): up pauses the following...
        await pilot.press("7")
        assert app.focused is log
        await pilot.press("pageup")
        await wait_for_async(lambda: not log.following, what="the log scrolled up")
        # (in words of its own: "paused" is the polling's, p)
        assert not log.following and "scrolled up" in str(pane.border_subtitle)
        assert "paused" not in str(pane.border_subtitle)
        top = log.lines[round(log.scroll_y)]
        # ...new lines then leave what is read where it is, and say how many came.
        await feed(pilot, [with_tail(capped, log_lines(21, 60))])
        await pilot.pause()
        assert log.lines[round(log.scroll_y)] == top
        assert "step 60 |" not in screen_text(app)
        assert log.unseen == 10 and "↓ 10 new lines" in str(pane.border_subtitle)
        # End follows again, at once and from then on.
        await pilot.press("end")
        await wait_for_async(lambda: log.following and "step 60 |" in screen_text(app),
                             what="the log following again, its end on screen")
        assert not str(pane.border_subtitle)
        await feed(pilot, [with_tail(capped, log_lines(31, 70))])
        await pilot.pause()
        assert "step 70 |" in screen_text(app)
        # So does G.
        await pilot.press("up", "up")
        await wait_for_async(lambda: not log.following, what="the log scrolled up")
        await pilot.press("G")
        await wait_for_async(lambda: log.following and log.scroll_y == log.max_scroll_y,
                             what="the log following again, at its end")


# ----------------------------------------------------------------------------- no silent keys

def footer_keys(app: GpuwatchApp) -> set[str]:
    return {key.key for key in app.screen.query(FooterKey)}


async def toast_after(pilot: Pilot[Any], key: str) -> str:
    """The one toast a key brings up (waited for: the key brought one)."""
    toasts = toasts_of(pilot.app)
    before = len(toasts)
    await pilot.press(key)
    said = await toasts.said_since(before)
    assert len(said) == 1, (key, said)
    return said[0]


async def test_greyed_and_host_only_keys_say_why_in_a_toast(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        await pilot.pause()
        # The fleet view: k and r are host-only, so not in its footer; pressed, they say where
        # they work. z acts on the highlighted host: gpu-healthy has nothing to reap.
        assert isinstance(app.screen, FleetScreen)
        shown = footer_keys(app)
        assert "z" in shown and not {"K", "r"} & shown, shown
        said = await toast_after(pilot, "r")
        assert "open the host (Enter)" in said and "relaunch" in said
        said = await toast_after(pilot, "K")
        assert "open the host (Enter)" in said and "Processes (6)" in said
        said = await toast_after(pilot, "z")
        assert said.startswith(f"nothing to reap on {app.screen.table.selected_host}")
        assert isinstance(app.screen, FleetScreen)

        # The host view: the cursor is on the run's heading, the run is running, no zombie.
        screen = await open_host(pilot, "gpu-healthy")
        assert {"K", "z", "r"} <= footer_keys(app)  # shown, greyed out
        assert screen.selected_pid is None
        said = await toast_after(pilot, "K")  # the process table has the focus
        assert said.startswith("the cursor is on a run's heading") and "(j or ↓)" in said
        await pilot.press("1")  # the GPUs pane
        said = await toast_after(pilot, "K")
        assert said.startswith("no process selected") and "Processes (6)" in said
        said = await toast_after(pilot, "z")
        assert said.startswith("nothing to reap on gpu-healthy")
        said = await toast_after(pilot, "r")
        assert said.startswith("llama-7b is running")
        assert isinstance(app.screen, HostScreen) and fake_execute == []
        await pilot.press("escape")  # back in the fleet view, its footer as it was
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen) and not {"K", "r"} & footer_keys(app)


async def test_view_keys_that_cannot_act_here_say_why() -> None:
    """n / N with one run, P on a configured run, the plot's keys with no curve, Enter on a
    filter that matches nothing: each says why in a toast (they were silent)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        assert (await toast_after(pilot, "n")).startswith("n / N go from run to run in a host")
        await pilot.press("slash", *"xyzq")
        said = await toast_after(pilot, "enter")
        assert said == "no host matches 'xyzq': Esc clears the filter"
        await pilot.press("escape", "escape")
        await pilot.pause()
        await open_host(pilot, "gpu-healthy")
        for key in ("n", "N"):
            assert await toast_after(pilot, key) == (
                "llama-7b is the only run on gpu-healthy: n / N go from run to run")
        said = await toast_after(pilot, "P")
        assert said.startswith("llama-7b is already in your config")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        await open_host(pilot, "gpu-down")
        for key in ("right_square_bracket", "l", "x", "S"):
            said = await toast_after(pilot, key)
            assert "acts on a run's loss plot, and gpu-down has no run" in said, (key, said)
        assert isinstance(app.screen, HostScreen)


async def test_readonly_keys_say_the_session_is_read_only(
        fake_execute: list[tuple[str, Any]]) -> None:
    app = make_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        await open_host(pilot, "gpu-zombie")
        await pilot.press("down")
        for key in ("K", "z", "r"):
            assert "read-only" in await toast_after(pilot, key), key
        assert isinstance(app.screen, HostScreen) and fake_execute == []


async def test_R_while_paused_polls_once_and_says_the_pause_holds() -> None:
    """htop and k9s refresh a frozen view on request: R while paused polls once (every host
    from the fleet, the host shown from its view), says so, and polling stays paused."""
    cfg = fx.config()
    collector = FakeCollector(fx.latest(cfg))
    app = make_app(cfg, poll=True, collector=collector)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        assert (await toast_after(pilot, "p")).startswith("polling paused")
        feed = app.fleet
        assert feed.paused
        # A poll under way as p was pressed lands; then none starts while paused.
        await wait_for_async(lambda: not feed.in_flight(), what="no poll under way")
        calls = dict(collector.calls)
        said = await toast_after(pilot, "R")
        assert "polling all" in said and "once" in said and "stays paused" in said
        await wait_for_async(lambda: all(collector.calls[h] == calls[h] + 1 for h in calls))
        await open_host(pilot, "gpu-capped")
        said = await toast_after(pilot, "R")
        assert "polling gpu-capped once" in said and "stays paused" in said
        await wait_for_async(lambda: collector.calls["gpu-capped"] == calls["gpu-capped"] + 2)
        assert app.paused
        assert all(collector.calls[h] == calls[h] + 1 for h in calls if h != "gpu-capped")


def test_user_text_says_things_in_words_not_gotcha_codes() -> None:
    """Findings, death causes and help speak to a person: "(U21)" or "(seed 002)" mean nothing
    to one (docs/findings.md explains the codes; code comments cite them)."""
    import re

    from gpuwatch.remote.findings.diagnosis import CAUSES, Diagnosis
    from gpuwatch.tui.screens.help import HelpScreen

    code = re.compile(r"\bU\d+\b|\bseed 00\d\b")
    cfg = fx.config()
    store = fx.seeded_store(cfg)
    messages = [f.message for h in cfg.hosts for f in store.findings(h.name)]
    messages += [Diagnosis(cause, {"line": "x", "pids": [1]}).summary for cause in CAUSES]
    assert messages and not [m for m in messages if code.search(m)]
    import inspect

    assert not code.search(inspect.getsource(HelpScreen).split('"""', 2)[-1])


async def test_the_state_column_names_the_worst_problem_not_ok() -> None:
    """A host polled fine but with a dead run, a zombie or a wedged driver does not read
    "● ok": its state cell names its worst finding in words, in that severity's colour, and
    how many more there are (the findings column is the first to go on a narrow terminal)."""
    from gpuwatch.tui.format import FINDING_WORDS

    cfg = fx.config()
    app = make_app(cfg)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, fx.latest(cfg))
        table = app.screen.query_one(FleetTable)
        for name, data in app.hosts.items():
            cell = table.state_cell(data, fx.NOW, 10.0).plain
            serious = [f for f in data.findings if f.severity >= Severity.WARNING]
            if data.status(fx.NOW, 10.0).kind != "ok":
                continue
            if not serious:
                assert cell == "● ok", (name, cell)
                continue
            top = max(f.severity for f in serious)
            words = [FINDING_WORDS[f.code] for f in serious if f.severity == top]
            assert "ok" not in cell.split(), (name, cell)
            # the most important of the worst severity (FINDING_WORDS' order), cut to fit
            first = min(words, key=lambda w: list(FINDING_WORDS.values()).index(w))
            assert cell[2:].rstrip("…") in first or first in cell, (name, cell, first)
        assert any(not c.startswith("●") for c in (
            table.state_cell(d, fx.NOW, 10.0).plain for d in app.hosts.values()))


async def test_help_explains_every_glyph_the_screens_use() -> None:
    """▶ ? ⊘ ✗ ▲ ● were never explained: the help lists each with its meaning in words."""
    from gpuwatch.tui.colours import RUN_GLYPH, SEVERITY_GLYPH
    from gpuwatch.tui.screens.help import GLYPHS

    listed = " ".join(glyph for glyph, _ in GLYPHS)
    for glyph in [*RUN_GLYPH.values(), *SEVERITY_GLYPH.values(), "◌", "…"]:
        assert glyph in listed, glyph
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        text = screen_text(app)
        assert "what the glyphs mean" in text and "left behind" in text


async def test_a_timed_out_host_says_so_first() -> None:
    from gpuwatch.remote.config.schema import HostConfig as Host

    cfg = fx.config()
    app = make_app(cfg)
    async with app.run_test(size=(80, 24)) as pilot:
        host = cfg.hosts[0]
        await feed(pilot, [fx.failed(host, fx.NOW, "timeout", "did not finish connecting")])
        cell = app.screen.query_one(FleetTable).state_cell(app.hosts[host.name], fx.NOW, 10.0)
        assert cell.plain.startswith("✗ timed out: did") and isinstance(host, Host)


async def test_the_cursor_stays_on_its_host_through_sort_resize_refit_and_filter() -> None:
    """`o`, a resize and a poll that changes the columns rebuilt the table and left the cursor
    on row 0: Enter, z and ? then acted on another host than the one picked."""
    cfg = fx.config(n_extra=3)
    app = make_app(cfg)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, fx.latest(cfg))
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        table = screen.table
        await pilot.press("o")  # the config's order
        await pilot.press("g", "j", "j")
        assert table.selected_host == "gpu-zombie"
        for _ in range(5):  # every order, back to the config's
            await pilot.press("o")
            await pilot.pause()
            assert table.selected_host == "gpu-zombie", screen.sort
        fit = table.fit
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert table.fit != fit and table.selected_host == "gpu-zombie"
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert table.selected_host == "gpu-zombie"
        # a poll whose cells need other columns: every row anew, the cursor stays put
        fit = table.fit
        from gpuwatch.remote.model.snapshot import GpuError

        capped = next(o for o in fx.latest(cfg) if o.host.name == "gpu-capped")
        assert capped.snapshot is not None
        wedged = replace(capped, snapshot=replace(capped.snapshot, gpus=(), gpu_error=GpuError(
            "driver_mismatch", "Failed to initialize NVML: Driver/library version mismatch",
            0.1)))
        await feed(pilot, [wedged])
        await pilot.pause()
        assert table.fit != fit and table.selected_host == "gpu-zombie", (fit, table.fit)
        # filtered: kept while it matches; filtered out, the cursor goes to a shown host
        await pilot.press("slash", *"gpu")
        await pilot.pause()
        assert table.selected_host == "gpu-zombie"
        await pilot.press(*"-new")
        await pilot.pause()
        assert table.selected_host == "gpu-new"
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert table.selected_host == "gpu-new"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HostScreen) and app.screen.host == "gpu-new"


async def test_the_confirm_dialog_keeps_its_buttons_and_keys_on_a_small_screen() -> None:
    """At 80x24 a long plan (a relaunch's command lines, paths) pushed the buttons out of the
    box: the description scrolls instead, and the keys that answer are said beside them."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        description = "\n".join(f"line {i}: /data/run/outputs/checkpoint-{i}" for i in range(40))
        app.push_screen(ConfirmAction("Relaunch bert-ddp on gpu-zombie?", description,
                                      verb="Relaunch"))
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmAction)
        screen = modal.region
        for button in ("#cancel", "#confirm", "#confirm-keys"):
            region = modal.query_one(button).region
            assert region.height and screen.contains_region(region), (button, region, screen)
            box = modal.query_one("#confirm-box").region
            assert box.contains_region(region), (button, region, box)
        text = screen_text(app)
        assert "y relaunch · n / Esc cancel" in text
        assert "Cancel" in text and "Relaunch" in text
        body = modal.query_one("#confirm-body")
        assert body.max_scroll_y > 0  # the rest of the plan is a scroll away
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmAction)
        refused = ConfirmAction("Relaunch?", description, verb="Relaunch", refusal="alive")
        app.push_screen(refused)
        await pilot.pause()
        assert "n / Esc cancel" in screen_text(app) and "y relaunch" not in screen_text(app)
        assert screen.contains_region(refused.query_one("#cancel").region)


def dead_run(run: str, cause: str, evidence: dict[str, Any],
             severity: Severity = Severity.CRITICAL) -> Any:
    from gpuwatch.remote.model.death import Diagnosis
    from gpuwatch.remote.model.finding import Finding

    diagnosis = Diagnosis(cause, evidence)
    return Finding("run.dead", severity, f"run {run} is dead: {diagnosis.summary}", run=run,
                   evidence={"cause": cause, "diagnosis": diagnosis.to_json()})


async def test_the_state_says_why_a_run_died_and_the_host_header_says_the_same() -> None:
    """demo-oom read "▲ run died" in the fleet and "ok" in its own header: the state cell names
    the cause in words, and the host view's header says the fleet's words (one source)."""
    cfg = fx.config()
    app = make_app(cfg)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, fx.latest(cfg))
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        data = app.hosts["gpu-healthy"]
        data._set_findings([dead_run("llama-7b", "oom_cgroup", {"pid": 4121})], fx.NOW)
        screen.refresh_all()
        await pilot.pause()
        for size in ((80, 24), (160, 48)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            cell = screen.table.get_cell("gpu-healthy", "state").plain
            assert cell == "✖ run died: OOM-killed", (size, cell)
        data._set_findings([dead_run("llama-7b", "killed", {
            "signal": 9, "signal_name": "SIGKILL", "exit_code": 137}, Severity.WARNING)],
            fx.NOW)
        assert data.headline(fx.NOW, 10.0).text == "▲ run died: killed (SIGKILL)"
        data._set_findings([dead_run("llama-7b", "unknown", {})], fx.NOW)
        assert data.headline(fx.NOW, 10.0).text == "✖ run died"
        data._set_findings([dead_run("llama-7b", "oom_cgroup", {"pid": 4121})], fx.NOW)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        # the host view's header: the fleet's words, never "ok" beside a critical finding
        for name in ("gpu-healthy", "gpu-zombie", "gpu-capped"):
            host = await open_host(pilot, name)
            header = screen_text(app).splitlines()[0]
            words = app.hosts[name].headline(app.clock(), 10.0).text
            assert words in header, (name, header)
            if name != "gpu-capped":  # a dead run, a zombie: never "ok"
                assert words.split()[0] != "●" and " ok " not in header, (name, header)
            assert isinstance(host, HostScreen)
            await pilot.press("escape", "g")  # open_host counts rows from the first
            await pilot.pause()
        await open_host(pilot, "gpu-healthy")
        assert "✖ run died: OOM-killed" in screen_text(app).splitlines()[0]


async def test_paused_the_state_still_names_the_worst_and_the_title_says_the_age() -> None:
    """After `p` every row read "◌ paused, data 26 s …": the worst findings went and "old" was
    cut. Paused, a host's worst finding stays; the data's age is said where nothing is wrong
    and in the title."""
    cfg = fx.config()
    now = [fx.NOW]
    # Every poll stamped alike: their data is equally old, however the polls were spread out.
    collector = FakeCollector(fx.latest(cfg), stamp=lambda: fx.NOW)
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=lambda: now[0],
                    collector=collector)  # type: ignore[arg-type]
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        table = screen.table
        await wait_for_async(lambda: not [h for h in cfg.hosts if "not polled yet" in
                                          table.get_cell(h.name, "state").plain],
                             what="every host's first poll on screen")
        before = {h: table.get_cell(h, "state").plain for h in ("gpu-zombie", "gpu-down")}
        await pilot.press("p")
        await pilot.pause()
        assert app.paused
        now[0] = max(h.history.last_ok_at or 0.0 for h in app.hosts.values()) + 60
        screen.tick()
        await pilot.pause()
        cells = {h: table.get_cell(h, "state").plain for h in app.hosts}
        for name, cell in before.items():
            assert cells[name] == cell, (name, cell, cells[name])  # the worst, not "paused"
        assert cells["gpu-healthy"] == "◌ ok 60 s ago", cells
        assert not [c for c in cells.values() if c.endswith("…") and "ago" in c]
        title = str(screen.query_one("#fleet-title").render())
        assert "PAUSED, data 60 s old (p resumes)" in title, title
        await open_host(pilot, "gpu-zombie")
        header = screen_text(app).splitlines()[0]
        assert before["gpu-zombie"] in header and "polling paused (p)" in header, header


async def test_the_fleet_title_and_cells_drop_whole_words_never_cut_a_number() -> None:
    """At 80x24 the title read "… · polling every" (the number gone) while filtering, and a
    wedged driver's words read "⚠ driver misma…": whole parts go, least needed first."""
    from gpuwatch.tui.format import fit_words

    app = make_app(fx.config(n_extra=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, fx.latest(app.config))
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await pilot.press("o", "o")  # the config's order, then by name
        await pilot.press("slash", *"xyzq")
        await pilot.pause()
        title = str(screen.query_one("#fleet-title").render()).rstrip()
        assert len(title) <= 78, title
        assert "0 shown (filter 'xyzq')" in title, title
        counts = [p for _, p in summary(list(app.hosts.values()), fx.NOW, 10.0)]
        assert counts[0] in title  # the hosts by verdict stay; GPUs and idle may go first
        for part in title.split(" · "):
            assert part in ("gpuwatch", "6 hosts", "0 shown (filter 'xyzq')",
                            "sorted by name", "polling every 10 s", *counts), (part, title)
        await pilot.press("escape", "escape")
        await pilot.pause()
        title = str(screen.query_one("#fleet-title").render()).rstrip()
        # the interval where it fits beside what is more needed (a dead run, a broken GPU)
        assert title.endswith("polling every 10 s") or len(
            title + " · polling every 10 s") > 78, title
    assert fit_words("⚠ driver mismatch", 15) == "⚠ driver…"
    assert fit_words("⚠ driver mismatch: reboot: Failed", 18) == "⚠ driver mismatch…"
    assert fit_words("✖ run died: OOM-killed", 16, " +2") == "✖ run died… +2"
    assert fit_words("✗ timed out after 12.5 s", 19) == "✗ timed out after…"
    assert fit_words("12345", 3) == "…"  # a number is never cut
    assert fit_words("● ok", 20) == "● ok"


async def test_help_explains_the_other_glyphs_and_fits_or_says_it_scrolls() -> None:
    """⚠ ◆ ▼ ▾ ├ └ and "+1" were not in the legend, and ✗ meant both "could not be polled" and
    "dead run"; at 160x48 the help did not fit and nothing said it scrolled."""
    from gpuwatch.tui.colours import RUN_GLYPH, STATUS_GLYPH
    from gpuwatch.tui.screens.help import GLYPHS

    listed = " ".join(glyph for glyph, _ in GLYPHS)
    for glyph in ("⚠", "◆", "▼", "▾", "├", "└", "+2"):
        assert glyph in listed, glyph
    assert RUN_GLYPH["dead"] not in STATUS_GLYPH.values()
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        await pilot.pause()
        scroll = app.screen.query_one("#help-scroll")
        assert scroll.max_scroll_y == 0  # side by side, all of it on screen
        assert "Esc / ? / q close" in screen_text(app)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        await pilot.pause()
        assert "more below: ↓ PageDown End scroll" in screen_text(app)
        await pilot.press("end")
        await pilot.pause()
        await pilot.pause()
        text = screen_text(app)
        assert "more below" not in text and "↑ PageUp Home scroll" in text
        assert "Cancel as the default" in text


async def test_the_footer_says_resume_while_paused_and_enter_opens_in_the_fleet() -> None:
    """The footer kept "p Pause" while polling was paused, and the fleet's footer did not say
    that Enter opens a host."""
    cfg = fx.config()
    collector = FakeCollector(fx.latest(cfg))
    app = make_app(cfg, poll=True, collector=collector)  # type: ignore[arg-type]
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()

        def labels() -> dict[str, str]:
            return {key.key: key.description for key in app.screen.query(FooterKey)}

        assert labels().get("enter") == "Open" and labels().get("p") == "Pause", labels()
        await pilot.press("p")
        await pilot.pause()
        await pilot.pause()
        assert app.paused and labels().get("p") == "Resume", labels()
        await pilot.press("p")
        await pilot.pause()
        await pilot.pause()
        assert not app.paused and labels().get("p") == "Pause", labels()
        first = app.screen.table.shown[0]  # the worst host, where the cursor rests
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HostScreen) and app.screen.host == first


async def test_the_terminal_driver_resumes_on_sigcont_only_after_a_suspend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A closing terminal sends SIGHUP and SIGCONT (Linux signals the session leader with
    both): Textual's driver answered that SIGCONT by starting its output again on the dead
    terminal, and the app's shutdown then waited for ever (the demo's fleet and temp folder
    were left behind, about one closed terminal in six). Ctrl+Z then `fg` still resumes."""
    import signal

    from gpuwatch.tui.app import terminal_driver
    from textual.drivers.linux_driver import LinuxDriver

    driver_class = terminal_driver()
    assert driver_class is not None and issubclass(driver_class, LinuxDriver)
    resumed: list[bool] = []
    monkeypatch.setattr(LinuxDriver, "resume_application_mode", lambda self: resumed.append(True))
    monkeypatch.setattr(LinuxDriver, "suspend_application_mode", lambda self: None)
    monkeypatch.setattr("os.kill", lambda pid, sig: None)  # the SIGSTOP a suspend sends itself
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}
    try:
        driver = driver_class(make_app())
        driver.on_sigcont()  # with the hang-up: never suspended
        assert resumed == []
        driver.on_sigtstp()
        driver.on_sigcont()  # fg
        assert resumed == [True]
        driver.on_sigcont()
        assert resumed == [True]
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


async def test_the_fleet_title_sums_up_broken_gpus_and_dead_runs() -> None:
    """The fleet's one line for hundreds of hosts: GPUs broken (a critical finding of the GPU's
    own: gpu-mig's GPU 1 needs a reset), runs dead (gpu-oom's OOM-killed, gpu-driver's), runs
    alive; a GPU with only a warning is not broken."""
    app = make_app(fx.config(more=True))
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(app.config))
        hosts = list(app.hosts.values())
        parts = dict((p, need) for need, p in summary(hosts, fx.NOW, 10.0))
        critical = {(h.name, f.gpu) for h in hosts for f in h.findings
                    if f.gpu is not None and f.severity == Severity.CRITICAL}
        assert critical == {("gpu-mig", 1)}, critical
        dead = sorted((h.name, r) for h in hosts for r in h.run_names()
                      if h.run_status(r) == "dead")
        assert len(dead) == 2, dead
        assert parts["1 GPU broken"] == 1 and parts["2 runs dead"] == 2, parts
        assert any(p.endswith(" running") for p in parts), parts
