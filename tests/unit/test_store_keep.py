"""What the store keeps (remote/store_keep.py): raw GPU rows, then per-minute, then per-hour
ones, then none; the cap; VACUUM on its own schedule; events, findings and the audit log never
thinned. Time is the polls' own (a fake clock), so hours of store pass in a second."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.store import GpuRow, Store, StorePolicy
from gpuwatch.remote.store_keep import rollup
from gpuwatch.remote.watch.fleet import FleetWatch

T0 = 1_784_001_600.0  # a whole hour
STEP = 10.0


def power(t: float, gpu: int) -> float:
    """Each minute's own level: the per-minute average is that level, exactly."""
    return 100.0 + gpu + (int(t // 60) % 7) * 10.0


def poll(store: Store, t: float, policy: StorePolicy | None, *, gpus: int = 2,
         throttle: tuple[str, ...] = ()) -> None:
    store.record_poll("h", taken_at=t, ok=True, boot_id="b", gpu_rows=[
        GpuRow(t=t, gpu=g, util_pct=90.0 + g, sm_clock_mhz=1900.0, sm_clock_max_mhz=1980.0,
               power_w=power(t, g), power_limit_w=700.0, temp_c=60.0 + (t % 60) / 10,
               mem_used_mib=1000.0 + g, throttle=throttle) for g in range(gpus)])
    if policy is not None:
        store.maintain("h", t, policy)


def test_raw_rows_become_minutes_then_hours_then_go(tmp_path: Path) -> None:
    policy = StorePolicy(raw_s=600, minute_s=3 * 3600, keep_s=12 * 3600, every_s=60,
                         vacuum=False)
    with Store.open(tmp_path / "s.sqlite3") as store:
        store.record_action(who="me", host="h", action="kill", phase="execute", targets=[],
                            command=None, outcome="sent", ok=None, message="x", at=T0)
        store.update_findings("h", [Finding("disk.low", Severity.WARNING, "low")], T0)
        n = int(20 * 3600 / STEP)
        for i in range(n):
            t = T0 + i * STEP
            poll(store, t, policy, throttle=("hw_slowdown",) if i == 4000 else ())
        now = T0 + (n - 1) * STEP
        raw = store.gpu_history("h")
        minutes = store.gpu_rollups("h", 60)
        hours = store.gpu_rollups("h", 3600)
        # raw: the last raw_s (and what one maintenance period left on top)
        assert raw[0].t >= now - policy.raw_s - policy.every_s - 60
        assert raw[-1].t == now
        # minutes: from where the hours end to where raw begins, every minute, 6 polls each
        assert minutes and minutes[-1].t + 60 <= raw[0].t + 1e-6
        assert minutes[0].t >= now - policy.minute_s - policy.every_s - 3600
        by_minute = {(r.t, r.gpu): r for r in minutes}
        assert len(by_minute) == len(minutes)
        for r in minutes:
            assert r.power_w == power(r.t, r.gpu) and r.util_pct == 90 + r.gpu
            assert r.sm_clock_max_mhz == 1980 and r.mem_used_mib == 1000 + r.gpu
            assert r.temp_c == 65  # the minute's maximum (60 + 50 s / 10)
        # hours: up to keep_s back, none older; averages of their minutes
        assert hours and hours[-1].t + 3600 <= minutes[0].t
        assert hours[0].t >= now - policy.keep_s - 3600 - policy.every_s
        for r in hours:
            levels = [power(r.t + m * 60, r.gpu) for m in range(60)]
            assert r.power_w == round(sum(levels) / 60)
        # the one poll that throttled is in its hour's reasons, and no other hour's
        throttled = [r for r in hours if r.throttle]
        assert [(r.t, r.throttle) for r in throttled] == [
            (T0 + (4000 * STEP // 3600) * 3600, ("hw_slowdown",))] * 2
        # no sample lost or counted twice: the tiers' counts add up to the polls they cover
        with sqlite3.connect(tmp_path / "s.sqlite3") as conn:
            rolled = conn.execute("SELECT SUM(n) FROM gpu_rollups").fetchone()[0]
        first = hours[0].t
        assert rolled + len(raw) == 2 * sum(1 for i in range(n) if T0 + i * STEP >= first)
        # events, findings and the audit log are kept whatever their age
        assert len(store.audit_log("h")) == 1
        assert [f.code for f in store.findings("h")] == ["disk.low"]
        assert [e.kind for e in store.events(host="h")] == ["finding"]


def test_a_rollup_averages_by_count_and_keeps_maxima() -> None:
    rows = [(0.0, 0, 1, 10.0, 1000.0, 1980.0, 100.0, 700.0, 50.0, 10.0, "a"),
            (30.0, 0, 3, 30.0, None, 1900.0, 200.0, None, 70.0, 5.0, "b,a"),
            (59.9, 0, 1, None, 2000.0, None, None, 690.0, None, None, ""),
            (60.0, 0, 1, 50.0, 1500.0, 1980.0, 300.0, 700.0, 60.0, 1.0, None),
            (10.0, 1, 1, None, None, None, None, None, None, None, None)]
    out = rollup(rows, 60)
    assert out == [
        (0, 0, 5, 25, 1500, 1980, 175, 700, 70, 10, "a,b"),
        (0, 1, 1, None, None, None, None, None, None, None, None),
        (60, 0, 1, 50, 1500, 1980, 300, 700, 60, 1, None),
    ]


def fill(store: Store, days: int, every: float = 60.0) -> float:
    t = T0
    for _ in range(int(days * 86_400 / every)):
        poll(store, t, None, gpus=8)
        t += every
    return t - every


def test_over_the_cap_the_oldest_day_goes_first(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.sqlite3") as store:
        store.record_action(who="me", host="h", action="kill", phase="execute", targets=[],
                            command=None, outcome="sent", ok=None, message="x", at=T0)
        now = fill(store, 3)
        used, _ = store.data_bytes()
        policy = StorePolicy(raw_s=10 * 86_400, max_bytes=used // 2)
        assert store.enforce_cap(now, policy) >= 1
        assert store.data_bytes()[0] <= policy.max_bytes
        raw = store.gpu_history("h", limit=10**9)
        assert raw[-1].t == now and raw[0].t >= T0 + 86_400  # the first day went first
        assert len(store.audit_log()) == 1  # the audit log is not the cap's to thin
        # under the cap, nothing goes
        assert store.enforce_cap(now, StorePolicy(max_bytes=1 << 30)) == 0


def test_vacuum_runs_on_its_own_schedule_and_gives_space_back(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with Store.open(path) as store:
        now = fill(store, 2)
        week = 7 * 86_400
        policy = StorePolicy(raw_s=3600, minute_s=3600, keep_s=3600, vacuum_s=week,
                             every_s=60)
        store.maintain("h", now, policy)  # drops all but an hour: most pages are free now
        used, size = store.data_bytes()
        assert (size - used) / size > 0.5
        meta = "SELECT value FROM meta WHERE key = 'vacuumed_at'"
        # the first upkeep started the schedule; nothing is due before a week
        assert float(store._conn.execute(meta).fetchone()[0]) == now
        assert not store.vacuum_if_due(now + week - 1, policy)
        assert store.data_bytes()[1] == size
        assert store.vacuum_if_due(now + week, policy)
        assert store.data_bytes()[1] < size / 2
        assert float(store._conn.execute(meta).fetchone()[0]) == now + week
        assert not store.vacuum_if_due(now + week + 60, policy)  # not again so soon
    with Store.open(path) as store:  # a TUI's upkeep never vacuums
        tui = StorePolicy(vacuum=False, every_s=60)
        for i in range(3):
            store.maintain("h", now + 30 * 86_400 * (i + 1), tui)
        assert float(store._conn.execute(meta).fetchone()[0]) == now + week


def test_the_pipeline_takes_the_store_policy_from_the_config(tmp_path: Path) -> None:
    config = parse_config('interval = 20\n[store]\nraw_hours = 2\nminute_days = 1\n'
                          'keep_days = 30\nmax_mb = 64\nvacuum_days = 2\n')
    with Store.open(":memory:") as store:
        tui = FleetWatch(config, store, role="tui").store_policy
        watch = FleetWatch(config, store, role="watch").store_policy
    assert (tui.raw_s, tui.minute_s, tui.keep_s, tui.max_bytes, tui.vacuum_s) == (
        7200, 86_400, 30 * 86_400, 64 << 20, 2 * 86_400)
    assert tui.gap_s == 60 and not tui.vacuum and watch.vacuum


def test_every_store_key_has_a_range_that_holds_its_default() -> None:
    from dataclasses import fields

    from gpuwatch.remote.config.schema import PRICE_RANGE, STORE_RANGES, StoreConfig

    d = StoreConfig()
    assert {f.name for f in fields(StoreConfig)} == set(STORE_RANGES)
    assert all(STORE_RANGES[k].holds(getattr(d, k)) for k in STORE_RANGES)
    assert d.minute_days * 24 >= d.raw_hours and d.keep_days >= d.minute_days
    assert PRICE_RANGE.holds(0) and not PRICE_RANGE.holds(-0.01)
    # the policy the pipeline builds from the defaults is the store's own default
    config = parse_config("")
    with Store.open(":memory:") as store:
        policy = FleetWatch(config, store, role="once").store_policy
    assert (policy.raw_s, policy.minute_s, policy.keep_s, policy.max_bytes, policy.vacuum_s) == (
        StorePolicy().raw_s, StorePolicy().minute_s, StorePolicy().keep_s,
        StorePolicy().max_bytes, StorePolicy().vacuum_s)
