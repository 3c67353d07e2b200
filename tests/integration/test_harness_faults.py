"""Each fault of tests/harness/faults.py produces exactly what it names."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from harness.faults import (
    change_host_key,
    frozen_listener,
    frozen_sessions,
    hanging_standin,
    session_pids,
    silent_port,
    wrong_client_key,
)
from harness.sshd import SshdBox, key_fingerprint


def _connect(box: SshdBox, **overrides: object) -> Any:
    """asyncssh.connect straight to the box (awaitable and async context manager)."""
    return asyncssh.connect(**box.asyncssh_options(**overrides))


def test_silent_port_accepts_and_never_speaks() -> None:
    with silent_port() as port, socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        readable, _, _ = select.select([sock], [], [], 0.5)
        assert readable == []  # connected, and not one byte (no SSH banner) comes


@pytest.mark.asyncio
async def test_silent_port_makes_a_client_connect_time_out() -> None:
    with silent_port() as port:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncssh.connect("127.0.0.1", port, connect_timeout=1, known_hosts=None)
        assert time.monotonic() - start < 2.0


@pytest.mark.asyncio
async def test_frozen_session_stops_answering_and_thawed_resumes(sshd_box: SshdBox) -> None:
    async with _connect(sshd_box) as frozen_conn, _connect(sshd_box) as other:
        assert (await frozen_conn.run("echo 1", check=True)).stdout == "1\n"
        client_port = frozen_conn.get_extra_info("sockname")[1]
        with frozen_sessions(sshd_box, client_port=client_port) as pids:
            assert pids and set(pids) < set(session_pids(sshd_box))
            pending = asyncio.ensure_future(frozen_conn.run("echo 2", check=True))
            done, _ = await asyncio.wait([pending], timeout=1.0)
            assert not done, "a frozen session answered"
            # Only that connection froze: the other one still answers.
            other_run = other.run("echo other", check=True)
            assert (await asyncio.wait_for(other_run, 5)).stdout == "other\n"
        result = await asyncio.wait_for(pending, 5)
        assert result.stdout == "2\n"


@pytest.mark.asyncio
async def test_frozen_listener_refuses_new_logins_but_not_live_sessions(
    sshd_box: SshdBox,
) -> None:
    async with _connect(sshd_box) as live:
        with frozen_listener(sshd_box):
            with pytest.raises(TimeoutError):
                await _connect(sshd_box, connect_timeout=1)
            assert (await asyncio.wait_for(live.run("echo live"), 5)).stdout == "live\n"
    async with _connect(sshd_box) as again:
        assert (await again.run("echo back")).stdout == "back\n"


@pytest.mark.asyncio
async def test_wrong_client_key_is_refused(sshd_box: SshdBox) -> None:
    wrong = wrong_client_key(sshd_box)
    assert wrong.read_text() != sshd_box.client_key.read_text()
    with pytest.raises(asyncssh.PermissionDenied):
        await _connect(sshd_box, client_keys=[str(wrong)])
    # IdentityFile given with -o would add to the alias's key, not replace it: use an alias.
    alias = sshd_box.add_host("wrongkey", IdentityFile=str(wrong))
    done = sshd_box.ssh("true", alias=alias)
    assert done.returncode == 255
    assert b"Permission denied" in done.stderr


@pytest.mark.asyncio
async def test_changed_host_key_is_refused_by_a_strict_client(sshd_box: SshdBox) -> None:
    old = key_fingerprint(sshd_box.host_key)
    port = sshd_box.port
    new = change_host_key(sshd_box)
    assert new != old
    assert sshd_box.port == port
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _connect(sshd_box)
    done = sshd_box.ssh("true")
    assert done.returncode == 255
    assert b"REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr
    # The box itself is fine: a client that does not check host keys gets in.
    async with _connect(sshd_box, known_hosts=None) as conn:
        assert (await conn.run("echo in")).stdout == "in\n"


def _processes_running(path: Path) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline and b"\0" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.asyncio
async def test_hanging_standin_hangs_and_leaves_no_process(sshd_box: SshdBox) -> None:
    standin = hanging_standin(sshd_box.bin_dir, "nvidia-smi")
    async with _connect(sshd_box) as conn:
        pending = asyncio.ensure_future(conn.run("nvidia-smi"))
        done, _ = await asyncio.wait([pending], timeout=1.0)
        assert not done, "the stand-in answered"
        assert _processes_running(standin)
        pending.cancel()
        conn.abort()
    assert await asyncio.to_thread(_gone_within, standin, 5.0)


def _gone_within(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _processes_running(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
