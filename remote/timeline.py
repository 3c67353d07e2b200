"""The timeline: what happened on the fleet, from the store, as one list oldest first.

Three of the store's tables are events: `events` (a finding's appearance, change of severity and
clearing, a host's reboot, its polls failing and answering again, a run running with new
processes), the audit log (every action a person or the watchdog asked for, and its outcome) and
the watchdog's restarts. `timeline` reads the three for a span of time (a host, or all) and
gives Entries; `text` prints them a line each (for a terminal or a morning mail), `to_json` as
the `gpuwatch events --json` document (docs/json.md). A run's death is the appearance of
run.dead (or run.rank_dead): it is shown as a death, with its cause.

Box text (finding messages quote command lines and paths) goes through textsafe.visible before
a terminal; the JSON needs nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .store import AuditEntry, EventRow, RestartRecord, Store
from .textsafe import visible
from .units import duration as fmt_dur

SCHEMA = "gpuwatch/1"
DEATH_CODES = ("run.dead", "run.rank_dead")
"""Findings whose appearance is a death (their evidence says the cause)."""
KINDS = ("finding", "changed", "cleared", "death", "started", "reboot", "unreachable",
         "reachable", "action", "restart")
"""Every kind an entry can be (docs/json.md, docs/history.md)."""
RESTART_SEVERITY = {"gave_up": "critical", "failed": "warning", "hung_killed": "warning"}


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing that happened, at one time (this machine's clock), on one host."""

    at: float
    host: str
    kind: str
    """One of KINDS."""
    severity: str | None
    message: str
    code: str | None = None
    run: str | None = None
    gpu: int | None = None
    who: str | None = None
    """Who acted (an action, a restart)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    order: int = 0
    """Ties at one time keep the order they were written in."""

    def to_json(self) -> dict[str, Any]:
        return {"at": round(self.at, 3), "host": self.host, "kind": self.kind,
                "severity": self.severity, "code": self.code, "run": self.run, "gpu": self.gpu,
                "who": self.who, "message": self.message, "detail": dict(self.detail)}


def timeline(store: Store, *, since: float, until: float = float("inf"),
             host: str | None = None, run: str | None = None) -> list[Entry]:
    """Everything the store says happened from `since` to `until` (of one host; of one run,
    with its host's own events), oldest first."""
    entries = [_of_event(e) for e in store.events(since=since, until=until, host=host, run=run)]
    entries += [_of_action(a) for a in store.audit_log(host, limit=100_000, since=since)
                if a.at <= until and (run is None or _action_run(a) in (run, None))]
    entries += [_of_restart(r) for r in store.restarts_since(since, host)
                if r.at <= until and (run is None or r.run == run)]
    kinds = {k: i for i, k in enumerate(KINDS)}
    return sorted(entries, key=lambda e: (e.at, e.order, kinds.get(e.kind, 0)))


def _of_event(e: EventRow) -> Entry:
    kind = "death" if e.kind == "finding" and e.code in DEATH_CODES else e.kind
    return Entry(at=e.at, host=e.host, kind=kind, severity=e.severity, message=e.message,
                 code=e.code, run=e.run, gpu=e.gpu, detail=e.detail, order=e.id)


def _action_run(a: AuditEntry) -> str | None:
    runs = {t.get("run") for t in a.targets if isinstance(t.get("run"), str)}
    return next(iter(runs)) if len(runs) == 1 else None


def _of_action(a: AuditEntry) -> Entry:
    pids = [str(t["pid"]) for t in a.targets if isinstance(t.get("pid"), int)]
    what = f" pid {', '.join(pids)}" if pids else ""
    run = _action_run(a)
    what += f" run {run}" if run else ""
    severity = "warning" if a.ok is False else "info"
    phase = "verified" if a.phase == "verify" else a.outcome
    return Entry(at=a.at, host=a.host, kind="action", severity=severity, who=a.who, run=run,
                 message=f"{a.action}{what} by {a.who}: {phase}: {a.message}",
                 detail={"action": a.action, "phase": a.phase, "outcome": a.outcome,
                         "ok": a.ok, "command": a.command, "targets": list(a.targets)},
                 order=a.id)


def _of_restart(r: RestartRecord) -> Entry:
    return Entry(at=r.at, host=r.host, kind="restart",
                 severity=RESTART_SEVERITY.get(r.outcome, "info"), run=r.run,
                 who=r.holder.split("@")[0], message=f"watchdog, run {r.run}: "
                 f"{r.outcome.replace('_', ' ')}: {r.message}",
                 detail={"outcome": r.outcome, "death": r.death, "holder": r.holder},
                 order=r.id)


# --- words -----------------------------------------------------------------------------------

def clock(at: float, *, date: bool = True) -> str:
    """A time of this machine, as a person reads it here."""
    return datetime.fromtimestamp(at).astimezone().strftime(
        "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")


def line(e: Entry, *, host_width: int = 0) -> str:
    """One entry in one line: time, host, severity, kind, what (box text made visible)."""
    # what got better reads "ok", whatever the severity it had (the JSON keeps that)
    sev = "OK" if e.kind in ("cleared", "reachable") else (e.severity or "").upper()
    message = e.message
    if e.kind == "death":
        cause = e.detail.get("cause")
        message = f"[{cause}] {message}" if isinstance(cause, str) else message
    elif e.kind == "reachable":
        down = e.detail.get("down_s")
        message = (f"answering again after {fmt_dur(down)} unreachable"
                   if isinstance(down, (int, float)) else message)
    elif e.code:
        message = f"{e.code}: {message}"
    return visible(f"{clock(e.at)}  {e.host.ljust(host_width)}  {sev:8}  {e.kind:11}  "
                   f"{message}")


def text(entries: Sequence[Entry], *, since: float, host: str | None = None) -> str:
    """The timeline for a terminal or a mail: a summary line, then an entry a line."""
    hosts = sorted({e.host for e in entries})
    deaths = sum(e.kind == "death" for e in entries)
    where = f" on {visible(host)}" if host else (
        f" on {len(hosts)} host{'s' * (len(hosts) != 1)}" if hosts else "")
    head = (f"gpuwatch events since {clock(since)}{where}: {len(entries)} event"
            f"{'s' * (len(entries) != 1)}, {deaths} death{'s' * (deaths != 1)}")
    if not entries:
        return head + "\nnothing happened\n"
    width = max(len(h) for h in hosts)
    return "\n".join([head, "", *(line(e, host_width=width) for e in entries)]) + "\n"


def to_json(entries: Sequence[Entry], *, since: float, host: str | None = None,
            generated_at: float | None = None) -> dict[str, Any]:
    """The `gpuwatch events --json` document (docs/json.md)."""
    return {"schema": SCHEMA, "kind": "events",
            "generated_at": round(time.time() if generated_at is None else generated_at, 3),
            "since": round(since, 3), "host": host,
            "events": [finite(e.to_json()) for e in entries]}


def finite(value: Any) -> Any:
    """A JSON value with every non-finite number as the string "nan", "inf" or "-inf" (a
    finding's evidence may hold one; JSON has no word for it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
