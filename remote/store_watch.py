"""The watchdog's part of the local store: leases, restarts, notified findings.

Store (remote/store.py) inherits WatchdogTables, so callers keep one object and one connection;
this module holds the three tables' schema (appended to the store's, one file, one version),
their methods and RestartRecord. actions/restart.py takes leases and counts restarts; notify.py
remembers what it last notified. Like store.py it imports nothing of gpuwatch.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass

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
    outcome TEXT NOT NULL,               -- sent | verified | failed | gave_up
    message TEXT NOT NULL
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


class WatchdogTables:
    """The watchdog's methods on the store (actions/restart.py, notify.py); a mixin of Store,
    which owns the connection and runs WATCH_SCHEMA with its own."""

    _conn: sqlite3.Connection

    def take_lease(self, host: str, run: str, holder: str, ttl_s: float,
                   now: float | None = None) -> bool:
        """Take or renew the lease on (host, run) for ttl_s; False while another holder's lease
        has not expired. One IMMEDIATE transaction: two processes never both get it."""
        now = time.time() if now is None else now
        conn = self._conn
        if conn.in_transaction:
            conn.commit()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # locked past the busy timeout: not ours this time
            return False
        try:
            row = conn.execute("SELECT holder, expires_at FROM leases WHERE host = ? AND "
                               "run = ?", (host, run)).fetchone()
            mine = row is None or row[0] == holder or row[1] <= now
            if mine:
                conn.execute("INSERT INTO leases VALUES (?, ?, ?, ?) ON CONFLICT(host, run) "
                             "DO UPDATE SET holder = excluded.holder, "
                             "expires_at = excluded.expires_at", (host, run, holder, now + ttl_s))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return mine

    def lease(self, host: str, run: str) -> tuple[str, float] | None:
        """(holder, expires_at) of the lease on (host, run), if any."""
        row = self._conn.execute("SELECT holder, expires_at FROM leases WHERE host = ? AND "
                                 "run = ?", (host, run)).fetchone()
        return (row[0], row[1]) if row is not None else None

    def release_leases(self, holder: str) -> None:
        with self._conn:
            self._conn.execute("DELETE FROM leases WHERE holder = ?", (holder,))

    def record_restart(self, host: str, run: str, *, death: str, holder: str, outcome: str,
                       message: str, at: float | None = None) -> int:
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO restarts (host, run, death, at, holder, outcome, message) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (host, run, death, time.time() if at is None else at, holder, outcome, message))
        return int(cur.lastrowid or 0)

    def settle_restart(self, restart_id: int, outcome: str, message: str) -> None:
        """A sent restart verified or failed."""
        with self._conn:
            self._conn.execute("UPDATE restarts SET outcome = ?, message = ? WHERE id = ? AND "
                               "outcome = 'sent'", (outcome, message, restart_id))

    def restarts(self, host: str, run: str, *, since: float = 0.0) -> list[RestartRecord]:
        """The watchdog's restarts of a run since `since`, oldest first."""
        rows = self._conn.execute(
            "SELECT id, host, run, death, at, holder, outcome, message FROM restarts WHERE "
            "host = ? AND run = ? AND at >= ? ORDER BY id", (host, run, since)).fetchall()
        return [RestartRecord(*r) for r in rows]

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
