"""The store's migrations (remote/store_schema.py): a store written by an earlier gpuwatch
(tests/data/stores/, see its PROVENANCE.md) opens after an upgrade with everything it held, the
pipeline restores its hosts from it, a migration that fails leaves it as it was, and a gpuwatch
of before can still open a migrated one."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from gpuwatch.remote import store_schema
from gpuwatch.remote.store import SCHEMA_VERSION, RunHold, Store
from gpuwatch.remote.store_schema import LATEST, V1, migrate, statements
from gpuwatch.remote.watch.fleet import FleetWatch
from tui_fixtures import NOW, config

STORES = Path(__file__).parents[1] / "data" / "stores"


def old_store(tmp_path: Path, name: str = "store-v1.sqlite3") -> Path:
    path = tmp_path / name
    shutil.copyfile(STORES / name, path)
    return path


def counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("host_state", "gpu_samples", "run_state", "findings", "run_deaths",
                              "audit", "acks", "restarts", "launches")}


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def test_a_store_of_before_opens_with_everything_it_held(tmp_path: Path) -> None:
    path = old_store(tmp_path)
    before = counts(path)
    assert user_version(path) == 0 and before["gpu_samples"] == 847
    with Store.open(path) as store:
        assert store.warning is None and store.path == path
        assert counts(path) == before
        assert sorted(store.hosts()) == ["gpu-capped", "gpu-down", "gpu-driver", "gpu-healthy",
                                         "gpu-oom", "gpu-zombie"]
        state = store.host_state("gpu-healthy")
        assert state is not None and state.ok and state.doc is None and state.boot_id == "boot-1"
        down = store.host_state("gpu-down")
        assert down is not None and not down.ok and down.error is not None
        assert len(store.gpu_history("gpu-capped")) == 61
        (reap,) = store.audit_log()
        assert (reap.action, reap.host, reap.targets[0]["pid"]) == ("reap", "gpu-zombie", 5150)
        assert store.acks("gpu-oom")[0]["pids"] == [6001]
        assert store.restarts("gpu-oom", "gpt-sft")[0].outcome == "gave_up"
        assert store.launch("gpu-healthy", "llama-7b") is not None
        assert {f.code for f in store.findings("gpu-oom", active=True)} >= {"run.dead"}
        assert "bert-ddp" in store.runs("gpu-zombie")
        # what the new version adds works on it
        store.record_poll("gpu-healthy", taken_at=NOW + 10, ok=True, boot_id="boot-1",
                          runs={"llama-7b": RunHold((4121,), (0,))})
        assert store.run_spans("gpu-healthy", "llama-7b")[0].pids == (4121,)
    assert user_version(path) == LATEST == SCHEMA_VERSION
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("1",)
    with Store.open(path) as store:  # a second opening migrates nothing
        assert store.warning is None and user_version(path) == LATEST


def test_the_pipeline_restores_its_hosts_from_a_migrated_store(tmp_path: Path) -> None:
    path = old_store(tmp_path)
    with Store.open(path) as store:
        fleet = FleetWatch(config(more=True), store, role="once", clock=lambda: NOW)
        history = fleet.history("gpu-oom")
        assert history.runs["gpt-sft"].status == "dead"
        assert history.deaths["gpt-sft"].cause == "oom_cgroup"
        assert history.acks["gpt-sft"][0].pids == (6001,)


def test_a_failed_migration_leaves_the_store_as_it_was(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = old_store(tmp_path)
    before = counts(path)
    def broken(conn: sqlite3.Connection) -> None:
        """Version 2's statements, then a failure where the file is (a full disk, say)."""
        for statement in store_schema.V2:
            conn.execute(statement)
        if conn.execute("PRAGMA database_list").fetchone()[2]:  # a file, not :memory:
            raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setitem(store_schema.MIGRATIONS, 2, broken)
    store = Store.open(path)
    assert store.path is None and store.warning and "could not be used" in store.warning
    store.close()
    assert user_version(path) == 0 and counts(path) == before
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "events" not in tables and "gpu_samples_v2" not in tables
    monkeypatch.setitem(store_schema.MIGRATIONS, 2, store_schema.V2)
    with Store.open(path) as store:  # and the next gpuwatch migrates it
        assert store.warning is None
    assert user_version(path) == LATEST and counts(path) == before


def test_a_gpuwatch_of_before_still_opens_a_migrated_store(tmp_path: Path) -> None:
    """What version 1 did at each opening (its whole script, CREATE IF NOT EXISTS, then the
    schema check) and wrote (a plain INSERT of a GPU row) works on a migrated store: every
    migration so far only adds, so meta 'schema' stays 1."""
    path = old_store(tmp_path)
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.executescript(V1)
        (schema,) = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        assert int(schema) <= 1
        conn.execute("INSERT INTO gpu_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     ("gpu-x", NOW + 1, 0, 50.0, 1500.0, 1980.0, 300.0, 700.0, 60.0, 1.0, ""))
    with Store.open(path) as store:
        assert store.warning is None and store.gpu_history("gpu-x")[0].power_w == 300.0


def test_a_new_store_is_born_at_the_latest_version(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    Store.open(path).close()
    assert user_version(path) == LATEST
    with sqlite3.connect(path) as conn:
        assert migrate(conn) == LATEST  # nothing left to do
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("1",)


def test_a_store_a_newer_gpuwatch_added_to_is_used_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 5}")
        conn.execute("CREATE TABLE from_the_future (x)")
    with Store.open(path) as store:
        assert store.warning is None and store.path == path
        store.record_poll("h", taken_at=1.0, ok=True)
    assert user_version(path) == LATEST + 5


def test_the_scripts_split_into_whole_statements() -> None:
    """A semicolon inside a comment (`-- relaunch: the command; kill...`) ends nothing."""
    parts = statements(V1)
    assert all(sqlite3.complete_statement(p) or sqlite3.complete_statement(p + ";")
               for p in parts)
    tables = V1.upper().count("CREATE TABLE IF NOT EXISTS")  # every one, whatever it holds
    assert tables >= 12
    assert sum(p.lstrip().upper().startswith("CREATE TABLE") for p in parts) == tables
