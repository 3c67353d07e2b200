"""Bounded SSH exec over asyncssh: one connection, one command, closed (DESIGN §2).

``run_once(target, command, stdin, bounds=...)`` opens a fresh connection, runs one command with
``stdin`` fed in, reads its output under byte caps, closes, and returns an ``ExecResult``. Every
step has a deadline (U16, U17: a poll can fail, it can never hang): ``connect_timeout`` covers
TCP, key exchange and login (``login_timeout`` too), the ServerAlive pair becomes asyncssh's
keepalive, and ``command_timeout`` bounds the command. asyncssh turns most of these off by
default, so all are set on every call.

Failures raise one type, ``SshError(kind, message)``, whose kind is one of the ``--json`` error
kinds (``unreachable``, ``timeout``, ``auth``, ``host_key``, ``config``; ``probe`` is left to the
caller, for a command that ran and failed) and whose message is one sentence a person can act on.
``SshError.retryable`` sorts them as gpustat-web does: timeouts and dropped or refused connections
are worth another try; a refused login or host key is not.

Host keys are checked against known_hosts by default. ``accept_new_host_keys`` behaves as
OpenSSH's ``StrictHostKeyChecking=accept-new``: an unknown key is accepted and recorded; a changed
key is always refused, with the file and line to remove.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import asyncssh

__all__ = [
    "DEFAULT_MAX_STDERR",
    "DEFAULT_MAX_STDOUT",
    "Bounds",
    "ErrorKind",
    "ExecResult",
    "SshBounds",
    "SshError",
    "Target",
    "endpoint_keys",
    "keepalive_bound_s",
    "parse_target",
    "run_once",
]

ErrorKind = Literal["unreachable", "timeout", "auth", "host_key", "probe", "config"]

DEFAULT_MAX_STDOUT = 4 * 1024 * 1024
DEFAULT_MAX_STDERR = 256 * 1024
# A clean close normally takes one round trip; past this the connection is dropped instead.
CLOSE_GRACE_S = 1.0
DEFAULT_SSH_PORT = 22
_RETRYABLE_KINDS = frozenset({"unreachable", "timeout"})
ACK_PROMPTLY = True
"""Re-arm TCP_QUICKACK on every read (see ``_ack_promptly``); a switch for benchmarks."""


class SshError(Exception):
    """A bounded SSH call failed. ``kind`` is a ``--json`` error kind; ``message`` one sentence."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message

    @property
    def retryable(self) -> bool:
        """True for timeouts and lost/refused connections (try again later); False for a refused
        login, a host key problem or a bad config, which only a person can fix."""
        return self.kind in _RETRYABLE_KINDS

    def __repr__(self) -> str:
        return f"SshError({self.kind!r}, {self.message!r})"


class Bounds(Protocol):
    """The deadlines of one call, in seconds: the config's ``[ssh]`` keys (DESIGN §3).
    ``gpuwatch.remote.config.schema.SshSettings`` fits, and so does ``SshBounds``."""

    @property
    def connect_timeout(self) -> float: ...
    @property
    def server_alive_interval(self) -> float: ...
    @property
    def server_alive_count_max(self) -> int: ...
    @property
    def command_timeout(self) -> float: ...


@dataclass(frozen=True)
class SshBounds:
    """Deadlines of one call, in seconds (the ``[ssh]`` defaults of DESIGN §3)."""

    connect_timeout: float = 10.0
    """TCP connect + key exchange + login (also asyncssh's ``login_timeout``)."""
    server_alive_interval: float = 5.0
    """Keepalive request after this many seconds of silence (OpenSSH ServerAliveInterval)."""
    server_alive_count_max: int = 3
    """Unanswered keepalives before the connection is declared dead (ServerAliveCountMax)."""
    command_timeout: float = 30.0
    """Overall deadline on the command, from opening the session to its end."""


def keepalive_bound_s(bounds: Bounds) -> float:
    """How long a silent server can hold a call: asyncssh sends a keepalive every interval of
    silence and gives up when the (count_max + 1)th timer fires with none answered."""
    return bounds.server_alive_interval * (bounds.server_alive_count_max + 1)


@dataclass(frozen=True)
class Target:
    """What was typed after ``ssh``, split: ``user`` and ``port`` are None when not given (the
    ssh config or the defaults decide)."""

    host: str
    user: str | None = None
    port: int | None = None


def parse_target(text: str) -> Target:
    """Split ``alias``, ``user@host``, ``host:port``, ``user@host:port``, ``[v6]:port`` or a bare
    IPv6 address. Raises ``SshError("config")`` when it cannot be read."""
    raw = text.strip()
    user: str | None = None
    if "@" in raw:
        user, raw = raw.rsplit("@", 1)
        if not user:
            raise SshError("config", f"'{text}' has an empty user name before '@'.")
    port_text: str | None = None
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise SshError("config", f"'{text}' opens '[' without a closing ']'.")
        host, rest = raw[1:close], raw[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise SshError("config", f"'{text}' has '{rest}' after ']'; write [ADDRESS]:PORT.")
            port_text = rest[1:]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    else:
        host = raw  # a name, or a bare IPv6 address (several colons, no port)
    if not host:
        raise SshError("config", f"'{text}' names no host.")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise SshError("config", f"'{text}' has port '{port_text}'; a port is 1-65535.")
        port = int(port_text)
    return Target(host=host, user=user, port=port)


@dataclass(frozen=True)
class ExecResult:
    """One finished command. Timings are wall-clock seconds on this machine."""

    exit_status: int | None
    """The command's exit status; None when it died by a signal or output was cut off."""
    exit_signal: str | None
    """Signal name (e.g. ``KILL``) when the command died by one."""
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    """stdout passed ``max_stdout``: reading stopped and the channel was closed."""
    stderr_truncated: bool
    """stderr passed ``max_stderr``: the rest was discarded."""
    connect_s: float
    """TCP connect + key exchange + login."""
    exec_s: float
    """Opening the session to the command's end."""
    total_s: float
    """The whole call, close included."""
    bytes_sent: int
    """Channel payload sent: the command line and stdin."""
    bytes_received: int
    """Channel payload received: stdout and stderr, discarded bytes included."""

    @property
    def ok(self) -> bool:
        """Exit status 0 and nothing cut off."""
        return self.exit_status == 0 and not self.stdout_truncated


# --------------------------------------------------------------------------------------------
# known_hosts


@dataclass(frozen=True)
class _KnownHostsFile:
    path: Path
    lines: tuple[str, ...]
    hashed: bool


_known_hosts_cache: dict[Path, tuple[int, int, _KnownHostsFile]] = {}


def _read_known_hosts(path: Path) -> _KnownHostsFile | None:
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
    entry = _KnownHostsFile(path, lines, any(ln.startswith("|1|") for ln in lines))
    _known_hosts_cache[path] = (st.st_mtime_ns, st.st_size, entry)
    return entry


def _load_known_hosts(files: Sequence[_KnownHostsFile]) -> asyncssh.SSHKnownHosts:
    """One SSHKnownHosts from all files. A line asyncssh cannot read is skipped, as OpenSSH
    does, instead of failing the whole file."""
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
    files: Sequence[_KnownHostsFile], host: str, addr: str, port: int | None
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
class _HostKeyVerdict:
    kind: Literal["unknown", "changed", "added"]
    fingerprint: str
    lines: list[tuple[Path, int]] = field(default_factory=list)
    recorded_in: Path | None = None


class _Client(asyncssh.SSHClient):
    """Decides on host keys known_hosts does not already trust, like OpenSSH: unknown (no entry
    for the host) vs changed (an entry with another key). asyncssh calls
    ``validate_host_public_key`` only for a key it did not find trusted."""

    def __init__(self, files: Sequence[_KnownHostsFile], append_to: Path, accept_new: bool):
        self._files = files
        self._append_to = append_to
        self._accept_new = accept_new
        self.verdict: _HostKeyVerdict | None = None
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
            self.verdict = _HostKeyVerdict("changed", fingerprint, lines)
            return False
        if not self._accept_new:
            self.verdict = _HostKeyVerdict("unknown", fingerprint)
            return False
        existing = _read_known_hosts(self._append_to)
        _append_known_host(
            self._append_to, _known_hosts_entry(host, port, key, bool(existing and existing.hashed))
        )
        self.verdict = _HostKeyVerdict("added", fingerprint, recorded_in=self._append_to)
        return True


# --------------------------------------------------------------------------------------------
# Output


class _Collector(asyncssh.SSHClientSession[bytes]):
    """Keeps at most ``max_stdout``/``max_stderr`` bytes. Past the stdout cap it stops reading
    and closes the channel (a box printing garbage cannot grow our memory); past the stderr cap
    the rest is dropped and counted."""

    def __init__(self, max_stdout: int, max_stderr: int) -> None:
        self._max = {None: max_stdout, asyncssh.EXTENDED_DATA_STDERR: max_stderr}
        self.out = {None: bytearray(), asyncssh.EXTENDED_DATA_STDERR: bytearray()}
        self.truncated = {None: False, asyncssh.EXTENDED_DATA_STDERR: False}
        self.bytes_received = 0
        self.done: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None

    def connection_made(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self._chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.bytes_received += len(data)
        stderr = datatype == asyncssh.EXTENDED_DATA_STDERR
        stream = asyncssh.EXTENDED_DATA_STDERR if stderr else None
        buf = self.out[stream]
        room = self._max[stream] - len(buf)
        if len(data) <= room:
            buf += data
            return
        buf += data[: max(room, 0)]
        if not self.truncated[stream]:
            self.truncated[stream] = True
            if stream is None and self._chan is not None:
                self._chan.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(exc)


# --------------------------------------------------------------------------------------------
# The call


async def run_once(
    target: str,
    command: str,
    stdin: bytes = b"",
    *,
    bounds: Bounds | None = None,
    config_file: str | os.PathLike[str] | None = None,
    known_hosts: str | os.PathLike[str] | None = None,
    identity_file: str | os.PathLike[str] | None = None,
    accept_new_host_keys: bool = False,
    max_stdout: int = DEFAULT_MAX_STDOUT,
    max_stderr: int = DEFAULT_MAX_STDERR,
    opening: contextlib.AbstractAsyncContextManager[Any] | None = None,
) -> ExecResult:
    """Run ``command`` on ``target`` over one fresh SSH connection, feed it ``stdin``, close.

    ``target`` is what you would type after ``ssh``. ``config_file`` is read like OpenSSH reads
    ``~/.ssh/config`` (Host aliases, User, Port, IdentityFile, ProxyJump; default
    ``~/.ssh/config``); ``known_hosts`` overrides its UserKnownHostsFile (default
    ``~/.ssh/known_hosts``); ``identity_file`` overrides its IdentityFile. The ssh-agent at
    ``SSH_AUTH_SOCK`` is used when set. ``opening``, when given, is held from the TCP connect
    to the end of the login (the poller's per-sshd bound on connections being opened; waiting
    for it counts in ``total_s``, not ``connect_s``). A non-zero exit is a result, not an error.
    Raises ``SshError`` on every failure to connect, log in or finish within ``bounds``.
    """
    bounds = bounds or SshBounds()
    t0 = time.monotonic()
    tgt = parse_target(target)
    kwargs = _connect_kwargs(tgt, bounds, config_file, identity_file)
    resolved = await asyncio.to_thread(_resolve, tgt, kwargs, config_file)
    if resolved.client_keys is not None:
        kwargs["client_keys"] = resolved.client_keys
    files, append_to = _known_hosts_files(resolved, known_hosts)
    client = _Client(files, append_to, accept_new_host_keys)
    where = f"{resolved.username}@{resolved.host} port {resolved.port}"

    try:
        async with opening or contextlib.nullcontext():
            t_open = time.monotonic()
            conn = await asyncssh.connect(
                **_from_parsed(kwargs, resolved),
                known_hosts=_load_known_hosts(files),
                client_factory=lambda: client,
            )
    except TimeoutError:
        raise SshError(
            "timeout",
            f"{where} did not finish connecting and logging in within "
            f"connect_timeout ({bounds.connect_timeout:g} s); check the host is up and "
            "reachable, or raise connect_timeout.",
        ) from None
    except asyncssh.HostKeyNotVerifiable as exc:
        ssh_cmd = _ssh_command(tgt, config_file, known_hosts)
        raise _host_key_error(resolved.host, resolved.port, ssh_cmd, client.verdict, exc) from None
    except asyncssh.PermissionDenied:
        raise _auth_error(where, resolved, identity_file) from None
    except asyncssh.KeyExchangeFailed as exc:
        kind: ErrorKind = "host_key" if "host key" in exc.reason.lower() else "unreachable"
        raise SshError(kind, f"{where}: key exchange failed ({exc.reason}).") from None
    except (asyncssh.DisconnectError, asyncssh.ChannelOpenError) as exc:
        raise _lost_error(where, exc, bounds, during="login") from None
    except OSError as exc:
        raise _os_error(where, resolved.host, exc) from None
    t_conn = time.monotonic()
    _ack_promptly(conn)

    closed_cleanly = False
    try:
        collector, chan = await _exec(conn, command, stdin, bounds, where, max_stdout, max_stderr)
        t_exec = time.monotonic()
        closed_cleanly = True
    finally:
        await _close(conn, cleanly=closed_cleanly)
    signal_info = chan.get_exit_signal()
    status = chan.get_exit_status()
    return ExecResult(
        exit_status=None if status is None or status < 0 else status,
        exit_signal=signal_info[0] if signal_info else None,
        stdout=bytes(collector.out[None]),
        stderr=bytes(collector.out[asyncssh.EXTENDED_DATA_STDERR]),
        stdout_truncated=collector.truncated[None],
        stderr_truncated=collector.truncated[asyncssh.EXTENDED_DATA_STDERR],
        connect_s=t_conn - t_open,
        exec_s=t_exec - t_conn,
        total_s=time.monotonic() - t0,
        bytes_sent=len(command.encode()) + len(stdin),
        bytes_received=collector.bytes_received,
    )


async def _exec(
    conn: asyncssh.SSHClientConnection,
    command: str,
    stdin: bytes,
    bounds: Bounds,
    where: str,
    max_stdout: int,
    max_stderr: int,
) -> tuple[_Collector, asyncssh.SSHClientChannel[bytes]]:
    """Open one session, send stdin + EOF, wait for the channel to close under command_timeout."""
    chan: asyncssh.SSHClientChannel[bytes] | None = None
    try:
        async with asyncio.timeout(bounds.command_timeout):
            chan, session = await conn.create_session(
                lambda: _Collector(max_stdout, max_stderr), command, encoding=None
            )
            collector = cast(_Collector, session)
            try:
                if stdin:
                    chan.write(stdin)
                chan.write_eof()
            except BrokenPipeError:
                # The command ended before we could feed it (a missing interpreter: the shell
                # exits 127 at once): its exit status still comes; a lost connection shows in
                # collector.done as it would have anyway.
                pass
            exc = await collector.done
    except TimeoutError:
        if chan is not None:
            _terminate(chan)
        raise SshError(
            "timeout",
            f"the command on {where} did not finish within command_timeout "
            f"({bounds.command_timeout:g} s); the box may be overloaded or the command hung.",
        ) from None
    except (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError) as err:
        raise _lost_error(where, err, bounds, during="command") from None
    if exc is not None:  # the connection went away under the command (keepalive, reset, ...)
        raise _lost_error(where, exc, bounds, during="command")
    return collector, chan


def _terminate(chan: asyncssh.SSHClientChannel[bytes]) -> None:
    """Ask sshd to send SIGTERM to a command we give up on, before the connection is dropped.

    Why: sshd signals no non-tty command when its client goes, so a hung command would stay on
    the box, one more every poll (U16, U17). OpenSSH >= 7.9 honours the request (it signals
    the session's process group), but not for a root login (no post-auth privilege separation
    there: it logs a refusal); older ones ignore it. Only a belt: the probe bounds itself
    (probe.arm_deadline), ending its own commands, which lead process groups of their own.
    """
    with contextlib.suppress(OSError, ValueError):  # the channel may be closing already
        chan.send_signal("TERM")


def _ack_promptly(conn: asyncssh.SSHClientConnection) -> None:
    """Re-arm TCP_QUICKACK after every read, so replies to the exec are ACKed at once.

    Why: sshd sets TCP_NODELAY only for tty sessions, so for an exec its packets are Nagled:
    after the channel-open confirmation it holds each further small packet (exec reply, window
    adjust, output, exit status, close) until we ACK the previous one, and Linux delays that ACK
    up to 40 ms. asyncssh already sets TCP_NODELAY on our side, which does not help here.
    TCP_QUICKACK is not sticky (the kernel drops back to delayed ACKs), hence once per read.
    Measured on loopback, same run, medians of 40: exec 48.6 -> 6.0 ms, connect + run + close
    95.9 -> 54.5 ms; setting it once, or before the key exchange, gains nothing. Linux only.
    """
    quickack = getattr(socket, "TCP_QUICKACK", None) if ACK_PROMPTLY else None
    sock = conn.get_extra_info("socket")
    if quickack is None or sock is None:
        return
    receive = conn.data_received

    def data_received(data: bytes, datatype: asyncssh.DataType = None) -> None:
        receive(data, datatype)
        with contextlib.suppress(OSError):  # the socket may be closing
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)

    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
        # The transport calls the protocol's data_received; an instance attribute wins.
        setattr(conn, "data_received", data_received)  # noqa: B010


async def _close(conn: asyncssh.SSHClientConnection, *, cleanly: bool) -> None:
    """Close within CLOSE_GRACE_S; a connection that failed (or will not close) is dropped."""
    if not cleanly:
        conn.abort()
        return
    conn.close()
    try:
        async with asyncio.timeout(CLOSE_GRACE_S):
            await conn.wait_closed()
    except TimeoutError:
        conn.abort()


# --------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class _Resolved:
    host: str
    port: int
    username: str
    config: Any  # asyncssh's parsed ssh config for this host
    client_keys: list[str] | None  # IdentityFile entries that exist, when some do not
    parsed: Any = None  # the options it came from (_parsed): the connection starts from them


def _connect_kwargs(
    tgt: Target,
    bounds: Bounds,
    config_file: str | os.PathLike[str] | None,
    identity_file: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "host": tgt.host,
        # DESIGN §2: every step bounded. asyncssh's defaults are no connect timeout, a 2 min
        # login timeout and no keepalive; ssh_config values are overridden by ours.
        "connect_timeout": bounds.connect_timeout,
        "login_timeout": bounds.connect_timeout,
        "keepalive_interval": bounds.server_alive_interval,
        "keepalive_count_max": bounds.server_alive_count_max,
        # No GSSAPI round trips (the ssh config may ask for them; a GPU box hardly uses Kerberos).
        "gss_auth": False,
        "gss_kex": False,
    }
    if tgt.port is not None:
        kwargs["port"] = tgt.port
    if tgt.user is not None:
        kwargs["username"] = tgt.user
    if config_file is not None:
        kwargs["config"] = [str(Path(config_file).expanduser())]
    if identity_file is not None:
        kwargs["client_keys"] = [str(Path(identity_file).expanduser())]
    return kwargs


def _from_parsed(kwargs: dict[str, Any], resolved: _Resolved) -> dict[str, Any]:
    """The connection's kwargs, starting from the ssh config as _parsed read it rather than
    reading the file again: asyncssh parses the whole file on every connection (9 ms of client
    CPU per poll with a 51-host config, as much as the rest of the poll; issue 3).

    The parsed options were made with no keys, no agent and no known_hosts (only to read the
    config), and asyncssh's options inherit every keyword of the options they start from: so
    client_keys and agent_path are given again here as asyncssh's defaults (the config's
    IdentityFile / IdentityAgent, SSH_AUTH_SOCK) and known_hosts by the caller. A ProxyJump
    target is left to read the file: asyncssh opens the jump connection with the `config` given
    to connect, and None there would resolve the jump host without the ssh config."""
    parsed = resolved.parsed
    if parsed is None or parsed.tunnel:
        return kwargs
    return {**kwargs, "options": parsed, "config": None,
            "client_keys": kwargs.get("client_keys", ()), "agent_path": ()}


def _options(kwargs: dict[str, Any], host: str) -> asyncssh.SSHClientConnectionOptions:
    """asyncssh's options for these connect kwargs with the ssh config applied, keys not
    loaded. Config errors become ``SshError("config")``."""
    probe = {k: v for k, v in kwargs.items() if k != "client_keys"}
    try:
        return asyncssh.SSHClientConnectionOptions(
            **probe, client_keys=None, agent_path=None, known_hosts=None
        )
    except asyncssh.ConfigParseError as exc:
        raise SshError("config", f"cannot read the ssh config: {exc}.") from None
    except (OSError, ValueError) as exc:
        raise SshError("config", f"bad ssh options for '{host}': {exc}.") from None


PARSED_TTL_S = 30.0
"""How long one reading of the ssh config is reused while its file is unchanged (a file it
Includes may change unseen for this long)."""
_parsed_cache: dict[
    tuple[Target, str | None], tuple[float, tuple[int, int] | None, Any]
] = {}


def _parsed(
    tgt: Target, config_file: str | os.PathLike[str] | None
) -> asyncssh.SSHClientConnectionOptions:
    """The ssh config applied to a target (host, port, user and the config's other keys), keys
    not loaded; reused for PARSED_TTL_S while the file is unchanged.

    Why: asyncssh reads the whole file for every target, shlex-splitting each line (about 6 ms
    for a 50-host config), and each poll needs it twice here (endpoint_keys, _resolve): with N
    hosts in one ssh config a fleet poll cost O(N^2), on the event loop for endpoint_keys. The
    connection's own reading (asyncssh's, in its executor) is left as it is.
    """
    path = Path(config_file).expanduser() if config_file is not None else None
    try:
        st = (path or Path.home() / ".ssh" / "config").stat()
        stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    key = (tgt, str(path) if path else None)
    now = time.monotonic()
    cached = _parsed_cache.get(key)
    if cached is not None and cached[1] == stamp and now - cached[0] < PARSED_TTL_S:
        return cast(asyncssh.SSHClientConnectionOptions, cached[2])
    options = _options(_connect_kwargs(tgt, SshBounds(), config_file, None), tgt.host)
    if len(_parsed_cache) > 4096:  # a long-running TUI with ad-hoc targets: stay bounded
        _parsed_cache.clear()
    _parsed_cache[key] = (now, stamp, options)
    return options


def _resolve(
    tgt: Target, kwargs: dict[str, Any], config_file: str | os.PathLike[str] | None
) -> _Resolved:
    """Apply the ssh config to the target (host, port, user, key and known_hosts files) the way
    the connection will. Blocking file reads: run it in a thread."""
    _check_files(config_file, kwargs.get("client_keys"))
    options = _parsed(tgt, config_file)
    client_keys = None
    if "client_keys" not in kwargs:
        # OpenSSH skips an IdentityFile that does not exist (one ssh config, many machines);
        # asyncssh fails the connection on it. Hand it only the files that are there.
        present = _identity_files(options.config)
        if len(present) != len(cast(list[str], options.config.get("IdentityFile", []))):
            client_keys = present
    return _Resolved(
        host=str(options.host),
        port=int(options.port or DEFAULT_SSH_PORT),
        username=str(options.username),
        config=options.config,
        client_keys=client_keys,
        parsed=options,
    )


def endpoint_keys(target: str, config_file: str | os.PathLike[str] | None = None) -> list[str]:
    """``host:port`` of every sshd a connection to ``target`` opens a connection to: the final
    sshd and each ProxyJump hop, as the ssh config resolves them (aliases of one sshd give one
    key). For bounding how many connections are being opened per sshd (MaxStartups)."""
    keys: list[str] = []
    hops = [target]
    while hops and len(keys) < 16:  # a ProxyJump loop in the config must not spin
        tgt = parse_target(hops.pop(0))
        options = _parsed(tgt, config_file)
        keys.append(f"{options.host}:{options.port or DEFAULT_SSH_PORT}")
        jump = options.tunnel if isinstance(options.tunnel, str) else ""
        if jump and jump.lower() != "none":
            hops.extend(h.strip() for h in jump.split(",") if h.strip())
    return keys


def _identity_files(config: Any) -> list[str]:
    """The ssh config's IdentityFile entries that exist, ``~`` expanded."""
    paths = (Path(p).expanduser() for p in config.get("IdentityFile", ()))
    return [str(p) for p in paths if p.is_file()]


def _check_files(config_file: str | os.PathLike[str] | None, keys: list[str] | None) -> None:
    if config_file is not None and not Path(config_file).expanduser().is_file():
        raise SshError("config", f"ssh config file {config_file} does not exist; fix config_file.")
    for key in keys or ():
        if not Path(key).is_file():
            raise SshError("config", f"identity_file {key} does not exist; fix identity_file.")


def _known_hosts_files(
    resolved: _Resolved, known_hosts: str | os.PathLike[str] | None
) -> tuple[list[_KnownHostsFile], Path]:
    """The files to trust keys from and the one to record new keys in, as OpenSSH picks them:
    UserKnownHostsFile (or ~/.ssh/known_hosts; ``known_hosts`` overrides both) plus
    GlobalKnownHostsFile (or /etc/ssh/ssh_known_hosts{,2}). New keys go to the first user file."""
    if known_hosts is not None:
        user_files = [str(known_hosts)]
    else:
        user_files = list(resolved.config.get("UserKnownHostsFile", ())) or ["~/.ssh/known_hosts"]
    global_files = list(resolved.config.get("GlobalKnownHostsFile", ())) or [
        "/etc/ssh/ssh_known_hosts",
        "/etc/ssh/ssh_known_hosts2",
    ]
    paths = [Path(p).expanduser() for p in [*user_files, *global_files] if p.lower() != "none"]
    loaded = [kh for kh in map(_read_known_hosts, paths) if kh is not None]
    append_to = Path(user_files[0]).expanduser()
    return loaded, append_to


# --------------------------------------------------------------------------------------------
# Errors


def _ssh_command(
    tgt: Target,
    config_file: str | os.PathLike[str] | None,
    known_hosts: str | os.PathLike[str] | None,
) -> str:
    """The OpenSSH command that reaches the same host with the same files: the fix to print."""
    words = ["ssh"]
    home_ssh = Path.home() / ".ssh"
    if config_file is not None and Path(config_file).expanduser() != home_ssh / "config":
        words += ["-F", shlex.quote(str(config_file))]
    if known_hosts is not None and Path(known_hosts).expanduser() != home_ssh / "known_hosts":
        words += ["-o", shlex.quote(f"UserKnownHostsFile={known_hosts}")]
    if tgt.port is not None:
        words += ["-p", str(tgt.port)]
    words.append(f"{tgt.user}@{tgt.host}" if tgt.user else tgt.host)
    return " ".join(words)


def _host_key_error(
    host: str, port: int, ssh_cmd: str, verdict: _HostKeyVerdict | None, exc: Exception
) -> SshError:
    shown = host if port == DEFAULT_SSH_PORT else f"[{host}]:{port}"
    if verdict is None:  # revoked key, or a certificate problem: asyncssh said why
        return SshError("host_key", f"the host key of {shown} was refused: {exc}.")
    if verdict.kind == "changed":
        where = ", ".join(f"{path} line {line}" for path, line in verdict.lines)
        return SshError(
            "host_key",
            f"the host key of {shown} has CHANGED (now {verdict.fingerprint}); this can mean the "
            f"box was reinstalled or someone is intercepting the connection: check with the "
            f"box's owner, then remove the old entry ({where}) and connect once with `{ssh_cmd}`.",
        )
    return SshError(
        "host_key",
        f"the host key of {shown} is not in known_hosts (it is {verdict.fingerprint}); run "
        f"`{ssh_cmd}` once to check and accept it, or pass --accept-new-host-keys.",
    )


def _auth_error(
    where: str, resolved: _Resolved, identity_file: str | os.PathLike[str] | None
) -> SshError:
    if identity_file is not None:
        keys = [str(identity_file)]
    else:
        configured = _identity_files(resolved.config)
        defaults = ["id_ed25519_sk", "id_ecdsa_sk", "id_ed25519", "id_ecdsa", "id_rsa"]
        keys = configured or [
            f"~/.ssh/{name}" for name in defaults if (Path.home() / ".ssh" / name).is_file()
        ]
    tried = ", ".join(keys) if keys else "no key files"
    if os.environ.get("SSH_AUTH_SOCK") and not resolved.config.get("IdentitiesOnly"):
        tried += " and the ssh-agent's keys"
    return SshError(
        "auth",
        f"{where} refused the login for user '{resolved.username}' (tried {tried}); add your "
        f"public key to ~{resolved.username}/.ssh/authorized_keys on the box, or point "
        "identity_file (or IdentityFile in the ssh config) at the right key.",
    )


def _lost_error(where: str, exc: Exception, bounds: Bounds, *, during: str) -> SshError:
    reason = str(getattr(exc, "reason", "") or exc)
    lowered = reason.lower()
    if "keepalive" in lowered:  # asyncssh: "Server not responding to keepalive"
        return SshError(
            "timeout",
            f"{where} stopped answering during the {during}: no reply to keepalives for "
            f"server_alive_interval × (server_alive_count_max + 1) = "
            f"{bounds.server_alive_interval:g} s × {bounds.server_alive_count_max + 1} "
            f"({keepalive_bound_s(bounds):g} s); the box or the network is stalled.",
        )
    if "login timeout" in lowered:
        return SshError(
            "timeout",
            f"{where} did not finish the login within login_timeout "
            f"({bounds.connect_timeout:g} s, the connect_timeout); raise connect_timeout.",
        )
    if isinstance(exc, asyncssh.ChannelOpenError):
        return SshError(
            "unreachable",
            f"{where} accepted the login but refused to open a session ({reason}); check the "
            "box's sshd (MaxSessions, ForceCommand) and try again.",
        )
    return SshError(
        "unreachable",
        f"{where} dropped the connection during the {during} ({reason}); sshd may be "
        "overloaded (MaxStartups) or restarting; try again.",
    )


def _os_error(where: str, host: str, exc: OSError) -> SshError:
    if isinstance(exc, socket.gaierror):
        return SshError(
            "unreachable",
            f"cannot resolve host name '{host}' ({exc.strerror}); check the name, the ssh "
            "config's HostName, or DNS.",
        )
    # asyncio reports "Multiple exceptions: [Errno 111] ..." when every address refused.
    if isinstance(exc, ConnectionRefusedError) or "[Errno 111]" in str(exc):
        return SshError(
            "unreachable",
            f"{where} refused the connection: no sshd is listening there; check the host and "
            "port, and that sshd runs.",
        )
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return SshError(
            "unreachable",
            f"{where} reset the connection ({exc.strerror}); sshd may be overloaded "
            "(MaxStartups) or restarting; try again.",
        )
    if exc.filename is not None:  # a local file (a key, a known_hosts), not the network
        return SshError(
            "config", f"cannot read {exc.filename} ({exc.strerror}); fix the path or its mode."
        )
    reason = exc.strerror or str(exc)
    return SshError(
        "unreachable", f"cannot reach {where} ({reason}); check the network route to it."
    )
