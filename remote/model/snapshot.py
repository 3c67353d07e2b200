"""One poll of one host as plain data: frozen dataclasses built from the probe's document.

Units live in field names; None means the box did not say (N/A, Not Supported, a section
that failed). `parse_probe_output` trusts nothing: a garbage document or one from another
probe version is a ProbeError naming the place; keys it does not know are ignored.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import zlib
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from ..wire.raw_events import expand_raw_events
from .discovered import Discovery, parse_discovery

PROBE_VERSION = 1

T = TypeVar("T")

# ---------------------------------------------------------------- limits on a box's document
# A box is not trusted: each limit is checked before the data is used (inflating, then a scan
# of the text, then json.loads), and a document over one is that host's ProbeError naming it.
# Each sits far above what the probe's own budgets produce (DEFAULT_LIMITS: a busy 8-GPU box
# with a run sends ~40 KB, under 300 containers and 4,000 values).

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""The largest document read, inflated (checked while inflating: a small zlib stream may
inflate to gigabytes)."""
MAX_DEPTH = 64
"""Nesting of objects and lists (the probe's documents nest 9 deep)."""
MAX_CONTAINERS = 250_000
"""Objects and lists in one document: ~70 bytes each once parsed (16 MiB of `{},` would be
400 MB)."""
MAX_VALUES = 2_000_000
"""Values in one document (commas): 16 MiB of `1.5,` parsed is 170 MB."""
MAX_STRING_BYTES = 256 * 1024
"""One string, as written in the document (the longest the probe sends: base64 raw event
records, 32 KiB)."""
MAX_NUMBER_DIGITS = 40
"""Digits in a row in one number (int64 has 19): Python reads a 4,000-digit int gladly."""
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Every integer field (int64: what SQLite and the series' columns hold)."""
FLOAT_MAX = 2.0**53
"""Every float field but scalar values: finite and within ±FLOAT_MAX (times, sizes and
percentages are all far inside; a value beyond it is the box's error, not a measurement)."""


class ProbeError(Exception):
    """The probe's output cannot be read; the message names the host and the place."""

    def __init__(self, host: str, where: str, problem: str) -> None:
        super().__init__(f"{host}: probe output {where}: {problem}")
        self.host, self.where, self.problem = host, where, problem


@dataclass(frozen=True, slots=True)
class GpuErrorKind:
    """What one kind of GPU query failure means, in one place for every part that says it."""

    summary: str
    """A few words for a table cell, where the GPUs would be."""
    fix: str | None
    """What to do, for gpu.query_failed (None: another finding says it)."""
    wedged: bool
    """The whole driver stopped answering: what runs on the GPUs died or hangs with it."""
    relaunch: str | None
    """Why a relaunch is refused meanwhile, and what to do first (None: not refused)."""


GPU_ERRORS: Mapping[str, GpuErrorKind] = MappingProxyType({
    "timeout": GpuErrorKind(
        "GPUs not answering", "the driver is hung (often a GPU that fell off the bus, Xid 79): "
        "look for Xid lines in `dmesg`; the box usually needs a reboot", True,
        "the driver is hung: reboot the box first"),
    "driver_mismatch": GpuErrorKind(
        "driver mismatch: reboot", None, False,
        "reboot the box (or reload the nvidia kernel modules) first"),
    "driver_not_loaded": GpuErrorKind(
        "NVIDIA driver not loaded", "CUDA cannot run there: load the driver (`sudo modprobe "
        "nvidia`) or reboot, and check that the driver package is installed", True,
        "load the driver or reboot the box first"),
    "gpu_lost": GpuErrorKind(
        "GPU lost", None, False,
        "reboot the box first (a lost GPU comes back only with a reboot)"),
    "no_devices": GpuErrorKind(
        "driver sees no GPU", "the driver sees no GPU: check `lspci | grep -i nvidia` and the "
        "box's GPU allocation", False, None),
    "failed": GpuErrorKind("GPUs unreadable", "run `nvidia-smi` on the box to see why", False,
                           None),
})
"""Every kind of `gpu_error` (the JSON schema's enum) and what it means."""
GPU_ERROR_KINDS = tuple(GPU_ERRORS)


@dataclass(frozen=True, slots=True)
class GpuError:
    """The GPUs could not be read (a wedged driver is not "no GPU"): what kind of failure, the
    tool's own first line, and how long the query took (DESIGN §3, `gpu_error`)."""

    kind: str
    """One of GPU_ERROR_KINDS."""
    message: str
    query_s: float | None
    devices: bool | None = None
    """Whether the box has /dev/nvidia* nodes (None: could not tell)."""
    lost: tuple[str, ...] = ()
    """nvidia-smi's lines for GPUs it could not reach ("Unable to determine the device
    handle for GPU 0000:3B:00.0: Unknown Error")."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "query_s": self.query_s}

    @property
    def meaning(self) -> GpuErrorKind:
        return GPU_ERRORS.get(self.kind, GPU_ERRORS["failed"])

    @property
    def summary(self) -> str:
        """A few words for a table cell: where the GPUs would be, never "no GPU"."""
        took = (f" after {self.query_s:.0f} s" if self.kind == "timeout"
                and self.query_s is not None else "")
        return self.meaning.summary + took


def classify_gpu_error(message: str, *, exit_status: int | None = None, timeout: bool = False,
                       missing: bool = False, devices: bool | None = None,
                       lost: Sequence[str] = ()) -> str | None:
    """The kind of a failed GPU query, from what nvidia-smi (or NVML) said and its exit status
    (nvidia-smi(1)'s return values: 6 not found, 9 driver not loaded, 15 GPU lost, 18 NVML's
    library/driver version mismatch). None: the box has no NVIDIA GPU (no nvidia-smi, no
    /dev/nvidia*), which is not an error."""
    said = message.lower()
    if timeout:
        return "timeout"
    if "version mismatch" in said or exit_status == 18:
        return "driver_mismatch"
    if lost or "gpu is lost" in said or "device handle" in said or exit_status == 15 \
            or "gpuislost" in said.replace(" ", "").replace("_", ""):
        return "gpu_lost"
    if "couldn't communicate with the nvidia driver" in said or exit_status == 9 \
            or "driver not loaded" in said or "drivernotloaded" in said.replace("_", ""):
        return "driver_not_loaded"
    if "no devices were found" in said or exit_status == 6:
        return "no_devices"
    if missing and not devices:
        return None
    return "failed"


def same_gpu_ids(uuid: object, pci: object, index: object, gpu: GpuSample) -> bool:
    """Whether a GPU known by (uuid, PCI bus id, index) is `gpu`: by uuid or by bus id, either
    (a poll may read one as N/A); by index only where neither is known (the driver renumbers
    the rest when one falls off the bus)."""
    if uuid and gpu.uuid and uuid == gpu.uuid:
        return True
    if pci and gpu.pci_bus_id:
        return str(pci).lower() == gpu.pci_bus_id.lower()
    if uuid and gpu.uuid:
        return False  # both say a uuid, and they differ
    return index == gpu.index


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str | None
    name: str | None
    util_pct: float | None  # U21: "a kernel ran", not "the SMs were busy"
    mem_used_mib: int | None
    mem_total_mib: int | None
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: int | None
    throttle_reasons: tuple[str, ...] | None  # U23; () = none active, None = unknown
    mig: bool | None
    pci_bus_id: str | None = None  # "00000000:3B:00.0": maps an Xid line to its GPU (U22)
    persistence: bool | None = None
    """Persistence mode: off, every nvidia-smi or NVML start re-initialises the GPU (seconds
    on an 8-GPU box), and polls run into their deadline."""

    def to_json(self) -> dict[str, Any]:
        reasons = None if self.throttle_reasons is None else list(self.throttle_reasons)
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name,
            "util_pct": self.util_pct, "mem_used_mib": self.mem_used_mib,
            "mem_total_mib": self.mem_total_mib, "sm_clock_mhz": self.sm_clock_mhz,
            "sm_clock_max_mhz": self.sm_clock_max_mhz, "power_w": self.power_w,
            "power_limit_w": self.power_limit_w, "temp_c": self.temp_c,
            "throttle_reasons": reasons, "mig": self.mig,
            "persistence_mode": self.persistence,
        }


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process as the driver lists it; its pid may be missing from the box's
    /proc (another PID namespace: a container), which is itself a finding (U11)."""

    gpu_index: int | None
    uuid: str | None
    pid: int
    gpu_mem_mib: int | None
    process_name: str | None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    ppid: int
    user: str
    state: str
    comm: str
    cmd: str
    start_ticks: int  # with the boot id, what makes a pid an identity (DESIGN §4)
    started_at: float | None  # epoch, ±1 s (btime is whole seconds)
    tty_nr: int
    session: int
    pgrp: int
    sighup_ignored: bool  # seed 000: nohup sets SIG_IGN
    sighup_caught: bool
    threads: int  # U40: against the cgroup's CPU quota
    cgroup: str | None
    cwd: str | None
    exe: str | None
    nvidia_devs: tuple[int, ...] | None  # /dev/nvidiaN minors held open; None = fds unread
    run: str | None
    gpu_index: int | None  # the GPU where the driver shows it holding the most memory
    gpu_mem_mib: int | None  # summed over GPUs
    script: str | None = None  # U2, U42: a run process's .py/.sh, as the box resolves it
    script_mtime: float | None = None  # the box's clock; newer than started_at: code changed
    elastic_rank: bool = False  # U11: a session leader holding a GPU with TORCHELASTIC_RUN_ID

    @property
    def holds_nvidia_dev(self) -> bool | None:
        return None if self.nvidia_devs is None else bool(self.nvidia_devs)

    @property
    def has_tty(self) -> bool:
        return self.tty_nr != 0

    @property
    def zombie(self) -> bool:
        return self.state == "Z"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "ppid": self.ppid, "user": self.user, "state": self.state,
            "started_at": self.started_at, "gpu_index": self.gpu_index,
            "gpu_mem_mib": self.gpu_mem_mib, "cmd": self.cmd, "run": self.run,
            "zombie": "defunct" if self.zombie else None,
        }


@dataclass(frozen=True, slots=True)
class ProcessCounts:
    """The processes the probe counted but did not list in full."""

    total: int
    kernel_threads: int
    zombies: int
    not_listed: int
    fd_unreadable: int  # other users' fds, when the probe is not root
    fd_skipped: tuple[int, ...]  # pids with too many fds to scan for /dev/nvidia*
    euid: int | None = None  # whom the probe (the login) runs as; None: an older probe


@dataclass(frozen=True, slots=True)
class DiskUsage:
    path: str
    mount: str | None
    bytes_total: int | None
    bytes_free: int | None  # what a non-root writer can still use (U6)
    inodes_total: int | None  # None: the filesystem does not count inodes (U7)
    inodes_free: int | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "mount": self.mount, "bytes_total": self.bytes_total,
            "bytes_free": self.bytes_free, "inodes_total": self.inodes_total,
            "inodes_free": self.inodes_free,
        }


@dataclass(frozen=True, slots=True)
class CgroupCounter:
    """Another cgroup than the probe's own, one that a run's processes live in (U41)."""

    path: str
    oom_kill: int | None
    memory_max_bytes: int | None  # None: "max", no limit (or unreadable)


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    version: int
    path: str | None
    memory_current_bytes: int | None
    memory_max_bytes: int | None  # None: "max", no limit
    memory_events: Mapping[str, int]
    cpu_quota_us: int | None  # None: "max", no quota
    cpu_period_us: int | None
    cpu_stat: Mapping[str, int]
    groups: Mapping[str, CgroupCounter] = field(default_factory=dict)
    """The runs' cgroups other than this one, by path (probe.run_groups)."""

    @property
    def oom_kill(self) -> int | None:
        """U41: the authoritative "was I OOM-killed" counter."""
        return self.memory_events.get("oom_kill")

    def counter(self, path: str) -> CgroupCounter | None:
        """The oom_kill counter and memory limit of the cgroup at `path`, this one included;
        None where the probe did not read it."""
        if path == self.path:
            return CgroupCounter(path, self.oom_kill, self.memory_max_bytes)
        return self.groups.get(path)

    @property
    def cpus(self) -> float | None:
        """U40: the vCPUs the quota allows, not the host's core count."""
        if self.cpu_quota_us is None or not self.cpu_period_us:
            return None
        return self.cpu_quota_us / self.cpu_period_us


@dataclass(frozen=True, slots=True)
class KernelEvent:
    kind: str  # "xid" | "oom"
    at: float | None  # epoch; from the boot time for plain dmesg stamps
    since_boot_s: float | None
    pid: int | None
    name: str | None
    xid: int | None = None  # U22: 48 and 79 mean a dead GPU
    pci: str | None = None
    message: str | None = None
    memcg: bool | None = None  # U9, U41: a cgroup OOM rather than the whole host's
    cgroup: str | None = None  # a memcg OOM's cgroup, the one whose limit was hit
    limit_bytes: int | None = None  # that cgroup's limit, as the OOM report printed it


# ---------------------------------------------------------------- training runs

@dataclass(frozen=True, slots=True)
class Scalars:
    """New points of one tag, as columns. Non-finite values are float nan/inf (a loss gone
    NaN is news, not noise); wall_times is None for sources that carry no time."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    wall_times: tuple[float, ...] | None = None

    def __len__(self) -> int:
        return len(self.steps)

    def points(self) -> Iterator[tuple[int, float, float]]:
        """(step, value, wall_time) with nan where the source has no time."""
        walls = self.wall_times or (float("nan"),) * len(self.steps)
        return zip(self.steps, self.values, walls, strict=True)


@dataclass(frozen=True, slots=True)
class LogInfo:
    path: str
    bytes: int
    mtime: float  # the box's clock
    tail: str | None  # the last lines as data, never markup; None: unchanged since last poll


@dataclass(frozen=True, slots=True)
class EventFile:
    """One TensorBoard event file: what was read of it this poll, and where to go on."""

    path: str
    bytes: int
    mtime: float
    offset: int  # send it back next poll
    start: int | None  # where this poll's read began; None: not read (nothing new or no budget)
    stopped: str | None  # eof | partial | bytes | time | shrunk | budget
    first_wall_time: float | None  # only when read from 0: orders a run's files (restarts)
    reset: bool  # the file shrank (replaced): read again from 0
    scalars: Mapping[str, Scalars]
    errors: tuple[str, ...]
    error: str | None = None  # the file could not be read at all

    @property
    def pending(self) -> bool:
        """The byte or time budget cut this poll's read short: more next poll."""
        return self.stopped in ("bytes", "time", "budget")

    @property
    def progress(self) -> float:
        """The share of the file read so far (a first load of a big file spreads over polls)."""
        return 1.0 if self.bytes <= 0 else min(1.0, self.offset / self.bytes)


@dataclass(frozen=True, slots=True)
class MetricsFile:
    """One metrics source: trainer_state.json, Lightning's metrics.csv or a JSONL log."""

    path: str  # as configured (may be a glob)
    file: str | None  # the file read (a glob's newest match)
    kind: str | None  # trainer_state | csv | jsonl
    bytes: int | None
    mtime: float | None
    cursor: Any  # opaque: send it back next poll
    reset: bool  # the file started over: its points replace what came before
    pending: bool  # a budget cut this poll's read short
    skipped: int  # entries without a step, unparseable lines, steps out of range
    scalars: Mapping[str, Scalars]
    error: str | None = None
    errors: tuple[str, ...] = ()  # points left out (a step out of range), one line a tag
    skip_reason: str | None = None  # what was wrong with the first line skipped (box text)
    progress: Mapping[str, float | bool] | None = None
    """What the framework wrote of the run's end, read with the file (probe.trainer_progress,
    probe.lightning_limits): global_step, max_steps, epoch, num_train_epochs, final (HF);
    max_epochs, max_steps (Lightning's hparams.yaml). None: the file was not read this poll."""


PROGRESS_KEYS = ("global_step", "max_steps", "epoch", "num_train_epochs", "max_epochs")


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """How a run gpuwatch relaunched ended, as its launch wrapper recorded it (seed 004)."""

    path: str
    exists: bool
    mtime: float | None  # the box's clock: when the wrapper wrote it
    code: int | None  # the command's exit status, 128+N for signal N; None: none recorded


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: str
    mtime: float  # a folder's: its newest file's (when the checkpoint was last written)
    bytes: int  # a folder's: summed
    capped: bool = False  # the size walk hit its file cap: bytes is a lower bound

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "mtime": self.mtime, "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class RunSample:
    """One poll's look at a configured training run."""

    name: str
    pids: tuple[int, ...]  # processes whose command line matched the run's `process`
    log: LogInfo | None
    events_path: str | None
    event_files: tuple[EventFile, ...]
    events_capped: bool  # more event files or folders than the search looks at
    metrics: tuple[MetricsFile, ...]
    checkpoints: tuple[Checkpoint, ...]  # oldest first; the newest N of checkpoints_total
    checkpoints_total: int
    leftovers: tuple[Checkpoint, ...]  # U6: *.tmp, *.partial, tmp* beside the checkpoints
    done: bool | None  # None: no done marker configured (or it could not be checked)
    done_mtime: float | None
    errors: Mapping[str, str]  # source ("log", "events", "metrics[0]", ...) → message
    discovered: Discovery | None = None  # issue 8: a run nobody configured, how it was found
    exit: ExitRecord | None = None  # a run gpuwatch relaunched: its wrapper's record

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return max(self.checkpoints, key=lambda c: c.mtime, default=None)

    def new_points(self) -> dict[str, list[tuple[int, float, float]]]:
        """This poll's new event points per tag, files in reading order."""
        out: dict[str, list[tuple[int, float, float]]] = {}
        for f in self.event_files:
            for tag, cols in f.scalars.items():
                out.setdefault(tag, []).extend(cols.points())
        return out


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    host: str
    taken_at: float | None  # the box's clock
    hostname: str | None
    boot_id: str | None
    uptime_s: float | None
    loadavg: tuple[float, ...] | None  # U41: the whole machine's, not this container's
    ncpu: int | None
    gpus: tuple[GpuSample, ...]
    gpu_processes: tuple[GpuProcess, ...]
    gpu_source: str | None  # "nvml" | "nvidia-smi"
    nvidia_smi_reasons: str | None  # send back as the request's hint next poll
    processes: tuple[ProcessInfo, ...]
    process_counts: ProcessCounts | None
    disks: tuple[DiskUsage, ...]
    cgroup: CgroupInfo | None
    kill_user_processes: bool | None  # logind; seed 000: kills even tmux at logout
    kernel_events: tuple[KernelEvent, ...]
    xid_counts: Mapping[int, int]
    section_errors: Mapping[str, str]
    probe_s: float | None
    probe_cpu_s: float | None
    poll_s: float | None = None  # set by the poller, which alone sees the whole round trip
    runs: tuple[RunSample, ...] = ()
    discovery_reuse: Mapping[str, Any] | None = None
    """What the next poll sends back instead of the discover module (issue 3, probe.py)."""
    discovery_need: str | None = None
    """"now" | "next": the probe could not reuse the last discovery, or a run's folder is due
    for a search: the client sends the discover module again, now or on the next poll."""
    pynvml: bool | None = None
    """Whether the box's python imports pynvml (the client sends the NVML reader only then)."""
    pynvml_dir: str | None = None
    """The folder the box's python imported pynvml from (the next poll's request names it, so
    that the probe need not load site-packages to find it)."""
    spawn: bool | None = None
    """Whether the box's python has os.posix_spawnp (the client sends the probe's subprocess
    way of running commands only where it has not)."""
    kernel_lines: int | None = None
    """How many kernel log lines may be Xids or OOM kills (the client sends the probe's parser
    of them only where some are)."""
    xid_counts_partial: bool = False
    """The box sent only the newest of its candidate lines raw (probe.RAW_KERNEL_LINES, an Xid
    storm on a box that had none at the last poll): xid_counts are a lower bound this once."""
    gpu_error: GpuError | None = None
    """The GPUs could not be read, or some of them (U22): never the same as having none."""
    gpu_query_s: float | None = None
    """How long the box's GPU query took (nvidia-smi or NVML), failed or not."""


# ---------------------------------------------------------------- validating reader

class _Bad(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where, self.problem = where, problem


def _kind(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not _is_int(value):
        return f"an integer out of range ({len(str(abs(value)))} digits)"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            not _is_number(value):
        return f"a number out of range ({value!r}; the limit is ±2^53)"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number")


def _is_integer(value: object) -> bool:
    """An int of any size (JSON's true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    """An integer field's value: an int within int64."""
    return isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_path(value: object) -> bool:
    """A path: a string, not empty (os.path calls on "" raise)."""
    return isinstance(value, str) and value != ""


def _is_number(value: object) -> bool:
    """A numeric field's value: finite, within ±FLOAT_MAX (an int within int64 that far)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -FLOAT_MAX <= value <= FLOAT_MAX  # nan compares false; no int to float (overflow)


class _Node:
    """A JSON object being read, with its place in the document for error messages."""

    __slots__ = ("data", "where")

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def child(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, test: Callable[[Any], bool], kind: str, optional: bool) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        if not test(value):
            raise _Bad(self.child(key), f"expected {kind}, got {_kind(value)}")
        return value

    def get_int(self, key: str) -> int:
        return int(self._get(key, _is_int, "an integer", False))

    def opt_int(self, key: str) -> int | None:
        value = self._get(key, _is_int, "an integer or null", True)
        return None if value is None else int(value)

    def opt_float(self, key: str) -> float | None:
        value = self._get(key, _is_number, "a number or null", True)
        return None if value is None else float(value)

    def get_number(self, key: str) -> float:
        return float(self._get(key, _is_number, "a number", False))

    def get_str(self, key: str) -> str:
        return str(self._get(key, _is_str, "a string", False))

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, _is_str, "a string or null", True)
        return None if value is None else str(value)

    def get_path(self, key: str) -> str:
        return str(self._get(key, _is_path, "a path (a string, not empty)", False))

    def opt_path(self, key: str) -> str | None:
        value = self._get(key, _is_path, "a path (a string, not empty) or null", True)
        return None if value is None else str(value)

    def get_bool(self, key: str) -> bool:
        return bool(self._get(key, lambda v: isinstance(v, bool), "a boolean", False))

    def opt_bool(self, key: str) -> bool | None:
        value = self._get(key, lambda v: isinstance(v, bool), "a boolean or null", True)
        return None if value is None else bool(value)

    def opt_list(self, key: str, test: Callable[[Any], bool], kind: str) -> tuple[Any, ...] | None:
        value = self._get(key, lambda v: isinstance(v, list), f"a list of {kind} or null", True)
        if value is None:
            return None
        if not all(map(test, value)):
            i, bad = next((i, v) for i, v in enumerate(value) if not test(v))
            raise _Bad(f"{self.child(key)}[{i}]", f"expected one of {kind}, got {_kind(bad)}")
        return tuple(value)

    def node(self, key: str) -> _Node:
        value = self._get(key, lambda v: isinstance(v, dict), "an object", False)
        return _Node(value, self.child(key))

    def nodes(self, key: str) -> Iterator[_Node]:
        items = self._get(key, lambda v: isinstance(v, list), "a list", True) or []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _Bad(f"{self.child(key)}[{i}]", f"expected an object, got {_kind(item)}")
            yield _Node(item, f"{self.child(key)}[{i}]")

    def counters(self, key: str) -> Mapping[str, int]:
        value = self._get(key, lambda v: isinstance(v, dict) and all(map(_is_int, v.values())),
                          "an object of integers", False)
        return MappingProxyType(dict(value))

    def messages(self, key: str) -> Mapping[str, str]:
        value = self._get(key, lambda v: isinstance(v, dict) and all(map(_is_str, v.values())),
                          "an object of messages", True)
        return MappingProxyType(dict(value or {}))

    def table(self, key: str) -> Iterator[_Node]:
        """{"fields": [...], "rows": [[...], ...]} → one node per row."""
        tbl = self.node(key)
        fields = tbl._get("fields", lambda v: isinstance(v, list) and all(map(_is_str, v)),
                          "a list of names", False)
        rows = tbl._get("rows", lambda v: isinstance(v, list), "a list", False)
        for i, row in enumerate(rows):
            where = f"{tbl.where}.rows[{i}]"
            if not isinstance(row, list) or len(row) != len(fields):
                raise _Bad(where, f"expected a list of {len(fields)} values")
            yield _Node(dict(zip(fields, row, strict=True)), where)


# ---------------------------------------------------------------- sections

def _gpu(row: _Node) -> GpuSample:
    return GpuSample(
        index=row.get_int("index"), uuid=row.opt_str("uuid"), name=row.opt_str("name"),
        util_pct=row.opt_float("util_pct"), mem_used_mib=row.opt_int("mem_used_mib"),
        mem_total_mib=row.opt_int("mem_total_mib"), sm_clock_mhz=row.opt_int("sm_clock_mhz"),
        sm_clock_max_mhz=row.opt_int("sm_clock_max_mhz"), power_w=row.opt_float("power_w"),
        power_limit_w=row.opt_float("power_limit_w"), temp_c=row.opt_int("temp_c"),
        throttle_reasons=row.opt_list("throttle_reasons", _is_str, "names"),
        mig=row.opt_bool("mig"), pci_bus_id=row.opt_str("pci_bus_id"),
        persistence=row.opt_bool("persistence"),
    )


def _gpu_processes(section: _Node, gpus: tuple[GpuSample, ...]) -> tuple[GpuProcess, ...]:
    if "apps" not in section.data:  # nvidia-smi answered for the GPUs but not the processes
        return ()
    index_of = {gpu.uuid: gpu.index for gpu in gpus}
    return tuple(
        GpuProcess(gpu_index=index_of.get(row.opt_str("uuid")), uuid=row.opt_str("uuid"),
                   pid=row.get_int("pid"), gpu_mem_mib=row.opt_int("gpu_mem_mib"),
                   process_name=row.opt_str("process_name"))
        for row in section.table("apps"))


def _gpu_use(apps: tuple[GpuProcess, ...]) -> dict[int, tuple[int | None, int | None]]:
    """pid → (GPU where it holds the most memory, total MiB) from the driver's list."""
    per_pid: dict[int, list[GpuProcess]] = {}
    for app in apps:
        per_pid.setdefault(app.pid, []).append(app)
    use = {}
    for pid, entries in per_pid.items():
        known = [e.gpu_mem_mib for e in entries if e.gpu_mem_mib is not None]
        top = max(entries, key=lambda e: e.gpu_mem_mib or 0)
        use[pid] = (top.gpu_index, sum(known) if known else None)
    return use


def _process(row: _Node, use: Mapping[int, tuple[int | None, int | None]],
             clock: tuple[int, int] | None,
             scripts: Mapping[int, tuple[str | None, float | None]],
             elastic: frozenset[int]) -> ProcessInfo:
    pid, start_ticks = row.get_int("pid"), row.get_int("start_ticks")
    gpu_index, gpu_mem_mib = use.get(pid, (None, None))
    started_at = None if clock is None else clock[0] + start_ticks / clock[1]
    return ProcessInfo(
        pid=pid, ppid=row.get_int("ppid"), user=row.get_str("user"), state=row.get_str("state"),
        comm=row.get_str("comm"), cmd=row.get_str("cmd"), start_ticks=start_ticks,
        started_at=started_at, tty_nr=row.get_int("tty_nr"), session=row.get_int("session"),
        pgrp=row.get_int("pgrp"), sighup_ignored=row.get_bool("sighup_ignored"),
        sighup_caught=row.get_bool("sighup_caught"), threads=row.get_int("threads"),
        cgroup=row.opt_str("cgroup"), cwd=row.opt_str("cwd"), exe=row.opt_str("exe"),
        nvidia_devs=row.opt_list("nvidia_devs", _is_int, "integers"), run=row.opt_str("run"),
        gpu_index=gpu_index, gpu_mem_mib=gpu_mem_mib, script=scripts.get(pid, (None, None))[0],
        script_mtime=scripts.get(pid, (None, None))[1], elastic_rank=pid in elastic,
    )


def _elastic(section: _Node) -> frozenset[int]:
    """Pids of torchrun's ranks among the session leaders holding a GPU (U11); none from
    probes that do not say."""
    raw = section.data.get("elastic")
    return frozenset(p for p in raw if _is_int(p)) if isinstance(raw, list) else frozenset()


def _scripts(section: _Node) -> dict[int, tuple[str | None, float | None]]:
    """pid → (script, mtime) of run processes (U2, U42), from {script: [mtime, pid, ...]};
    {} from probes that do not say."""
    raw = section.data.get("scripts")
    out: dict[int, tuple[str | None, float | None]] = {}
    if not isinstance(raw, dict):
        return out
    for script, value in raw.items():
        if not (isinstance(value, list) and value and _is_number(value[0])
                and all(_is_int(p) for p in value[1:])):
            raise _Bad(f"{section.where}.scripts", "expected {script: [mtime, pid, ...]}")
        for pid in value[1:]:
            out[int(pid)] = (str(script), float(value[0]))
    return out


def _counts(section: _Node) -> ProcessCounts:
    skipped = section.opt_list("fd_skipped", _is_int, "pids")
    return ProcessCounts(
        total=section.get_int("total"), kernel_threads=section.get_int("kernel_threads"),
        zombies=section.get_int("zombies"), not_listed=section.get_int("not_listed"),
        fd_unreadable=section.get_int("fd_unreadable"), fd_skipped=skipped or (),
        euid=section.opt_int("euid"))


def _disk(node: _Node) -> DiskUsage:
    return DiskUsage(
        path=node.get_str("path"), mount=node.opt_str("mount"),
        bytes_total=node.opt_int("bytes_total"), bytes_free=node.opt_int("bytes_free"),
        inodes_total=node.opt_int("inodes_total"),
        inodes_free=node.opt_int("inodes_free"), error=node.opt_str("error"))


def _cgroup(section: _Node) -> CgroupInfo:
    return CgroupInfo(
        version=section.get_int("version"), path=section.opt_str("path"),
        memory_current_bytes=section.opt_int("memory_current_bytes"),
        memory_max_bytes=section.opt_int("memory_max_bytes"),
        memory_events=section.counters("memory_events"),
        cpu_quota_us=section.opt_int("cpu_quota_us"),
        cpu_period_us=section.opt_int("cpu_period_us"),
        cpu_stat=section.counters("cpu_stat"),
        groups=_cgroup_groups(section) if section.data.get("groups") is not None else {})


def _cgroup_groups(section: _Node) -> Mapping[str, CgroupCounter]:
    groups = {}
    for row in section.table("groups"):
        path = row.get_str("path")
        groups[path] = CgroupCounter(path, row.opt_int("oom_kill"),
                                     row.opt_int("memory_max_bytes"))
    return MappingProxyType(groups)


def _kernel_events(section: _Node, btime: int | None) -> tuple[KernelEvent, ...]:
    def when(row: _Node) -> tuple[float | None, float | None]:
        mono, epoch = row.opt_float("t_mono_s"), row.opt_float("t_epoch")
        if epoch is None and mono is not None and btime is not None:
            epoch = btime + mono  # plain dmesg stamps count from boot
        return epoch, mono

    events = []
    for row in section.table("xid"):
        at, mono = when(row)
        events.append(KernelEvent(kind="xid", at=at, since_boot_s=mono, pid=row.opt_int("pid"),
                                  name=row.opt_str("name"), xid=row.get_int("xid"),
                                  pci=row.opt_str("pci"), message=row.opt_str("msg")))
    for row in section.table("oom"):
        at, mono = when(row)
        events.append(KernelEvent(kind="oom", at=at, since_boot_s=mono, pid=row.opt_int("pid"),
                                  name=row.opt_str("name"), memcg=row.opt_bool("memcg"),
                                  cgroup=row.opt_str("cgroup"),
                                  limit_bytes=row.opt_int("limit_bytes")))
    return tuple(events)


def _xid_counts(section: _Node) -> Mapping[int, int]:
    counts = section.counters("xid_counts")
    if not all(code.isascii() and code.isdigit() and len(code) < 10 for code in counts):
        raise _Bad(f"{section.where}.xid_counts", "expected Xid codes as keys")
    return MappingProxyType({int(code): n for code, n in counts.items()})


def _value(value: Any) -> float:
    if isinstance(value, str):
        return _NON_FINITE[value]
    return float(value)  # an int of at most MAX_NUMBER_DIGITS digits: no OverflowError


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _is_value(value: object) -> bool:
    """A scalar's value: any number (a loss gone NaN or inf is news, not noise), or JSON's
    stand-in for a non-finite one ("nan", "inf", "-inf")."""
    return (_is_integer(value) or isinstance(value, float)
            or (isinstance(value, str) and value in _NON_FINITE))


def _wall(value: Any) -> float:
    """A point's wall time; nan (no time) for null and for one out of range."""
    return float(value) if _is_number(value) else float("nan")


class _Dropped:
    """Points of one source left out for a step out of range: counted, one message a tag."""

    def __init__(self) -> None:
        self.count = 0
        self.messages: list[str] = []

    def note(self, where: str, steps: list[int]) -> None:
        self.count += len(steps)
        self.messages.append(f"{where}: {len(steps)} point(s) dropped, step out of range "
                             f"(e.g. {str(steps[0])[:MAX_NUMBER_DIGITS]})")


def _scalars(node: _Node, key: str, with_wall: bool, dropped: _Dropped) -> Mapping[str, Scalars]:
    """A source's columns by tag. A point whose step is out of int64 (what the series and the
    store hold) is dropped and counted in `dropped`, the tag's other points kept."""
    value = node.data.get(key)
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, dict):
        raise _Bad(node.child(key), f"expected an object, got {_kind(value)}")
    out = {}
    for tag, cols in value.items():
        where = f"{node.child(key)}.{tag}"
        col = _Node(cols, where) if isinstance(cols, dict) else None
        if col is None:
            raise _Bad(where, f"expected an object, got {_kind(cols)}")
        steps = col.opt_list("steps", _is_integer, "integers") or ()
        raw = col.opt_list("values", _is_value, "numbers") or ()
        walls = col.opt_list("wall_times", lambda v: v is None or _is_integer(v)
                             or isinstance(v, float), "numbers") if with_wall else None
        if len(raw) != len(steps) or (walls is not None and len(walls) != len(steps)):
            raise _Bad(where, "columns of different lengths")
        keep = [i for i, step in enumerate(steps) if _is_int(step)]
        if len(keep) < len(steps):
            dropped.note(where, [s for s in steps if not _is_int(s)])
        out[tag] = Scalars(
            steps=tuple(int(steps[i]) for i in keep), values=tuple(_value(raw[i]) for i in keep),
            wall_times=None if walls is None else tuple(_wall(walls[i]) for i in keep))
    return MappingProxyType(out)


def _event_file(node: _Node) -> EventFile:
    error = node.opt_str("error")
    if error is not None:
        return EventFile(path=node.get_path("path"), bytes=0, mtime=0.0, offset=0, start=None,
                         stopped=None, first_wall_time=None, reset=False,
                         scalars=MappingProxyType({}), errors=(), error=error)
    dropped = _Dropped()
    scalars = _scalars(node, "scalars", True, dropped)
    return EventFile(
        path=node.get_path("path"), bytes=node.get_int("size"), mtime=float(node.get_number(
            "mtime")), offset=node.get_int("offset"), start=node.opt_int("start"),
        stopped=node.opt_str("stopped"), first_wall_time=node.opt_float("first_wall_time"),
        reset=node.opt_bool("reset") or False, scalars=scalars,
        errors=(node.opt_list("errors", _is_str, "messages") or ()) + tuple(dropped.messages))


def _metrics_file(node: _Node) -> MetricsFile:
    dropped = _Dropped()
    scalars = _scalars(node, "scalars", False, dropped)
    return MetricsFile(
        path=node.get_path("path"), file=node.opt_str("file"), kind=node.opt_str("kind"),
        bytes=node.opt_int("size"), mtime=node.opt_float("mtime"),
        cursor=node.data.get("cursor"), reset=node.opt_bool("reset") or False,
        pending=node.opt_bool("pending") or False,
        skipped=(node.opt_int("skipped") or 0) + dropped.count,
        scalars=scalars, error=node.opt_str("error"), errors=tuple(dropped.messages),
        progress=_progress(node), skip_reason=node.opt_str("skip_reason"))


def _progress(node: _Node) -> Mapping[str, float | bool] | None:
    """A metrics file's "progress": the known keys that hold finite numbers, and "final"."""
    raw = node.data.get("progress")
    if not isinstance(raw, dict):
        return None
    out: dict[str, float | bool] = {k: float(raw[k]) for k in PROGRESS_KEYS
                                    if _is_number(raw.get(k)) and math.isfinite(raw[k])}
    if raw.get("final") is True:
        out["final"] = True
    return MappingProxyType(out)


def _exit(node: _Node) -> ExitRecord | None:
    if node.data.get("exit") is None:
        return None
    ex = node.node("exit")
    code = ex.opt_int("code")
    return ExitRecord(path=ex.get_str("path"), exists=ex.get_bool("exists"),
                      mtime=ex.opt_float("mtime"),
                      code=code if code is not None and 0 <= code <= 255 else None)


def _checkpoints(node: _Node, key: str) -> tuple[Checkpoint, ...]:
    if node.data.get(key) is None:
        return ()
    return tuple(Checkpoint(path=row.get_path("path"), mtime=float(row.get_number("mtime")),
                            bytes=row.get_int("bytes"), capped=row.opt_bool("capped") or False)
                 for row in node.table(key))


def _run(node: _Node) -> RunSample:
    log = node.data.get("log")
    log_info = None
    if log is not None:
        ln = node.node("log")
        log_info = LogInfo(path=ln.get_path("path"), bytes=ln.get_int("size"),
                           mtime=float(ln.get_number("mtime")), tail=ln.opt_str("tail"))
    events = node.node("events") if node.data.get("events") is not None else None
    ckpts = node.node("checkpoints") if node.data.get("checkpoints") is not None else None
    done = node.node("done") if node.data.get("done") is not None else None
    return RunSample(
        name=node.get_str("name"),
        pids=node.opt_list("pids", _is_int, "pids") or (),
        log=log_info,
        events_path=events.opt_path("path") if events else None,
        event_files=tuple(_event_file(f) for f in events.nodes("files")) if events else (),
        events_capped=(events.opt_bool("capped") or False) if events else False,
        metrics=tuple(_metrics_file(m) for m in node.nodes("metrics")),
        checkpoints=_checkpoints(ckpts, "items") if ckpts else (),
        checkpoints_total=(ckpts.opt_int("total") or 0) if ckpts else 0,
        leftovers=_checkpoints(ckpts, "leftovers") if ckpts else (),
        done=done.get_bool("exists") if done else None,
        done_mtime=done.opt_float("mtime") if done else None,
        errors=node.messages("errors"),
        discovered=_discovered(node),
        exit=_exit(node),
    )


def _discovered(node: _Node) -> Discovery | None:
    if node.data.get("discovered") is None:
        return None
    try:
        return parse_discovery(node.get_str("name"), node.data["discovered"])
    except ValueError as exc:
        raise _Bad(node.child("discovered"), str(exc)) from None


def _discovered_runs(doc: _Node, errors: dict[str, str]) -> tuple[RunSample, ...]:
    """Issue 8: the "discovered" section's runs (probe's discover.py), after the configured."""
    value = doc.data.get("discovered")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("discovered", _Node(value, "discovered").get_str("error"))
        return ()
    return tuple(_run(node) for node in doc.nodes("discovered"))


def _runs(doc: _Node, errors: dict[str, str]) -> tuple[RunSample, ...]:
    value = doc.data.get("runs")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("runs", _Node(value, "runs").get_str("error"))
        return ()
    return tuple(_run(node) for node in doc.nodes("runs"))


# ---------------------------------------------------------------- the document

_MIB = 1024 * 1024
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_SKELETON = bytes(set(range(256)) - set(b'"[]{}'))
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # \" and \\ most of all: what hides a quote
_ESCAPES_BY_REGEX = 10_000
_STRING = re.compile(rb'"[^"]*"')  # in text without escapes
_LONG_STRING = re.compile(rb'"[^"]{%d,}"' % MAX_STRING_BYTES)
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * (MAX_NUMBER_DIGITS + 1)  # in text through _DIGITS
_ZEROS = re.compile(rb"0+")
_DEPTH_CHUNK = 64 * 1024


def decode_document(data: bytes) -> bytes:
    """The probe's stdout as JSON text: inflated where the request asked for compression,
    never past MAX_DOCUMENT_BYTES (a zlib stream of a few KB can inflate to gigabytes)."""
    if not data.strip():
        raise _Bad("", "the probe printed nothing")
    text = data if data.lstrip().startswith(b"{") else _inflate(data)
    if len(text) > MAX_DOCUMENT_BYTES:
        raise _too_big("")
    return text


def _too_big(how: str) -> _Bad:
    return _Bad("", f"larger than the limit of {MAX_DOCUMENT_BYTES // _MIB} MiB "
                    f"(MAX_DOCUMENT_BYTES){how}")


def _inflate(data: bytes) -> bytes:
    """A zlib stream inflated a MiB at a time, given up as soon as it passes the limit:
    nothing past it is ever inflated, and a bomb's pieces are never joined."""
    inflate, parts, size = zlib.decompressobj(), [], 0
    try:
        part = inflate.decompress(data, _MIB)
        while part:
            parts.append(part)
            size += len(part)
            if size > MAX_DOCUMENT_BYTES:
                raise _too_big(" once inflated")
            part = inflate.decompress(inflate.unconsumed_tail, _MIB)
    except zlib.error:
        raise _Bad("", "neither JSON nor zlib-compressed JSON") from None
    if not inflate.eof:
        raise _Bad("", "neither JSON nor zlib-compressed JSON (the stream is cut short)")
    return b"".join(parts)


def _outside_strings(flat: bytes, find: Callable[[int], tuple[int, int] | None]) -> bool:
    """Whether what `find(pos)` finds from pos on ((start, where to look on)) begins somewhere
    in `flat` outside a string (an even number of quotes before it: a long string's match
    begins at its opening quote)."""
    quotes = counted = pos = 0
    while (found := find(pos)) is not None:
        quotes += flat.count(b'"', counted, found[0])
        counted, pos = found
        if quotes % 2 == 0:
            return True
    return False


def _long_string(flat: bytes) -> Callable[[int], tuple[int, int] | None]:
    def find(pos: int) -> tuple[int, int] | None:
        m = _LONG_STRING.search(flat, pos)
        return None if m is None else (m.start(), m.end() - 1)  # its end may open the next
    return find


def _long_number(digits: bytes) -> Callable[[int], tuple[int, int] | None]:
    def find(pos: int) -> tuple[int, int] | None:
        at = digits.find(_LONG_NUMBER, pos)
        if at < 0:
            return None
        run = _ZEROS.match(digits, at)
        return at, at if run is None else run.end()
    return find


def _depth(skeleton: bytes) -> int:
    """The deepest nesting of a text of brackets alone; stops at the first chunk past
    MAX_DEPTH (a document nested 300,000 deep is refused after 64 KB of it)."""
    level = deepest = 0
    steps = skeleton.translate(_BRACKETS, b'"')  # a stray quote: JSON that will not load
    for at in range(0, len(steps), _DEPTH_CHUNK):
        chunk = array("b", steps[at:at + _DEPTH_CHUNK])
        deepest = max(deepest, max(itertools.accumulate(chunk, initial=level)))
        if deepest > MAX_DEPTH:
            break
        level += sum(chunk)
    return deepest


def _unescaped(text: bytes) -> bytes:
    """The text without escapes, so that every quote left opens or closes a string. The regex
    is the fast way; two replaces (no object per match) where escapes are many."""
    if text.count(b"\\") < _ESCAPES_BY_REGEX:
        return _ESCAPE.sub(b"", text)
    return text.replace(b"\\\\", b"").replace(b'\\"', b"")


def check_text(text: bytes) -> None:
    """The limits on a document's shape, from its text before json.loads builds anything:
    nesting depth, containers, values, string length and number length. A few C-level passes
    over the bytes (tens of microseconds for a steady poll's document); strings are told
    apart from structure by the parity of the quotes once escapes are taken out."""
    flat = _unescaped(text)
    # Brackets outside strings: strings without brackets go first (adjacent quotes only ever
    # join two strings' contents, so dropping `""` keeps the rest in step); strings holding
    # brackets, rare, go by a regex once their number is known to be bounded.
    skeleton = flat.translate(None, _NOT_SKELETON).replace(b'""', b"")
    exact = b'"' not in skeleton
    if exact and _depth(skeleton) > MAX_DEPTH:
        raise _Bad("", f"nested deeper than the limit of {MAX_DEPTH} (MAX_DEPTH)")
    if skeleton.count(b"[") + skeleton.count(b"{") > MAX_CONTAINERS:  # strings' too: over
        raise _Bad("", f"more than the limit of {MAX_CONTAINERS:,} objects and lists "
                       f"(MAX_CONTAINERS)")
    if not exact and _depth(_STRING.sub(b"", skeleton)) > MAX_DEPTH:
        raise _Bad("", f"nested deeper than the limit of {MAX_DEPTH} (MAX_DEPTH)")
    if text.count(b",") > MAX_VALUES:
        raise _Bad("", f"more than the limit of {MAX_VALUES:,} values (MAX_VALUES)")
    if _outside_strings(flat, _long_string(flat)):
        raise _Bad("", f"a string longer than the limit of {MAX_STRING_BYTES // 1024} KiB "
                       f"(MAX_STRING_BYTES)")
    digits = flat.translate(_DIGITS)
    if _LONG_NUMBER in digits and _outside_strings(digits, _long_number(digits)):
        raise _Bad("", f"a number of more than the limit of {MAX_NUMBER_DIGITS} digits "
                       f"(MAX_NUMBER_DIGITS)")


def _decode(data: bytes) -> Any:
    """The probe prints JSON, or its zlib stream when the request asked for compression;
    every limit is checked before json.loads."""
    text = decode_document(data)
    check_text(text)
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _Bad("", f"not JSON: {exc}") from None


def _section(doc: _Node, name: str, errors: dict[str, str]) -> _Node | None:
    """A section's node; None when not asked for or failed ({"error": ...}, recorded)."""
    value = doc.data.get(name)
    if isinstance(value, dict) and "error" in value:
        errors.setdefault(name, _Node(value, doc.child(name)).get_str("error"))
        return None
    return None if value is None else doc.node(name)


def _kernel_section(doc: _Node, errors: dict[str, str]) -> _Node | None:
    """The kernel section. Where the box's probe came without its parser of Xid and OOM lines
    (issue 3: sent only where the last poll saw some), the lines come raw and are parsed here
    by the same code (probe.parse_kernel_log, the probe's default limits)."""
    kernel = _section(doc, "kernel", errors)
    if kernel is None or kernel.data.get("raw") is None:
        return kernel
    raw = kernel.opt_list("raw", lambda v: isinstance(v, str), "strings") or ()
    from ..box.probe import DEFAULT_LIMITS, parse_kernel_log  # only here: a box's first Xid

    parsed = parse_kernel_log(raw, DEFAULT_LIMITS["kernel_events"], DEFAULT_LIMITS["msg_chars"])
    parsed["candidates"] = kernel.opt_int("candidates")
    total = kernel.opt_int("raw_total")
    parsed["partial"] = total is not None and total > len(raw)
    return _Node(parsed, doc.child("kernel"))


def _host_clock(host: _Node | None) -> tuple[int, int] | None:
    """(btime, clock ticks per second): what turns start ticks into epoch seconds."""
    if host is None:
        return None
    btime, ticks = host.opt_int("btime"), host.opt_int("clk_tck")
    return (btime, ticks) if btime is not None and ticks else None


def _disks(doc: _Node, errors: dict[str, str]) -> tuple[DiskUsage, ...]:
    value = doc.data.get("disks")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("disks", _Node(value, "disks").get_str("error"))
        return ()
    return tuple(_disk(node) for node in doc.nodes("disks"))


def _snapshot(doc: _Node, host: str) -> HostSnapshot:
    errors = dict(doc.messages("errors"))
    info = _section(doc, "host", errors)
    clock = _host_clock(info)
    gpu_section = _section(doc, "gpus", errors)
    gpu_error = _gpu_error(doc.data.get("gpus"), doc.child("gpus"))
    gpus = tuple(_gpu(row) for row in gpu_section.table("devices")) if gpu_section else ()
    apps = _gpu_processes(gpu_section, gpus) if gpu_section else ()
    if gpu_section and gpu_section.opt_str("apps_error"):
        errors["gpus.apps"] = gpu_section.get_str("apps_error")
    procs = _section(doc, "processes", errors)
    use = _gpu_use(apps)
    cgroup = _section(doc, "cgroup", errors)
    scripts = _scripts(procs) if procs else {}
    elastic = _elastic(procs) if procs else frozenset()
    logind = _section(doc, "logind", errors)
    kernel = _kernel_section(doc, errors)
    return HostSnapshot(
        host=host,
        taken_at=info.opt_float("time") if info else None,
        hostname=info.opt_str("hostname") if info else None,
        boot_id=info.opt_str("boot_id") if info else None,
        uptime_s=info.opt_float("uptime_s") if info else None,
        loadavg=info.opt_list("loadavg", _is_number, "numbers") if info else None,
        ncpu=info.opt_int("ncpu") if info else None,
        gpus=gpus,
        gpu_processes=apps,
        gpu_source=gpu_section.opt_str("source") if gpu_section else None,
        nvidia_smi_reasons=gpu_section.opt_str("reasons") if gpu_section else None,
        processes=tuple(_process(row, use, clock, scripts, elastic)
                        for row in procs.table("procs")) if procs else (),
        process_counts=_counts(procs) if procs else None,
        disks=_disks(doc, errors),
        cgroup=_cgroup(cgroup) if cgroup else None,
        kill_user_processes=logind.opt_bool("kill_user_processes") if logind else None,
        kernel_events=_kernel_events(kernel, clock[0] if clock else None) if kernel else (),
        xid_counts=_xid_counts(kernel) if kernel else MappingProxyType({}),
        section_errors=MappingProxyType(errors),
        probe_s=doc.opt_float("probe_s"),
        probe_cpu_s=doc.opt_float("cpu_s"),
        runs=_runs(doc, errors) + _discovered_runs(doc, errors),
        pynvml=gpu_section.opt_bool("pynvml") if gpu_section else None,
        pynvml_dir=gpu_section.opt_str("pynvml_dir") if gpu_section else None,
        spawn=info.opt_bool("spawn") if info else None,
        kernel_lines=kernel.opt_int("candidates") if kernel else None,
        xid_counts_partial=bool(kernel and kernel.data.get("partial") is True),
        gpu_error=gpu_error,
        gpu_query_s=gpu_error.query_s if gpu_error is not None
        else gpu_section.opt_float("query_s") if gpu_section else None,
        **_discovery_note(doc),
    )


def _gpu_error(value: object, where: str) -> GpuError | None:
    """The GPU section's failure, or its lost GPUs beside the ones that answered, classified;
    None where the GPUs were read (or the box has none)."""
    if not isinstance(value, dict):
        return None
    node = _Node(value, where)
    if node.opt_bool("not_read"):  # the probe's deadline passed before the GPUs' turn
        return None
    lost = node.opt_list("lost", lambda v: isinstance(v, str), "strings") or ()
    if "error" not in value:
        if not lost:
            return None
        return GpuError("gpu_lost", lost[0], node.opt_float("query_s"), True, tuple(lost))
    message = node.get_str("error")
    said = node.opt_str("said")
    nvml = node.opt_str("nvml")
    devices = node.opt_bool("devices")
    kind = classify_gpu_error(
        " ".join(t for t in (message, said, nvml) if t), exit_status=node.opt_int("exit"),
        timeout=node.opt_bool("timeout") is True, missing=node.opt_bool("missing") is True,
        devices=devices, lost=lost)
    if kind is None:
        return None
    return GpuError(kind, (said or message)[:300], node.opt_float("query_s"), devices,
                    tuple(lost))


def _discovery_note(doc: _Node) -> dict[str, Any]:
    """The probe's word on its discovery (issue 3): the cache to send back, or the need for the
    module. Malformed reads as absent: the next poll sends the module, which is always right."""
    note = doc.data.get("discovery")
    if not isinstance(note, dict):
        return {}
    reuse = note.get("reuse")
    return {"discovery_reuse": MappingProxyType(reuse) if isinstance(reuse, dict) else None,
            "discovery_need": note.get("need") if note.get("need") in ("now", "next") else None}


def load_document(data: bytes, host: str) -> Any:
    """The probe's stdout as JSON values, within every limit; ProbeError if not (for readers of
    fields the snapshot does not keep: `gpuwatch check`)."""
    try:
        return _decode(data)
    except _Bad as bad:
        raise ProbeError(host, bad.where or "document", bad.problem) from None


def parse_probe_output(data: bytes, host: str) -> HostSnapshot:
    """The probe's stdout → a HostSnapshot; ProbeError if it is not a document we read."""
    try:
        raw = _decode(data)
        if not isinstance(raw, dict):
            raise _Bad("", f"expected an object, got {_kind(raw)}")
        if raw.get("v") != PROBE_VERSION:
            version = raw.get("v")
            raise _Bad("v", f"version {version!r}; this gpuwatch reads version {PROBE_VERSION}")
        return _snapshot(_Node(expand_raw_events(raw), ""), host)
    except _Bad as bad:
        raise ProbeError(host, bad.where or "document", bad.problem) from None
