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

In files: ssh_base.py (targets, bounds, results, SshError), ssh_config.py (the ssh config
applied to a target), ssh_hosts.py (known_hosts); this one runs the call and names its
failures, and re-exports what callers use (``__all__``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Any, cast

import asyncssh

from .ssh_base import (
    DEFAULT_MAX_STDERR,
    DEFAULT_MAX_STDOUT,
    DEFAULT_SSH_PORT,
    Bounds,
    ErrorKind,
    ExecResult,
    SshBounds,
    SshError,
    Target,
    keepalive_bound_s,
    parse_target,
)
from .ssh_config import (
    Resolved,
    connect_kwargs,
    endpoint_keys,
    from_parsed,
    identity_files,
    kept_endpoint_keys,
    known_hosts_files,
    resolve,
)
from .ssh_hosts import (
    Client,
    HostKeyVerdict,
    load_known_hosts,
)

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
    "kept_endpoint_keys",
    "parse_target",
    "run_once",
]

# A clean close normally takes one round trip; past this the connection is dropped instead.
CLOSE_GRACE_S = 1.0
ACK_PROMPTLY = True
"""Re-arm TCP_QUICKACK on every read (see ``_ack_promptly``); a switch for benchmarks."""

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
    kwargs = connect_kwargs(tgt, bounds, config_file, identity_file)
    # the ssh config's kept reading on the loop (a stat); a new reading in a thread (a file
    # read, the whole config parsed: milliseconds): a thread's hop costs a steady poll ~0.1 ms
    resolved = resolve(tgt, kwargs, config_file, kept_only=True) or await asyncio.to_thread(
        resolve, tgt, kwargs, config_file)
    assert resolved is not None
    if resolved.client_keys is not None:
        kwargs["client_keys"] = resolved.client_keys
    files, append_to = known_hosts_files(resolved, known_hosts)
    client = Client(files, append_to, accept_new_host_keys)
    where = f"{resolved.username}@{resolved.host} port {resolved.port}"

    try:
        async with opening or contextlib.nullcontext():
            t_open = time.monotonic()
            conn = await asyncssh.connect(
                **from_parsed(kwargs, resolved),
                known_hosts=load_known_hosts(files),
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
    host: str, port: int, ssh_cmd: str, verdict: HostKeyVerdict | None, exc: Exception
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
    where: str, resolved: Resolved, identity_file: str | os.PathLike[str] | None
) -> SshError:
    if identity_file is not None:
        keys = [str(identity_file)]
    else:
        configured = identity_files(resolved.config)
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
