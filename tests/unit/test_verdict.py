"""One verdict per host, said the same everywhere (remote/verdict.py).

Each fixture host (healthy, capped, a zombie, down, new, OOM-killed, a driver mismatch, and the
extra hosts) goes through the pipeline once; then every output says what it says of the host:
the TUI's fleet cell and host header, `--once`'s STATE column, its JSON `verdict`, Prometheus'
`gpuwatch_host_severity`, `check`'s verdict line and a notification's body. They must agree, and
the verdict must be the worst finding's (or the failed poll's)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.remote.config.schema import NotifyConfig
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.notify import Notifier
from gpuwatch.remote.report import HostReport, document, prometheus_text, text_report
from gpuwatch.remote.verdict import FINDING_WORDS, LEVELS, verdict_of
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.tui.app import build_app
from gpuwatch.tui.cli.check import HostCheck, found_lines
from gpuwatch.tui.widgets.fleet_table import FleetTable
from gpuwatch.tui.widgets.host_header import HostHeader

CFG = fx.config(more=True)
POLLED = [o.host.name for o in fx.latest(CFG)]
CASES = [*POLLED, "gpu-zombie+ack"]
"""Every polled fixture host, and the zombie host once its dead run's death is acknowledged
(then its worst is a warning)."""


@pytest.fixture(scope="module")
def landed() -> dict[str, HostReport]:
    """Each host's latest poll, landed on its night of history (the store the TUI opens)."""
    store = fx.seeded_store(CFG)
    fleet = FleetWatch(CFG, store, role="once")
    for o in fx.earlier(CFG):
        fleet.land(o)
    out = {o.host.name: fleet.land(o) for o in fx.latest(CFG)}
    fleet.acknowledge("gpu-zombie", "bert-ddp", who="tester@here")
    zombie = next(o for o in fx.latest(CFG) if o.host.name == "gpu-zombie")
    out["gpu-zombie+ack"] = fleet.land(zombie)
    return out


def test_the_fixture_fleet_has_every_kind_of_verdict(landed: dict[str, HostReport]) -> None:
    """The table below is worth something only if it holds hosts of every kind."""
    labels = {r.verdict.label for r in landed.values()}
    assert {"ok", "warning", "critical"} <= labels, labels
    assert any(r.verdict.state == "unreachable" for r in landed.values())
    assert any(r.verdict.code == "run.dead" for r in landed.values())


@pytest.mark.parametrize("case", CASES)
def test_every_output_says_the_same_verdict(case: str, landed: dict[str, HostReport]) -> None:
    report = landed[case]
    name = report.name
    verdict = report.verdict
    # the worst finding names it (of equals, the one FINDING_WORDS lists first)
    serious = [f for f in report.findings if f.severity >= Severity.WARNING]
    if report.outcome.ok and serious:
        top = max(f.severity for f in serious)
        first = min((f for f in serious if f.severity == top),
                    key=lambda f: list(FINDING_WORDS).index(f.code))
        assert (verdict.severity, verdict.code) == (top, first.code)
    elif not report.outcome.ok:
        assert (verdict.severity, verdict.code) == (Severity.CRITICAL, "host.unreachable")
    else:
        assert verdict.headline == "ok" and verdict.code is None
    # JSON
    doc = document([report])["hosts"][0]["verdict"]
    assert doc == {"severity": verdict.label, "headline": verdict.headline,
                   "code": verdict.code, "state": verdict.state}
    # the text report's STATE column
    row = next(line for line in text_report([report]).splitlines()
               if line.startswith(name + " "))
    state = row[len(name):].strip()
    if verdict.headline == "ok":
        assert state.startswith("ok")
    else:
        assert state.startswith(f"{verdict.label.upper()} {verdict.headline[:20]}")
    # Prometheus
    prom = prometheus_text([report])
    found = re.search(rf'^gpuwatch_host_severity{{host="{re.escape(name)}"[^}}]*}} (\d)$', prom,
                      re.MULTILINE)
    assert found is not None and int(found.group(1)) == LEVELS[verdict.severity]
    # check's lines (a host that answered)
    if report.outcome.ok:
        lines = found_lines(HostCheck(report.outcome.host, True, [], report=report))
        said = [line for line in lines if ": verdict: " in line]
        if verdict.severity is None or verdict.headline == "ok":
            assert said == []
        else:
            assert said == [f"{name}: verdict: {verdict.label}: {verdict.headline}"]


def test_the_tui_says_the_pipelines_verdict(landed: dict[str, HostReport]) -> None:
    """The fleet's state cell and the host header show the verdict's words and severity."""
    async def go() -> dict[str, tuple[str, str]]:
        app = build_app(CFG, store=fx.seeded_store(CFG), clock=fx.clock, poll=False)
        async with app.run_test(size=(200, 50)) as pilot:
            for o in fx.latest(CFG):
                app.fleet.land(o)
            await pilot.pause()
            table = app.screen.query_one(FleetTable)
            cells = {name: (table.get_cell(name, "state").plain,
                            app.hosts[name].headline(fx.NOW, CFG.interval).text)
                     for name in POLLED}
            app.open_host("gpu-oom")  # the host view's header says it too
            await pilot.pause()
            header = app.screen.query_one(HostHeader)
            cells["header:gpu-oom"] = (str(header.render()), cells["gpu-oom"][1])
            return cells
    cells = asyncio.run(go())
    header, text = cells.pop("header:gpu-oom")
    assert text in header, (text, header)
    for name, (cell, text) in cells.items():
        verdict = landed[name].verdict
        shown = cell.removesuffix("…").split("…")[0]  # a cell too narrow cuts whole words
        assert text.startswith(shown.rstrip(" :,;·(")), (cell, text)
        if verdict.state == "unreachable":
            assert text.startswith("✗ " + verdict.headline)  # then "; data 1 m old"
        elif verdict.code is not None:
            assert text.endswith(verdict.headline + (f" +{verdict.more}" if verdict.more
                                                     else ""))
        else:
            assert text.endswith("ok")


def test_a_notification_opens_with_the_verdict() -> None:
    """A message about a host says its verdict first, as the other outputs say it."""
    sent: list[tuple[str, str]] = []

    def sender(url: str, title: str, body: str, severity: Severity, timeout: float) -> None:
        sent.append((title, body))

    cfg = NotifyConfig(urls=("json://example.invalid",), batch_s=0, min_severity="warning")
    notifier = Notifier(cfg, ["json://example.invalid"], lambda _line: None, sender=sender)
    config = replace(CFG, notify=cfg)
    with fx.seeded_store(config) as store:
        fleet = FleetWatch(config, store, role="cron", notifier=notifier)
        oom = next(o for o in fx.latest(config) if o.host.name == "gpu-oom")

        async def go() -> HostReport:
            report = fleet.land(oom)
            await fleet.act(report)
            return report
        report = asyncio.run(go())
        assert notifier.flush(10)
        fleet.close(0)
    verdict = report.verdict
    assert verdict.severity == Severity.CRITICAL
    assert sent and sent[0][1].splitlines()[0] == (
        f"host gpu-oom: {verdict.label}: {verdict.headline}")


def test_verdict_of_states() -> None:
    assert verdict_of([], "waiting").headline == "not polled yet"
    failed = verdict_of([], "unreachable", failure=("auth", "Permission denied"))
    assert failed.severity == Severity.CRITICAL and failed.headline.startswith("login refused")
    assert verdict_of([], "ok").to_json() == {"severity": "ok", "headline": "ok", "code": None,
                                              "state": "ok"}


@pytest.mark.parametrize(("reasons", "said"), [
    (("sw_power_cap",), "held at its power limit of 250 W (sw_power_cap)"),
    (("hw_thermal_slowdown",), "held back for heat at 88 °C"),
    (("hw_power_brake_slowdown",), "hardware power brake"),
    ((), "nothing throttles it, so it is underfed"),
    (None, "underfed or throttled"),
])
def test_a_slow_busy_gpu_names_what_holds_it_back(reasons: Any, said: str) -> None:
    """The capped demo GPU's warning hedged ("underfed or throttled… check its throttle
    reasons") although gpuwatch read sw_power_cap at 250 W: it names the reason, the limit and
    what lifts it."""
    from gpuwatch.remote.findings.gpu import held_back

    gpu = replace(fx.gpu(0, 100, 700, power=248.0, limit=250.0, temp=88), throttle_reasons=reasons)
    text = held_back(gpu)
    assert said in text
    if reasons == ("sw_power_cap",):
        assert "nvidia-smi -pl" in text
