"""The fleet gpuwatch watches: config.toml, validated, with every default in one place.

A config error names the file, the line and the key, and what was expected, so a person can fix
it without reading the docs (DESIGN §3). Nothing here touches the network.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .findings import Thresholds

LOCAL = "local"
"""The host name that means this machine: the probe runs as a subprocess, no SSH."""

DETACH_MODES = ("tmux", "setsid")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ConfigError(Exception):
    """A config that cannot be used. `str()` is the one line a person reads."""

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.path, self.line, self.key, self.detail = path, line, key, message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(f"{where}{key + ': ' if key else ''}{message}")


@dataclass(frozen=True, slots=True)
class SshSettings:
    """Bounds and files of every SSH poll; each key can be set per host."""

    connect_timeout: float = 10.0
    """Seconds to wait for the TCP connection and SSH handshake (OpenSSH ConnectTimeout)."""
    server_alive_interval: float = 5.0
    """Seconds between keepalives on a quiet connection (OpenSSH ServerAliveInterval)."""
    server_alive_count_max: int = 3
    """Unanswered keepalives before the connection is declared dead (ServerAliveCountMax)."""
    command_timeout: float = 30.0
    """Overall deadline of one poll's command on the box, in seconds."""
    config_file: str = "~/.ssh/config"
    """OpenSSH client config read for Host aliases, User, Port, IdentityFile, ProxyJump."""
    known_hosts: str | None = None
    """Known host keys; unset: the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts.
    An unknown or changed key is refused unless told otherwise."""
    identity_file: str | None = None
    """A private key used instead of the ssh config's IdentityFile (ssh-agent still is)."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    """A training run on a host: how to recognise it, where its artifacts are, how to relaunch."""

    name: str
    process: str | None = None
    """Substring matched against process command lines."""
    workdir: str | None = None
    log: str | None = None
    events: str | None = None
    """TensorBoard event files: a file or a folder searched recursively."""
    metrics: tuple[str, ...] = ()
    """trainer_state.json, metrics.csv or *.jsonl files."""
    checkpoints: str | None = None
    """Glob of checkpoint files or directories."""
    done: str | None = None
    """A file whose existence means finished, not dead (seed 004)."""
    relaunch: str | None = None
    """Command template; {latest_checkpoint}, {workdir}, {run} are filled in."""
    detach: str = "tmux"
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment exported to a relaunched run."""

    def resolve(self, path: str | None) -> str | None:
        """A run path made absolute against the workdir (relative paths are relative to it)."""
        if path is None or self.workdir is None or path.startswith(("/", "~")):
            return path
        return f"{self.workdir.rstrip('/')}/{path}"


@dataclass(frozen=True, slots=True)
class HostConfig:
    """One box: how to reach it and what to watch on it."""

    name: str
    ssh: str
    """What you would type after `ssh` (alias, user@host, host:port), or "local"."""
    python: str = "python3"
    """Interpreter on the box that runs the probe."""
    disks: tuple[str, ...] = ("/",)
    runs: tuple[RunConfig, ...] = ()
    settings: SshSettings = SshSettings()

    @property
    def is_local(self) -> bool:
        return self.ssh == LOCAL


@dataclass(frozen=True, slots=True)
class Config:
    """The whole fleet, as loaded (or built from command-line hosts)."""

    path: Path | None = None
    interval: float = 10.0
    """Seconds between two polls of one host."""
    readonly: bool = False
    """Turn every action (kill, reap, relaunch) off."""
    theme: str | None = None
    ssh: SshSettings = SshSettings()
    hosts: tuple[HostConfig, ...] = ()
    thresholds: Thresholds | None = None
    """The `[thresholds]` table: what the findings compare against (None: the defaults of
    remote.findings.Thresholds, where every key is documented)."""

    def host(self, name: str) -> HostConfig | None:
        return next((h for h in self.hosts if h.name == name), None)


# --- where the config lives ----------------------------------------------------------------

def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/gpuwatch/config.toml (XDG's default ~/.config when unset)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuwatch" / "config.toml"


def find_config(explicit: str | None, env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config path and whether the person named it (--config or $GPUWATCH_CONFIG).

    A named config that is missing is an error; the XDG default may simply not exist yet.
    """
    env = os.environ if env is None else env
    if explicit:
        return Path(explicit).expanduser(), True
    if env.get("GPUWATCH_CONFIG"):
        return Path(env["GPUWATCH_CONFIG"]).expanduser(), True
    return default_config_path(env), False


def load_config(explicit: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load the config from --config, $GPUWATCH_CONFIG or the XDG path; none at all is fine."""
    path, named = find_config(explicit, env)
    if not path.exists():
        if named:
            raise ConfigError("no such file (create one with `gpuwatch init`)", path=path)
        return Config()
    return load_file(path)


def load_file(path: Path) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", path=path) from None
    return parse_config(text, path)


def parse_config(text: str, path: Path | None = None) -> Config:
    """Parse and validate TOML text; raise ConfigError naming file, line and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))
        raise ConfigError(f"not valid TOML: {exc}", path=path,
                          line=int(match.group(1)) if match else None) from None
    return _Validator(text, path).config(data)


# --- validation ------------------------------------------------------------------------------

_SSH_KEYS = {f.name for f in fields(SshSettings)}
_TOP_KEYS = {"interval", "readonly", "theme", "ssh", "hosts", "thresholds"}
_HOST_KEYS = {"ssh", "python", "disks", "runs"} | _SSH_KEYS
_RUN_KEYS = {f.name for f in fields(RunConfig)} - {"name"}


class _Validator:
    """Turns a parsed TOML dict into a Config, or a ConfigError that points at the line."""

    def __init__(self, text: str, path: Path | None) -> None:
        self.path = path
        self.lines = text.splitlines()

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.line_of(key), key=key)

    def line_of(self, dotted: str) -> int | None:
        """Best-effort line of a dotted key: its own `key =` line, else its table header."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            table, key = parts[: cut - 1], parts[cut - 1]
            line = self._find(table, key)
            if line:
                return line
        return None

    def _find(self, table: list[str], key: str) -> int | None:
        header = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")
        current: list[str] = []
        for number, raw in enumerate(self.lines, 1):
            m = header.match(raw)
            if m:
                current = [p.strip().strip('"\'') for p in m.group(1).split(".")]
                if current == [*table, key]:
                    return number
                continue
            m = re.match(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=", raw)
            if m and current == table and m.group(1).strip('"\'') == key:
                return number
        return None

    # typed getters ---------------------------------------------------------------------------
    def _unknown(self, table: Mapping[str, Any], allowed: set[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.fail(f"{where}{key}", f"unknown key (expected one of: {expected})")

    def _number(self, table: Mapping[str, Any], key: str, where: str, *, integer: bool = False,
                minimum: float = 0.0) -> Any:
        value = table[key]
        kind = "an integer" if integer else "a number"
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            raise self.fail(f"{where}{key}", f"expected {kind}, got {_describe(value)}")
        if value <= minimum:
            raise self.fail(f"{where}{key}",
                            f"expected {kind} greater than {minimum:g}, got {value}")
        return value

    def _string(self, table: Mapping[str, Any], key: str, where: str) -> str:
        value = table[key]
        if not isinstance(value, str):
            raise self.fail(f"{where}{key}", f"expected a string, got {_describe(value)}")
        if not value.strip():
            raise self.fail(f"{where}{key}", "expected a non-empty string")
        if _CONTROL.search(value):
            raise self.fail(f"{where}{key}", "control characters (newlines, tabs) are not allowed")
        return value

    def _strings(self, table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        value = table[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(f"{where}{key}", f"expected a list of strings, got {_describe(value)}")
        return tuple(self._string({key: v}, key, where) for v in value)

    def _table(self, table: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = table[key]
        if not isinstance(value, dict):
            raise self.fail(f"{where}{key}", f"expected a table, got {_describe(value)}")
        return value

    # sections --------------------------------------------------------------------------------
    def ssh(self, table: Mapping[str, Any], where: str, base: SshSettings) -> SshSettings:
        changes: dict[str, Any] = {}
        for key in _SSH_KEYS & table.keys():
            if key in ("connect_timeout", "server_alive_interval", "command_timeout"):
                changes[key] = float(self._number(table, key, where))
            elif key == "server_alive_count_max":
                changes[key] = self._number(table, key, where, integer=True)
            else:
                changes[key] = self._string(table, key, where)
        return replace(base, **changes)

    def config(self, data: Mapping[str, Any]) -> Config:
        self._unknown(data, _TOP_KEYS, "")
        interval = float(self._number(data, "interval", "")) if "interval" in data else 10.0
        readonly = data.get("readonly", False)
        if not isinstance(readonly, bool):
            raise self.fail("readonly", f"expected true or false, got {_describe(readonly)}")
        theme = self._string(data, "theme", "") if "theme" in data else None
        ssh = SshSettings()
        if "ssh" in data:
            table = self._table(data, "ssh", "")
            self._unknown(table, _SSH_KEYS, "ssh.")
            ssh = self.ssh(table, "ssh.", ssh)
        hosts: list[HostConfig] = []
        if "hosts" in data:
            for name, table in self._table(data, "hosts", "").items():
                hosts.append(self.host(name, table, ssh))
        thresholds = (self.thresholds(self._table(data, "thresholds", ""))
                      if "thresholds" in data else None)
        return Config(path=self.path, interval=interval, readonly=readonly, theme=theme, ssh=ssh,
                      hosts=tuple(hosts), thresholds=thresholds)

    def thresholds(self, table: Mapping[str, Any]) -> Thresholds:
        """`[thresholds]`: any field of remote.findings.Thresholds (documented there), numbers
        greater than 0 (an int where the default is one), or lists for the tuple fields."""
        from .findings import Thresholds  # findings → series → config: import when needed

        defaults = Thresholds()
        known = {f.name for f in fields(Thresholds)}
        self._unknown(table, known, "thresholds.")
        changes: dict[str, Any] = {}
        for key, value in table.items():
            default = getattr(defaults, key)
            if isinstance(default, tuple):
                items = value if isinstance(value, list) else None
                kind = int if default and isinstance(default[0], int) else str
                if items is None or not all(isinstance(v, kind) and not isinstance(v, bool)
                                            for v in items):
                    raise self.fail(f"thresholds.{key}", f"expected a list of "
                                    f"{'integers' if kind is int else 'strings'}, got "
                                    f"{_describe(value)}")
                changes[key] = tuple(items)
            elif isinstance(default, int):
                changes[key] = int(self._number(table, key, "thresholds.", integer=True))
            else:
                changes[key] = float(self._number(table, key, "thresholds."))
        return replace(defaults, **changes)

    def host(self, name: str, table: Any, ssh: SshSettings) -> HostConfig:
        where = f"hosts.{name}."
        if not isinstance(table, dict):
            raise self.fail(f"hosts.{name}", f"expected a table, got {_describe(table)}")
        if _CONTROL.search(name) or not name.strip():
            raise self.fail(f"hosts.{name}", "a host name must be printable and non-empty")
        self._unknown(table, _HOST_KEYS, where)
        target = self._string(table, "ssh", where) if "ssh" in table else name
        python = self._string(table, "python", where) if "python" in table else "python3"
        disks = self._strings(table, "disks", where) if "disks" in table else ("/",)
        for disk in disks:
            if not disk.startswith(("/", "~")):
                raise self.fail(f"{where}disks", f"expected absolute paths, got {disk!r}")
        runs: list[RunConfig] = []
        if "runs" in table:
            for run_name, run_table in self._table(table, "runs", where).items():
                runs.append(self.run(run_name, run_table, f"{where}runs.{run_name}"))
        return HostConfig(name=name, ssh=target, python=python, disks=disks, runs=tuple(runs),
                          settings=self.ssh(table, where, ssh))

    def run(self, name: str, table: Any, where_key: str) -> RunConfig:
        where = where_key + "."
        if not isinstance(table, dict):
            raise self.fail(where_key, f"expected a table, got {_describe(table)}")
        if _CONTROL.search(name) or not name.strip():
            raise self.fail(where_key, "a run name must be printable and non-empty")
        self._unknown(table, _RUN_KEYS, where)
        values: dict[str, Any] = {}
        for key in ("process", "workdir", "log", "events", "checkpoints", "done", "relaunch"):
            if key in table:
                values[key] = self._string(table, key, where)
        if "metrics" in table:
            values["metrics"] = self._strings(table, "metrics", where)
        if "detach" in table:
            detach = self._string(table, "detach", where)
            if detach not in DETACH_MODES:
                raise self.fail(f"{where}detach", f"expected one of {', '.join(DETACH_MODES)}, "
                                f"got {detach!r}")
            values["detach"] = detach
        if "env" in table:
            env = self._table(table, "env", where)
            for var, value in env.items():
                if not _ENV_NAME.match(var):
                    raise self.fail(f"{where}env.{var}", "expected an environment variable name "
                                    "(letters, digits, underscore; not starting with a digit)")
                if not isinstance(value, str):
                    raise self.fail(f"{where}env.{var}",
                                    f"expected a string, got {_describe(value)}")
            values["env"] = dict(env)
        return RunConfig(name=name, **values)


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    return f"{names.get(type(value), type(value).__name__)} ({value!r})" if not isinstance(
        value, (list, dict)) else names[type(value)]


# --- hosts from the command line -------------------------------------------------------------

def host_name_for(target: str) -> str:
    """A short display name for an ssh target: `user@gpu1:2222` -> `gpu1`."""
    name = target.rsplit("@", 1)[-1]
    if name.startswith("["):
        return name[1:].split("]", 1)[0]
    if name.count(":") == 1:
        name = name.split(":", 1)[0]
    return name or target


def select_hosts(config: Config, targets: list[str]) -> Config:
    """The hosts to watch: those named on the command line (a config host by name, or an ad-hoc
    ssh target), else the config's hosts, else this machine."""
    if not targets:
        if config.hosts:
            return config
        return replace(config, hosts=(HostConfig(name=LOCAL, ssh=LOCAL, settings=config.ssh),))
    chosen: list[HostConfig] = []
    for target in targets:
        if _CONTROL.search(target) or not target.strip() or target.startswith("-"):
            raise ConfigError(f"not a host: {target!r}")
        known = config.host(target)
        chosen.append(known or HostConfig(name=host_name_for(target) if target != LOCAL else LOCAL,
                                          ssh=target, settings=config.ssh))
    names = [h.name for h in chosen]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:  # two targets with one display name (user1@gpu1, user2@gpu1): keep them apart
        chosen = [replace(h, name=h.ssh) if h.name in dupes else h for h in chosen]
    return replace(config, hosts=tuple(chosen))
