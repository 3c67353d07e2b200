"""The local store: state across runs, bounded history, rebuilt when corrupt, private."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpuwatch.remote.store import GpuRow, Store, default_store_path


def row(t: float, gpu: int = 0, util: float = 50.0) -> GpuRow:
    return GpuRow(t=t, gpu=gpu, util_pct=util, sm_clock_mhz=1980, sm_clock_max_mhz=1980,
                  power_w=650.5, power_limit_w=700, temp_c=61, mem_used_mib=1000,
                  throttle=("sw_power_cap",))


def test_state_survives_reopen_and_a_failed_poll_keeps_the_last_good_data(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with Store.open(path) as store:
        store.record_poll("gpu1", taken_at=100.0, ok=True, boot_id="b1", doc=b'{"v": 1}',
                          counters={"oom_kill": 3}, gpu_rows=[row(100.0), row(100.0, gpu=1)])
    with Store.open(path) as store:
        store.record_poll("gpu1", taken_at=110.0, ok=False,
                          error={"kind": "timeout", "message": "slow"})
        state = store.host_state("gpu1")
        assert state is not None
        assert (state.ok, state.taken_at, state.last_ok_at) == (False, 110.0, 100.0)
        assert state.boot_id == "b1" and state.doc == b'{"v": 1}'
        assert state.counters == {"oom_kill": 3}
        assert state.error == {"kind": "timeout", "message": "slow"}
        history = store.gpu_history("gpu1")
        assert [(r.t, r.gpu) for r in history] == [(100.0, 0), (100.0, 1)]
        assert history[0].throttle == ("sw_power_cap",) and history[0].power_w == 650.5
        assert store.host_state("nope") is None and store.hosts() == ["gpu1"]
        # a good poll that brings no counters (a TUI without a poller) keeps the last ones
        store.record_poll("gpu1", taken_at=120.0, ok=True, boot_id="b1", doc=b'{"v": 1}')
        assert store.host_state("gpu1").counters == {"oom_kill": 3}
        store.record_poll("gpu1", taken_at=130.0, ok=True, boot_id="b1", counters={})
        assert store.host_state("gpu1").counters == {}


def test_store_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "s.sqlite3"
    Store.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_read_of_history_is_bounded(tmp_path: Path) -> None:
    """What is kept is the retention's (test_store_keep.py); one read returns at most `limit`
    rows, the newest."""
    with Store.open(tmp_path / "s.sqlite3") as store:
        for t in range(200):
            store.record_poll("h", taken_at=float(t), ok=True, gpu_rows=[row(float(t))])
        history = store.gpu_history("h", limit=50)
        assert [r.t for r in history] == [float(t) for t in range(150, 200)]


def test_corrupt_file_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"this is not a database, it is a text file " * 200)
    store = Store.open(path)
    assert store.warning and "moved to" in store.warning
    store.record_poll("h", taken_at=1.0, ok=True, boot_id="x")
    assert store.host_state("h") is not None
    store.close()
    assert list(tmp_path.glob("s.sqlite3.corrupt-*"))


def test_newer_schema_is_kept_not_destroyed(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema'")
    store = Store.open(path)
    assert store.path is None and store.warning and "newer" in store.warning
    store.close()
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_writer_killed_mid_write_leaves_the_store_usable(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with Store.open(path) as store:
        store.record_poll("h", taken_at=1.0, ok=True, boot_id="before")
    # A separate process writes in a loop and is SIGKILLed while doing so.
    code = textwrap.dedent(f"""
        from gpuwatch.remote.store import Store, GpuRow
        s = Store.open({str(path)!r})
        print("ready", flush=True)
        t = 2.0
        while True:
            s.record_poll("h", taken_at=t, ok=True, boot_id="during",
                          gpu_rows=[GpuRow(t, g, 1, 2, 3, 4, 5, 6, 7) for g in range(8)])
            t += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with Store.open(path) as store:
        assert store.warning is None
        state = store.host_state("h")
        assert state is not None and state.boot_id == "during"
        ts = [r.t for r in store.gpu_history("h")]
        assert len(ts) % 8 == 0  # whole polls only: no half-written transaction


def test_default_path_follows_xdg(tmp_path: Path) -> None:
    assert default_store_path({"XDG_STATE_HOME": str(tmp_path)}) == (
        tmp_path / "gpuwatch" / "gpuwatch.sqlite3")
