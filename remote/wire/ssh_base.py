"""What the bounded SSH exec (ssh.py) is given and gives back: targets, bounds, results, and
its one error type, SshError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

ErrorKind = Literal["unreachable", "timeout", "auth", "host_key", "probe", "config"]

DEFAULT_MAX_STDOUT = 4 * 1024 * 1024
DEFAULT_MAX_STDERR = 256 * 1024
DEFAULT_SSH_PORT = 22
_RETRYABLE_KINDS = frozenset({"unreachable", "timeout"})


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
