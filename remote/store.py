"""The local store: SQLite (WAL) under $XDG_STATE_HOME/gpuwatch/.

It is what makes a cron `--once` stateful (a boot id that changed since the last run, a run that
was alive and is now dead) and lets the TUI show what happened overnight. Every write is one
transaction, so a writer killed mid-way leaves the previous state intact; a file that is not a
database any more is moved aside and rebuilt, never fatal (DESIGN §5).

The schema and its migrations (PRAGMA user_version) are store_schema.py's. The watchdog's tables
(leases, restarts, notified) and their methods live in store_watch.py, the timeline's (events,
run spans) in store_timeline.py, retention, rollups, the cap and VACUUM in store_keep.py; Store
inherits them all, and their records are importable from here.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .paths import state_dir
from .store_keep import KeepTables, StorePolicy
from .store_schema import LATEST, StoreTooNew, migrate
from .store_timeline import MESSAGE_MAX, EventRow, RunHold, RunSpan, TimelineTables
from .store_watch import RestartRecord, WatchdogTables

__all__ = ["GPU_SAMPLES_PER_HOST", "SCHEMA_VERSION", "AuditEntry", "EventRow", "FindingRecord",
           "GpuRow", "HostState", "RestartRecord", "RunHold", "RunSpan", "Store", "StorePolicy",
           "StoreTooNew", "default_store_path"]

SCHEMA_VERSION = LATEST
"""The schema this gpuwatch writes (PRAGMA user_version; store_schema.py migrates to it)."""
GPU_SAMPLES_PER_HOST = 20_000
"""The most raw GPU rows one read returns (at one poll per 10 s and 8 GPUs, about 7 hours);
what is kept, and for how long, is store_keep.py's."""
QUICK_CHECK_MAX_BYTES = 16 << 20
"""A file up to this size is checked whole on opening (quick_check reads every page: a
second or more for a month's store); a bigger one is checked before each VACUUM, and a bad
page met meanwhile is that write's error, never fatal."""



def default_store_path(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/gpuwatch/gpuwatch.sqlite3 (XDG's default ~/.local/state when unset)."""
    return state_dir(env) / "gpuwatch.sqlite3"


@dataclass(frozen=True, slots=True)
class HostState:
    """What the store remembers of a host between polls (and between gpuwatch runs)."""

    host: str
    taken_at: float
    ok: bool
    error: Mapping[str, str] | None
    last_ok_at: float | None
    boot_id: str | None
    doc: bytes | None
    """The probe's JSON document of the last good poll, as it came off the wire."""
    counters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU sample for the history table."""

    t: float
    gpu: int
    util_pct: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    mem_used_mib: float | None
    throttle: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit log: who asked for what, on which process or run, and the result."""

    id: int
    at: float
    who: str
    host: str
    action: str
    phase: str
    targets: tuple[Mapping[str, Any], ...]
    command: str | None
    outcome: str
    ok: bool | None
    message: str


class Store(WatchdogTables, TimelineTables, KeepTables):
    """One SQLite file shared by the TUI and cron runs (WAL lets them read while one writes).
    The watchdog's methods (take_lease, record_restart, notified, ...) come from WatchdogTables,
    the timeline's (events, run_spans) from TimelineTables, maintain from KeepTables."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, *,
                 warning: str | None = None) -> None:
        self._conn = conn
        self._maintained: dict[str, float] = {}
        self._spans: dict[tuple[str, str], tuple[float, float, list[int], list[int]]] = {}
        self._powers: dict[str, tuple[float, dict[int, float | None]]] = {}
        self.path = path
        self.warning = warning
        """Said once to the person when the file had to be rebuilt or could not be used."""

    @classmethod
    def open(cls, path: Path | str | None = None) -> Store:
        """Open (creating or rebuilding as needed). `":memory:"` gives a throwaway store."""
        if path == ":memory:":
            return cls(_memory(), None)
        target = Path(path) if path is not None else default_store_path()
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            return cls(_connect(target), target)
        except StoreTooNew as exc:  # not ours to rebuild: keep it, work from memory this time
            return cls(_memory(), None, warning=f"{target}: {exc}; history is not kept this run")
        except sqlite3.OperationalError as exc:
            # Locked, busy, unopenable, a full disk: the file may be whole and another process
            # may be using it. Never moved aside for that; this run works from memory.
            return cls(_memory(), None,
                       warning=f"{target} could not be used ({exc}); history is not kept "
                               f"this run")
        except (sqlite3.DatabaseError, OSError) as exc:
            aside = target.with_name(f"{target.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(f"{target}{suffix}")
                if src.exists():
                    os.replace(src, f"{aside}{suffix}")
            return cls(_connect(target), target,
                       warning=f"{target} was unreadable ({exc}); moved to {aside}, started anew")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- host state ----------------------------------------------------------------------
    def host_state(self, host: str) -> HostState | None:
        row = self._conn.execute(
            "SELECT host, taken_at, ok, error, last_ok_at, boot_id, doc, counters "
            "FROM host_state WHERE host = ?", (host,)).fetchone()
        if row is None:
            return None
        return HostState(
            host=row[0], taken_at=row[1], ok=bool(row[2]),
            error=json.loads(row[3]) if row[3] else None, last_ok_at=row[4], boot_id=row[5],
            doc=zlib.decompress(row[6]) if row[6] else None, counters=json.loads(row[7]))

    def hosts(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT host FROM host_state ORDER BY host")]

    def record_poll(self, host: str, *, taken_at: float, ok: bool,
                    error: Mapping[str, str] | None = None, boot_id: str | None = None,
                    doc: bytes | None = None, counters: Mapping[str, Any] | None = None,
                    gpu_rows: Iterable[GpuRow] = (), runs: Mapping[str, RunHold] | None = None,
                    gap_s: float | None = None) -> None:
        """Remember one poll. A failed poll keeps the last good document, boot id and counters
        (its data is stale, not gone); so does a good one given no counters. The timeline gets
        what changed (unreachable, answering again, rebooted), and each live run in `runs`
        its span (store_timeline.py; `gap_s`: the longest step integrated)."""
        rows = list(gpu_rows)
        with self._conn:  # one transaction: a killed writer leaves the previous state whole
            prev = self._conn.execute(
                "SELECT taken_at, ok, last_ok_at, boot_id FROM host_state WHERE host = ?",
                (host,)).fetchone()
            self._note_transitions(host, prev, at=taken_at, ok=ok, boot_id=boot_id, error=error)
            if ok:
                self._conn.execute(
                    "INSERT INTO host_state (host, taken_at, ok, error, last_ok_at, boot_id, doc, "
                    "counters) VALUES (?, ?, 1, NULL, ?, ?, ?, ?) ON CONFLICT(host) DO UPDATE SET "
                    "taken_at = excluded.taken_at, ok = 1, error = NULL, "
                    "last_ok_at = excluded.last_ok_at, boot_id = excluded.boot_id, "
                    "doc = excluded.doc, "
                    "counters = COALESCE(?, host_state.counters)",
                    (host, taken_at, taken_at, boot_id,
                     zlib.compress(doc) if doc is not None else None,
                     json.dumps(dict(counters or {}), sort_keys=True),
                     None if counters is None else json.dumps(dict(counters), sort_keys=True)))
            else:
                self._conn.execute(
                    "INSERT INTO host_state (host, taken_at, ok, error) VALUES (?, ?, 0, ?) "
                    "ON CONFLICT(host) DO UPDATE SET taken_at = excluded.taken_at, ok = 0, "
                    "error = excluded.error",
                    (host, taken_at, json.dumps(dict(error or {}), sort_keys=True)))
            if rows:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO gpu_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(host, r.t, r.gpu, r.util_pct, r.sm_clock_mhz, r.sm_clock_max_mhz,
                      r.power_w, r.power_limit_w, r.temp_c, r.mem_used_mib, ",".join(r.throttle))
                     for r in rows])
            if ok and runs:
                same_boot = prev is None or not prev[3] or not boot_id or prev[3] == boot_id
                self._note_spans(host, taken_at, runs, {r.gpu: r.power_w for r in rows},
                                 same_boot=same_boot, gap_s=gap_s)

    def save_runs(self, host: str, runs: Mapping[str, tuple[Mapping[str, Any],
                                                             Mapping[str, Any] | None]]) -> None:
        """Remember each run's state (offsets, so a restart of gpuwatch does not re-read whole
        event files) and, when given, its series."""
        with self._conn:
            for name, (state, points) in runs.items():
                blob = (zlib.compress(json.dumps(points, separators=(",", ":")).encode())
                        if points is not None else None)
                self._conn.execute(
                    "INSERT INTO run_state (host, run, state, points) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(host, run) DO UPDATE SET state = excluded.state, "
                    "points = COALESCE(excluded.points, run_state.points)",
                    (host, name, json.dumps(dict(state)), blob))

    def runs(self, host: str) -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
        """Each remembered run of a host: (state, points or None). Unreadable rows are skipped."""
        out: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
        for name, state, blob in self._conn.execute(
                "SELECT run, state, points FROM run_state WHERE host = ?", (host,)):
            try:
                points = json.loads(zlib.decompress(blob)) if blob else None
                out[name] = (json.loads(state), points)
            except (ValueError, zlib.error):
                continue
        return out

    # --- audit log (append-only: rows are added, never changed or pruned) -----------------
    def record_action(self, *, who: str, host: str, action: str, phase: str,
                      targets: Iterable[Mapping[str, Any]], command: str | None, outcome: str,
                      ok: bool | None, message: str, at: float | None = None) -> int:
        """Append one action (or its verification) to the audit log; returns its id."""
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO audit (at, who, host, action, phase, targets, command, outcome, ok, "
                "message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (time.time() if at is None else at, who, host, action, phase,
                 json.dumps([dict(t) for t in targets], sort_keys=True), command, outcome,
                 None if ok is None else int(ok), message))
        return int(cur.lastrowid or 0)

    def audit_log(self, host: str | None = None, *, limit: int = 1000,
                  since: float | None = None) -> list[AuditEntry]:
        """The newest `limit` audit rows (of one host, or all; since: at or after it), oldest
        first."""
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if host is not None:
            where.append("host = ?")
            args.append(host)
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        rows = self._conn.execute(
            "SELECT id, at, who, host, action, phase, targets, command, outcome, ok, message "
            f"FROM (SELECT * FROM audit WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?) "
            "ORDER BY id", (*args, limit)).fetchall()
        out = []
        for r in rows:
            try:
                targets = tuple(t for t in json.loads(r[6]) if isinstance(t, dict))
            except ValueError:
                targets = ()
            out.append(AuditEntry(id=r[0], at=r[1], who=r[2], host=r[3], action=r[4],
                                  phase=r[5], targets=targets, command=r[7], outcome=r[8],
                                  ok=None if r[9] is None else bool(r[9]), message=r[10]))
        return out

    # --- findings ----------------------------------------------------------------------------
    def update_findings(self, host: str, findings: Iterable[Any], at: float, *,
                        clear: bool = True) -> None:
        """Fold one poll's findings in: new ones start (first_seen = at), held ones get
        last_seen = at, ones not seen any more are cleared at `at` (not when clear=False: a
        failed poll's data is stale, not gone); one that comes back after clearing starts
        anew. Each start, change of severity and clearing is an event of the timeline.
        `findings` are remote.findings.Finding objects."""
        with self._conn:
            holding = {tuple(r[:5]): r[5] for r in self._conn.execute(
                "SELECT host, code, gpu, run, subject, severity FROM findings "
                "WHERE host = ? AND cleared_at IS NULL", (host,))}
            seen = set()
            for f in findings:
                key = (host, f.code, -1 if f.gpu is None else f.gpu, f.run or "",
                       getattr(f, "subject", None) or "")
                if key in seen:
                    continue
                seen.add(key)
                evidence = json.dumps(dict(f.evidence), sort_keys=True, default=str)
                self._conn.execute(
                    "INSERT INTO findings (host, code, gpu, run, subject, severity, message, "
                    "evidence, first_seen, last_seen, cleared_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL) "
                    "ON CONFLICT(host, code, gpu, run, subject) DO UPDATE SET "
                    "severity = excluded.severity, message = excluded.message, "
                    "evidence = excluded.evidence, last_seen = excluded.last_seen, "
                    "first_seen = CASE WHEN findings.cleared_at IS NULL "
                    "THEN findings.first_seen ELSE excluded.first_seen END, cleared_at = NULL",
                    (*key, f.severity.label, f.message, evidence, at, at))
                was = holding.get(key)
                if was is None or was != f.severity.label:
                    self._finding_event(key, at, "finding" if was is None else "changed",
                                        f.severity.label, f.message, evidence)
            for key in holding if clear else ():
                if key not in seen:
                    self._conn.execute(
                        "UPDATE findings SET cleared_at = ? WHERE host = ? AND code = ? "
                        "AND gpu = ? AND run = ? AND subject = ?", (at, *key))
                    self._finding_event(key, at, "cleared", holding[key], "", "{}")

    def _finding_event(self, key: tuple[Any, ...], at: float, kind: str, severity: str,
                       message: str, evidence: str) -> None:
        host, code, gpu, run, subject = key
        if kind == "cleared":
            row = self._conn.execute(
                "SELECT message FROM findings WHERE host = ? AND code = ? AND gpu = ? AND "
                "run = ? AND subject = ?", key).fetchone()
            message = f"cleared: {row[0]}" if row is not None else "cleared"
        self._conn.execute(
            "INSERT INTO events (host, at, kind, code, run, gpu, subject, severity, message, "
            "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (host, at, kind, code, run, gpu, subject, severity, message[:MESSAGE_MAX], evidence))

    def findings(self, host: str | None = None, *, active: bool | None = None,
                 since: float | None = None) -> list[FindingRecord]:
        """Findings of one host (or all): active=True only those holding, False only cleared
        ones; since: only those seen at or after it. Newest first."""
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if host is not None:
            where.append("host = ?")
            args.append(host)
        if active is not None:
            where.append("cleared_at IS NULL" if active else "cleared_at IS NOT NULL")
        if since is not None:
            where.append("last_seen >= ?")
            args.append(since)
        rows = self._conn.execute(
            "SELECT host, code, gpu, run, subject, severity, message, evidence, first_seen, "
            f"last_seen, cleared_at FROM findings WHERE {' AND '.join(where)} "
            "ORDER BY last_seen DESC, first_seen DESC", args).fetchall()
        out = []
        for r in rows:
            try:
                evidence = json.loads(r[7])
            except ValueError:
                evidence = {}
            out.append(FindingRecord(
                host=r[0], code=r[1], gpu=None if r[2] == -1 else r[2], run=r[3] or None,
                subject=r[4] or None, severity=r[5], message=r[6],
                evidence=evidence if isinstance(evidence, dict) else {}, first_seen=r[8],
                last_seen=r[9], cleared_at=r[10]))
        return out

    # --- acknowledged deaths ---------------------------------------------------------------
    ACKS_KEPT = 20
    """Acks kept per run (the newest): one covers one death; older deaths are long settled."""

    def acknowledge(self, host: str, run: str, *, pids: Iterable[int], who: str, at: float,
                    reason: str = "acknowledged") -> None:
        """Record that a run's death (its dead `pids`) is known to a person: it stops being
        critical. `reason` "stopped on request" for a death gpuwatch itself was asked to cause
        (a kill of the run's processes)."""
        with self._conn:
            self._conn.execute(
                "INSERT INTO acks (host, run, pids, who, at, reason) VALUES (?, ?, ?, ?, ?, ?)",
                (host, run, json.dumps(sorted({int(p) for p in pids})), who, at, reason))
            self._conn.execute(
                "DELETE FROM acks WHERE host = ? AND run = ? AND id NOT IN (SELECT id FROM acks "
                "WHERE host = ? AND run = ? ORDER BY id DESC LIMIT ?)",
                (host, run, host, run, self.ACKS_KEPT))

    def acks(self, host: str) -> list[dict[str, Any]]:
        """The host's acks, oldest first: {run, pids, who, at, reason} each."""
        out = []
        for run, pids, who, at, reason in self._conn.execute(
                "SELECT run, pids, who, at, reason FROM acks WHERE host = ? ORDER BY id",
                (host,)):
            try:
                listed = json.loads(pids)
            except ValueError:
                listed = []
            out.append({"run": run, "pids": [p for p in listed if isinstance(p, int)]
                        if isinstance(listed, list) else [], "who": who, "at": at,
                        "reason": reason})
        return out

    # --- launches of discovered runs -------------------------------------------------
    def save_launch(self, host: str, run: str, launch: Mapping[str, Any], at: float) -> None:
        """Record how a run was started (remote.discovered.LaunchRecord.to_json()), replacing
        the previous launch of that run. Secret-named variables never reach this (U34)."""
        with self._conn:
            self._conn.execute(
                "INSERT INTO launches (host, run, recorded_at, launch) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(host, run) DO UPDATE SET recorded_at = excluded.recorded_at, "
                "launch = excluded.launch",
                (host, run, at, json.dumps(dict(launch), sort_keys=True)))

    def launch(self, host: str, run: str) -> tuple[float, dict[str, Any]] | None:
        """(recorded_at, launch) of a run's last recorded launch; None if none (or unreadable)."""
        row = self._conn.execute("SELECT recorded_at, launch FROM launches WHERE host = ? AND "
                                 "run = ?", (host, run)).fetchone()
        try:
            value = json.loads(row[1]) if row is not None else None
        except ValueError:
            return None
        return (row[0], value) if isinstance(value, dict) else None

    # --- run deaths (U3) ----------------------------------------------------------------------
    def save_deaths(self, host: str, deaths: Mapping[str, Mapping[str, Any]],
                    rank_deaths: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Replace a host's remembered diagnoses (each `Diagnosis.state()`)."""
        with self._conn:
            self._conn.execute("DELETE FROM run_deaths WHERE host = ?", (host,))
            for kind, table in (("dead", deaths), ("rank_dead", rank_deaths or {})):
                for run, state in table.items():
                    self._conn.execute(
                        "INSERT INTO run_deaths (host, run, kind, diagnosis) VALUES (?, ?, ?, ?)",
                        (host, run, kind, json.dumps(dict(state), sort_keys=True, default=str)))

    def deaths(self, host: str, kind: str = "dead") -> dict[str, dict[str, Any]]:
        out = {}
        for run, raw in self._conn.execute(
                "SELECT run, diagnosis FROM run_deaths WHERE host = ? AND kind = ?", (host, kind)):
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict):
                out[run] = value
        return out

    def gpu_rollups(self, host: str, span: int, *, since: float = 0.0,
                    until: float = float("inf")) -> list[GpuRow]:
        """A host's rolled-up GPU rows (store_keep.py) of one span (60 or 3600 s), oldest
        first; t is the bucket's start, the values its averages and maxima."""
        rows = self._conn.execute(
            "SELECT t, gpu, util_pct, sm_clock_mhz, sm_clock_max_mhz, power_w, power_limit_w, "
            "temp_c, mem_used_mib, throttle FROM gpu_rollups WHERE host = ? AND span = ? AND "
            "t >= ? AND t <= ? ORDER BY t, gpu", (host, span, since, until)).fetchall()
        return [GpuRow(t=r[0], gpu=r[1], util_pct=r[2], sm_clock_mhz=r[3], sm_clock_max_mhz=r[4],
                       power_w=r[5], power_limit_w=r[6], temp_c=r[7], mem_used_mib=r[8],
                       throttle=tuple(filter(None, (r[9] or "").split(","))))
                for r in rows]

    def gpu_poll_before(self, host: str, at: float) -> list[GpuRow]:
        """The raw GPU rows of the host's last poll at or before `at` (none kept: [])."""
        (t,) = self._conn.execute("SELECT MAX(t) FROM gpu_samples WHERE host = ? AND t <= ?",
                                  (host, at)).fetchone()
        if t is None:
            return []
        rows = self._conn.execute(
            "SELECT t, gpu, util_pct, sm_clock_mhz, sm_clock_max_mhz, power_w, power_limit_w, "
            "temp_c, mem_used_mib, throttle FROM gpu_samples WHERE host = ? AND t = ? "
            "ORDER BY gpu", (host, t)).fetchall()
        return [GpuRow(t=r[0], gpu=r[1], util_pct=r[2], sm_clock_mhz=r[3], sm_clock_max_mhz=r[4],
                       power_w=r[5], power_limit_w=r[6], temp_c=r[7], mem_used_mib=r[8],
                       throttle=tuple(filter(None, (r[9] or "").split(","))))
                for r in rows]

    def gpu_history(self, host: str, *, since: float = 0.0,
                    limit: int = GPU_SAMPLES_PER_HOST) -> list[GpuRow]:
        """GPU samples of a host, oldest first."""
        rows = self._conn.execute(
            "SELECT t, gpu, util_pct, sm_clock_mhz, sm_clock_max_mhz, power_w, power_limit_w, "
            "temp_c, mem_used_mib, throttle FROM (SELECT * FROM gpu_samples WHERE host = ? AND "
            "t >= ? ORDER BY t DESC, gpu DESC LIMIT ?) ORDER BY t, gpu",
            (host, since, limit)).fetchall()
        return [GpuRow(t=r[0], gpu=r[1], util_pct=r[2], sm_clock_mhz=r[3], sm_clock_max_mhz=r[4],
                       power_w=r[5], power_limit_w=r[6], temp_c=r[7], mem_used_mib=r[8],
                       throttle=tuple(filter(None, (r[9] or "").split(","))))
                for r in rows]


@dataclass(frozen=True, slots=True)
class FindingRecord:
    """One finding's life in the store (times are this machine's clock)."""

    host: str
    code: str
    gpu: int | None
    run: str | None
    subject: str | None
    severity: str
    message: str
    evidence: dict[str, Any]
    first_seen: float
    last_seen: float
    cleared_at: float | None

    @property
    def active(self) -> bool:
        return self.cleared_at is None


def _memory() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    _init(conn)
    return conn


def _connect(path: Path) -> sqlite3.Connection:
    fresh = not path.exists()
    if fresh:  # the store may hold how runs were started; keep it private
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    conn = sqlite3.connect(path, timeout=5.0, isolation_level="DEFERRED")
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        # Reading the header and schema finds a file that is no database; a whole check of
        # a big file would cost seconds at every start (QUICK_CHECK_MAX_BYTES).
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        if path.stat().st_size <= QUICK_CHECK_MAX_BYTES:
            (status,) = conn.execute("PRAGMA quick_check").fetchone()
            if status != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {status}")
        _init(conn)
    except (sqlite3.DatabaseError, StoreTooNew):
        conn.close()
        raise
    return conn


def _init(conn: sqlite3.Connection) -> None:
    migrate(conn)
