"""Where a poll lands: restore a host's history from the store, judge an outcome on it, and
remember what it gave. Private to the pipeline (fleet.py's FleetWatch is the only caller; an
import-linter contract keeps the rest of gpuwatch out), so a host is restored, judged and saved
one way, whoever looks at it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config.schema import Config, HostConfig
from ..config.thresholds import Thresholds
from ..findings.evaluate import evaluate
from ..model.ack import acks_from_rows
from ..model.discovered import discovered_names, is_discovered_state
from ..model.history import HostHistory, PollFailure
from ..model.launches import record_launches
from ..model.series import RunSeries
from ..model.snapshot import HostSnapshot, ProbeError
from ..report import HostReport
from ..store import GpuRow, RunHold, Store, StorePolicy
from ..wire.collect import Collector, PollOutcome, internal_failure
from ..wire.document import parse_probe_output


def restore(store: Store, host: HostConfig, thresholds: Thresholds | None = None) -> HostHistory:
    """What the store remembers of a host, as the rules' history (the last good snapshot,
    the runs' state and why the dead ones died, the deaths a person acknowledged)."""
    history = HostHistory(host.name, thresholds=thresholds or Thresholds(),
                          expects_gpus=bool(host.runs))
    history.restore_deaths(store.deaths(host.name), store.deaths(host.name, "rank_dead"))
    history.acks = acks_from_rows(store.acks(host.name))
    configured = {r.name for r in host.runs}
    history.curve_tags = {r.name: (r.loss_tag, r.eval_tag) for r in host.runs
                          if r.loss_tag or r.eval_tag}
    for name, (run_state, points) in store.runs(host.name).items():
        if name in configured or is_discovered_state(run_state):  # discovered too
            series = RunSeries.from_state(name, run_state)
            if points:
                series.restore_points(points)
            history.runs[name] = series
    state = store.host_state(host.name)
    if state is not None:
        history.restore_known_gpus(state.counters.get("known_gpus"))
    if state is not None and state.doc is not None and state.last_ok_at is not None:
        try:
            snapshot = parse_probe_output(state.doc, host.name)
        except ProbeError:
            return history  # written by another probe version: this host's history starts anew
        history.record(snapshot, state.last_ok_at, runs=False)
    return history


def resume(collector: Collector, store: Store, host: HostConfig) -> None:
    """Give the collector what an earlier run's collector carried for the host (a
    cron `--once` polls like a steady poll, not like a first one)."""
    state = store.host_state(host.name)
    if state is not None:
        collector.restore(host, state.counters.get("collector"))


def judge(history: HostHistory, outcome: PollOutcome) -> HostReport:
    """Fold one outcome into the host's history and run the rules on it. Never raises: a
    document that breaks a rule is that host's `probe` error (the traceback in the error log),
    reported beside every other host as usual."""
    try:
        return _judge(history, outcome)
    except Exception as exc:
        failed = internal_failure(outcome.host, outcome.started_at, exc, "judging",
                                  outcome.poll_s)
    try:  # the failure itself is judged as any failed poll is (the last good data kept, stale)
        return _judge(history, failed)
    except Exception:
        return HostReport(failed)


def _judge(history: HostHistory, outcome: PollOutcome) -> HostReport:
    if outcome.snapshot is not None:
        history.record(outcome.snapshot, outcome.ended_at)
        # As the history keeps it: its processes' CPU% since the previous poll worked out, a
        # missing GPU tool said as the failure it is where GPUs were expected.
        outcome = replace(outcome, snapshot=history.current)
    else:
        history.record_failure(PollFailure(outcome.error_kind or "probe",
                                           outcome.error_message or "", outcome.ended_at))
    findings = evaluate(history).apply(history)
    zombies = {z.pid: z.reason for z in history.zombies or () if z.pid is not None}
    return HostReport(outcome, findings, runs=runs_json(history, outcome.host), zombies=zombies)


def runs_json(history: HostHistory, host: HostConfig) -> list[dict[str, Any]]:
    """The configured runs as the schema's run objects (a run never seen yet is `unknown`),
    then the discovered ones, by name; not a discovered "run" that is only what a
    dead run left behind holding VRAM (its processes say `zombie`, gpu.vram_zombie what to
    do): the schema's statuses have no word for it, and "running" would be false."""
    now = history.snapshots[-1].taken_at if history.snapshots else None
    out = []
    discovered = [n for n in discovered_names(history.runs, host)
                  if n not in history.left_behind]
    for name in [r.name for r in host.runs] + discovered:
        series = history.runs.get(name, RunSeries(name))
        doc = series.to_json(now)
        death = history.deaths.get(name) if series.status == "dead" else None
        doc["diagnosis"] = death.to_json() if death is not None else None  # U3
        out.append(doc)
    return out


GAP_INTERVALS = 3
"""A step between two polls of a run longer than this many intervals is a gap in its energy:
not integrated, and said (docs/history.md)."""


def store_policy(config: Config, role: str) -> StorePolicy:
    """What the store keeps and for how long (`[store]`), the energy's gap limit (from
    `interval`), and whether this caller may VACUUM (not the TUI: it would freeze)."""
    s = config.store
    return StorePolicy(raw_s=s.raw_hours * 3600, minute_s=s.minute_days * 86_400,
                       keep_s=s.keep_days * 86_400, max_bytes=int(s.max_mb * (1 << 20)),
                       vacuum_s=s.vacuum_days * 86_400, vacuum=role != "tui",
                       gap_s=GAP_INTERVALS * config.interval)


def holds(snap: HostSnapshot) -> dict[str, RunHold]:
    """Each live run's processes (the run's own, as its sample says) and the GPUs that they
    and their descendants held (as the driver and the probe's process table say)."""
    out = {}
    for sample in snap.runs:
        if not sample.pids:
            continue
        pids = set(sample.pids)
        gpus = {p.gpu_index for p in snap.processes
                if (p.pid in pids or p.run == sample.name) and p.gpu_index is not None}
        gpus |= {g.gpu_index for g in snap.gpu_processes
                 if g.pid in pids and g.gpu_index is not None}
        out[sample.name] = RunHold(tuple(sorted(pids)), tuple(sorted(gpus)))
    return out


def remember(store: Store, outcome: PollOutcome, history: HostHistory | None = None,
             collector: Collector | None = None, *, save_runs: bool = True,
             policy: StorePolicy | None = None) -> None:
    """Save one judged outcome. `save_runs=False` leaves out what is costly to write (the runs'
    series, findings, deaths: the TUI writes them at most once a minute). `policy`: the runs'
    spans get their energy's gap limit from it, and the store's upkeep runs (store_keep.py)."""
    full = history if save_runs else None
    if full is not None and full.runs:
        save_runs_of(store, outcome.host.name, full)
    if full is not None:  # findings' first/last seen/cleared, and why dead runs died
        store.update_findings(outcome.host.name, full.findings, outcome.ended_at,
                              clear=outcome.snapshot is not None)
        store.save_deaths(outcome.host.name,
                          {n: d.state() for n, d in full.deaths.items()},
                          {n: d.state() for n, d in full.rank_deaths.items()})
    snap = outcome.snapshot
    if snap is None:
        store.record_poll(outcome.host.name, taken_at=outcome.ended_at, ok=False,
                          error=outcome.error_json())
        if policy is not None:
            store.maintain(outcome.host.name, outcome.ended_at, policy)
        return
    rows = [GpuRow(t=outcome.ended_at, gpu=g.index, util_pct=g.util_pct,
                   sm_clock_mhz=g.sm_clock_mhz, sm_clock_max_mhz=g.sm_clock_max_mhz,
                   power_w=g.power_w, power_limit_w=g.power_limit_w, temp_c=g.temp_c,
                   mem_used_mib=g.mem_used_mib, throttle=tuple(g.throttle_reasons or ()))
            for g in snap.gpus]
    carried: dict[str, Any] = {}
    if collector is not None:
        carried["collector"] = collector.memory(outcome.host)
    if history is not None and history.known_gpus:  # gpu.lost and gpu.query_failed, by cron
        carried["known_gpus"] = history.known_gpus
    store.record_poll(outcome.host.name, taken_at=outcome.ended_at, ok=True,
                      boot_id=snap.boot_id, doc=outcome.doc, gpu_rows=rows,
                      counters=carried or None, runs=holds(snap),
                      gap_s=policy.gap_s if policy is not None else None)
    record_launches(store, outcome.host.name, snap, outcome.ended_at)
    if policy is not None:
        store.maintain(outcome.host.name, outcome.ended_at, policy)


def save_runs_of(store: Store, host: str, history: HostHistory) -> None:
    """The runs' series and offsets (what a restart resumes from)."""
    store.save_runs(host, {name: (series.state(), series.points_state())
                           for name, series in history.runs.items()})
