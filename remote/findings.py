"""Findings: what is wrong on a host and what to do, as pure functions of its history.

Every rule takes the host's history (this poll and the ones before, plus what the store carried
over from earlier runs) and returns findings: a code, a severity, one sentence a person can act
on, and the numbers behind it. No SSH, no Textual: every rule is testable on plain data. Each rule
names the gotcha of seeds/003 it encodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from .series import RunSeries

if TYPE_CHECKING:
    from .model import HostSnapshot


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @classmethod
    def parse(cls, name: str) -> Severity:
        return cls[name.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong, in one sentence, with the evidence behind it."""

    code: str
    severity: Severity
    message: str
    gpu: int | None = None
    run: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int | None, str | None]:
        """What makes two findings the same across polls (for first seen / cleared)."""
        return (self.code, self.gpu, self.run)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity.label,
                               "message": self.message}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.run is not None:
            out["run"] = self.run
        out["evidence"] = dict(self.evidence)
        return out


@dataclass(frozen=True, slots=True)
class PollFailure:
    """A poll that did not return a snapshot."""

    kind: str
    message: str
    at: float


HISTORY_LEN = 64
"""Snapshots kept per host in memory: enough for 'sustained over several polls' rules."""


@dataclass
class HostHistory:
    """What the rules see of one host. Bounded: the newest HISTORY_LEN snapshots."""

    name: str
    snapshots: deque[HostSnapshot] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    failure: PollFailure | None = None
    """Set when the latest poll failed (the snapshots are then stale, not gone)."""
    last_ok_at: float | None = None
    runs: dict[str, RunSeries] = field(default_factory=dict)
    """Each run's series, offsets and liveness, fed by every good poll."""

    @property
    def current(self) -> HostSnapshot | None:
        return self.snapshots[-1] if self.snapshots and self.failure is None else None

    @property
    def previous(self) -> HostSnapshot | None:
        if self.failure is not None:
            return self.snapshots[-1] if self.snapshots else None
        return self.snapshots[-2] if len(self.snapshots) > 1 else None

    def record(self, snapshot: HostSnapshot, at: float, *, runs: bool = True) -> None:
        """A good poll that ended at `at` (this machine's clock: boxes' clocks drift).
        runs=False for a snapshot whose run data is already in `runs` (restored from the store)."""
        self.snapshots.append(snapshot)
        self.failure = None
        self.last_ok_at = at
        if runs:
            for sample in snapshot.runs:
                series = self.runs.get(sample.name)
                if series is None:
                    series = self.runs[sample.name] = RunSeries(sample.name)
                series.update(sample, snapshot.taken_at)

    def record_failure(self, failure: PollFailure) -> None:
        self.failure = failure


Rule = Callable[[HostHistory], Iterable[Finding]]


def host_unreachable(history: HostHistory) -> Iterable[Finding]:
    """U3, U17: a failed poll is not a dead run; say what failed and keep the last data."""
    failure = history.failure
    if failure is None:
        return
    stale = (f"; last good data is {failure.at - history.last_ok_at:.0f} s old"
             if history.last_ok_at is not None else "")
    yield Finding(
        "host.unreachable", Severity.CRITICAL,
        f"{history.name} could not be polled ({failure.kind}): {failure.message}{stale}",
        evidence={"kind": failure.kind, "last_ok_at": history.last_ok_at, "at": failure.at})


def host_rebooted(history: HostHistory) -> Iterable[Finding]:
    """U3: a reboot is the most-missed cause of a vanished run: nothing in its log says so."""
    now, before = history.current, history.previous
    if now is None or before is None or not now.boot_id or not before.boot_id:
        return
    if now.boot_id != before.boot_id:
        up = f" {now.uptime_s / 60:.0f} min ago" if now.uptime_s is not None else ""
        yield Finding(
            "host.rebooted", Severity.WARNING,
            f"{history.name} rebooted{up} (boot id changed); runs that were on it died with it "
            "— check they were relaunched",
            evidence={"boot_id_before": before.boot_id, "boot_id_now": now.boot_id,
                      "uptime_s": now.uptime_s})


RULES: tuple[Rule, ...] = (host_unreachable, host_rebooted)


def evaluate(history: HostHistory, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every finding of every rule, most severe first."""
    found = [f for rule in rules for f in rule(history)]
    return sorted(found, key=lambda f: (-f.severity, f.code, f.gpu or -1, f.run or ""))


def worst(findings: Iterable[Finding]) -> Severity | None:
    return max((f.severity for f in findings), default=None)
