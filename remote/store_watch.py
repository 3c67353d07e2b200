"""The watchdog's part of the local store: leases, restarts, notified findings.

Store (remote/store.py) inherits WatchdogTables, so callers keep one object and one connection;
this module holds its tables' schema (appended to the store's, one file, one version), their
methods and RestartRecord. actions/restart.py takes leases and counts restarts; notify.py
remembers what it last notified. Like store.py it imports nothing of gpuwatch.

Leases are wall-clock times, as they must be between processes; a clock step must neither end a
live holder's lease early by much nor keep a dead holder's alive: each renewal also records
when it was made (lease_beats), and a lease whose renewal lies more than LEASE_SKEW_S in the
future of the reader's clock (the clock stepped back since) counts as lapsed. Tables added
later are new tables beside the first ones (lease_beats, restart_launches), so an older
gpuwatch on the same store still reads and writes its own.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LEASE_SKEW_S = 10.0
"""How far a renewal may seem to lie in the future before its lease counts as lapsed: a clock
stepped back by more than this ends every lease written before the step (their holders renew
them at once if they live), so a dead watcher's lease is stretched by at most this."""

WATCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (     -- one actor per run (actions/restart.py): who, until
    host TEXT NOT NULL, run TEXT NOT NULL,   -- run '': the host's notifications
    holder TEXT NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (host, run)
);
CREATE TABLE IF NOT EXISTS restarts (   -- the watchdog's restarts, for its window and its limit
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL, run TEXT NOT NULL,
    death TEXT NOT NULL,                 -- which death it answers (the dead pids)
    at REAL NOT NULL, holder TEXT NOT NULL,
    outcome TEXT NOT NULL,               -- sent | verified | failed | gave_up | hung_killed
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_beats (  -- when each lease was last renewed (LEASE_SKEW_S)
    host TEXT NOT NULL, run TEXT NOT NULL, holder TEXT NOT NULL, renewed_at REAL NOT NULL,
    PRIMARY KEY (host, run)
);
CREATE TABLE IF NOT EXISTS restart_launches (  -- what each restart started on the box
    restart_id INTEGER PRIMARY KEY,      -- restarts.id
    token TEXT NOT NULL,                 -- its name in the box's launch marker
    launch TEXT,                         -- JSON: the launch shell's pid, start_ticks, boot_id
    pids TEXT                            -- JSON list: the run's pids once it ran again
);
CREATE TABLE IF NOT EXISTS notified (   -- the last state each finding was notified in
    host TEXT NOT NULL, key TEXT NOT NULL, severity TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (host, key)
);
"""


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """One restart by the watchdog (times are this machine's clock)."""

    id: int
    host: str
    run: str
    death: str
    at: float
    holder: str
    outcome: str
    message: str
    token: str | None = None
    """The launch's name in the box's launch marker (None: a row of an older gpuwatch)."""
    launch: Mapping[str, Any] | None = None
    """What the box answered it started: the launch shell's pid, start_ticks, boot_id,
    session; None until known (a watcher stopped mid-call: the survivor reads the box's)."""
    pids: tuple[int, ...] = ()
    """The run's processes that verified it."""


_RESTART_COLUMNS = ("r.id, r.host, r.run, r.death, r.at, r.holder, r.outcome, r.message, "
                    "l.token, l.launch, l.pids")


def _restart(row: Sequence[Any]) -> RestartRecord:
    launch = _json(row[9])
    pids = _json(row[10])
    return RestartRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                         launch=launch if isinstance(launch, dict) else None,
                         pids=tuple(p for p in pids if isinstance(p, int))
                         if isinstance(pids, list) else ())


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


class WatchdogTables:
    """The watchdog's methods on the store (actions/restart.py, notify.py); a mixin of Store,
    which owns the connection and runs WATCH_SCHEMA with its own."""

    _conn: sqlite3.Connection

    def take_lease(self, host: str, run: str, holder: str, ttl_s: float,
                   now: float | None = None) -> bool:
        """Take or renew the lease on (host, run) for ttl_s; False while another holder's lease
        holds (lease_holds). One IMMEDIATE transaction: two processes never both get it."""
        now = time.time() if now is None else now
        conn = self._conn
        if conn.in_transaction:
            conn.commit()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # locked past the busy timeout: not ours this time
            return False
        try:
            row = self._lease_row(host, run)
            mine = row is None or row[0] == holder or not lease_holds(row[1], row[2], now)
            if mine:
                conn.execute("INSERT INTO leases VALUES (?, ?, ?, ?) ON CONFLICT(host, run) "
                             "DO UPDATE SET holder = excluded.holder, "
                             "expires_at = excluded.expires_at", (host, run, holder, now + ttl_s))
                conn.execute("INSERT INTO lease_beats VALUES (?, ?, ?, ?) ON CONFLICT(host, run) "
                             "DO UPDATE SET holder = excluded.holder, "
                             "renewed_at = excluded.renewed_at", (host, run, holder, now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return mine

    def _lease_row(self, host: str, run: str) -> tuple[str, float, float | None] | None:
        """(holder, expires_at, renewed_at: None when the holder did not record it)."""
        row = self._conn.execute(
            "SELECT l.holder, l.expires_at, b.renewed_at FROM leases l LEFT JOIN lease_beats b "
            "ON b.host = l.host AND b.run = l.run AND b.holder = l.holder "
            "WHERE l.host = ? AND l.run = ?", (host, run)).fetchone()
        return (row[0], row[1], row[2]) if row is not None else None

    def lease(self, host: str, run: str) -> tuple[str, float] | None:
        """(holder, expires_at) of the lease on (host, run), if any (held or lapsed)."""
        row = self._lease_row(host, run)
        return (row[0], row[1]) if row is not None else None

    def lease_holder(self, host: str, run: str, now: float | None = None) -> str | None:
        """Who holds the lease on (host, run) at `now` (default: this clock), if anyone."""
        row = self._lease_row(host, run)
        now = time.time() if now is None else now
        return row[0] if row is not None and lease_holds(row[1], row[2], now) else None

    def release_leases(self, holder: str) -> None:
        with self._conn:
            self._conn.execute("DELETE FROM leases WHERE holder = ?", (holder,))
            self._conn.execute("DELETE FROM lease_beats WHERE holder = ?", (holder,))

    def record_restart(self, host: str, run: str, *, death: str, holder: str, outcome: str,
                       message: str, at: float | None = None, token: str | None = None) -> int:
        """A restart (or a give-up, a hung run killed), with the token its launch will carry,
        in one transaction: a watcher killed right after it leaves a row the next can check."""
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO restarts (host, run, death, at, holder, outcome, message) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (host, run, death, time.time() if at is None else at, holder, outcome, message))
            rid = int(cur.lastrowid or 0)
            if token is not None:
                self._conn.execute("INSERT INTO restart_launches (restart_id, token) "
                                   "VALUES (?, ?)", (rid, token))
        return rid

    def record_launch(self, restart_id: int, *, token: str | None = None,
                      launch: Mapping[str, Any] | None = None,
                      pids: Sequence[int] | None = None) -> None:
        """What a restart launched (its token before it is sent; the box's launch identity
        once known; the run's pids once it runs again). Only what is given is changed."""
        with self._conn:
            self._conn.execute("INSERT INTO restart_launches (restart_id, token) VALUES (?, ?) "
                               "ON CONFLICT(restart_id) DO NOTHING", (restart_id, token or ""))
            if token is not None:
                self._conn.execute("UPDATE restart_launches SET token = ? WHERE restart_id = ?",
                                   (token, restart_id))
            if launch is not None:
                self._conn.execute("UPDATE restart_launches SET launch = ? WHERE restart_id = ?",
                                   (json.dumps(dict(launch)), restart_id))
            if pids is not None:
                self._conn.execute("UPDATE restart_launches SET pids = ? WHERE restart_id = ?",
                                   (json.dumps([int(p) for p in pids]), restart_id))

    def settle_restart(self, restart_id: int, outcome: str, message: str,
                       pids: Sequence[int] | None = None) -> bool:
        """A sent restart verified or failed (with the run's pids that verified it); False when
        it was settled already (by another watcher)."""
        with self._conn:
            cur = self._conn.execute("UPDATE restarts SET outcome = ?, message = ? WHERE id = ? "
                                     "AND outcome = 'sent'", (outcome, message, restart_id))
        if cur.rowcount and pids is not None:
            self.record_launch(restart_id, pids=pids)
        return bool(cur.rowcount)

    def restarts(self, host: str, run: str, *, since: float = 0.0) -> list[RestartRecord]:
        """The watchdog's restarts of a run since `since`, oldest first."""
        rows = self._conn.execute(
            f"SELECT {_RESTART_COLUMNS} FROM restarts r LEFT JOIN restart_launches l "
            "ON l.restart_id = r.id WHERE r.host = ? AND r.run = ? AND r.at >= ? ORDER BY r.id",
            (host, run, since)).fetchall()
        return [_restart(r) for r in rows]

    def restarts_since(self, since: float, host: str | None = None) -> list[RestartRecord]:
        """Every run's restarts by the watchdog since `since` (of one host, or all), oldest
        first (the timeline's)."""
        where, args = ("at >= ? AND host = ?", (since, host)) if host is not None else (
            "at >= ?", (since,))
        rows = self._conn.execute(
            "SELECT id, host, run, death, at, holder, outcome, message FROM restarts WHERE "
            f"{where} ORDER BY at, id", args).fetchall()
        return [RestartRecord(*r) for r in rows]

    def notified(self, host: str) -> dict[str, tuple[str, float]]:
        """Each finding key of a host last notified: (severity, at)."""
        return {k: (sev, at) for k, sev, at in self._conn.execute(
            "SELECT key, severity, at FROM notified WHERE host = ?", (host,))}

    def set_notified(self, host: str, changes: Mapping[str, tuple[str, float] | None]) -> None:
        """Record what was notified: (severity, at) per key; None: cleared, forgotten."""
        with self._conn:
            for key, value in changes.items():
                if value is None:
                    self._conn.execute("DELETE FROM notified WHERE host = ? AND key = ?",
                                       (host, key))
                else:
                    self._conn.execute("INSERT INTO notified VALUES (?, ?, ?, ?) ON CONFLICT "
                                       "(host, key) DO UPDATE SET severity = excluded.severity, "
                                       "at = excluded.at", (host, key, *value))


def lease_holds(expires_at: float, renewed_at: float | None, now: float) -> bool:
    """Whether a lease holds at `now`: not expired, and not renewed in the future of this clock
    beyond LEASE_SKEW_S (the clock stepped back since: the renewal's time says nothing)."""
    if now >= expires_at:
        return False
    return renewed_at is None or now >= renewed_at - LEASE_SKEW_S
