"""Finding, reading and validating config.toml into the schema's types (schema.py): each error
names the file, the line and the key, and what was expected; a file's errors come all at once.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..paths import config_dir
from .schema import (  # [slurm]
    CONTROL_CHARS,
    DEFAULT_RESTART_ON,
    DETACH_MODES,
    ENV_NAME,
    EXCEPTION_KINDS,
    LOCAL,
    NOTIFY_RANGES,
    PRICE_RANGE,
    PROMETHEUS_METRICS,
    PROMETHEUS_RANGES,
    RESTART_CAUSES,
    RESTART_MODES,
    RESTART_RANGES,
    SEVERITIES,
    SLURM_RANGES,
    SOURCES,
    SSH_RANGES,
    STORE_RANGES,
    TOP_RANGES,
    Config,
    ConfigError,
    HostConfig,
    NotifyConfig,
    NumberRange,
    PrometheusConfig,
    PrometheusLabels,
    RunConfig,
    SlurmConfig,
    SourcesConfig,
    SshSettings,
    StoreConfig,
    quiet_span,
    threshold_ranges,
)
from .thresholds import Thresholds

# --- where the config lives ----------------------------------------------------------------

def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/gpuwatch/config.toml (XDG's default ~/.config when unset)."""
    return config_dir(env) / "config.toml"


def find_config(explicit: str | None, env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config path and whether the person named it (--config or $GPUWATCH_CONFIG).

    A named config that is missing is an error; the XDG default may simply not exist yet.
    """
    env = os.environ if env is None else env
    if explicit == "":
        raise ConfigError("an empty path names no config file (leave --config out for the "
                          "default one)")
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
    return parse_config(read_config_text(path), path)


CONFIG_MAX_BYTES = 1 << 20
"""A config is a few kilobytes; one over a mebibyte is not one (a log named by mistake)."""
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO: reading it would wait for a "
          "writer"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def read_config_text(path: Path) -> str:
    """The text of a config file, as read_text gives it (UTF-8, universal newlines), or a
    ConfigError naming the file: only a regular file (a link to one is followed), and only
    up to CONFIG_MAX_BYTES, both checked on the opened file before a byte is read. Opened
    without blocking, so a FIFO is refused rather than waited on; /dev/zero is refused rather
    than read until memory runs out."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((what for test, what in _KINDS if test(st.st_mode)), "not a file")
            raise ConfigError(f"not a regular file ({kind}); a config is a TOML file", path=path)
        if st.st_size > CONFIG_MAX_BYTES:
            raise ConfigError(f"{st.st_size} bytes, over the {CONFIG_MAX_BYTES} bytes a config "
                              "may have: is this the config file?", path=path)
        chunks, size = [], 0
        while size <= CONFIG_MAX_BYTES:
            chunk = os.read(fd, CONFIG_MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from None
    finally:
        os.close(fd)
    if size > CONFIG_MAX_BYTES:
        raise ConfigError(f"over the {CONFIG_MAX_BYTES} bytes a config may have (it grew while "
                          "being read)", path=path)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read: {exc}", path=path) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


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


# --- validation ------------------------------------------------------------------------------

_SSH_KEYS = {f.name for f in fields(SshSettings)}
_TOP_KEYS = {"interval", "readonly", "theme", "ssh", "hosts", "thresholds", "notify", "store",
             "slurm"}
_HOST_KEYS = {"ssh", "python", "disks", "runs", "price_per_gpu_hour", "price_per_kwh"} | _SSH_KEYS
_TOP_KEYS |= {"sources"}  # [sources.prometheus] (remote/sources/)
_HOST_KEYS |= {"source", "group"}
_RUN_KEYS = {f.name for f in fields(RunConfig)} - {"name"}
_RUN_STRINGS = ("process", "workdir", "log", "events", "checkpoints", "done", "relaunch",
                "loss_tag", "eval_tag")

_SLURM_KEYS = {"host", "user", "partition", "account", "nodes", *SLURM_RANGES}

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
        if CONTROL_CHARS.search(value):
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
        notify = self.get(data, "notify", (), self.notify, NotifyConfig())
        store = self.get(data, "store", (), self.store, StoreConfig())
        slurm = self.get(data, "slurm", (), lambda v, k: self.slurm(v, k, ssh), None)
        sources = self.get(data, "sources", (), self.sources, SourcesConfig())
        self.sourced_hosts(hosts, sources)
        if self.errors:
            raise ConfigError.of(self.errors)
        return Config(path=self.path, interval=interval, readonly=readonly, theme=theme, ssh=ssh,
                      hosts=tuple(hosts), thresholds=thresholds, notify=notify, store=store,
                      slurm=slurm, sources=sources)

    # [slurm] (remote/sources/slurm.py, docs/slurm.md) ---------------------------------------
    def slurm(self, value: Any, key: Key, ssh: SshSettings) -> SlurmConfig | None:
        """`[slurm]`: `host` (required), `user`, `partition`, `account`, `nodes` (an ssh target
        with `{node}`, or "local"), the numbers in SLURM_RANGES, and [ssh]'s keys for the login
        host."""
        table = self.table(value, key)
        self.unknown(table, _SLURM_KEYS | _SSH_KEYS, key)
        if "host" not in table:
            self.note(key, 'needs host = "..." (the login host, as you would type it after '
                      'ssh, or "local")')
            return None
        d = SlurmConfig(host="local")
        words = {name: self.get(table, name, key, self.string, getattr(d, name))
                 for name in ("host", "user", "partition", "account", "nodes")}
        nodes = words["nodes"]
        if nodes != LOCAL and "{node}" not in nodes:
            self.note((*key, "nodes"), f'expected "local" or an ssh target with {{node}} in it '
                      f'(e.g. "{{node}}", "me@{{node}}.cluster"), got {nodes!r}')
            words["nodes"] = d.nodes
        numbers = {name: self.get(table, name, key, self.number(rng), getattr(d, name))
                   for name, rng in SLURM_RANGES.items()}
        return SlurmConfig(**words, **numbers, settings=self.ssh(table, key, ssh))

    def store(self, value: Any, key: Key) -> StoreConfig:
        """`[store]` (remote/store_keep.py): each number in its range, and the tiers in order
        (raw rows, then per-minute ones, then per-hour ones)."""
        table = self.table(value, key)
        self.unknown(table, set(STORE_RANGES), key)
        d = StoreConfig()
        got = {name: self.get(table, name, key, self.number(rng), getattr(d, name))
               for name, rng in STORE_RANGES.items()}
        if got["minute_days"] * 24 < got["raw_hours"]:
            self.note((*key, "minute_days" if "minute_days" in table else "raw_hours"),
                      f"per-minute rows (minute_days = {got['minute_days']:g}) must be kept at "
                      f"least as long as raw ones (raw_hours = {got['raw_hours']:g}, "
                      f"{got['raw_hours'] / 24:g} days)")
        elif got["keep_days"] < got["minute_days"]:
            self.note((*key, "keep_days" if "keep_days" in table else "minute_days"),
                      f"keep_days ({got['keep_days']:g}) must be at least minute_days "
                      f"({got['minute_days']:g})")
        return StoreConfig(**got)

    def ssh(self, table: Mapping[str, Any], where: Key, base: SshSettings) -> SshSettings:
        changes: dict[str, Any] = {}
        for key in (k for k in table if k in _SSH_KEYS):
            rng = SSH_RANGES.get(key)
            parse = self.number(rng) if rng else self.string
            changes[key] = self.get(table, key, where, parse, getattr(base, key))
        return replace(base, **changes)

    def thresholds(self, value: Any, key: Key) -> Thresholds:
        """`[thresholds]`: any field of config.thresholds.Thresholds (documented there), a number
        in its range (threshold_ranges), or a list for the tuple fields."""
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
        if CONTROL_CHARS.search(name) or not name.strip():
            self.note(key, "a host name must be printable and non-empty")
        self.unknown(table, _HOST_KEYS, key)
        target = self.get(table, "ssh", key, self.string, name)
        python = self.get(table, "python", key, self.string, "python3")
        disks = self.get(table, "disks", key, self.disks, ("/",))
        runs = [self.run(run_name, run_table, (*key, "runs", run_name))
                for run_name, run_table in self.get(table, "runs", key, self.table, {}).items()]
        prices = {p: self.get(table, p, key, self.number(PRICE_RANGE), None)
                  for p in ("price_per_gpu_hour", "price_per_kwh")}
        source = self.get(table, "source", key, self.choice(SOURCES), "ssh")
        group = self.get(table, "group", key, self.string, None)
        return HostConfig(name=name, ssh=target, python=python, disks=disks, runs=tuple(runs),
                          settings=self.ssh(table, key, ssh), source=source,
                          group=group.strip() if group else None,
                          **prices)

    def disks(self, value: Any, key: Key) -> tuple[str, ...]:
        disks = self.strings(value, key)
        for disk in disks:
            if not disk.startswith(("/", "~")):
                raise self.fail(key, f"expected absolute paths, got {disk!r}")
        return disks

    def run(self, name: str, value: Any, key: Key) -> RunConfig:
        table = self.get({name: value}, name, key[:-1], self.table, {})
        if CONTROL_CHARS.search(name) or not name.strip():
            self.note(key, "a run name must be printable and non-empty")
        self.unknown(table, _RUN_KEYS, key)
        values: dict[str, Any] = {}
        for field_name in _RUN_STRINGS:
            values[field_name] = self.get(table, field_name, key, self.string, None)
        values["metrics"] = self.get(table, "metrics", key, self.strings, ())
        values["detach"] = self.get(table, "detach", key, self.detach, "tmux")
        values["env"] = self.get(table, "env", key, self.env, {})
        values.update(self.restart_policy(table, key))
        return RunConfig(name=name, **values)

    def restart_policy(self, table: Mapping[str, Any], key: Key) -> dict[str, Any]:
        """The watchdog's keys of a run (remote/actions/restart.py)."""
        out: dict[str, Any] = {}
        out["restart"] = self.get(table, "restart", key, self.choice(RESTART_MODES), "never")
        for name, default in (("max_restarts", 3), ("restart_window_s", 6 * 3600.0),
                              ("restart_delay_s", 60.0)):
            out[name] = self.get(table, name, key, self.number(RESTART_RANGES[name]), default)
        out["restart_on"] = self.get(table, "restart_on", key, self.causes, DEFAULT_RESTART_ON)
        return out

    def choice(self, allowed: Sequence[str]) -> Callable[[Any, Key], str]:
        def parse(value: Any, key: Key) -> str:
            text = self.string(value, key)
            if text not in allowed:
                raise self.fail(key, f"expected one of {', '.join(allowed)}, got {text!r}")
            return text
        return parse

    def causes(self, value: Any, key: Key) -> tuple[str, ...]:
        causes = self.reasons(value, key)
        for cause in causes:
            kind, _, detail = cause.partition(":")
            ok = (cause in RESTART_CAUSES if not detail else
                  (kind == "xid" and detail.isdigit() and len(detail) <= 5)
                  or (kind == "exception" and detail in EXCEPTION_KINDS))
            if not ok:
                raise self.fail(key, f"{cause!r} is no cause of death: expected "
                                     f"{', '.join(RESTART_CAUSES)}, xid:N or exception:KIND "
                                     f"(KIND one of {', '.join(EXCEPTION_KINDS)})")
        return causes

    def notify(self, value: Any, key: Key) -> NotifyConfig:
        table = self.table(value, key)
        self.unknown(table, {f.name for f in fields(NotifyConfig)}, key)
        d = NotifyConfig()
        return NotifyConfig(
            urls=self.get(table, "urls", key, self.reasons, d.urls),
            urls_env=self.get(table, "urls_env", key, self.string, d.urls_env),
            min_severity=self.get(table, "min_severity", key, self.choice(SEVERITIES),
                                  d.min_severity),
            mute=self.get(table, "mute", key, self.reasons, d.mute),
            quiet_hours=self.get(table, "quiet_hours", key, self.hours, d.quiet_hours),
            batch_s=self.get(table, "batch_s", key, self.number(NOTIFY_RANGES["batch_s"]),
                             d.batch_s),
            timeout_s=self.get(table, "timeout_s", key, self.number(NOTIFY_RANGES["timeout_s"]),
                               d.timeout_s),
            retries=self.get(table, "retries", key, self.number(NOTIFY_RANGES["retries"]),
                             d.retries))

    def hours(self, value: Any, key: Key) -> str:
        text = self.string(value, key)
        if quiet_span(text) is None:
            raise self.fail(key, f"expected \"HH:MM-HH:MM\" (local time), got {text!r}")
        return text

    def detach(self, value: Any, key: Key) -> str:
        detach = self.string(value, key)
        if detach not in DETACH_MODES:
            raise self.fail(key, f"expected one of {', '.join(DETACH_MODES)}, got {detach!r}")
        return detach

    # [sources] (remote/sources/) ---------------------------------------------------------------
    def sources(self, value: Any, key: Key) -> SourcesConfig:
        table = self.table(value, key)
        self.unknown(table, {"prometheus"}, key)
        return SourcesConfig(prometheus=self.get(table, "prometheus", key, self.prometheus, None))

    def prometheus(self, value: Any, key: Key) -> PrometheusConfig | None:
        """`[sources.prometheus]`: a server's URL (required), the bounds of reading it, what to
        read, and which labels say the host and the GPU."""
        table = self.table(value, key)
        self.unknown(table, {f.name for f in fields(PrometheusConfig)}, key)
        if "url" not in table:
            self.note(key, "url is required: the server's address, e.g. "
                           "url = \"http://127.0.0.1:9090\"")
        url = self.get(table, "url", key, self.http_url, None)
        d = PrometheusConfig(url="")
        numbers = {name: self.get(table, name, key, self.number(rng), getattr(d, name))
                   for name, rng in PROMETHEUS_RANGES.items()}
        metrics = self.get(table, "metrics", key, self.metric_kinds, d.metrics)
        selector = self.get(table, "selector", key, self.selector, None)
        labels = self.get(table, "labels", key, self.prometheus_labels, d.labels)
        if url is None:  # noted: the config is refused
            return None
        return PrometheusConfig(url=url, metrics=metrics, selector=selector, labels=labels,
                                **numbers)

    def http_url(self, value: Any, key: Key) -> str:
        text = self.string(value, key)
        parts = urllib.parse.urlsplit(text)
        try:
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            raise self.fail(key, f"not a URL with a valid port: {text!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self.fail(key, f"expected an http:// or https:// URL, got {text!r}")
        if parts.query or parts.fragment:
            raise self.fail(key, "the server's base URL, without ?query or #fragment")
        return text.rstrip("/")

    def metric_kinds(self, value: Any, key: Key) -> tuple[str, ...]:
        kinds = self.strings(value, key)
        wrong = [k for k in kinds if k not in PROMETHEUS_METRICS]
        if wrong or not kinds:
            raise self.fail(key, f"expected a list naming {', '.join(PROMETHEUS_METRICS)} "
                                 f"or both, got {wrong[0] if wrong else 'none'!r}")
        return tuple(dict.fromkeys(kinds))

    def selector(self, value: Any, key: Key) -> str:
        """Label matchers as PromQL writes them inside braces, nothing else (a selector is no
        place for a query)."""
        text = self.string(value, key)
        if _MATCHERS.fullmatch(text) is None:
            raise self.fail(key, f"expected label matchers like cluster=\"a\", job!=\"test\" "
                                 f"(name, one of = != =~ !~, a double-quoted value), got "
                                 f"{text!r}")
        return text.strip()

    def prometheus_labels(self, value: Any, key: Key) -> PrometheusLabels:
        table = self.table(value, key)
        names = {f.name for f in fields(PrometheusLabels)}
        self.unknown(table, names, key)
        d = PrometheusLabels()
        return PrometheusLabels(**{n: self.get(table, n, key, self.label_name, getattr(d, n))
                                   for n in names})

    def label_name(self, value: Any, key: Key) -> str:
        text = self.string(value, key)
        if _LABEL.fullmatch(text) is None:
            raise self.fail(key, f"expected a Prometheus label name (letters, digits, _), got "
                                 f"{text!r}")
        return text

    def sourced_hosts(self, hosts: Sequence[HostConfig], sources: SourcesConfig) -> None:
        """A host read from Prometheus needs the source, and has no runs (a run is read from
        its files, over SSH)."""
        for host in hosts:
            if host.source != "prometheus":
                continue
            where = ("hosts", host.name, "source")
            if sources.prometheus is None and not any(
                    e.key and e.key.startswith("sources") for e in self.errors):
                self.note(where, "source = \"prometheus\" needs a [sources.prometheus] table "
                                 "with the server's url")
            elif host.runs:
                self.note(where, "a host read from Prometheus has no runs (runs are read from "
                                 "their files over SSH): remove its runs or the source key")

    def env(self, value: Any, key: Key) -> dict[str, str]:
        env = self.table(value, key)
        for var, text in env.items():
            if not ENV_NAME.match(var):
                self.note((*key, var), "expected an environment variable name (letters, "
                          "digits, underscore; not starting with a digit)")
            elif not isinstance(text, str):
                self.note((*key, var), f"expected a string, got {_describe(text)}")
        return dict(env)


# --- where each key sits ---------------------------------------------------------------------

_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?\s*")
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
