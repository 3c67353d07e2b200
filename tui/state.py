"""What the TUI knows of each host, as plain data the widgets render (no Textual here).

The app owns one `HostData` per configured host. Poll outcomes are folded in by the app's
HostReported handler (the pipeline landed it); the store's memory is folded in at start so the views
show last night before the first poll lands (marked stale, with its age).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.findings.forecast import disk_forecast
from gpuwatch.remote.model.discovered import discovered_names
from gpuwatch.remote.model.discovery import Discovery
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import DiskUsage, HostSnapshot
from gpuwatch.remote.report import HostReport
from gpuwatch.remote.store import GpuRow
from gpuwatch.remote.units import duration as human_age
from gpuwatch.remote.verdict import Verdict, failure_words, verdict_of
from gpuwatch.remote.wire.collect import PollOutcome

from .format import SEVERITY_GLYPH, STATUS_GLYPH

GPU_HISTORY = 720
"""GPU samples kept per GPU in memory for the sparklines (2 h at 10 s)."""
DISK_HISTORY = 720
"""Disk samples kept per disk for the gauge's forecast (longer than the findings' history)."""

@dataclass(frozen=True, slots=True)
class GpuPoint:
    t: float
    util_pct: float | None
    clock_pct: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None


@dataclass(frozen=True, slots=True)
class DiskPoint:
    t: float
    bytes_free: int | None
    inodes_free: int | None


@dataclass(frozen=True, slots=True)
class HostStatus:
    """How fresh a host's data is: kind is ok | stale | unreachable | waiting."""

    kind: str
    text: str
    age_s: float | None
    paused: bool = False
    """Old only because polling is paused (kind "stale"): the data is the last poll's."""


@dataclass(frozen=True, slots=True)
class Headline:
    """A host's verdict (remote/verdict.py) as the fleet's state cell and the host view's
    header both show it: a glyph, then the verdict's words, with the data's age where the
    state is not "ok" ("stale 42 s", "unreachable: ...; data 2 m old")."""

    glyph: str
    words: str
    more: int = 0
    """Further findings at warning or worse ("+2")."""
    kind: str = "ok"
    """The status's kind (ok | stale | unreachable | waiting)."""
    severity: Severity | None = None
    """The verdict's, where the words name a finding."""
    verdict: Verdict | None = None

    @property
    def text(self) -> str:
        return f"{self.glyph} {self.words}{self.suffix}"

    @property
    def suffix(self) -> str:
        return f" +{self.more}" if self.more else ""


def _clock_pct(clock: float | None, clock_max: float | None) -> float | None:
    if clock is None or not clock_max:
        return None
    return max(0.0, min(100.0, 100.0 * clock / clock_max))


@dataclass
class HostData:
    """One host as the TUI shows it."""

    config: HostConfig
    history: HostHistory
    findings: list[Finding] = field(default_factory=list)
    first_seen: dict[tuple[str, int | None, str | None], float] = field(default_factory=dict)
    outcome: PollOutcome | None = None
    """The latest poll's outcome; None until the first poll of this session lands."""
    restored_at: float | None = None
    """When the snapshot restored from the store was taken (this machine's clock)."""
    gpu_history: dict[int, deque[GpuPoint]] = field(default_factory=dict)
    disk_history: dict[str, deque[DiskPoint]] = field(default_factory=dict)
    """Each disk's free bytes and inodes, poll by poll: the gauge's forecast (disk_gauges)."""
    reap_targets: frozenset[int] = frozenset()
    """The pids a reap would hit now (from the actions' own plan: one source of truth)."""
    version: int = 0
    """Bumped on every change, so widgets can skip work when nothing changed."""
    watchdog: dict[str, str] = field(default_factory=dict)
    """Per run: its restart policy, restarts used, next restart, last message (watcher)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def snapshot(self) -> HostSnapshot | None:
        """The newest good snapshot, fresh or stale."""
        return self.history.snapshots[-1] if self.history.snapshots else None

    def run_names(self) -> list[str]:
        """The configured runs, then the discovered ones (shown like configured)."""
        return [r.name for r in self.config.runs] + discovered_names(self.history.runs,
                                                                     self.config)

    def gpu_users(self) -> list[str]:
        """The users of the processes on its GPUs (the newest snapshot's), each once."""
        snap = self.snapshot
        if snap is None:
            return []
        return list(dict.fromkeys(p.user for p in snap.processes
                                  if p.gpu_index is not None or p.gpu_mem_mib))

    def run_status(self, name: str) -> str:
        """A run's status as the TUI shows it: the series' ("running", "dead", ...), "left
        behind" for a discovered run that is only a dead run's VRAM zombie (U11), "unknown"
        before its first poll."""
        if name in self.history.left_behind:
            return "left behind"
        series = self.history.runs.get(name)
        return series.status if series is not None else "unknown"

    def run_progress(self, name: str) -> str:
        """" 200/300 · ETA 5m" where the run's framework wrote its max_steps (seed 004), ""
        where it did not."""
        series = self.history.runs.get(name)
        progress = series.progress_json() if series is not None else None
        if progress is None or progress["max_steps"] is None or progress["step"] is None:
            return ""
        eta, silent = progress["eta_s"], progress.get("silent_s")
        left = "" if eta is None else (f" · ETA {int(eta // 60)}m" if eta < 5400
                                      else f" · ETA {eta / 3600:.1f}h")
        if silent is not None:  # a stalled run's ETA is unknown, not 0 (series.silent_s)
            left = f" · ETA ? (silent {int(silent // 60)}m)"
        return f" {progress['step']}/{progress['max_steps']}{left}"

    def discovery(self, run: str | None) -> Discovery | None:
        """What discovery found of `run` when it is a discovered (not configured) run."""
        if run is None or any(r.name == run for r in self.config.runs):
            return None
        series = self.history.runs.get(run)
        return series.discovery if series is not None else None

    # -- folding data in -------------------------------------------------------------------
    def restore(self, findings: list[Finding], gpu_rows: Iterable[GpuRow],
                restored_at: float | None) -> None:
        """What the store held at start: the last snapshot (already in history), findings as
        they stand, and the GPU history for the plots."""
        self.restored_at = restored_at
        self._set_findings(findings, restored_at or 0.0)
        for row in gpu_rows:
            self._gpu_point(row.gpu, GpuPoint(
                row.t, row.util_pct, _clock_pct(row.sm_clock_mhz, row.sm_clock_max_mhz),
                row.power_w, row.power_limit_w, row.temp_c))
        snap = self.snapshot
        if snap is not None and restored_at is not None:
            self._disk_points(snap.disks, restored_at)
        self.version += 1

    def apply(self, report: HostReport) -> None:
        """One poll as the pipeline landed it (judged, remembered)."""
        outcome = report.outcome
        self.outcome = outcome
        at = outcome.ended_at
        self._set_findings(list(report.findings), at)
        snap = outcome.snapshot
        if snap is not None:
            for g in snap.gpus:
                self._gpu_point(g.index, GpuPoint(
                    at, g.util_pct, _clock_pct(g.sm_clock_mhz, g.sm_clock_max_mhz), g.power_w,
                    g.power_limit_w, None if g.temp_c is None else float(g.temp_c)))
            self._disk_points(snap.disks, at)
        self.version += 1

    def _set_findings(self, findings: list[Finding], at: float) -> None:
        keys = {f.key for f in findings}
        for key in [k for k in self.first_seen if k not in keys]:
            del self.first_seen[key]
        for f in findings:
            self.first_seen.setdefault(f.key, at)
        # Newest first; among equals, most severe first.
        self.findings = sorted(findings, key=lambda f: (-self.first_seen[f.key], -f.severity,
                                                        f.code))

    def _gpu_point(self, index: int, point: GpuPoint) -> None:
        ring = self.gpu_history.get(index)
        if ring is None:
            ring = self.gpu_history[index] = deque(maxlen=GPU_HISTORY)
        ring.append(point)

    def _disk_points(self, disks: Iterable[DiskUsage], at: float) -> None:
        for d in disks:
            ring = self.disk_history.get(d.path)
            if ring is None:
                ring = self.disk_history[d.path] = deque(maxlen=DISK_HISTORY)
            ring.append(DiskPoint(at, d.bytes_free, d.inodes_free))

    # -- what the views ask ------------------------------------------------------------------
    def status(self, now: float, interval: float, paused: bool = False) -> HostStatus:
        """Paused, old data says so ("paused, data 2 m old"): it is old because nothing is
        polled, not because the host stopped answering."""
        last_ok = self.history.last_ok_at
        age = None if last_ok is None else max(0.0, now - last_ok)
        failure = self.history.failure
        if self.outcome is not None and failure is not None:
            where = f"; data {human_age(age)} old" if age is not None else ""
            said = failure_words(failure.kind, failure.message)  # the kind first, in words
            return HostStatus("unreachable", f"{said}{where}", age)
        if self.outcome is None:
            if age is None:
                return HostStatus("waiting", "not polled yet", None)
            return HostStatus("stale", f"stale {human_age(age)} (from the store)", age)
        if age is not None and age > 3 * interval + 5:
            if paused:
                return HostStatus("stale", f"paused, data {human_age(age)} old", age, True)
            return HostStatus("stale", f"stale {human_age(age)}", age)
        return HostStatus("ok", "ok", age)

    def verdict(self, now: float, interval: float, paused: bool = False) -> Verdict:
        """The host's one verdict (remote/verdict.py's verdict_of, as every output says it),
        with how fresh its data is now."""
        status = self.status(now, interval, paused)
        failure = self.history.failure
        state = "ok" if status.paused else status.kind
        return verdict_of(self.findings, state,
                          failure=(failure.kind, failure.message) if failure else None,
                          age_s=status.age_s, paused=status.paused)

    def headline(self, now: float, interval: float, paused: bool = False) -> Headline:
        """The host's verdict in a glyph and a few words: a dead run or a wedged driver is not
        "ok", and pausing hides neither (old data while paused says its age where it is ok)."""
        status = self.status(now, interval, paused)
        verdict = self.verdict(now, interval, paused)
        if verdict.code is not None and verdict.state != "unreachable":
            assert verdict.severity is not None
            return Headline(SEVERITY_GLYPH[verdict.severity], verdict.headline, verdict.more,
                            status.kind, verdict.severity, verdict)
        if status.paused:
            return Headline(STATUS_GLYPH["stale"], f"ok {human_age(status.age_s)} ago",
                            kind=status.kind, verdict=verdict)
        severity = verdict.severity if verdict.state == "unreachable" else None
        return Headline(STATUS_GLYPH[status.kind], status.text, verdict.more, status.kind,
                        severity, verdict)

    def severity_counts(self) -> dict[Severity, int]:
        counts = dict.fromkeys(Severity, 0)
        for f in self.findings:
            counts[f.severity] += 1
        return counts

    def disk_forecast(self, path: str, inodes: bool = False) -> float | None:
        """Seconds until the disk (or its inodes) runs out at the recent growth rate."""
        forecast = disk_forecast(self.history, path, inodes=inodes)  # the finding's, too
        return forecast.seconds_left if forecast is not None else None

    def box_now(self, now: float) -> float | None:
        """The box's clock now, estimated from the last snapshot (boxes' clocks drift)."""
        snap = self.snapshot
        if snap is None or snap.taken_at is None or self.history.last_ok_at is None:
            return None
        return snap.taken_at + max(0.0, now - self.history.last_ok_at)

