"""Real faults for the integration tests; each produces exactly what its name says.

- ``silent_port()``: a TCP port that accepts connections and never sends a byte.
- ``frozen_sessions(box)`` / ``frozen_listener(box)``: SIGSTOP the sshd processes serving live
  connections (all, or the one from a given client port) or the listener itself; SIGCONT on exit.
- ``wrong_client_key(box)``: a generated key that is not in the box's authorized_keys.
- ``change_host_key(box)``: a new host key, sshd restarted on the same port; the box's
  known_hosts still holds the old key.
- ``hanging_standin(bin_dir, name)``: an executable that never answers (hung nvidia-smi, a
  hung probe) and exits by itself once its parent is gone, so no test leaks processes.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .sshd import SshdBox, descendants, generate_key, key_fingerprint, proc_table


@contextmanager
def silent_port(arrivals: list[float] | None = None) -> Iterator[int]:
    """Yield a port on 127.0.0.1 that accepts TCP connections and never speaks; each accepted
    connection's time.monotonic() is appended to `arrivals` when given (start-up benchmarks)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _addr = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if arrivals is not None:
                arrivals.append(time.monotonic())
            held.append(conn)  # kept open, never written to

    thread = threading.Thread(target=accept_and_hold, name="silent-port", daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        listener.close()


# --------------------------------------------------------------------------------------------
# Freezing sshd


def _socket_inodes(local_port: int, peer_port: int) -> set[str]:
    """Inodes of the TCP sockets from local_port to peer_port (loopback, v4 and v6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, remote, inode = cols[1], cols[2], cols[9]
            if int(local.rsplit(":", 1)[1], 16) == local_port and (
                int(remote.rsplit(":", 1)[1], 16) == peer_port
            ):
                inodes.add(inode)
    return inodes


def _holds_socket(pid: int, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def session_pids(box: SshdBox, client_port: int | None = None) -> list[int]:
    """The sshd processes serving live connections to ``box``: every one, or only those of the
    connection from ``client_port`` (the client socket's local port).

    A connection is served by a child of the listener and its sshd children (privilege
    separation: a monitor plus the process that speaks the protocol); the user's own commands
    below them are left alone. Works as root and as an ordinary user (same-user /proc).
    """
    table = proc_table()
    sshd_pids = {pid for pid in descendants(box.pid, table) if table[pid][1].startswith("sshd")}
    if client_port is None:
        return sorted(sshd_pids)
    inodes = _socket_inodes(box.port, client_port)
    chosen: list[int] = []
    for child in (pid for pid in sshd_pids if table[pid][0] == box.pid):
        tree = [child, *(p for p in descendants(child, table) if p in sshd_pids)]
        if any(_holds_socket(pid, inodes) for pid in tree):
            chosen.extend(tree)
    return sorted(chosen)


def freeze(pids: Sequence[int]) -> None:
    """SIGSTOP each pid (a gone pid is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass


def thaw(pids: Sequence[int]) -> None:
    """SIGCONT each pid (a gone pid is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@contextmanager
def frozen(pids: Sequence[int]) -> Iterator[list[int]]:
    """SIGSTOP pids for the block, SIGCONT them after (also on error)."""
    chosen = list(pids)
    if not chosen:
        raise RuntimeError("nothing to freeze: no live sshd session was found")
    freeze(chosen)
    try:
        yield chosen
    finally:
        thaw(chosen)


@contextmanager
def frozen_sessions(box: SshdBox, client_port: int | None = None) -> Iterator[list[int]]:
    """Freeze the sshd side of live connections (one, by client port, or all)."""
    with frozen(session_pids(box, client_port)) as pids:
        yield pids


@contextmanager
def frozen_listener(box: SshdBox) -> Iterator[int]:
    """Freeze the listening sshd: the kernel still completes TCP handshakes (backlog), but no
    banner ever comes. Live sessions are not touched."""
    with frozen([box.pid]):
        yield box.pid


# --------------------------------------------------------------------------------------------
# Keys


def wrong_client_key(box: SshdBox, name: str = "wrong_ed25519") -> Path:
    """A fresh client key that the box's authorized_keys does not hold."""
    path = box.root / name
    generate_key(path, "gpuwatch-test-wrong-key")
    return path


def change_host_key(box: SshdBox) -> str:
    """Give the box a new host key and restart sshd on the same port; known_hosts keeps the
    old key, so a strict client must refuse. Returns the new key's SHA256 fingerprint."""
    generate_key(box.host_key, "gpuwatch-test-host-changed")
    box.restart()
    return key_fingerprint(box.host_key)


# --------------------------------------------------------------------------------------------
# Stand-ins that hang

_HANG_SCRIPT = """#!/bin/sh
# gpuwatch test stand-in that hangs: reads nothing, prints nothing, never exits on its own
# while its parent lives. It leaves once re-parented (session gone), so no test leaks it.
parent=$PPID
while [ "$(cut -d' ' -f4 /proc/$$/stat)" = "$parent" ]; do sleep 0.2; done
"""


def hanging_standin(bin_dir: Path, name: str = "nvidia-smi") -> Path:
    """Write an executable ``bin_dir/name`` that hangs (e.g. a hung nvidia-smi or probe)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(_HANG_SCRIPT)
    path.chmod(0o755)
    return path
