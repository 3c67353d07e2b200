"""One verdict per host: how bad it is, in a few words, and the finding behind it.

Every place that says how a host is doing says this: the fleet's state cell and the host view's
header (tui/), `--once`'s STATE column and `hosts[].verdict` in its JSON, the Prometheus
`gpuwatch_host_severity` gauge, `check`'s lines and the notifications. It is computed from the
host's findings and the state of its polling, by `verdict_of` alone, so two outputs can never
disagree about a host. Pure: no store, no clock (the caller says how fresh the data is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .model.death import Diagnosis
from .model.finding import Finding, Severity
from .textsafe import visible

FINDING_WORDS = {  # most important first: of two findings of one severity, the cell names it
    "run.dead": "run died", "run.rank_dead": "a rank died", "run.restart_limit": "restarts used up",
    "gpu.lost": "GPU lost", "gpu.query_failed": "GPUs unreadable",
    "gpu.driver_mismatch": "driver mismatch", "gpu.remap_failed": "GPU memory failed",
    "gpu.recovery_action": "GPU needs recovery", "gpu.ecc_uncorrected": "ECC errors",
    "host.unreachable": "unreachable", "host.cgroup_oom": "OOM-killed",
    "run.loss_nan": "loss is NaN", "run.hung": "hung", "run.diverging": "diverging",
    "gpu.xid": "GPU error (Xid)", "run.stalled": "stalled", "gpu.vram_zombie": "VRAM zombie",
    "disk.full_soon": "disk full soon", "disk.low": "disk low", "disk.inodes_low": "inodes low",
    "host.rebooted": "rebooted", "gpu.util_without_clock": "busy, low clock",
    "gpu.throttled": "throttled", "gpu.idle_while_running": "GPU idle",
    "run.sighup_risk": "dies at logout", "host.kill_user_processes": "logout kills runs",
    "ckpt.overdue": "checkpoint overdue", "run.log_buffered": "log silent",
    "ckpt.tmp_leftover": "partial checkpoint", "run.events_empty": "no events",
    "run.code_changed": "code changed", "host.cpu_oversubscribed": "CPU oversubscribed",
    "gpu.persistence_off": "persistence off", "run.slowed": "slowed",
    "gpu.remap_pending": "GPU reset pending", "gpu.hw_slowdown_rate": "HW slowdown",
    "gpu.pcie_degraded": "PCIe degraded", "run.straggler": "straggler",
    "run.overfitting": "overfitting", "run.loss_spike": "loss spikes", "run.plateau": "plateau",
}
"""A finding's code in a few words, for a cell that names a host's worst problem."""

FAILURE_WORDS = {"unreachable": "unreachable", "timeout": "timed out", "auth": "login refused",
                 "host_key": "host key refused", "probe": "probe failed",
                 "config": "config error", "source": "no data from its source"}
"""A failed poll's kind in words, first in the headline (its reason may not fit a cell)."""

STATES = ("ok", "stale", "unreachable", "waiting")
"""How fresh a host's data is: polled fine, old, the last poll failed, not polled yet."""

LEVELS = {None: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}
"""A verdict's severity as a number (Prometheus' gpuwatch_host_severity: 0 ok … 3 critical)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A host's verdict: its severity (None: nothing at info or above), the headline in words,
    the finding's code behind the headline, and how fresh the data is."""

    severity: Severity | None
    headline: str
    code: str | None
    state: str = "ok"
    """ok | stale | unreachable | waiting (STATES)."""
    more: int = 0
    """Further findings at warning or worse than the one the headline names ("+2")."""
    age_s: float | None = None
    """Seconds since the data shown was polled, where the caller knows it."""
    paused: bool = False
    """Old only because polling is paused (state "stale")."""

    @property
    def level(self) -> int:
        return LEVELS[self.severity]

    @property
    def label(self) -> str:
        """ok | info | warning | critical."""
        return "ok" if self.severity is None else self.severity.label

    def to_json(self) -> dict[str, Any]:
        """`hosts[].verdict` of `--once --json` (schema gpuwatch/1, additive)."""
        return {"severity": self.label, "headline": self.headline, "code": self.code,
                "state": self.state}


def finding_words(finding: Finding) -> str:
    """A finding in a few words: FINDING_WORDS', and for a dead run the cause where it is
    known ("run died: OOM-killed"), in the words of the diagnosis the host view shows whole."""
    words = FINDING_WORDS.get(finding.code, finding.code)
    said = finding.evidence.get("diagnosis") if finding.code == "run.dead" else None
    if isinstance(said, Mapping):
        diagnosis = Diagnosis.from_state(said)
        cause = diagnosis.words if diagnosis is not None else None
        if cause:
            words = f"{words}: {cause}"
    return visible(words)


def rank(finding: Finding) -> tuple[int, int]:
    """Where a finding stands among a host's (smaller first): the more severe, then the more
    pressing kind (FINDING_WORDS' order: a dead run before a full disk)."""
    order = list(FINDING_WORDS)
    return (-finding.severity, order.index(finding.code) if finding.code in order
            else len(order))


def failure_words(kind: str | None, message: str | None) -> str:
    """A failed poll in words: its kind first ("login refused: ..."), then what it said."""
    said = FAILURE_WORDS.get(kind or "probe", kind or "probe failed")
    return visible(f"{said}: {message}" if message else said)


def verdict_of(findings: Iterable[Finding], state: str = "ok", *,
               failure: tuple[str | None, str | None] | None = None,
               age_s: float | None = None, paused: bool = False) -> Verdict:
    """The one verdict of a host from its findings and how fresh its data is.

    The worst finding at warning or worse names the headline (of two of one severity, the one
    FINDING_WORDS lists first), whatever the state: the answer first, its age beside it. A
    failed poll (state "unreachable", `failure` its kind and message) says why in the headline.
    Otherwise the state says it: "ok", "stale", "not polled yet"."""
    found = list(findings)
    worst = max((f.severity for f in found), default=None)
    serious = sorted((f for f in found if f.severity >= Severity.WARNING), key=rank)
    if state == "unreachable":
        kind, message = failure or (None, None)
        others = [f for f in serious if f.code != "host.unreachable"]
        return Verdict(max(worst or Severity.CRITICAL, Severity.CRITICAL),
                       failure_words(kind, message), "host.unreachable", state, len(others),
                       age_s, paused)
    if serious:
        top = serious[0]
        return Verdict(worst, finding_words(top), top.code, state, len(serious) - 1, age_s,
                       paused)
    if state == "waiting":
        return Verdict(worst, "not polled yet", None, state, 0, age_s, paused)
    if state == "stale":
        return Verdict(worst, "stale", None, state, 0, age_s, paused)
    return Verdict(worst, "ok", None, state, 0, age_s, paused)
