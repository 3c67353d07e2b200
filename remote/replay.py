"""The fleet as the store saw it at a chosen time: replay (the TUI's `T`).

The store keeps no whole snapshot but the last, so a moment of the past is put together from
what it does keep: the findings that held then (the timeline's appearances and clearings up to
that time), whether the host answered (its `unreachable` / `reachable` events), its GPUs (the
raw rows of the last poll at or before it, else the minute or hour it falls in), its runs (the
spans that cover it: which processes held which GPUs), and the events around it. Nothing here
polls or acts: it reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .store import GpuRow, RunSpan, Store
from .store_keep import HOUR, MINUTE
from .timeline import Entry, timeline

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True, slots=True)
class PastFinding:
    code: str
    severity: str
    message: str
    since: float
    run: str | None = None
    gpu: int | None = None
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class PastRun:
    name: str
    status: str
    """running (a span covers the moment) | dead (seen before it, not at it) | gone"""
    pids: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HostAt:
    """One host at one moment, as far as the store can tell."""

    host: str
    at: float
    reachable: bool | None
    """False inside an unreachable span; None before the store knew the host."""
    findings: tuple[PastFinding, ...]
    gpus: tuple[GpuRow, ...]
    gpus_at: float | None
    """When the GPU rows were taken (a poll's time, or a minute's or an hour's start)."""
    gpus_span: int
    """0: one poll's rows; 60 or 3600: averages over that bucket."""
    runs: tuple[PastRun, ...]
    events: tuple[Entry, ...] = field(default_factory=tuple)
    """The host's timeline shortly before and after the moment (actions and restarts too)."""

    @property
    def worst(self) -> PastFinding | None:
        return max(self.findings, key=lambda f: (SEVERITY_RANK.get(f.severity, 0), f.since),
                   default=None)


def host_at(store: Store, host: str, at: float, *, around_s: float = 1800.0) -> HostAt:
    """`host` at `at` (this machine's clock)."""
    events = store.events(since=-math.inf, until=at, host=host)
    held: dict[tuple[str, str | None, int | None, str | None], PastFinding] = {}
    reachable: bool | None = None
    for e in events:
        if e.kind in ("unreachable", "reachable"):
            reachable = e.kind == "reachable"
        if e.code is None:
            continue
        key = (e.code, e.run, e.gpu, e.subject)
        if e.kind == "cleared":
            held.pop(key, None)
        elif e.kind in ("finding", "changed"):
            since = held[key].since if key in held and e.kind == "changed" else e.at
            held[key] = PastFinding(e.code, e.severity or "info", e.message, since, e.run,
                                    e.gpu, e.subject)
    if reachable is None and events:
        reachable = True
    state = store.host_state(host)
    if reachable is None and state is not None and state.last_ok_at is not None \
            and state.last_ok_at <= at:
        reachable = True
    gpus, gpus_at, span = gpus_at_time(store, host, at)
    near = timeline(store, since=at - around_s, until=at + around_s, host=host)
    return HostAt(host=host, at=at, reachable=reachable,
                  findings=tuple(sorted(held.values(), key=lambda f: (
                      -SEVERITY_RANK.get(f.severity, 0), -f.since))),
                  gpus=tuple(gpus), gpus_at=gpus_at, gpus_span=span,
                  runs=tuple(runs_at(store.run_spans(host, until=at), at)), events=tuple(near))


def gpus_at_time(store: Store, host: str, at: float) -> tuple[list[GpuRow], float | None, int]:
    """The GPU rows of the last poll at or before `at` (within an hour of it), else of the
    minute, else of the hour, that holds it; ([], None, 0) where the store has none."""
    rows = store.gpu_poll_before(host, at)
    if rows and at - rows[0].t <= HOUR:
        return rows, rows[0].t, 0
    for span in (MINUTE, HOUR):
        start = math.floor(at / span) * span
        bucket = store.gpu_rollups(host, span, since=start, until=start)
        if bucket:
            return bucket, float(start), span
    return [], None, 0


def runs_at(spans: Sequence[RunSpan], at: float) -> list[PastRun]:
    """Each run the spans know, at `at`, by its latest span that started by then: running
    where it covers the moment, else dead (seen before, not then)."""
    latest: dict[str, RunSpan] = {}
    for s in spans:
        if s.start <= at and (s.run not in latest or s.start > latest[s.run].start):
            latest[s.run] = s
    return [PastRun(s.run, "running", s.pids, s.gpus) if s.end >= at else PastRun(s.run, "dead")
            for s in sorted(latest.values(), key=lambda s: s.run)]


def moments(store: Store, hosts: Sequence[str], since: float, until: float) -> list[float]:
    """Every event's time from `since` to `until` (of these hosts), for jumping from one to
    the next."""
    out: set[float] = set()
    for host in hosts:
        out.update(e.at for e in store.events(since=since, until=until, host=host))
    return sorted(out)
