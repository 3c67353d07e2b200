"""Leases in the store under a clock that steps: wall-clock times (they are compared between
processes), with a bounded skew allowance, so a step back neither keeps a dead watcher's lease
nor, within the allowance, hands a live one's away. A faked clock: each call names its `now`."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.remote.store import Store
from gpuwatch.remote.store_watch import LEASE_SKEW_S

T = 1_800_000_000.0


def stores(tmp_path: Path) -> tuple[Store, Store]:
    path = tmp_path / "state.sqlite3"
    return Store.open(path), Store.open(path)


def test_a_clock_stepped_back_does_not_keep_a_dead_watchers_lease(tmp_path: Path) -> None:
    a, b = stores(tmp_path)
    assert a.take_lease("h", "r", "A", 60, now=T)  # then A dies
    assert not b.take_lease("h", "r", "B", 60, now=T + 30)
    # The clock steps back an hour: A's renewal now lies an hour ahead and says nothing; an
    # expiry read as wall time would have kept A's lease for an hour and a minute more.
    assert b.take_lease("h", "r", "B", 60, now=T - 3600)
    assert a.lease_holder("h", "r", now=T - 3600) == "B"
    a.close()
    b.close()


def test_a_step_back_within_the_allowance_keeps_the_lease(tmp_path: Path) -> None:
    a, b = stores(tmp_path)
    assert a.take_lease("h", "r", "A", 60, now=T)
    assert not b.take_lease("h", "r", "B", 60, now=T - LEASE_SKEW_S + 1)
    assert b.lease_holder("h", "r", now=T - LEASE_SKEW_S + 1) == "A"
    a.close()
    b.close()


def test_the_holder_renews_its_own_lease_whatever_the_clock_did(tmp_path: Path) -> None:
    a, b = stores(tmp_path)
    assert a.take_lease("h", "r", "A", 60, now=T)
    assert a.take_lease("h", "r", "A", 60, now=T - 3600)  # stepped back: A renews at once
    assert not b.take_lease("h", "r", "B", 60, now=T - 3590)  # and holds it again
    assert not b.take_lease("h", "r", "B", 60, now=T - 3600 + 59)
    assert b.take_lease("h", "r", "B", 60, now=T - 3600 + 60)  # A stopped renewing: expired
    b.release_leases("B")
    assert a.lease("h", "r") is None
    a.close()
    b.close()


def test_a_restart_keeps_its_token_launch_and_pids(tmp_path: Path) -> None:
    """Every restart is recorded with what it started: its token (written with the row, before
    the call), the launch the box answered, the run's pids once it ran again."""
    a, b = stores(tmp_path)
    rid = a.record_restart("h", "r", death="41", holder="A", outcome="sent",
                           message="restart 1 of 3 in 6 h", at=T, token="t0k3n")
    (sent,) = b.restarts("h", "r")
    assert (sent.token, sent.launch, sent.pids) == ("t0k3n", None, ())
    a.record_launch(rid, launch={"pid": 7, "start_ticks": 99, "boot_id": "b"})
    assert b.settle_restart(rid, "verified", "running again (pid 8)", pids=[8])
    assert not a.settle_restart(rid, "failed", "late")  # settled once, by one watcher
    (done,) = a.restarts("h", "r")
    assert done.outcome == "verified" and done.pids == (8,)
    assert done.launch == {"pid": 7, "start_ticks": 99, "boot_id": "b"}
    a.close()
    b.close()
