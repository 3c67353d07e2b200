"""A run's report (remote/runreport.py, `gpuwatch report`): energy integrates a known power
profile to within 1%, gaps are not integrated and are said, GPU-hours and cost follow the spans
and prices, and time alive / dead / stalled / unknown, deaths and restarts come from the store's
timeline. The whole pipeline's night is tests/unit/test_night.py's."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.runreport import NoSuchRun, report_of, text, usage_of
from gpuwatch.remote.store import GpuRow, RunHold, Store
from gpuwatch.tui.cli import report_verb

T0 = 1_784_001_600.0
HOST = HostConfig(name="h", ssh="h")


def profile(t: float, gpu: int) -> float:
    """Watts: a half-hour wave, a GPU's own offset, and 100 W more from the 1st to the 1.5th
    hour (a step the polls cannot resolve)."""
    x = t - T0
    return 450 + 200 * math.sin(2 * math.pi * x / 1800) + 50 * gpu + (
        100 if 3600 <= x < 5400 else 0)


def exact_joules(a: float, b: float, gpus: int) -> float:
    """The profile's integral from a to b over GPUs 0..gpus-1 (closed form)."""
    def wave(x: float) -> float:  # the antiderivative of 450 + 200 sin(2 pi x / 1800)
        return 450 * x - 200 * 1800 / (2 * math.pi) * math.cos(2 * math.pi * x / 1800)

    out = 0.0
    for g in range(gpus):
        xa, xb = a - T0, b - T0
        out += wave(xb) - wave(xa) + 50 * g * (xb - xa)
        out += 100 * max(0.0, min(xb, 5400) - max(xa, 3600))
    return out


def jittered(start: float, end: float, seed: int = 7) -> list[float]:
    """Poll times every 10 s, each late by a fraction of a second to 2 s (a busy machine)."""
    import random

    rng = random.Random(seed)
    n = int((end - start) / 10)
    return [start + 10 * i + (rng.random() * 2 if 0 < i < n else 0) for i in range(n + 1)]


def poll(store: Store, t: float, pids: tuple[int, ...] = (100, 101), gpus: int = 2,
         ok: bool = True, gap_s: float = 30.0) -> None:
    if not ok:
        store.record_poll("h", taken_at=t, ok=False, error={"kind": "timeout", "message": "x"})
        return
    store.record_poll("h", taken_at=t, ok=True, boot_id="b",
                      gpu_rows=[GpuRow(t, g, 95.0, 1900.0, 1980.0, profile(t, g), 700.0, 60.0,
                                       1.0) for g in range(gpus)],
                      runs={"llama": RunHold(pids, tuple(range(gpus)))}, gap_s=gap_s)


def test_energy_integrates_a_known_power_profile_within_one_percent() -> None:
    times = jittered(T0, T0 + 3 * 3600)
    with Store.open(":memory:") as store:
        for t in times:
            poll(store, t)
        usage = usage_of(store, "h", "llama")
    want = exact_joules(times[0], times[-1], 2)
    assert abs(usage.energy_j - want) / want < 0.01
    assert usage.gaps == 0 and usage.unmeasured_gpu_s == pytest.approx(0, abs=1e-6)
    assert usage.gpu_hours == pytest.approx(2 * (times[-1] - times[0]) / 3600)
    assert usage.energy_kwh == pytest.approx(want / 3.6e6, rel=0.01)


def test_a_gap_is_not_integrated_and_is_said() -> None:
    """Twenty minutes without a poll (the host unreachable): the run's same processes are
    alive on both sides, so its GPUs were held (GPU-hours count it), but their power is not
    known then: the energy leaves it out and says how much was not measured."""
    with Store.open(":memory:") as store:
        for t in jittered(T0, T0 + 7200):
            poll(store, t)
        poll(store, T0 + 7210, ok=False)
        for t in jittered(T0 + 8400, T0 + 10_800):
            poll(store, t)
        usage = usage_of(store, "h", "llama")
        report = report_of(store, HOST, "llama", now=T0 + 10_800)
    measured = exact_joules(T0, T0 + 7200, 2) + exact_joules(T0 + 8400, T0 + 10_800, 2)
    assert abs(usage.energy_j - measured) / measured < 0.01
    assert usage.gaps == 1 and usage.unmeasured_gpu_s == pytest.approx(2 * 1200)
    assert usage.gpu_hours == pytest.approx(2 * 3)
    assert usage.energy_kwh_estimated > usage.energy_kwh
    assert report.alive_s == pytest.approx(10_800) and report.dead_s == pytest.approx(0)
    assert report.unreachable == ((T0 + 7210, T0 + 8400),)
    said = text(report)
    assert "0.67 GPU-hours not measured (1 gap)" in said and "host unreachable" in said


def test_cost_is_gpu_hours_and_energy_at_the_hosts_prices() -> None:
    with Store.open(":memory:") as store:
        for t in jittered(T0, T0 + 3600):
            poll(store, t)
        usage = usage_of(store, "h", "llama")
        per_hour = HostConfig(name="h", ssh="h", price_per_gpu_hour=2.5)
        both = HostConfig(name="h", ssh="h", price_per_gpu_hour=2.5, price_per_kwh=0.3)
        assert usage.cost(HOST) is None
        assert usage.cost(per_hour) == pytest.approx(2.5 * usage.gpu_hours)
        assert usage.cost(both) == pytest.approx(2.5 * usage.gpu_hours
                                                 + 0.3 * usage.energy_kwh_estimated)
        report = report_of(store, both, "llama", now=T0 + 3600)
        assert report.cost == pytest.approx(usage.cost(both))
        assert "2.5 per GPU-hour + 0.3 per kWh" in text(report)
        # --since clips the spans: the last half hour is about half of it
        half = report_of(store, both, "llama", since=T0 + 1800, now=T0 + 3600)
        assert half.usage.gpu_hours == pytest.approx(1.0, rel=0.01)


def test_alive_dead_stalled_deaths_and_restarts_from_the_timeline() -> None:
    with Store.open(":memory:") as store:
        for t in range(int(T0), int(T0 + 3600) + 1, 10):  # alive an hour
            poll(store, float(t))
        stalled = Finding("run.stalled", Severity.WARNING, "stalled", run="llama")
        store.update_findings("h", [stalled], T0 + 1800)
        store.update_findings("h", [], T0 + 2400)
        store.update_findings("h", [Finding(
            "run.dead", Severity.CRITICAL, "run llama is dead: killed", run="llama",
            evidence={"cause": "killed", "work_lost_s": 900.0})], T0 + 3610)
        store.record_restart("h", "llama", death="100,101", holder="watch@x:1:a",
                             outcome="sent", message="restart 1 of 3", at=T0 + 3670)
        for t in range(int(T0 + 3680), int(T0 + 7200) + 1, 10):  # restarted: new pids
            poll(store, float(t), pids=(200, 201))
        report = report_of(store, HOST, "llama", now=T0 + 7200)
    assert report.since == T0 and report.until == T0 + 7200
    assert report.alive_s == pytest.approx(3600 + 3520)
    assert report.dead_s == pytest.approx(80) and report.unknown_s == 0
    assert report.stalled_s == pytest.approx(600)
    (death,) = report.deaths
    assert (death.at, death.cause, death.work_lost_s) == (T0 + 3610, "killed", 900.0)
    (restart,) = report.restarts
    assert (restart.at, restart.answered, restart.by, restart.pids) == (
        T0 + 3680, "killed", "the watchdog", (200, 201))
    doc = report.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["kind"] == "run_report" and doc["work_lost_s"] == 900.0
    assert doc["usage"]["gpu_hours"] == pytest.approx(2 * 7120 / 3600, rel=1e-3)


def test_gpuwatch_report_prints_it_or_says_what_runs_there_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[hosts.h]\nssh = "gpu-h"\nprice_per_gpu_hour = 3.0\n')
    path = str(tmp_path / "s.sqlite3")
    with Store.open(path) as store:
        for t in jittered(T0, T0 + 3600):
            poll(store, t)
    args = argparse.Namespace(host="h", run="llama", since=None, json=False,
                              config=str(config))
    assert report_verb.run_verb(args, store_path=path, now=T0 + 3600) == 0
    out = capsys.readouterr().out
    assert out.startswith("run llama on h: running") and "GPU-hours: 2.00" in out
    assert "cost: 6.00 (3 per GPU-hour)" in out
    args.json, args.since = True, 1800.0
    assert report_verb.run_verb(args, store_path=path, now=T0 + 3600) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["since"] == T0 + 1800 and doc["usage"]["cost"] == pytest.approx(3.0, rel=0.01)
    args.run = "mistral"
    assert report_verb.run_verb(args, store_path=path, now=T0 + 3600) == 1
    assert "no run 'mistral' on h (runs: llama)" in capsys.readouterr().err


def test_a_run_never_seen_is_no_report() -> None:
    with Store.open(":memory:") as store, pytest.raises(NoSuchRun, match="none seen yet"):
        report_of(store, HOST, "llama")


def test_once_json_gives_each_run_its_usage_and_stays_in_the_schema() -> None:
    """`--once --json`'s runs carry `usage` (additive): read from the run's spans, which the
    pipeline's remember wrote, so it is there from the second poll of a run."""
    import jsonschema
    from gpuwatch.remote.report import document, load_schema
    from gpuwatch.remote.watch.fleet import FleetWatch
    from tui_fixtures import NOW, config, earlier, latest

    cfg = config()
    with Store.open(":memory:") as store:
        fleet = FleetWatch(cfg, store, role="once", clock=lambda: NOW)
        for outcome in earlier(cfg):
            fleet.land(outcome)
        reports = [fleet.land(o) for o in latest(cfg)]
    doc = document(reports, generated_at=NOW)
    jsonschema.validate(doc, load_schema())
    healthy = next(h for h in doc["hosts"] if h["name"] == "gpu-healthy")
    (run,) = healthy["runs"]
    assert run["usage"]["gpu_hours"] == pytest.approx(4 * 10 / 3600, abs=1e-4)  # 4 digits
    assert run["usage"]["since"] == NOW - 10 and run["usage"]["cost"] is None
