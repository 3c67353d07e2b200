"""The TUI while open with a restart policy: it acts as a watcher under the same lease as
`gpuwatch watch`, and the run's line under its tab says the policy, the restarts used, who
acts and the last message. Kept apart from test_tui.py (its layout is edited elsewhere)."""

from __future__ import annotations

import time
from dataclasses import replace

import tui_fixtures as fx
from gpuwatch.remote.config.schema import Config
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.screens.host import HostScreen

SIZE = (200, 50)


def with_policy(cfg: Config) -> Config:
    hosts = []
    for h in cfg.hosts:
        runs = tuple(replace(r, restart="on-failure") for r in h.runs)
        hosts.append(replace(h, runs=runs))
    return replace(cfg, hosts=tuple(hosts))


async def test_the_tui_acts_under_the_lease_and_shows_the_runs_watchdog_line() -> None:
    cfg = with_policy(fx.config())
    store = fx.seeded_store(cfg)
    store.record_restart("gpu-healthy", "llama-7b", death="41", holder="watch@x:1:a",
                         outcome="verified", message="running again")
    store.set_notified("gpu-healthy", {"@last": ("gpuwatch: gpu-healthy: ↻ llama-7b → "
                                                 "ntfy://***@ntfy.sh/…: sent", time.time())})
    app = build_app(cfg, store=store, clock=fx.clock, poll=False)
    assert isinstance(app, GpuwatchApp) and app.fleet.acts
    async with app.run_test(size=SIZE) as pilot:
        for o in fx.latest(app.config):  # as the pipeline's own poll cycle: land, then act
            await app.fleet.act(app.fleet.land(o))
        await pilot.pause()
        holder = store.lease("gpu-healthy", "llama-7b")
        assert holder is not None and holder[0].startswith("tui@")  # the TUI is the actor
        app.open_host("gpu-healthy")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, HostScreen) and screen.host == "gpu-healthy"
        line = screen.query_one("#run-found")
        assert line.display
        shown = str(line.render())
        assert "restart on failure: at most 3 per 6 h" in shown
        assert "used 1 of 3" in shown and "acting: tui" in shown
        assert "last message" in shown and "ntfy://***@ntfy.sh/…: sent" in shown
    assert store.lease("gpu-healthy", "llama-7b") is None  # handed back on exit


async def test_without_a_policy_or_a_target_the_tui_does_not_watch() -> None:
    cfg = fx.config()
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False)
    assert isinstance(app, GpuwatchApp) and not app.fleet.acts
