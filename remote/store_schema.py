"""The store's schema and its migrations, by `PRAGMA user_version`.

A store records the version of its schema in SQLite's own header (`PRAGMA user_version`): each
version's migration runs once, in order, in one IMMEDIATE transaction with the version's bump,
so two gpuwatch processes opening an old store at once migrate it once, and a process killed
mid-way leaves the store as it was. A store from before versions were counted (user_version 0,
`meta` 'schema' = 1: every gpuwatch up to the one that added events) is version 1 once its
tables are all there (that version made them with CREATE IF NOT EXISTS, some of them late, so
version 1 is "whatever its script makes").

`meta` 'schema' is the oldest schema a gpuwatch must know to use the store (COMPAT): it stays 1
while every migration only adds (tables, columns with defaults, a table rebuilt with the same
columns), so a gpuwatch of before still opens a migrated store; a store whose 'schema' is newer
than COMPAT is refused (StoreTooNew) and kept as it is. A store whose user_version is newer than
LATEST (a newer gpuwatch's additions) is used as it is.

Like store.py, this imports nothing of gpuwatch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from .store_watch import WATCH_SCHEMA

LATEST = 2
"""The schema this gpuwatch writes."""
COMPAT = 1
"""meta 'schema': the oldest schema a reader must know (1: every migration so far adds)."""

V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS host_state (
    host TEXT PRIMARY KEY,
    taken_at REAL NOT NULL,      -- when the last poll ended (epoch s, this machine's clock)
    ok INTEGER NOT NULL,
    error TEXT,                  -- JSON {kind, message} of the last poll, if it failed
    last_ok_at REAL,             -- when the last good poll ended
    boot_id TEXT,                -- of the last good poll
    doc BLOB,                    -- the probe's document of the last good poll, zlib-compressed
    counters TEXT NOT NULL DEFAULT '{}'   -- JSON carried to the next poll: {"collector": ...}
);
CREATE TABLE IF NOT EXISTS gpu_samples (
    host TEXT NOT NULL, t REAL NOT NULL, gpu INTEGER NOT NULL,
    util_pct REAL, sm_clock_mhz REAL, sm_clock_max_mhz REAL, power_w REAL, power_limit_w REAL,
    temp_c REAL, mem_used_mib REAL, throttle TEXT
);
CREATE INDEX IF NOT EXISTS gpu_samples_host_t ON gpu_samples (host, t);
CREATE TABLE IF NOT EXISTS run_state (
    host TEXT NOT NULL, run TEXT NOT NULL,
    state TEXT NOT NULL,          -- JSON: event-file offsets, cursors, liveness memory
    points BLOB,                  -- zlib JSON: the run's series, decimated to a bound per tag
    PRIMARY KEY (host, run)
);
CREATE TABLE IF NOT EXISTS findings (   -- each finding's life: first seen, last seen, cleared
    host TEXT NOT NULL, code TEXT NOT NULL,
    gpu INTEGER NOT NULL DEFAULT -1,     -- -1: not about one GPU
    run TEXT NOT NULL DEFAULT '',        -- '': not about one run
    subject TEXT NOT NULL DEFAULT '',    -- what else tells them apart (a disk's mount)
    severity TEXT NOT NULL, message TEXT NOT NULL,
    evidence TEXT NOT NULL,              -- JSON, as of the last time it was seen
    first_seen REAL NOT NULL, last_seen REAL NOT NULL,
    cleared_at REAL,                     -- NULL while it holds
    PRIMARY KEY (host, code, gpu, run, subject)
);
CREATE TABLE IF NOT EXISTS run_deaths (  -- U3: why a dead run died, kept while it stays dead
    host TEXT NOT NULL, run TEXT NOT NULL,
    kind TEXT NOT NULL,                  -- dead | rank_dead
    diagnosis TEXT NOT NULL,             -- JSON {cause, evidence, at, pids}
    PRIMARY KEY (host, run, kind)
);
CREATE TABLE IF NOT EXISTS audit (   -- append-only: every action asked for, and its outcome
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,            -- epoch s, this machine's clock
    who TEXT NOT NULL,           -- local user@host that asked
    host TEXT NOT NULL,
    action TEXT NOT NULL,        -- kill | reap | relaunch | ack
    phase TEXT NOT NULL,         -- execute | verify
    targets TEXT NOT NULL,       -- JSON: [{pid, start_ticks, boot_id, user, cmd}] or [{run}]
    command TEXT,                -- relaunch: the command that ran; kill/reap: the signals
    outcome TEXT NOT NULL,       -- refused | failed | sent | verified | not_verified
    ok INTEGER,                  -- 1, 0, or NULL (sent, for the next poll to verify)
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_host_at ON audit (host, at);
CREATE TABLE IF NOT EXISTS launches (   -- how a discovered run was started, to relaunch
    host TEXT NOT NULL, run TEXT NOT NULL,
    recorded_at REAL NOT NULL,           -- epoch s, this machine's clock
    launch TEXT NOT NULL,                -- JSON: cwd, argv, env, dropped names (no secret, U34)
    PRIMARY KEY (host, run)
);
CREATE TABLE IF NOT EXISTS acks (   -- deaths a person acknowledged, or asked for (a kill)
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL, run TEXT NOT NULL,
    pids TEXT NOT NULL,          -- JSON list: the dead pids it covers ([]: a death before `at`)
    who TEXT NOT NULL, at REAL NOT NULL,
    reason TEXT NOT NULL         -- acknowledged | stopped on request
);
CREATE INDEX IF NOT EXISTS acks_host ON acks (host, run);
""" + WATCH_SCHEMA
"""Version 1, as every gpuwatch before user_version made it (its script, run at each open)."""

V2 = (
    # The timeline (store_timeline.py): what happened, appended where it is seen, never changed.
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        host TEXT NOT NULL,
        at REAL NOT NULL,             -- epoch s, this machine's clock (the poll's end)
        kind TEXT NOT NULL,           -- finding | changed | cleared | death | started |
                                      -- reboot | unreachable | reachable
        code TEXT NOT NULL DEFAULT '',     -- a finding's code
        run TEXT NOT NULL DEFAULT '',
        gpu INTEGER NOT NULL DEFAULT -1,
        subject TEXT NOT NULL DEFAULT '',
        severity TEXT NOT NULL DEFAULT '', -- info | warning | critical ('' for none)
        message TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}'  -- JSON: a death's cause and evidence, a span...
    )""",
    "CREATE INDEX events_at ON events (at)",
    "CREATE INDEX events_host_at ON events (host, at)",
    # Which GPUs each run's processes held, poll after poll, as spans (store_timeline.py).
    """CREATE TABLE run_spans (
        host TEXT NOT NULL, run TEXT NOT NULL,
        start REAL NOT NULL, end REAL NOT NULL,   -- the first and last poll that saw it so
        pids TEXT NOT NULL,           -- JSON list: its processes
        gpus TEXT NOT NULL,           -- JSON list: the GPU indices they held
        polls INTEGER NOT NULL DEFAULT 1,
        energy_j REAL NOT NULL DEFAULT 0,  -- power integrated over its GPUs (trapezoid)
        measured_s REAL NOT NULL DEFAULT 0,  -- of end - start, the part integrated
        segments INTEGER NOT NULL DEFAULT 0, -- poll-to-poll steps integrated
        gaps INTEGER NOT NULL DEFAULT 0,     -- steps too long to integrate (a gap)
        PRIMARY KEY (host, run, start)
    )""",
    # GPU samples older than the raw tier, one row per GPU per minute, then per hour
    # (store_keep.py): averages and maxima rounded to whole units.
    """CREATE TABLE gpu_rollups (
        host TEXT NOT NULL, span INTEGER NOT NULL,   -- 60 | 3600 seconds
        t INTEGER NOT NULL, gpu INTEGER NOT NULL,    -- the bucket's start
        n INTEGER NOT NULL,                          -- raw samples in it
        util_pct INTEGER, sm_clock_mhz INTEGER,      -- averages
        sm_clock_max_mhz INTEGER,                    -- the maximum
        power_w INTEGER,                             -- average
        power_limit_w INTEGER, temp_c INTEGER, mem_used_mib INTEGER,  -- maxima
        throttle TEXT,                               -- every reason seen in it
        PRIMARY KEY (host, span, t, gpu)
    ) WITHOUT ROWID""",
    # Raw samples keyed by (host, t, gpu) without a rowid: a third smaller than a rowid table
    # with its index, and what the retention deletes by is its key.
    """CREATE TABLE gpu_samples_v2 (
        host TEXT NOT NULL, t REAL NOT NULL, gpu INTEGER NOT NULL,
        util_pct REAL, sm_clock_mhz REAL, sm_clock_max_mhz REAL, power_w REAL,
        power_limit_w REAL, temp_c REAL, mem_used_mib REAL, throttle TEXT,
        PRIMARY KEY (host, t, gpu)
    ) WITHOUT ROWID""",
    "INSERT OR IGNORE INTO gpu_samples_v2 SELECT host, t, gpu, util_pct, sm_clock_mhz, "
    "sm_clock_max_mhz, power_w, power_limit_w, temp_c, mem_used_mib, throttle FROM gpu_samples",
    "DROP TABLE gpu_samples",
    "ALTER TABLE gpu_samples_v2 RENAME TO gpu_samples",
)

Migration = Sequence[str] | Callable[[sqlite3.Connection], None]
MIGRATIONS: dict[int, Migration] = {2: V2}
"""Version -> what brings a store of the version before to it."""


class StoreTooNew(Exception):
    """The store was written by a newer gpuwatch that changed what older ones rely on."""


def statements(script: str) -> list[str]:
    """A script's statements, for execute() inside a transaction (executescript commits
    first): lines gathered until SQLite calls them a complete statement (a semicolon in a
    comment does not end one)."""
    out, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the store to LATEST (creating it where it is empty); returns the version it had
    (0: new). Raises StoreTooNew, sqlite3 errors (the caller decides what they mean)."""
    if conn.in_transaction:
        conn.commit()
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version >= LATEST:
        _check_compat(conn)
        return int(version)
    conn.execute("BEGIN IMMEDIATE")  # one migrator: the others wait, then find it done
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        had = int(version)
        if had < 1:
            for statement in statements(V1):
                conn.execute(statement)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(COMPAT),))
            _check_compat(conn)
            had = 0 if row is None else 1
            version = 1
        else:
            _check_compat(conn)
        for target in range(int(version) + 1, LATEST + 1):
            step = MIGRATIONS[target]
            if callable(step):
                step(conn)
            else:
                for statement in step:
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {max(LATEST, int(version))}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return had


def _check_compat(conn: sqlite3.Connection) -> None:
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    try:
        compat = int(row[0]) if row is not None else COMPAT
    except ValueError:
        raise sqlite3.DatabaseError(f"meta 'schema' is not a number: {row[0]!r}") from None
    if compat > COMPAT:
        raise StoreTooNew(f"store schema {compat} is newer than this gpuwatch knows")
