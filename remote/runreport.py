"""A run's report: what one run did and cost over a span of time, from the store.

Wall time, and of it the time alive, dead and stalled (and unknown: the host unreachable with
the run not seen alive on both sides); each death with its cause and the work it lost since the
last checkpoint; each restart, what it answered and who made it; steps per second over the
span; the loss at its start and end; GPU-hours, energy and cost. Pure reading: the store's
run spans (store_timeline.py: which GPUs the run's processes held, poll to poll, with their
power integrated as it was polled), its events, restarts and audit log, and the run's series.

Energy is the trapezoid of each held GPU's power between two polls of the span; a step longer
than the gap limit (three intervals) or without a GPU's power is a gap: its GPU-seconds are
counted as held, not as measured, and the report says how much was not measured. The energy
"with the gaps" adds them at the run's own measured average power; the cost is the GPU-hours at
`price_per_gpu_hour` plus that energy at `price_per_kwh` (a host's config).

`report_of` builds the report; `text` prints it for a person; `to_json` is the `gpuwatch report
--json` document (docs/json.md). `usage_of` is the cheap part (spans only) that `--once --json`
adds to each run.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .config.schema import HostConfig
from .findings.curve_tags import tags_of
from .model.series import RunSeries
from .report import HostReport
from .store import EventRow, RunSpan, Store
from .textsafe import visible
from .timeline import clock, finite
from .units import duration as fmt_dur

SCHEMA = "gpuwatch/1"
STALL_CODES = ("run.stalled", "run.hung")
"""The findings whose spans are a run's stalled time (alive, no progress)."""
DEATH_CODES = ("run.dead", "run.rank_dead")
PACE_BUCKETS = 12
"""Steps per second is given over at most this many equal parts of the span."""

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Death:
    at: float
    cause: str
    message: str
    work_lost_s: float | None
    """The run's work since its last checkpoint when it died (run.dead's evidence)."""
    steps_lost: float | None = None
    """work_lost_s at the run's pace then: an estimate."""


@dataclass(frozen=True, slots=True)
class Restart:
    at: float
    answered: str | None
    """The cause of the death it followed (None: no death was seen before it)."""
    by: str
    """"the watchdog", "relaunch by USER", or "outside gpuwatch"."""
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-hours and energy of a run's spans (clipped to a window)."""

    since: float | None
    until: float | None
    gpu_s: float = 0.0
    """GPU-seconds held (a GPU held for an hour is 3600)."""
    measured_gpu_s: float = 0.0
    energy_j: float = 0.0
    gaps: int = 0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / 3600

    @property
    def energy_kwh(self) -> float:
        return self.energy_j / 3.6e6

    @property
    def unmeasured_gpu_s(self) -> float:
        return max(0.0, self.gpu_s - self.measured_gpu_s)

    @property
    def avg_power_w(self) -> float | None:
        """Per GPU, over the measured part."""
        return self.energy_j / self.measured_gpu_s if self.measured_gpu_s > 0 else None

    @property
    def energy_kwh_estimated(self) -> float:
        """The measured energy, plus the gaps at the measured average power."""
        avg = self.avg_power_w
        return self.energy_kwh + (self.unmeasured_gpu_s * avg / 3.6e6 if avg else 0.0)

    def cost(self, host: HostConfig) -> float | None:
        """GPU-hours at price_per_gpu_hour plus the estimated energy at price_per_kwh; None
        where the host has no price."""
        if host.price_per_gpu_hour is None and host.price_per_kwh is None:
            return None
        return ((host.price_per_gpu_hour or 0.0) * self.gpu_hours
                + (host.price_per_kwh or 0.0) * self.energy_kwh_estimated)

    def to_json(self, cost: float | None) -> dict[str, Any]:
        """The `usage` object of a run (report --json, and --once --json's runs)."""
        return {"since": _r(self.since), "until": _r(self.until),
                "gpu_hours": round(self.gpu_hours, 4),
                "energy_kwh": round(self.energy_kwh, 4),
                "energy_kwh_estimated": round(self.energy_kwh_estimated, 4),
                "unmeasured_gpu_hours": round(self.unmeasured_gpu_s / 3600, 4),
                "gaps": self.gaps,
                "avg_power_w": _r(self.avg_power_w, 1),
                "cost": None if cost is None else round(cost, 4)}


@dataclass(frozen=True, slots=True)
class RunReport:
    host: str
    run: str
    status: str
    since: float
    until: float
    alive_s: float
    dead_s: float
    stalled_s: float
    unknown_s: float
    deaths: tuple[Death, ...]
    restarts: tuple[Restart, ...]
    usage: Usage
    cost: float | None
    pace: tuple[tuple[float, float, float], ...]
    """(start, end, steps per second) per part of the span with progress."""
    loss_tag: str | None
    loss_start: tuple[int, float] | None
    loss_end: tuple[int, float] | None
    unreachable: tuple[Interval, ...] = ()
    """The host's unreachable spans within the window (when gaps come from)."""
    prices: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return self.until - self.since

    @property
    def work_lost_s(self) -> float:
        return sum(d.work_lost_s or 0.0 for d in self.deaths)

    def to_json(self) -> dict[str, Any]:
        """The `gpuwatch report --json` document (docs/json.md)."""
        return finite({
            "schema": SCHEMA, "kind": "run_report", "host": self.host, "run": self.run,
            "status": self.status, "since": _r(self.since), "until": _r(self.until),
            "wall_s": _r(self.wall_s, 1), "alive_s": _r(self.alive_s, 1),
            "dead_s": _r(self.dead_s, 1), "stalled_s": _r(self.stalled_s, 1),
            "unknown_s": _r(self.unknown_s, 1),
            "deaths": [{"at": _r(d.at), "cause": d.cause, "message": d.message,
                        "work_lost_s": _r(d.work_lost_s, 1),
                        "steps_lost": _r(d.steps_lost, 0)} for d in self.deaths],
            "restarts": [{"at": _r(r.at), "answered": r.answered, "by": r.by,
                          "pids": list(r.pids)} for r in self.restarts],
            "work_lost_s": _r(self.work_lost_s, 1),
            "steps_per_s": [{"since": _r(a), "until": _r(b), "steps_per_s": _r(v, 4)}
                            for a, b, v in self.pace],
            "loss": {"tag": self.loss_tag,
                     "start": _point(self.loss_start), "end": _point(self.loss_end)},
            "usage": self.usage.to_json(self.cost),
            "unreachable": [{"since": _r(a), "until": _r(b)} for a, b in self.unreachable],
            "prices": dict(self.prices),
        })


class NoSuchRun(LookupError):
    """The store has never seen the run on the host (the message says what it has)."""


def report_of(store: Store, host: HostConfig, run: str, *, since: float | None = None,
              now: float | None = None) -> RunReport:
    """The run's report from `since` (default: its first sighting) to now."""
    now = time.time() if now is None else now
    spans = store.run_spans(host.name, run)
    series = _series(store, host, run)
    if not spans and series is None:
        known = sorted({s.run for s in store.run_spans(host.name)} | set(store.runs(host.name)))
        raise NoSuchRun(f"the store has no run {run!r} on {host.name} (runs: "
                        f"{', '.join(known) or 'none seen yet'})")
    status = _status(store, host.name, spans, series)
    start = max(since, spans[0].start) if since is not None and spans else (
        spans[0].start if spans else (since if since is not None else now))
    until = spans[-1].end if status == "finished" and spans else now
    until = max(until, start)
    events = store.events(since=start - 1, until=until, host=host.name, run=run)
    alive = _union((max(s.start, start), min(s.end, until)) for s in spans
                   if s.end >= start and s.start <= until)
    alive_s = _length(alive)
    down = _unreachable(store, host.name, start, until)
    unknown_s = _length(_minus(down, alive))
    stalled = _intersect(_finding_spans(events, STALL_CODES, run, until), alive)
    loss_tag, points = _loss_points(series, host, run)
    deaths = _deaths(events, run, start, points)
    usage = usage_of(store, host.name, run, since=start, until=until, spans=spans)
    first, last = _loss(points, start)
    return RunReport(
        host=host.name, run=run, status=status, since=start, until=until, alive_s=alive_s,
        dead_s=max(0.0, (until - start) - alive_s - unknown_s), stalled_s=_length(stalled),
        unknown_s=unknown_s, deaths=tuple(deaths),
        restarts=tuple(_restarts(store, host.name, run, spans, start, until, deaths)),
        usage=usage, cost=usage.cost(host), pace=tuple(_pace(points, start, until)),
        loss_tag=loss_tag, loss_start=first, loss_end=last, unreachable=tuple(down),
        prices={"price_per_gpu_hour": host.price_per_gpu_hour,
                "price_per_kwh": host.price_per_kwh})


def usage_of(store: Store, host: str, run: str, *, since: float | None = None,
             until: float | None = None, spans: Sequence[RunSpan] | None = None) -> Usage:
    """GPU-hours and energy from the run's spans (a few rows: cheap at every poll), each clipped
    to [since, until] (its energy and measured time in proportion)."""
    spans = store.run_spans(host, run) if spans is None else spans
    lo = since if since is not None else -math.inf
    hi = until if until is not None else math.inf
    gpu_s = measured = energy = 0.0
    gaps = 0
    first = last = None
    for s in spans:
        a, b = max(s.start, lo), min(s.end, hi)
        if b < a or not s.gpus:
            continue
        share = (b - a) / s.seconds if s.seconds > 0 else 1.0
        gpu_s += (b - a) * len(s.gpus)
        measured += min(s.measured_s * share, b - a) * len(s.gpus)
        energy += s.energy_j * share
        gaps += s.gaps if share >= 1.0 else round(s.gaps * share)
        first = a if first is None else min(first, a)
        last = b if last is None else max(last, b)
    return Usage(since=first, until=last, gpu_s=gpu_s, measured_gpu_s=measured,
                 energy_j=energy, gaps=gaps)


def with_usage(report: HostReport, store: Store, host: HostConfig) -> HostReport:
    """The report with each run's `usage` over its life in the store (`--once --json`,
    additive): one read of the run's spans per run, a few rows each."""
    runs = []
    for run in report.runs:
        usage = usage_of(store, host.name, str(run.get("name")))
        runs.append({**run, "usage": usage.to_json(usage.cost(host))})
    return replace(report, runs=tuple(runs))


# --- the parts ---------------------------------------------------------------------------

def _series(store: Store, host: HostConfig, run: str) -> RunSeries | None:
    saved = store.runs(host.name).get(run)
    if saved is None:
        return None
    state, points = saved
    series = RunSeries.from_state(run, state)
    if points:
        series.restore_points(points)
    return series


def _status(store: Store, host: str, spans: Sequence[RunSpan],
            series: RunSeries | None) -> str:
    """As the store last saw it: running when the host's last good poll saw its processes;
    else finished where its series says so (a done marker, its framework's end), else dead."""
    state = store.host_state(host)
    if spans and state is not None and state.last_ok_at is not None \
            and spans[-1].end >= state.last_ok_at:
        return "running"
    if series is not None and series.status == "finished":
        return "finished"
    return "dead" if spans or (series is not None and series.seen_running) else "unknown"


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] >= i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def _intersect(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    out = []
    for a, b in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(b, d)
            if hi > lo:
                out.append((lo, hi))
    return _union(out)


def _minus(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    out = []
    for a, b in xs:
        pieces = [(a, b)]
        for c, d in ys:
            pieces = [p for lo, hi in pieces
                      for p in ((lo, min(hi, c)), (max(lo, d), hi)) if p[1] > p[0]]
        out += pieces
    return out


def _unreachable(store: Store, host: str, start: float, until: float) -> list[Interval]:
    """The host's unreachable spans (an `unreachable` event to the next `reachable`, or to
    `until` while it lasts), clipped to the window."""
    events = store.events(since=-math.inf, until=until, host=host)
    out, down_at = [], None
    for e in events:
        if e.kind == "unreachable" and down_at is None:
            down_at = e.at
        elif e.kind == "reachable" and down_at is not None:
            out.append((down_at, e.at))
            down_at = None
    if down_at is not None:
        out.append((down_at, until))
    return _union((max(a, start), min(b, until)) for a, b in out if b >= start and a <= until)


def _finding_spans(events: Sequence[EventRow], codes: Sequence[str], run: str,
                   until: float) -> list[Interval]:
    """When findings of `codes` about the run held (appearance to clearing)."""
    out, held = [], None
    for e in events:
        if e.code not in codes or e.run != run:
            continue
        if e.kind in ("finding", "changed") and held is None:
            held = e.at
        elif e.kind == "cleared" and held is not None:
            out.append((held, e.at))
            held = None
    if held is not None:
        out.append((held, until))
    return _union(out)


Points = Sequence[tuple[int, float, float]]


def _deaths(events: Sequence[EventRow], run: str, start: float, points: Points) -> list[Death]:
    out = []
    for e in events:
        if e.kind != "finding" or e.code not in DEATH_CODES or e.run != run or e.at < start:
            continue
        cause = e.detail.get("cause")
        lost = e.detail.get("work_lost_s")
        lost = float(lost) if isinstance(lost, (int, float)) and math.isfinite(lost) else None
        pace = _pace_at(points, e.at) if lost is not None else None
        out.append(Death(at=e.at, cause=cause if isinstance(cause, str) else "unknown",
                         message=e.message, work_lost_s=lost,
                         steps_lost=lost * pace if lost is not None and pace else None))
    return out


def _restarts(store: Store, host: str, run: str, spans: Sequence[RunSpan], start: float,
              until: float, deaths: Sequence[Death]) -> list[Restart]:
    """Each span whose processes differ from the span before it, within the window: what
    death it answered, and who started it (the watchdog's record, an audit relaunch, or
    neither: by hand outside gpuwatch, or the run's own script)."""
    out = []
    watchdog = [r for r in store.restarts(host, run, since=start - 86_400)
                if r.outcome in ("sent", "verified", "failed")]
    relaunches = [a for a in store.audit_log(host, limit=100_000, since=start - 86_400)
                  if a.action == "relaunch" and a.phase == "execute"
                  and any(t.get("run") == run for t in a.targets)]
    for before, span in itertools.pairwise(spans):
        if span.pids == before.pids or not start <= span.start <= until:
            continue
        death = next((d for d in reversed(deaths) if before.end <= d.at <= span.start), None)
        after = death.at if death is not None else before.end
        by = "outside gpuwatch (by hand, or its own script)"
        if any(after - 1 <= r.at <= span.start for r in watchdog):
            by = "the watchdog"
        else:
            who = next((a.who for a in relaunches if after - 1 <= a.at <= span.start), None)
            if who is not None:
                by = f"relaunch by {who}"
        out.append(Restart(at=span.start, answered=death.cause if death else None, by=by,
                           pids=span.pids))
    return out


def _loss_points(series: RunSeries | None, host: HostConfig,
                 run: str) -> tuple[str | None, list[tuple[int, float, float]]]:
    if series is None:
        return None, []
    configured = host.run(run)
    tags, loss, _, _ = tags_of(series, (configured.loss_tag, configured.eval_tag)
                               if configured is not None else (None, None))
    if loss is None:
        return None, []
    return loss, tags[loss].points()


def _loss(points: Points, start: float) -> tuple[tuple[int, float] | None,
                                               tuple[int, float] | None]:
    """The loss tag's first and last finite values at or after `start` (points without a
    wall time count: a metrics file's)."""
    kept = [(s, v) for s, v, w in points if math.isfinite(v) and (math.isnan(w) or w >= start)]
    if not kept:
        return None, None
    return kept[0], kept[-1]


def _rates(points: Points) -> list[tuple[float, float, float]]:
    """(wall before, wall after, steps) of each step forward between two timed points; a pair
    that goes back (a restart from a checkpoint) or that spans far more than the run's usual
    step time (it was dead or stopped) is left out."""
    pairs = [(w0, w1, s1 - s0) for (s0, _, w0), (s1, _, w1) in itertools.pairwise(points)
             if s1 > s0 and w1 > w0 and not (math.isnan(w0) or math.isnan(w1))]
    if not pairs:
        return []
    typical = statistics.median((w1 - w0) / n for w0, w1, n in pairs)
    return [(w0, w1, n) for w0, w1, n in pairs if (w1 - w0) <= 10 * typical * n]


def _pace(points: Points, start: float, until: float) -> list[tuple[float, float, float]]:
    """Steps per second in up to PACE_BUCKETS equal parts of the window (parts without
    progress left out)."""
    rates = [r for r in _rates(points) if r[0] >= start and r[1] <= until]
    if not rates:
        return []
    lo, hi = rates[0][0], rates[-1][1]
    width = (hi - lo) / PACE_BUCKETS if hi > lo else 1.0
    buckets: dict[int, list[float]] = {}
    for w0, w1, n in rates:
        i = min(PACE_BUCKETS - 1, int((w0 - lo) / width))
        b = buckets.setdefault(i, [0.0, 0.0])
        b[0] += n
        b[1] += w1 - w0
    return [(lo + i * width, lo + (i + 1) * width, steps / secs)
            for i, (steps, secs) in sorted(buckets.items()) if secs > 0]


def _pace_at(points: Points, at: float) -> float | None:
    """The run's steps per second over its last hour of points before `at`."""
    rates = [r for r in _rates(points) if at - 3600 <= r[1] <= at]
    secs = sum(w1 - w0 for w0, w1, _ in rates)
    return sum(n for *_, n in rates) / secs if secs > 0 else None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _point(p: tuple[int, float] | None) -> dict[str, Any] | None:
    return None if p is None else {"step": p[0], "value": p[1]}


# --- words --------------------------------------------------------------------------------

def _share(part: float, whole: float) -> str:
    return f"{fmt_dur(part)} ({100 * part / whole:.0f}%)" if whole > 0 else fmt_dur(part)


def text(r: RunReport) -> str:
    """The report for a person: a block of lines (box text made visible)."""
    lines = [f"run {r.run} on {r.host}: {r.status}",
             f"  from {clock(r.since)} to {clock(r.until)}: {fmt_dur(r.wall_s)}",
             f"  alive {_share(r.alive_s, r.wall_s)}, of it stalled {fmt_dur(r.stalled_s)}; "
             f"dead {_share(r.dead_s, r.wall_s)}"
             + (f"; unknown {fmt_dur(r.unknown_s)} (the host did not answer)"
                if r.unknown_s > 0 else "")]
    if r.deaths:
        lost = f", {fmt_dur(r.work_lost_s)} of work lost since their checkpoints" \
            if r.work_lost_s else ""
        lines.append(f"  deaths: {len(r.deaths)}{lost}")
        for d in r.deaths:
            steps = f", ~{d.steps_lost:.0f} steps" if d.steps_lost else ""
            lost_d = f" (lost {fmt_dur(d.work_lost_s)}{steps})" if d.work_lost_s else ""
            lines.append(f"    {clock(d.at)}  {d.cause}{lost_d}")
    else:
        lines.append("  deaths: none")
    if r.restarts:
        lines.append(f"  restarts: {len(r.restarts)}")
        for s in r.restarts:
            lines.append(f"    {clock(s.at)}  after {s.answered or 'no death seen'}, by {s.by}")
    if r.pace:
        rates = " ".join(f"{v:.3g}" for *_, v in r.pace)
        lines.append(f"  steps/s over the span: {rates}")
    if r.loss_tag and r.loss_start and r.loss_end:
        lines.append(f"  {r.loss_tag}: {r.loss_start[1]:.4g} at step {r.loss_start[0]} -> "
                     f"{r.loss_end[1]:.4g} at step {r.loss_end[0]}")
    u = r.usage
    lines.append(f"  GPU-hours: {u.gpu_hours:.2f}")
    energy = f"  energy: {u.energy_kwh:.2f} kWh measured"
    if u.unmeasured_gpu_s > 0:
        energy += (f"; {u.unmeasured_gpu_s / 3600:.2f} GPU-hours not measured ({u.gaps} gap"
                   f"{'s' * (u.gaps != 1)}), {u.energy_kwh_estimated:.2f} kWh with them at the "
                   "average power")
    if u.avg_power_w is not None:
        energy += f"; {u.avg_power_w:.0f} W per GPU on average"
    lines.append(energy)
    for a, b in r.unreachable:
        lines.append(f"    host unreachable {clock(a)} to {clock(b)} ({fmt_dur(b - a)})")
    if r.cost is not None:
        lines.append(f"  cost: {r.cost:.2f} ({_prices(r.prices)})")
    else:
        lines.append("  cost: no price set (price_per_gpu_hour or price_per_kwh in the host's "
                     "config)")
    return visible("\n".join(lines), multiline=True) + "\n"


def _prices(prices: Mapping[str, float | None]) -> str:
    said = []
    if prices.get("price_per_gpu_hour") is not None:
        said.append(f"{prices['price_per_gpu_hour']:g} per GPU-hour")
    if prices.get("price_per_kwh") is not None:
        said.append(f"{prices['price_per_kwh']:g} per kWh")
    return " + ".join(said)
