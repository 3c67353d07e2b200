"""What the local store keeps of GPU samples, and for how long; its cap; its VACUUM.

Every poll writes one raw row per GPU. Raw rows are kept `raw_s` (a day by default); older
ones become one row per GPU per minute (averages of util, SM clock and power, maxima of the
clock's max, the power limit, temperature and VRAM, every throttle reason seen), kept until
`minute_s` (a week); older minutes become one row per GPU per hour, kept `keep_s` (a year).
Events, findings, the audit log, the restarts and the runs' spans are never thinned. Over
`max_bytes` of data, the oldest GPU rows go first, a day at a time, whatever their tier. The
file gives freed pages back to the disk by VACUUM, on its own schedule: at most once per
`vacuum_s`, when a quarter of the file is free pages or the file is over the cap, and never by
the TUI (a VACUUM rewrites the whole file and would freeze its screen meanwhile).

All of it runs in `maintain`, which the pipeline calls after each poll is saved; a host's rows
are rolled up at most once per `every_s` of poll time (a few hundred rows each time), so no
poll pays for more than the last few minutes. Like store.py, this imports nothing of gpuwatch.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MINUTE, HOUR, DAY = 60, 3600, 86_400
FREE_SHARE_VACUUM = 0.25
"""VACUUM when at least this share of the file is free pages (or the file is over its cap)."""


@dataclass(frozen=True, slots=True)
class StorePolicy:
    """What the store keeps, for how long, and how a run's power is integrated (the config's
    `[store]` and `interval`: remote/watch/landing.py builds it)."""

    raw_s: float = DAY
    minute_s: float = 7 * DAY
    keep_s: float = 365 * DAY
    max_bytes: int = 1 << 30
    vacuum_s: float = 7 * DAY
    vacuum: bool = True
    """Whether this process may VACUUM (the TUI may not)."""
    gap_s: float | None = 30.0
    """A step between two polls of a run longer than this is a gap: not integrated."""
    every_s: float = 600.0
    """A host's samples are rolled up at most this often (poll time)."""


class KeepTables:
    """Retention, rollups, the cap and VACUUM (a mixin of Store, which owns the connection)."""

    _conn: sqlite3.Connection
    _maintained: dict[str, float]

    def maintain(self, host: str, now: float, policy: StorePolicy) -> None:
        """Roll up and drop a host's old samples, enforce the cap, VACUUM when due. Cheap
        when nothing is due (one dict lookup)."""
        last = self._maintained.get(host)
        if last is not None and 0 <= now - last < policy.every_s:
            return
        self._maintained[host] = now
        with self._conn:
            self._roll_minutes(host, now, policy)
            self._roll_hours(host, now, policy)
            self._conn.execute("DELETE FROM gpu_rollups WHERE host = ? AND span = ? AND t < ?",
                               (host, HOUR, now - policy.keep_s))
        last = self._maintained.get("")
        if last is None or not 0 <= now - last < policy.every_s:
            self._maintained[""] = now
            self.enforce_cap(now, policy)
            if policy.vacuum:
                self.vacuum_if_due(now, policy)

    def _roll_minutes(self, host: str, now: float, policy: StorePolicy) -> None:
        cutoff = math.floor((now - policy.raw_s) / MINUTE) * MINUTE
        (done,) = self._conn.execute(
            "SELECT MAX(t) FROM gpu_rollups WHERE host = ? AND span = ?",
            (host, MINUTE)).fetchone()
        start = done + MINUTE if done is not None else float("-inf")
        if start < cutoff:
            rows = self._conn.execute(
                "SELECT t, gpu, util_pct, sm_clock_mhz, sm_clock_max_mhz, power_w, "
                "power_limit_w, temp_c, mem_used_mib, throttle FROM gpu_samples WHERE "
                "host = ? AND t >= ? AND t < ?", (host, start, cutoff)).fetchall()
            self._insert_rollups(host, MINUTE, rollup(
                ((r[0], r[1], 1, *r[2:]) for r in rows), MINUTE))
        self._conn.execute("DELETE FROM gpu_samples WHERE host = ? AND t < ?", (host, cutoff))

    def _roll_hours(self, host: str, now: float, policy: StorePolicy) -> None:
        cutoff = math.floor((now - policy.minute_s) / HOUR) * HOUR
        (done,) = self._conn.execute(
            "SELECT MAX(t) FROM gpu_rollups WHERE host = ? AND span = ?", (host, HOUR)).fetchone()
        start = done + HOUR if done is not None else float("-inf")
        if start < cutoff:
            rows = self._conn.execute(
                "SELECT t, gpu, n, util_pct, sm_clock_mhz, sm_clock_max_mhz, power_w, "
                "power_limit_w, temp_c, mem_used_mib, throttle FROM gpu_rollups WHERE "
                "host = ? AND span = ? AND t >= ? AND t < ?",
                (host, MINUTE, start, cutoff)).fetchall()
            self._insert_rollups(host, HOUR, rollup(rows, HOUR))
        self._conn.execute("DELETE FROM gpu_rollups WHERE host = ? AND span = ? AND t < ?",
                           (host, MINUTE, cutoff))

    def _insert_rollups(self, host: str, span: int, rows: Iterable[tuple[Any, ...]]) -> None:
        # OR IGNORE: a bucket already rolled (samples arriving late, a clock set back) keeps
        # what it has; the late samples go with the raw tier.
        self._conn.executemany(
            "INSERT OR IGNORE INTO gpu_rollups (host, span, t, gpu, n, util_pct, sm_clock_mhz, "
            "sm_clock_max_mhz, power_w, power_limit_w, temp_c, mem_used_mib, throttle) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(host, span, *row) for row in rows])

    def data_bytes(self) -> tuple[int, int]:
        """(bytes of the file's pages in use, bytes of the whole file) as SQLite counts them."""
        (size,) = self._conn.execute("PRAGMA page_size").fetchone()
        (pages,) = self._conn.execute("PRAGMA page_count").fetchone()
        (free,) = self._conn.execute("PRAGMA freelist_count").fetchone()
        return (pages - free) * size, pages * size

    def enforce_cap(self, now: float, policy: StorePolicy) -> int:
        """Over the cap: drop the oldest GPU rows, a day at a time, whatever their tier (the
        last hour's raw rows are kept whatever the cap). Every read and delete goes by the
        tables' keys, host by host (a scan of a month's rows would take seconds). Returns the
        days dropped."""
        dropped = 0
        hosts = [h for (h,) in self._conn.execute(
            "SELECT DISTINCT host FROM host_state")]
        while self.data_bytes()[0] > policy.max_bytes:
            oldest = [t for h in hosts for (t,) in (
                self._conn.execute("SELECT MIN(t) FROM gpu_rollups WHERE host = ? AND span = ?",
                                   (h, HOUR)).fetchone(),
                self._conn.execute("SELECT MIN(t) FROM gpu_rollups WHERE host = ? AND span = ?",
                                   (h, MINUTE)).fetchone(),
                self._conn.execute("SELECT MIN(t) FROM gpu_samples WHERE host = ?",
                                   (h,)).fetchone()) if t is not None]
            if not oldest or min(oldest) >= now - HOUR:
                break
            until = min(min(oldest) + DAY, now - HOUR)
            with self._conn:
                for h in hosts:
                    for span in (HOUR, MINUTE):
                        self._conn.execute("DELETE FROM gpu_rollups WHERE host = ? AND span = ? "
                                           "AND t < ?", (h, span, until))
                    self._conn.execute("DELETE FROM gpu_samples WHERE host = ? AND t < ?",
                                       (h, until))
            dropped += 1
        return dropped

    def vacuum_if_due(self, now: float, policy: StorePolicy) -> bool:
        """VACUUM when its time has come and it would give something back; the schedule is
        in the store (meta 'vacuumed_at'), shared by every gpuwatch that writes it."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'vacuumed_at'").fetchone()
        try:
            last = float(row[0]) if row is not None else None
        except ValueError:
            last = None
        if last is None or now < last:  # the schedule starts now (or the clock went back)
            with self._conn:
                self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('vacuumed_at', ?)",
                                   (repr(now),))
            return False
        used, size = self.data_bytes()
        if now - last < policy.vacuum_s or not size or (
                (size - used) / size < FREE_SHARE_VACUUM and size <= policy.max_bytes):
            return False
        if self._conn.in_transaction:
            self._conn.commit()
        try:
            # the whole check the opening leaves out for a big file (store.QUICK_CHECK_MAX_BYTES)
            (status,) = self._conn.execute("PRAGMA quick_check").fetchone()
            if status != "ok":
                return False
            self._conn.execute("VACUUM")
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError:  # busy, or no room for the copy: next time
            return False
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('vacuumed_at', ?)",
                               (repr(now),))
        return True


def rollup(rows: Iterable[Sequence[Any]], span: int) -> list[tuple[Any, ...]]:
    """Rows (t, gpu, n, util, sm clock, sm clock max, power, power limit, temp, VRAM used,
    throttle) as one row per GPU per `span`-second bucket: (bucket start, gpu, n, then the
    averages of util, SM clock and power weighted by n, the maxima of the rest, every throttle
    reason seen, comma-separated, or None). Whole units: a rollup is for looking back."""
    buckets: dict[tuple[int, int], list[Any]] = {}
    for t, gpu, n, util, sm, sm_max, power, limit, temp, mem, throttle in rows:
        key = (math.floor(t / span) * span, gpu)
        b = buckets.get(key)
        if b is None:
            b = buckets[key] = [0, [0.0, 0], [0.0, 0], None, [0.0, 0], None, None, None, set()]
        b[0] += n
        for slot, value in ((1, util), (2, sm), (4, power)):
            if value is not None:
                b[slot][0] += value * n
                b[slot][1] += n
        for slot, value in ((3, sm_max), (5, limit), (6, temp), (7, mem)):
            if value is not None:
                b[slot] = value if b[slot] is None else max(b[slot], value)
        if throttle:
            b[8].update(throttle.split(","))
    out = []
    for (t, gpu), b in sorted(buckets.items()):
        def avg(slot: list[Any]) -> int | None:
            return round(slot[0] / slot[1]) if slot[1] else None

        def whole(value: float | None) -> int | None:
            return None if value is None else round(value)

        out.append((t, gpu, b[0], avg(b[1]), avg(b[2]), whole(b[3]), avg(b[4]), whole(b[5]),
                    whole(b[6]), whole(b[7]), ",".join(sorted(b[8])) or None))
    return out
