"""The TUI on hosts read from Prometheus (`[sources.prometheus]`): the app polls them through the
pipeline like any host, with no SSH, and shows their GPUs; a stand-in API server on loopback
(test_source_prometheus's) answers as Prometheus does."""

from __future__ import annotations

import time
from pathlib import Path

from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.store import Store
from gpuwatch.tui.app import build_app
from gpuwatch.tui.screens.host import HostScreen
from test_source_prometheus import answering, api, one_gpu


async def test_the_fleet_shows_hosts_read_from_prometheus_and_opens_one(tmp_path: Path) -> None:
    doc = one_gpu("n1")
    doc["data"]["result"][0]["value"] = [time.time(), "55"]
    async with api(answering(doc)) as (url, asked):
        config = parse_config(f'interval = 2\n[sources.prometheus]\nurl = "{url}"\n'
                              'metrics = ["dcgm"]\n[hosts.n1]\nsource = "prometheus"\n')
        with Store.open(tmp_path / "s.sqlite3") as store:
            app = build_app(config, store=store)
            async with app.run_test(size=(160, 40)) as pilot:
                deadline = time.monotonic() + 30
                while app.hosts["n1"].outcome is None:
                    assert time.monotonic() < deadline, "n1 was never polled"
                    await pilot.pause(0.05)
                host = app.hosts["n1"]
                assert host.outcome is not None and host.outcome.ok, host.outcome
                assert host.snapshot is not None
                assert [g.util_pct for g in host.snapshot.gpus] == [55.0]
                await pilot.press("enter")
                await pilot.pause()
                assert isinstance(app.screen, HostScreen) and app.screen.host == "n1"
    assert asked and all(t.startswith("/api/v1/query?") for t in asked)
