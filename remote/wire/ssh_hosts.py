"""known_hosts for the bounded SSH exec (ssh.py): reading the files, checking a host key, and
recording a new one (accept_new_host_keys, as OpenSSH's StrictHostKeyChecking=accept-new)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import asyncssh

from .ssh_base import (
    DEFAULT_SSH_PORT,
)


@dataclass(frozen=True)
class KnownHostsFile:
    path: Path
    lines: tuple[str, ...]
    hashed: bool


_known_hosts_cache: dict[Path, tuple[int, int, KnownHostsFile]] = {}


def read_known_hosts(path: Path) -> KnownHostsFile | None:
    """The file's lines, cached on (mtime, size): a poll every few seconds must not re-read it."""
    try:
        st = path.stat()
    except OSError:
        return None
    cached = _known_hosts_cache.get(path)
    if cached and cached[:2] == (st.st_mtime_ns, st.st_size):
        return cached[2]
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    lines = tuple(text.splitlines())
    entry = KnownHostsFile(path, lines, any(ln.startswith("|1|") for ln in lines))
    _known_hosts_cache[path] = (st.st_mtime_ns, st.st_size, entry)
    return entry


_loaded: dict[tuple[int, ...], tuple[tuple[KnownHostsFile, ...], asyncssh.SSHKnownHosts]] = {}


def load_known_hosts(files: Sequence[KnownHostsFile]) -> asyncssh.SSHKnownHosts:
    """One SSHKnownHosts from all files. A line asyncssh cannot read is skipped, as OpenSSH
    does, instead of failing the whole file. Kept while the files are unchanged (the same
    read_known_hosts readings): parsing every key of a user's known_hosts on every poll cost
    more client CPU than the rest of the poll; asyncssh only matches against it."""
    key = tuple(map(id, files))
    cached = _loaded.get(key)
    if cached is not None and all(a is b for a, b in zip(cached[0], files, strict=True)):
        return cached[1]
    known = _parse_known_hosts(files)
    if len(_loaded) > 64:  # files that change (accept-new appends) leave old readings behind
        _loaded.clear()
    _loaded[key] = (tuple(files), known)
    return known


def _parse_known_hosts(files: Sequence[KnownHostsFile]) -> asyncssh.SSHKnownHosts:
    known = asyncssh.SSHKnownHosts()
    for kh in files:
        try:
            known.load("\n".join(kh.lines))
        except ValueError:
            for line in kh.lines:
                try:
                    asyncssh.import_known_hosts(line)
                except ValueError:
                    continue
                known.load(line)
    return known


def _known_lines_for(
    files: Sequence[KnownHostsFile], host: str, addr: str, port: int | None
) -> list[tuple[Path, int]]:
    """(file, line number) of every plain key entry that names this host (asyncssh's matching,
    port fallback included). Only called when a key was not trusted, so per-line cost is fine."""
    found: list[tuple[Path, int]] = []
    for kh in files:
        for number, line in enumerate(kh.lines, 1):
            stripped = line.strip()
            if not stripped or stripped.startswith(("#", "@")):
                continue
            try:
                keys = asyncssh.import_known_hosts(stripped).match(host, addr, port)[0]
            except ValueError:
                continue
            if keys:
                found.append((kh.path, number))
    return found


def _known_hosts_entry(host: str, port: int, key: asyncssh.SSHKey, hashed: bool) -> str:
    """One known_hosts line as OpenSSH writes it: ``[host]:port`` off port 22; HMAC-SHA1 hashed
    (``|1|salt|hash``) when the file already uses hashed names (HashKnownHosts)."""
    name = host if port == DEFAULT_SSH_PORT else f"[{host}]:{port}"
    if hashed:
        salt = os.urandom(20)
        digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    alg, data = key.export_public_key("openssh").decode().split()[:2]
    return f"{name} {alg} {data}\n"


def _append_known_host(path: Path, entry: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        if fh.tell() > 0:
            with open(path, "rb") as check:
                check.seek(-1, os.SEEK_END)
                if check.read(1) != b"\n":
                    entry = "\n" + entry
        fh.write(entry)


@dataclass
class HostKeyVerdict:
    kind: Literal["unknown", "changed", "added"]
    fingerprint: str
    lines: list[tuple[Path, int]] = field(default_factory=list)
    recorded_in: Path | None = None


class Client(asyncssh.SSHClient):
    """Decides on host keys known_hosts does not already trust, like OpenSSH: unknown (no entry
    for the host) vs changed (an entry with another key). asyncssh calls
    ``validate_host_public_key`` only for a key it did not find trusted."""

    def __init__(self, files: Sequence[KnownHostsFile], append_to: Path, accept_new: bool):
        self._files = files
        self._append_to = append_to
        self._accept_new = accept_new
        self.verdict: HostKeyVerdict | None = None
        self.conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        fingerprint = key.get_fingerprint("sha256")
        match_port = None if port == DEFAULT_SSH_PORT else port
        lines = _known_lines_for(self._files, host, addr, match_port)
        if lines:
            self.verdict = HostKeyVerdict("changed", fingerprint, lines)
            return False
        if not self._accept_new:
            self.verdict = HostKeyVerdict("unknown", fingerprint)
            return False
        existing = read_known_hosts(self._append_to)
        _append_known_host(
            self._append_to, _known_hosts_entry(host, port, key, bool(existing and existing.hashed))
        )
        self.verdict = HostKeyVerdict("added", fingerprint, recorded_in=self._append_to)
        return True
