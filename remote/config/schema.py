"""The fleet gpuwatch watches: config.toml, validated, with every default in one place.

A config error names the file, the line and the key, and what was expected, so a person can fix
it without reading the docs (DESIGN §3); a file's errors come all at once, one line each. Every
number has a bounded range (NumberRange), so nan, inf or a 400-digit integer is an error here,
not a crash later. Nothing here touches the network.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..findings.rules import Thresholds

LOCAL = "local"
"""The host name that means this machine: the probe runs as a subprocess, no SSH."""

DETACH_MODES = ("tmux", "setsid")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ConfigError(Exception):
    """A config that cannot be used: one error, or every error found in one file.

    Each error is one line (`lines`) naming the file, the line and the key; `str()` is those
    lines joined, sorted by line. `path`, `line`, `key` and `detail` are the first error's."""

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None,
                 key: str | None = None, more: Sequence[ConfigError] = ()) -> None:
        self.path, self.line, self.key, self.detail = path, line, key, message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        self.line_text = f"{where}{key + ': ' if key else ''}{message}"
        self.errors: tuple[ConfigError, ...] = (self, *(e for m in more for e in m.errors))
        super().__init__("\n".join(self.lines))

    @property
    def lines(self) -> list[str]:
        """One line per error, in file order."""
        return [e.line_text for e in self.errors]

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """All of a file's errors as one exception, sorted by line (errors without one last)."""
        flat = [e for error in errors for e in error.errors]
        first, *rest = sorted(flat, key=lambda e: e.line or sys.maxsize)
        return cls(first.detail, path=first.path, line=first.line, key=first.key, more=rest)


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
    """Matched against each process's arguments: an argument equal to it or ending in
    "/" + it (several words: arguments in a row). See probe.match_runs."""
    workdir: str | None = None
    """With `process`: the run is the matching processes that work in this folder (cwd here or
    under it, or the matching argument a file here) and their descendants. Without: any
    matching command line on the box (loose; `gpuwatch check` says so)."""
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
    """Parse and validate TOML text. Whatever the text, the only error is a ConfigError, which
    names file, line and key of every problem in it (not only the first)."""
    data = _toml(text, path)
    return _Validator(text, path).config(data)


def _toml(text: str, path: Path | None) -> dict[str, Any]:
    """tomllib.loads, every way it can fail a ConfigError: a TOMLDecodeError, but also the
    ValueError of an integer over Python's digit limit and the RecursionError of arrays or
    inline tables nested thousands deep, which tomllib lets through."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))  # else "at end of document"
        line = int(match.group(1)) if match else _line_where(text, str.strip, last=True)
        raise ConfigError(f"not valid TOML: {exc}", path=path, line=line) from None
    except ValueError:
        raise ConfigError("not valid TOML: a number too long to read (over "
                          f"{sys.get_int_max_str_digits()} digits)", path=path,
                          line=_line_where(text, lambda s: _LONG_DIGITS.search(s) is not None)
                          ) from None
    except RecursionError:
        deepest = max(s.count("[") + s.count("{") for s in text.split("\n"))
        raise ConfigError("not valid TOML: arrays or tables nested too deeply", path=path,
                          line=_line_where(text, lambda s: s.count("[") + s.count("{")
                                           == deepest)) from None


_LONG_DIGITS = re.compile(r"[0-9A-Fa-f_]{1000}")


def _line_where(text: str, test: Callable[[str], Any], *, last: bool = False) -> int:
    """The number of the first (or last) line that passes test, else the last line. Lines as
    tomllib counts them: split at "\n" only (splitlines would also split at U+2028 in a string)."""
    lines = text.split("\n")
    numbered = list(enumerate(lines, 1))
    return next((n for n, s in (reversed(numbered) if last else numbered) if test(s)),
                len(lines))


# --- the numbers a config may hold -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NumberRange:
    """The numbers a config key accepts: finite, from `low` (excluded when `above`) to `high`,
    whole when `integer`. Booleans are not numbers. Every range is bounded, so nan, inf and a
    400-digit integer are errors like any other and every accepted value fits a float."""

    low: float
    high: float
    integer: bool = False
    above: bool = False

    def holds(self, value: int | float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.above:
            return f"{kind} greater than {_fmt(self.low)} and at most {_fmt(self.high)}"
        return f"{kind} from {_fmt(self.low)} to {_fmt(self.high)}"


_DAY_S = 86400
_DURATION_S = NumberRange(0, 365 * _DAY_S, above=True)
"""A threshold's span of time in seconds: more than 0 (rules divide by some), at most a year."""
_PERCENT = NumberRange(0, 100)
_SHARE = NumberRange(0, 1)
_FACTOR = NumberRange(1, 1000)

TOP_RANGES: Mapping[str, NumberRange] = {"interval": NumberRange(1, _DAY_S)}
"""Top-level numbers. An interval under 1 s would poll a host back to back."""
SSH_RANGES: Mapping[str, NumberRange] = {
    "connect_timeout": NumberRange(0, 3600, above=True),
    "server_alive_interval": NumberRange(0, 3600, above=True),
    "server_alive_count_max": NumberRange(1, 100, integer=True),
    "command_timeout": NumberRange(1, 3600),
}
"""`[ssh]` and per-host numbers, in seconds but the count. command_timeout is at least 1 s:
the probe's own deadline sits a little under it, and a kill waits on the box inside it."""


def threshold_ranges() -> dict[str, NumberRange]:
    """`[thresholds]` numbers (the fields of remote.findings.Thresholds; for a list of integers,
    the range of each item). A test holds every numeric field to having one."""
    from ..findings.rules import HISTORY_LEN  # findings → series → config: import when needed

    return {
        "sustain_polls": NumberRange(1, HISTORY_LEN, integer=True),  # more are never kept
        "sustain_window_s": _DURATION_S, "util_busy_pct": _PERCENT, "clock_low_ratio": _SHARE,
        "power_low_ratio": _SHARE, "idle_util_pct": _PERCENT, "idle_while_running_s": _DURATION_S,
        "zombie_unattributed_mib": NumberRange(0, 2**20, integer=True),  # 1 TiB
        "stalled_s": _DURATION_S, "log_buffered_s": _DURATION_S, "events_grace_s": _DURATION_S,
        "ckpt_overdue_factor": _FACTOR, "ckpt_overdue_min_s": _DURATION_S,
        "disk_low_pct": _PERCENT, "disk_low_bytes": NumberRange(0, 2**50, integer=True),  # 1 PiB
        "disk_critical_pct": _PERCENT, "inodes_low_pct": _PERCENT, "inodes_critical_pct": _PERCENT,
        "disk_full_hours": NumberRange(0, 365 * 24, above=True),
        "disk_full_min_span_s": _DURATION_S, "cpu_oversubscribed_ratio": _FACTOR,
        "tmp_stale_s": _DURATION_S, "persistence_slow_s": _DURATION_S,
        "xid_critical": NumberRange(1, 65535, integer=True),
    }


# --- validation ------------------------------------------------------------------------------

_SSH_KEYS = {f.name for f in fields(SshSettings)}
_TOP_KEYS = {"interval", "readonly", "theme", "ssh", "hosts", "thresholds"}
_HOST_KEYS = {"ssh", "python", "disks", "runs"} | _SSH_KEYS
_RUN_KEYS = {f.name for f in fields(RunConfig)} - {"name"}
_RUN_STRINGS = ("process", "workdir", "log", "events", "checkpoints", "done", "relaunch")

Key = tuple[str, ...]
"""A key's path from the top of the document: ("hosts", "gpu1.lab", "ssh")."""


class _Validator:
    """Turns a parsed TOML dict into a Config, or a ConfigError listing every problem, each
    pointing at its line. A bad value is noted and its default used, so checking goes on."""

    def __init__(self, text: str, path: Path | None) -> None:
        self.path = path
        self.text = text
        self.errors: list[ConfigError] = []
        self._lines: dict[Key, int] | None = None

    def fail(self, key: Key, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.line_of(key), key=dotted(key))

    def note(self, key: Key, message: str) -> None:
        self.errors.append(self.fail(key, message))

    def line_of(self, key: Key) -> int | None:
        """The line that defines key, else the one that defines the nearest table above it (a
        key inside an inline table: the line of the table, which holds the whole of it)."""
        if self._lines is None:
            self._lines = key_lines(self.text)
        for cut in range(len(key), 0, -1):
            if key[:cut] in self._lines:
                return self._lines[key[:cut]]
        return None

    def get(self, table: Mapping[str, Any], name: str, where: Key,
            parse: Callable[[Any, Key], Any], default: Any) -> Any:
        """table[name] parsed, else default: when missing, or (noted) when wrong."""
        if name not in table:
            return default
        try:
            return parse(table[name], (*where, name))
        except ConfigError as exc:
            self.errors.append(exc)
            return default

    # typed values: each raises the ConfigError of its key -----------------------------------
    def unknown(self, table: Mapping[str, Any], allowed: set[str], where: Key) -> None:
        expected = ", ".join(sorted(allowed))
        for key in table:
            if key not in allowed:
                self.note((*where, key), f"unknown key (expected one of: {expected})")

    def number(self, rng: NumberRange) -> Callable[[Any, Key], Any]:
        def parse(value: Any, key: Key) -> int | float:
            ok = isinstance(value, int) if rng.integer else isinstance(value, (int, float))
            if isinstance(value, bool) or not ok:
                raise self.fail(key, f"expected {rng}, got {_describe(value)}")
            if not rng.holds(value):
                raise self.fail(key, f"expected {rng}, got {_shown(value)}")
            return value if rng.integer else float(value)
        return parse

    def string(self, value: Any, key: Key) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        if not value.strip():
            raise self.fail(key, "expected a non-empty string")
        if _CONTROL.search(value):
            raise self.fail(key, "control characters (newlines, tabs) are not allowed")
        return value

    def strings(self, value: Any, key: Key) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of strings, got {_describe(value)}")
        return tuple(self.string(v, key) for v in value)

    def table(self, value: Any, key: Key) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {_describe(value)}")
        return value

    def boolean(self, value: Any, key: Key) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_describe(value)}")
        return value

    # sections --------------------------------------------------------------------------------
    def config(self, data: Mapping[str, Any]) -> Config:
        self.unknown(data, _TOP_KEYS, ())
        interval = self.get(data, "interval", (), self.number(TOP_RANGES["interval"]), 10.0)
        readonly = self.get(data, "readonly", (), self.boolean, False)
        theme = self.get(data, "theme", (), self.string, None)
        ssh = SshSettings()
        ssh_table = self.get(data, "ssh", (), self.table, {})
        self.unknown(ssh_table, _SSH_KEYS, ("ssh",))
        ssh = self.ssh(ssh_table, ("ssh",), ssh)
        hosts = [self.host(name, table, ssh)
                 for name, table in self.get(data, "hosts", (), self.table, {}).items()]
        thresholds = self.get(data, "thresholds", (), self.thresholds, None)
        if self.errors:
            raise ConfigError.of(self.errors)
        return Config(path=self.path, interval=interval, readonly=readonly, theme=theme, ssh=ssh,
                      hosts=tuple(hosts), thresholds=thresholds)

    def ssh(self, table: Mapping[str, Any], where: Key, base: SshSettings) -> SshSettings:
        changes: dict[str, Any] = {}
        for key in (k for k in table if k in _SSH_KEYS):
            rng = SSH_RANGES.get(key)
            parse = self.number(rng) if rng else self.string
            changes[key] = self.get(table, key, where, parse, getattr(base, key))
        return replace(base, **changes)

    def thresholds(self, value: Any, key: Key) -> Thresholds:
        """`[thresholds]`: any field of remote.findings.Thresholds (documented there), a number
        in its range (threshold_ranges), or a list for the tuple fields."""
        from ..findings.rules import Thresholds  # findings → series → config: import when needed

        table = self.table(value, key)
        defaults = Thresholds()
        self.unknown(table, {f.name for f in fields(Thresholds)}, key)
        ranges = threshold_ranges()
        changes: dict[str, Any] = {}
        for name in (n for n in table if n in ranges and n != "xid_critical"):
            changes[name] = self.get(table, name, key, self.number(ranges[name]),
                                     getattr(defaults, name))
        for name in ("throttle_reasons", "throttle_info_only"):
            changes[name] = self.get(table, name, key, self.reasons, getattr(defaults, name))
        changes["xid_critical"] = self.get(table, "xid_critical", key,
                                           self.numbers(ranges["xid_critical"]),
                                           defaults.xid_critical)
        return replace(defaults, **changes)

    def reasons(self, value: Any, key: Key) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of strings, got {_describe(value)}")
        return tuple(self.string(v, key) for v in value)

    def numbers(self, rng: NumberRange) -> Callable[[Any, Key], Any]:
        def parse(value: Any, key: Key) -> tuple[int | float, ...]:
            if not isinstance(value, list):
                raise self.fail(key, f"expected a list of numbers, each {rng}, got "
                                f"{_describe(value)}")
            item = self.number(rng)
            return tuple(item(v, key) for v in value)
        return parse

    def host(self, name: str, value: Any, ssh: SshSettings) -> HostConfig:
        key = ("hosts", name)
        table = self.get({name: value}, name, ("hosts",), self.table, {})
        if _CONTROL.search(name) or not name.strip():
            self.note(key, "a host name must be printable and non-empty")
        self.unknown(table, _HOST_KEYS, key)
        target = self.get(table, "ssh", key, self.string, name)
        python = self.get(table, "python", key, self.string, "python3")
        disks = self.get(table, "disks", key, self.disks, ("/",))
        runs = [self.run(run_name, run_table, (*key, "runs", run_name))
                for run_name, run_table in self.get(table, "runs", key, self.table, {}).items()]
        return HostConfig(name=name, ssh=target, python=python, disks=disks, runs=tuple(runs),
                          settings=self.ssh(table, key, ssh))

    def disks(self, value: Any, key: Key) -> tuple[str, ...]:
        disks = self.strings(value, key)
        for disk in disks:
            if not disk.startswith(("/", "~")):
                raise self.fail(key, f"expected absolute paths, got {disk!r}")
        return disks

    def run(self, name: str, value: Any, key: Key) -> RunConfig:
        table = self.get({name: value}, name, key[:-1], self.table, {})
        if _CONTROL.search(name) or not name.strip():
            self.note(key, "a run name must be printable and non-empty")
        self.unknown(table, _RUN_KEYS, key)
        values: dict[str, Any] = {}
        for field_name in _RUN_STRINGS:
            values[field_name] = self.get(table, field_name, key, self.string, None)
        values["metrics"] = self.get(table, "metrics", key, self.strings, ())
        values["detach"] = self.get(table, "detach", key, self.detach, "tmux")
        values["env"] = self.get(table, "env", key, self.env, {})
        return RunConfig(name=name, **values)

    def detach(self, value: Any, key: Key) -> str:
        detach = self.string(value, key)
        if detach not in DETACH_MODES:
            raise self.fail(key, f"expected one of {', '.join(DETACH_MODES)}, got {detach!r}")
        return detach

    def env(self, value: Any, key: Key) -> dict[str, str]:
        env = self.table(value, key)
        for var, text in env.items():
            if not _ENV_NAME.match(var):
                self.note((*key, var), "expected an environment variable name (letters, "
                          "digits, underscore; not starting with a digit)")
            elif not isinstance(text, str):
                self.note((*key, var), f"expected a string, got {_describe(text)}")
        return dict(env)


# --- where each key sits ---------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_DOTTED = rf"{_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART})*"
_HEADER = re.compile(rf"[ \t]*\[\[?[ \t]*({_DOTTED})[ \t]*\]")
_ASSIGN = re.compile(rf"[ \t]*({_DOTTED})[ \t]*=[ \t]*(.*)")


def key_lines(text: str) -> dict[Key, int]:
    """Each key and table of a TOML document (and each table above them) with the line that
    first defines it. Key text is decoded by tomllib itself, so quoted keys with dots or
    escapes come out as the loader sees them; multi-line strings are skipped."""
    found: dict[Key, int] = {}
    table: Key = ()
    closing: str | None = None  # the delimiter of the multi-line string we are in
    for number, line in enumerate(text.split("\n"), 1):  # as tomllib counts lines
        if closing is not None:
            if closing in line:
                closing = None
            continue
        header = _HEADER.match(line)
        assign = None if header else _ASSIGN.match(line)
        if header:
            table = _key_path(header.group(1))
            path = table
        elif assign:
            path = (*table, *_key_path(assign.group(1)))
            rest = assign.group(2)
            for quotes in ('"""', "'''"):
                if rest.startswith(quotes) and quotes not in rest[3:]:
                    closing = quotes
        else:
            continue
        for cut in range(1, len(path) + 1):
            found.setdefault(path[:cut], number)
    return found


def _key_path(text: str) -> Key:
    """A dotted TOML key as its parts, decoded as tomllib decodes them (() if it cannot)."""
    try:
        node: Any = tomllib.loads(f"{text} = 0")
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
        return ()
    parts: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        (part, node), = node.items()
        parts.append(part)
    return tuple(parts)


def dotted(key: Key) -> str:
    """A key path as one line of TOML-like text: bare parts as they are, others quoted with
    anything unprintable escaped, so a key from the file cannot break or colour the line."""
    return ".".join(p if _BARE.fullmatch(p) else _quoted(p) for p in key)


def _quoted(part: str) -> str:
    body = "".join(c if c.isprintable() and c not in '"\\' else
                   ("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                    f"\\U{ord(c):08x}") for c in part)
    return f'"{body}"'


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _shown(value: int | float) -> str:
    """A number as a message shows it: a 400-digit integer by its length, not its digits."""
    text = repr(value)
    return f"an integer of {len(text.lstrip('-'))} digits" if len(text) > 24 else text


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    if isinstance(value, (list, dict)):
        return names[type(value)]
    if isinstance(value, int) and not isinstance(value, bool):
        return f"an integer ({_shown(value)})"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{names.get(type(value), type(value).__name__)} ({text})"


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
