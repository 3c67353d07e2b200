"""The ssh config as the bounded SSH exec (ssh.py) applies it: a target's host, port, user,
keys and known_hosts files, and the connection's options (one reading reused while the file is
unchanged, PARSED_TTL_S)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import asyncssh

from .ssh_base import (
    DEFAULT_SSH_PORT,
    Bounds,
    SshBounds,
    SshError,
    Target,
    parse_target,
)
from .ssh_hosts import (
    KnownHostsFile,
    read_known_hosts,
)


@dataclass(frozen=True)
class Resolved:
    host: str
    port: int
    username: str
    config: Any  # asyncssh's parsed ssh config for this host
    client_keys: list[str] | None  # IdentityFile entries that exist, when some do not
    parsed: Any = None  # the options it came from (_parsed): the connection starts from them


def connect_kwargs(
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


def from_parsed(kwargs: dict[str, Any], resolved: Resolved) -> dict[str, Any]:
    """The connection's kwargs, starting from the ssh config as _parsed read it rather than
    reading the file again: asyncssh parses the whole file on every connection (9 ms of client
    CPU per poll with a 51-host config, as much as the rest of the poll).

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


PARSED_TTL_S = 300.0
"""How long one reading of the ssh config is reused while its file is unchanged (a file it
Includes may change unseen for this long). asyncssh reads the whole file for each target: with
one Host block per box, every target read again each 30 s cost a 512-host fleet more client
CPU than its polls (the file grows with the fleet: O(N^2) every TTL)."""
_parsed_cache: dict[
    tuple[Target, str | None], tuple[float, tuple[int, int] | None, Any]
] = {}


def _parsed(
    tgt: Target, config_file: str | os.PathLike[str] | None, *, kept_only: bool = False
) -> asyncssh.SSHClientConnectionOptions | None:
    """The ssh config applied to a target (host, port, user and the config's other keys), keys
    not loaded; reused for PARSED_TTL_S while the file is unchanged.

    Why: asyncssh reads the whole file for every target, shlex-splitting each line (about 6 ms
    for a 50-host config), and each poll needs it twice here (endpoint_keys, resolve): with N
    hosts in one ssh config a fleet poll cost O(N^2), on the event loop for endpoint_keys. The
    connection's own reading (asyncssh's, in its executor) is left as it is. With
    ``kept_only``, None rather than a new reading (a stat of the file, no read).
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
    if kept_only:
        return None
    options = _options(connect_kwargs(tgt, SshBounds(), config_file, None), tgt.host)
    if len(_parsed_cache) > 4096:  # a long-running TUI with ad-hoc targets: stay bounded
        _parsed_cache.clear()
    _parsed_cache[key] = (now, stamp, options)
    return options


def resolve(
    tgt: Target, kwargs: dict[str, Any], config_file: str | os.PathLike[str] | None,
    *, kept_only: bool = False,
) -> Resolved | None:
    """Apply the ssh config to the target (host, port, user, key and known_hosts files) the way
    the connection will. Blocking file reads: run it in a thread, unless ``kept_only``: then
    only from a kept reading of the config (the files stat'ed, none read), else None."""
    _check_files(config_file, kwargs.get("client_keys"))
    options = _parsed(tgt, config_file, kept_only=kept_only)
    if options is None:
        return None
    client_keys = None
    if "client_keys" not in kwargs:
        # OpenSSH skips an IdentityFile that does not exist (one ssh config, many machines);
        # asyncssh fails the connection on it. Hand it only the files that are there.
        present = identity_files(options.config)
        if len(present) != len(cast(list[str], options.config.get("IdentityFile", []))):
            client_keys = present
    return Resolved(
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
    keys = _endpoint_keys(target, config_file, kept_only=False)
    assert keys is not None
    return keys


def kept_endpoint_keys(target: str,
                       config_file: str | os.PathLike[str] | None = None) -> list[str] | None:
    """endpoint_keys from the kept reading of the ssh config (a stat, no read: fit for the
    event loop), or None where the config must be read (then endpoint_keys, in a thread)."""
    return _endpoint_keys(target, config_file, kept_only=True)


def _endpoint_keys(target: str, config_file: str | os.PathLike[str] | None,
                   *, kept_only: bool) -> list[str] | None:
    keys: list[str] = []
    hops = [target]
    while hops and len(keys) < 16:  # a ProxyJump loop in the config must not spin
        tgt = parse_target(hops.pop(0))
        options = _parsed(tgt, config_file, kept_only=kept_only)
        if options is None:
            return None
        keys.append(f"{options.host}:{options.port or DEFAULT_SSH_PORT}")
        jump = options.tunnel if isinstance(options.tunnel, str) else ""
        if jump and jump.lower() != "none":
            hops.extend(h.strip() for h in jump.split(",") if h.strip())
    return keys


def identity_files(config: Any) -> list[str]:
    """The ssh config's IdentityFile entries that exist, ``~`` expanded."""
    paths = (Path(p).expanduser() for p in config.get("IdentityFile", ()))
    return [str(p) for p in paths if p.is_file()]


def _check_files(config_file: str | os.PathLike[str] | None, keys: list[str] | None) -> None:
    if config_file is not None and not Path(config_file).expanduser().is_file():
        raise SshError("config", f"ssh config file {config_file} does not exist; fix config_file.")
    for key in keys or ():
        if not Path(key).is_file():
            raise SshError("config", f"identity_file {key} does not exist; fix identity_file.")


def known_hosts_files(
    resolved: Resolved, known_hosts: str | os.PathLike[str] | None
) -> tuple[list[KnownHostsFile], Path]:
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
    loaded = [kh for kh in map(read_known_hosts, paths) if kh is not None]
    append_to = Path(user_files[0]).expanduser()
    return loaded, append_to
