"""The fleet gpuwatch watches: config.toml, validated, with every default in one place.

A config error names the file, the line and the key, and what was expected, so a person can fix
it without reading the docs (DESIGN §3); a file's errors come all at once, one line each. Every
number has a bounded range (NumberRange), so nan, inf or a 400-digit integer is an error here,
not a crash later. Nothing here touches the network. This module holds what a config is (and
the ranges of its numbers); load.py finds, reads and validates the file.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .thresholds import HISTORY_LEN, Thresholds

LOCAL = "local"
"""The host name that means this machine: the probe runs as a subprocess, no SSH."""

DETACH_MODES = ("tmux", "setsid")
RESTART_MODES = ("never", "on-failure")
RESTART_CAUSES = ("killed", "sighup", "reboot", "xid", "exception", "oom_cgroup", "oom_kernel",
                  "gpu_lost", "exited", "unknown", "run.hung")
"""What `restart_on` may name: a death's cause (remote.diagnosis.CAUSES), `xid:N` for one Xid,
`exception:KIND` for one kind of crash line, or `run.hung` (the watchdog kills a hung run first)."""
EXCEPTION_KINDS = ("cuda_oom", "nccl_timeout", "nccl_error", "cuda_error", "disk_full",
                   "exception")
DEFAULT_RESTART_ON = ("killed", "sighup", "reboot", "xid", "exception:nccl_timeout", "run.hung",
                      "exited", "unknown")
"""What `on-failure` means to a person (systemd's on-failure too): a run that was killed, lost
its session, rebooted, crashed on an Xid or an NCCL timeout, hung, exited non-zero, or vanished
with no cause gpuwatch can name (a `kill -9` of a run started by hand leaves no trace) comes
back. Never OOM or CUDA OOM by default: the run would die again the same way. `xid` leaves out
48 and 79 (the GPU itself is gone, U22) unless they are named (`xid:48`)."""
SEVERITIES = ("info", "warning", "critical")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


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
    restart: str = "never"
    """The watchdog's policy: "never", or "on-failure" (relaunch when it dies of a cause in
    `restart_on`, at most `max_restarts` times per `restart_window_s`)."""
    max_restarts: int = 3
    restart_window_s: float = 6 * 3600.0
    restart_delay_s: float = 60.0
    """Wait after a death before restarting, doubled for each restart already in the window."""
    restart_on: tuple[str, ...] = DEFAULT_RESTART_ON
    loss_tag: str | None = None
    """The tag that is its training loss, where the name does not say (run.diverging...)."""
    eval_tag: str | None = None
    """The tag that is its evaluation loss (run.overfitting)."""

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
    price_per_gpu_hour: float | None = None
    """What an hour of one of its GPUs costs (a rental's rate): a run's report multiplies its
    GPU-hours by it."""
    price_per_kwh: float | None = None
    """What a kWh costs where it runs: a run's report multiplies its energy by it (with
    price_per_gpu_hour too, the two are added)."""
    source: str = "ssh"
    """Where its data comes from: "ssh" (a poll over SSH, or of this machine when `local`), or
    "prometheus" (`[sources.prometheus]`: GPUs and the watchers' verdicts, no runs)."""
    group: str | None = None
    """The fleet view's group of this host (None: where the fleet is large, its name less the
    trailing number: `node-017` is in `node`)."""

    @property
    def is_local(self) -> bool:
        return self.ssh == LOCAL

    def run(self, name: str | None) -> RunConfig | None:
        """The configured run of that name (None: not configured here)."""
        return next((r for r in self.runs if r.name == name), None)


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    """`[notify]`: where the watcher's messages go (Apprise URLs) and which ones."""

    urls: tuple[str, ...] = ()
    urls_env: str = "GPUWATCH_NOTIFY_URLS"
    """An environment variable with more URLs (whitespace or comma separated): tokens stay out
    of the config file."""
    min_severity: str = "warning"
    """Findings below it are not sent (restarts and give-ups always are)."""
    mute: tuple[str, ...] = ()
    """Finding codes never sent: `run.plateau`, or a prefix with `*` (`gpu.*`)."""
    quiet_hours: str | None = None
    """"HH:MM-HH:MM" in this machine's local time: only critical findings and give-ups are
    sent then."""
    batch_s: float = 5.0
    """A host's messages within this many seconds go out as one."""
    timeout_s: float = 10.0
    """Bound of one send to one target."""
    retries: int = 3
    """Further tries of a failed send, 2 s, 4 s, 8 s... apart."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """`[store]`: what the local store keeps of GPU samples and for how long, its cap, its
    VACUUM (remote/store_keep.py). Events, findings and the audit log are always kept."""

    raw_hours: float = 24.0
    """Every poll's GPU row is kept this long, then one row per GPU per minute."""
    minute_days: float = 7.0
    """Per-minute rows are kept until this age, then one row per GPU per hour."""
    keep_days: float = 365.0
    """Per-hour rows older than this are dropped."""
    max_mb: float = 1024.0
    """The store's cap, in MiB: over it, the oldest GPU rows go first, a day at a time."""
    vacuum_days: float = 7.0
    """The file gives its free pages back to the disk (VACUUM) at most this often, when a
    quarter of it is free or it is over the cap."""


# --- [slurm]: the user's jobs from a login host (remote/sources/slurm.py, docs/slurm.md) ------

@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """`[slurm]`: the user's jobs, asked of a Slurm login host each round."""

    host: str
    """What you would type after `ssh` to reach the login host, or "local" (on a login node)."""
    user: str | None = None
    """Whose jobs (default: the login's own user)."""
    partition: str | None = None
    """Only the jobs of this partition."""
    account: str | None = None
    """Only the jobs of this account."""
    nodes: str = "{node}"
    """How a running job's node is reached: an ssh target with `{node}` in it (default: the node's
    name, reached as the ssh config says, e.g. `Host gpu* / ProxyJump login1`), or "local"
    (this machine is the node)."""
    warn_before_limit_s: float = 1800.0
    """A running job this close to its time limit, whose latest checkpoint is older than the
    time it has left, is a warning."""
    ended_within_s: float = 86400.0
    """The first round asks accounting for the jobs that ended this long ago or less; later
    rounds for those that ended since the round before."""
    settings: SshSettings = SshSettings()
    """[ssh]'s bounds, for the login host (set here like a host's: `command_timeout = 60`)."""


# --- fleet sources (remote/sources/): [sources.prometheus] -----------------------------------

SOURCES = ("ssh", "prometheus")
"""A host's `source`: polled over SSH (or locally), or read from `[sources.prometheus]`."""
PROMETHEUS_METRICS = ("dcgm", "gpuwatch")
"""What `[sources.prometheus] metrics` may name: DCGM exporter's series, gpuwatch watchers'."""


@dataclass(frozen=True, slots=True)
class PrometheusLabels:
    """`[sources.prometheus.labels]`: the labels of DCGM exporter's series that say which host
    and which GPU (gpuwatch's own series are always `host`, `gpu`, `uuid`)."""

    host: str = "Hostname"
    """The host's name (DCGM exporter's `Hostname`; `instance` or `node` elsewhere)."""
    gpu: str = "gpu"
    uuid: str = "UUID"
    model: str = "modelName"
    pci: str = "pci_bus_id"


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """`[sources.prometheus]`: a Prometheus-compatible server's HTTP API as the source of hosts'
    GPU data (remote/sources/prometheus.py), instead of an SSH poll of each."""

    url: str
    """The server's base URL (`http://prometheus:9090`; a path prefix kept, as behind a proxy)."""
    timeout_s: float = 10.0
    """Bound of one read of the server (all its queries together)."""
    max_bytes: int = 16 << 20
    """The largest answer read (16 MiB: about 20,000 GPUs' series); more is the source's error."""
    metrics: tuple[str, ...] = PROMETHEUS_METRICS
    """Which series to read: "dcgm" (DCGM exporter), "gpuwatch" (gpuwatch watchers'), or both
    (a host with both: gpuwatch's)."""
    selector: str | None = None
    """Label matchers added to every query (`cluster="a", job!="test"`)."""
    max_age_s: float = 300.0
    """A watcher's last poll of a host older than this: that host's data is too old."""
    labels: PrometheusLabels = PrometheusLabels()


@dataclass(frozen=True, slots=True)
class SourcesConfig:
    """`[sources]`: fleet-level sources (DESIGN §1)."""

    prometheus: PrometheusConfig | None = None


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
    remote.config.thresholds.Thresholds, where every key is documented)."""
    notify: NotifyConfig = NotifyConfig()
    store: StoreConfig = StoreConfig()
    slurm: SlurmConfig | None = None
    """`[slurm]`: the user's jobs (None: no scheduler asked)."""
    sources: SourcesConfig = SourcesConfig()
    """`[sources]`: hosts read from a Prometheus-compatible server (remote/sources/)."""

    def host(self, name: str) -> HostConfig | None:
        return next((h for h in self.hosts if h.name == name), None)


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
_K = NumberRange(0, 1000, above=True)
"""How many noise units (1.4826 MAD) a curve's threshold stands off its median."""
_FACTOR_0 = NumberRange(0, 1000)

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


RESTART_RANGES: Mapping[str, NumberRange] = {
    "max_restarts": NumberRange(0, 1000, integer=True),
    "restart_window_s": NumberRange(0, 30 * _DAY_S, above=True),
    "restart_delay_s": NumberRange(0, _DAY_S),
}
STORE_RANGES: Mapping[str, NumberRange] = {
    "raw_hours": NumberRange(1, 30 * 24), "minute_days": NumberRange(0, 365),
    "keep_days": NumberRange(0, 3650), "max_mb": NumberRange(16, 1 << 20),
    "vacuum_days": NumberRange(0, 365, above=True),
}
"""`[store]`: minute_days at least raw_hours' days and keep_days at least minute_days (load.py
says so where they are not); max_mb from 16 MiB to 1 TiB."""
PRICE_RANGE = NumberRange(0, 1e6)
"""price_per_gpu_hour and price_per_kwh, in whatever currency the person counts in."""
NOTIFY_RANGES: Mapping[str, NumberRange] = {
    "batch_s": NumberRange(0, 3600), "timeout_s": NumberRange(0, 300, above=True),
    "retries": NumberRange(0, 20, integer=True),
}
SLURM_RANGES: Mapping[str, NumberRange] = {  # [slurm]
    "warn_before_limit_s": NumberRange(0, 7 * 86400, above=True),
    "ended_within_s": NumberRange(0, 31 * 86400, above=True),
}
PROMETHEUS_RANGES: Mapping[str, NumberRange] = {
    "timeout_s": NumberRange(0, 300, above=True),
    "max_bytes": NumberRange(1024, 1 << 30, integer=True),
    "max_age_s": NumberRange(1, 30 * 86400),
}
"""`[sources.prometheus]`'s numbers: max_bytes from 1 KiB to 1 GiB."""


def quiet_span(text: str) -> tuple[int, int] | None:
    """"22:00-07:00" as minutes of the day (start, end); None when it is not one."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text)
    if m is None:
        return None
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        return None
    return h1 * 60 + m1, h2 * 60 + m2


def threshold_ranges() -> dict[str, NumberRange]:
    """`[thresholds]` numbers (the fields of config.thresholds.Thresholds; for a list of integers,
    the range of each item). A test holds every numeric field to having one."""
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
        # the curves' (findings/run_curves.py)
        "curve_window": NumberRange(4, 1000, integer=True), "spike_k": _K,
        "spike_min_rel": _FACTOR_0, "spike_recent_points": NumberRange(1, 10**6, integer=True),
        "spike_repeat": NumberRange(1, 16, integer=True), "diverge_k": _K,
        "diverge_critical_k": _K, "diverge_min_rel": _FACTOR_0,
        "diverge_sustain_points": NumberRange(1, 10**6, integer=True), "plateau_k": _K,
        "plateau_min_rel": _FACTOR_0, "plateau_rate_factor": _K,
        "plateau_span_ratio": _SHARE, "plateau_min_points": NumberRange(1, 10**9, integer=True),
        "plateau_min_s": _DURATION_S, "overfit_min_evals": NumberRange(2, 1000, integer=True),
        "overfit_evals": NumberRange(1, 1000, integer=True), "overfit_min_rel": _FACTOR_0,
        "overfit_k": _K,
        "hung_factor": _FACTOR, "hung_min_s": _DURATION_S,
        "hung_longest_factor": _FACTOR, "slowed_ratio": _FACTOR,
        "slowed_k": _K, "slowed_points": NumberRange(2, 20, integer=True),
        "slowed_min_s": _DURATION_S,
    }


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


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
        if CONTROL_CHARS.search(target) or not target.strip() or target.startswith("-"):
            raise ConfigError(f"not a host: {target!r}")
        known = config.host(target)
        chosen.append(known or HostConfig(name=host_name_for(target) if target != LOCAL else LOCAL,
                                          ssh=target, settings=config.ssh))
    names = [h.name for h in chosen]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:  # two targets with one display name (user1@gpu1, user2@gpu1): keep them apart
        chosen = [replace(h, name=h.ssh) if h.name in dupes else h for h in chosen]
    return replace(config, hosts=tuple(chosen))
