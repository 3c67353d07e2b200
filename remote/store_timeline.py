"""The timeline's part of the local store: events, and which GPUs each run held when.

`events` is append-only: a finding's appearance, change of severity and clearing (written by
Store.update_findings), a host's reboot, its polls failing and answering again, a run seen
running with new processes (written by Store.record_poll, in the poll's own transaction). The
audit log and the watchdog's restarts are events too; remote/timeline.py reads all three as one
timeline. `run_spans` keeps, per run, the spans of polls in which the same processes held the
same GPUs, with the power of those GPUs integrated over the span as it grows (trapezoid between
two polls; a step longer than the gap limit is a gap, counted and not integrated): what a run's
report sums into GPU-hours and energy without reading a month of samples.

Store (remote/store.py) inherits TimelineTables; like it, this imports nothing of gpuwatch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EVENT_KINDS = ("finding", "changed", "cleared", "started", "reboot", "unreachable", "reachable")
"""What the events table holds (remote/timeline.py adds the audit log's and the restarts')."""
MESSAGE_MAX = 2000
"""An event's message is cut to this (a finding's message quotes box text)."""


@dataclass(frozen=True, slots=True)
class EventRow:
    """One row of the events table (times are this machine's clock)."""

    id: int
    host: str
    at: float
    kind: str
    code: str | None
    run: str | None
    gpu: int | None
    subject: str | None
    severity: str | None
    message: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunSpan:
    """Polls in a row in which a run's same processes held the same GPUs."""

    host: str
    run: str
    start: float
    end: float
    pids: tuple[int, ...]
    gpus: tuple[int, ...]
    polls: int
    energy_j: float
    """Their power integrated over the measured part of the span (joules)."""
    measured_s: float
    """Of end - start, the seconds integrated (both ends' power known, no gap between)."""
    segments: int
    gaps: int
    """Steps between two polls longer than the gap limit, or without a GPU's power."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class RunHold:
    """What one poll saw of a live run: its processes and the GPUs they held."""

    pids: tuple[int, ...]
    gpus: tuple[int, ...]


class TimelineTables:
    """The events and run spans methods of Store (a mixin: Store owns the connection)."""

    _conn: sqlite3.Connection
    _spans: dict[tuple[str, str], tuple[float, float, list[int], list[int]]]
    """Each run's last span (start, end, pids, gpus), as this process last wrote or read it."""
    _powers: dict[str, tuple[float, dict[int, float | None]]]
    """Each host's last poll's time and GPUs' power, as this process wrote it."""

    def add_event(self, host: str, at: float, kind: str, *, code: str = "", run: str = "",
                  gpu: int | None = None, subject: str = "", severity: str = "",
                  message: str = "", detail: Mapping[str, Any] | None = None) -> None:
        """Append one event (inside the caller's transaction, if one is open)."""
        self._conn.execute(
            "INSERT INTO events (host, at, kind, code, run, gpu, subject, severity, message, "
            "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (host, at, kind, code, run, -1 if gpu is None else gpu, subject, severity,
             message[:MESSAGE_MAX],
             json.dumps(dict(detail or {}), sort_keys=True, default=str)))

    def events(self, *, since: float = float("-inf"), until: float = float("inf"),
               host: str | None = None, run: str | None = None,
               limit: int = 100_000) -> list[EventRow]:
        """Events from `since` to `until` (of one host, of one run and its host's own), oldest
        first, the newest `limit` of them."""
        where = ["at >= ?", "at <= ?"]
        args: list[Any] = [since, until]
        if host is not None:
            where.append("host = ?")
            args.append(host)
        if run is not None:
            where.append("(run = ? OR run = '')")
            args.append(run)
        rows = self._conn.execute(
            "SELECT id, host, at, kind, code, run, gpu, subject, severity, message, detail FROM "
            f"(SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY at DESC, id DESC "
            "LIMIT ?) ORDER BY at, id", (*args, limit)).fetchall()
        out = []
        for r in rows:
            try:
                detail = json.loads(r[10])
            except ValueError:
                detail = {}
            out.append(EventRow(id=r[0], host=r[1], at=r[2], kind=r[3], code=r[4] or None,
                                run=r[5] or None, gpu=None if r[6] == -1 else r[6],
                                subject=r[7] or None, severity=r[8] or None, message=r[9],
                                detail=detail if isinstance(detail, dict) else {}))
        return out

    # -- what record_poll notes, in its transaction -------------------------------------------
    def _note_transitions(self, host: str, prev: Sequence[Any] | None, *, at: float, ok: bool,
                          boot_id: str | None, error: Mapping[str, str] | None) -> None:
        """A poll that failed after a good one (or a host never reached), a good one after
        failures (with how long it was down), a boot id that changed. `prev`: the host's
        host_state row before this poll (taken_at, ok, last_ok_at, boot_id) or None."""
        was_ok = bool(prev[1]) if prev is not None else None
        if not ok and was_ok is not False:
            said = dict(error or {})
            self.add_event(host, at, "unreachable", severity="warning",
                           message=f"not answering: {said.get('kind', 'error')}: "
                                   f"{said.get('message', '')}".rstrip(": "),
                           detail={"error": said,
                                   "last_ok_at": prev[2] if prev is not None else None})
        elif ok and was_ok is False:
            assert prev is not None
            since = self._down_since(host, prev)
            down = at - since if since is not None else None
            self.add_event(host, at, "reachable", severity="info",
                           message="answering again" + (f" after {_span(down)}"
                                                        if down is not None else ""),
                           detail={"down_since": since, "down_s": down})
        if ok and prev is not None and prev[3] and boot_id and prev[3] != boot_id:
            self.add_event(host, at, "reboot", severity="warning",
                           message="the box rebooted (its boot id changed)",
                           detail={"boot_id_before": prev[3], "boot_id": boot_id})

    def _down_since(self, host: str, prev: Sequence[Any]) -> float | None:
        row = self._conn.execute(
            "SELECT at FROM events WHERE host = ? AND kind = 'unreachable' ORDER BY at DESC, "
            "id DESC LIMIT 1", (host,)).fetchone()
        if row is not None and (prev[2] is None or row[0] >= prev[2]):
            return float(row[0])
        return float(prev[0]) if prev[0] is not None else None

    def _note_spans(self, host: str, at: float, runs: Mapping[str, RunHold],
                    power: Mapping[int, float | None], *, same_boot: bool,
                    gap_s: float | None) -> None:
        """Extend each live run's span (same processes, same GPUs, same boot) with this poll,
        integrating its GPUs' power since the span's last poll; else start a new span (and
        say so where its processes are new). The last span of each run and the last poll's
        power are kept in memory between polls (one UPDATE a run a poll); the UPDATE names the
        span's end it read, so a span another gpuwatch moved on is read again, never lost."""
        for name, hold in runs.items():
            pids = sorted(set(hold.pids))
            gpus = sorted(set(hold.gpus))
            for fresh in (False, True):
                if self._extend_span(host, name, at, pids, gpus, power, same_boot=same_boot,
                                     gap_s=gap_s, fresh=fresh):
                    break
        self._powers[host] = (at, dict(power))

    def _extend_span(self, host: str, name: str, at: float, pids: list[int], gpus: list[int],
                     power: Mapping[int, float | None], *, same_boot: bool,
                     gap_s: float | None, fresh: bool) -> bool:
        """One run's part of _note_spans; False when the kept span was stale (read again)."""
        key = (host, name)
        last = None if fresh else self._spans.get(key)
        if last is None:
            row = self._conn.execute(
                "SELECT start, end, pids, gpus FROM run_spans WHERE host = ? AND run = ? "
                "ORDER BY start DESC LIMIT 1", (host, name)).fetchone()
            last = (row[0], row[1], _ints(row[2]), _ints(row[3])) if row is not None else None
        start, end, last_pids, last_gpus = last if last is not None else (None, None, None, None)
        if last is not None and same_boot and last_pids == pids and last_gpus == gpus:
            assert start is not None and end is not None
            step = at - end
            if step <= 0:  # this poll's time again (or the clock went back): nothing new
                return True
            kept = self._powers.get(host)
            then = kept[1] if kept is not None and kept[0] == end else dict(
                self._conn.execute("SELECT gpu, power_w FROM gpu_samples WHERE host = ? AND "
                                   "t = ?", (host, end)).fetchall())
            watts = [(then.get(g), power.get(g)) for g in gpus]
            known = bool(gpus) and all(a is not None and b is not None for a, b in watts)
            if known and (gap_s is None or step <= gap_s):
                joules = sum((a + b) / 2 * step for a, b in watts
                             if a is not None and b is not None)
                cur = self._conn.execute(
                    "UPDATE run_spans SET end = ?, polls = polls + 1, energy_j = energy_j + ?, "
                    "measured_s = measured_s + ?, segments = segments + 1 WHERE host = ? AND "
                    "run = ? AND start = ? AND end = ?", (at, joules, step, host, name, start, end))
            else:
                cur = self._conn.execute(
                    "UPDATE run_spans SET end = ?, polls = polls + 1, gaps = gaps + ? WHERE "
                    "host = ? AND run = ? AND start = ? AND end = ?",
                    (at, 1 if gpus else 0, host, name, start, end))
            if cur.rowcount != 1:
                self._spans.pop(key, None)
                return fresh  # read it again (once)
            self._spans[key] = (start, at, pids, gpus)
            return True
        self._conn.execute(
            "INSERT OR REPLACE INTO run_spans (host, run, start, end, pids, gpus) "
            "VALUES (?, ?, ?, ?, ?, ?)", (host, name, at, at, json.dumps(pids), json.dumps(gpus)))
        self._spans[key] = (at, at, pids, gpus)
        if last_pids != pids or not same_boot:
            on = f" on GPU{'s' * (len(gpus) != 1)} {_list(gpus)}" if gpus else ""
            self.add_event(host, at, "started", run=name, severity="info",
                           message=f"run {name} running: pid{'s' * (len(pids) != 1)} "
                                   f"{_list(pids)}{on}",
                           detail={"pids": pids, "gpus": gpus, "pids_before": last_pids})
        return True

    def run_spans(self, host: str, run: str | None = None, *, since: float = float("-inf"),
                  until: float = float("inf")) -> list[RunSpan]:
        """The spans of a host's runs (or one run) that overlap [since, until], oldest first."""
        where = ["host = ?", "end >= ?", "start <= ?"]
        args: list[Any] = [host, since, until]
        if run is not None:
            where.append("run = ?")
            args.append(run)
        rows = self._conn.execute(
            "SELECT host, run, start, end, pids, gpus, polls, energy_j, measured_s, segments, "
            f"gaps FROM run_spans WHERE {' AND '.join(where)} ORDER BY start", args).fetchall()
        return [RunSpan(host=r[0], run=r[1], start=r[2], end=r[3], pids=tuple(_ints(r[4])),
                        gpus=tuple(_ints(r[5])), polls=r[6], energy_j=r[7], measured_s=r[8],
                        segments=r[9], gaps=r[10]) for r in rows]


def _ints(text: str) -> list[int]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return sorted(v for v in value if isinstance(v, int)) if isinstance(value, list) else []


def _list(numbers: Iterable[int]) -> str:
    return ", ".join(map(str, numbers))


def _span(seconds: float) -> str:
    """A duration in words: 45 s, 12 min, 1 h 05 min, 2 d 3 h."""
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86_400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86_400} d {s % 86_400 // 3600} h"
