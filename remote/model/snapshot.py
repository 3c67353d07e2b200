"""One poll of one host as plain data: frozen dataclasses built from the probe's document.

Units live in field names; None means the box did not say (N/A, Not Supported, a section
that failed). remote/wire/document.py's `parse_probe_output` reads the probe's document
into these; it trusts nothing: a garbage document is a ProbeError naming the place.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .discovery import Discovery
from .gpu import EccCounts, MemoryRemap, MigInstance, PcieLink


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
    "not_found": GpuErrorKind(
        "nvidia-smi not found", "nvidia-smi is not on the PATH of commands run over SSH (they "
        "run in a non-interactive shell, which reads less of the profile): put its folder on "
        "PATH near the top of ~/.bashrc, before any early return, or link it into /usr/bin",
        False, None),
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
    ecc: EccCounts | None = None
    remap: MemoryRemap | None = None
    recovery_action: str | None = None
    """What the driver says the GPU needs to recover ("none", "gpu_reset", "node_reboot", ...:
    model.gpu.RECOVERY_ACTIONS); None where the driver does not say."""
    pcie: PcieLink | None = None
    vendor: str = "nvidia"
    mig_instances: tuple[MigInstance, ...] = ()
    """Its MIG instances, where MIG is on and the probe read them (model.gpu.MigInstance)."""

    def to_json(self) -> dict[str, Any]:
        reasons = None if self.throttle_reasons is None else list(self.throttle_reasons)
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name,
            "util_pct": self.util_pct, "mem_used_mib": self.mem_used_mib,
            "mem_total_mib": self.mem_total_mib, "sm_clock_mhz": self.sm_clock_mhz,
            "sm_clock_max_mhz": self.sm_clock_max_mhz, "power_w": self.power_w,
            "power_limit_w": self.power_limit_w, "temp_c": self.temp_c,
            "throttle_reasons": reasons, "mig": self.mig,
            "persistence_mode": self.persistence, "vendor": self.vendor,
            "ecc": None if self.ecc is None else self.ecc.to_json(),
            "remap": None if self.remap is None else self.remap.to_json(),
            "recovery_action": self.recovery_action,
            "pcie": None if self.pcie is None else self.pcie.to_json(),
            "mig_instances": [m.to_json() for m in self.mig_instances] if self.mig else None,
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
    gpu_instance: int | None = None
    compute_instance: int | None = None
    """The MIG instance it runs in (a GPU with MIG on), where the driver says."""


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
    cpu_s: float | None = None
    """User + system CPU time it has used since it started (the box's utime + stime); None
    where the box did not say or said something that is no CPU time."""
    cpu_pct: float | None = None
    """CPU since the previous poll that listed this same process (pid and start time), as top
    shows it (100 = one core; a process with many threads can show more). None on its first
    sighting, after a reboot, or when the two polls' figures do not make one (model.processes
    .with_cpu_pct sets it when the history records the poll)."""

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
            "cpu_pct": None if self.cpu_pct is None else round(self.cpu_pct, 1),
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


NEXT_CHECKPOINT_FROM = 3
"""Checkpoints a run's next save is sized from (RunSample.next_checkpoint_bytes)."""


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
    discovered: Discovery | None = None  # a run nobody configured, how it was found
    exit: ExitRecord | None = None  # a run gpuwatch relaunched: its wrapper's record

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return max(self.checkpoints, key=lambda c: c.mtime, default=None)

    @property
    def next_checkpoint_bytes(self) -> int | None:
        """What the run's next save will take (U6), from its own checkpoints: the largest of
        its newest NEXT_CHECKPOINT_FROM (the newest may still be being written, and a size
        walk that hit its cap reads low: the others say what a whole one takes). None when
        it has none."""
        newest = sorted(self.checkpoints, key=lambda c: c.mtime)[-NEXT_CHECKPOINT_FROM:]
        return max((c.bytes for c in newest), default=None)

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
    gpu_source: str | None  # the source that read them: "nvml" | "nvidia-smi"
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
    """What the next poll sends back instead of the discover module (probe.py)."""
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
    gpu_tool_missing: str | None = None
    """The GPU query tool was not found on the box (its words, e.g. "nvidia-smi not found on
    PATH") and nothing else says the box has GPUs: "no GPU" to a CPU box, a GPU failure to a
    host that had GPUs or runs (HostHistory.record decides, with what it knows)."""
    gpu_query_s: float | None = None
    """How long the box's GPU query took (nvidia-smi or NVML), failed or not."""
    gpu_hints: Mapping[str, str] = field(default_factory=dict)
    """What the GPU source learnt of this box (the reason family, the fields its driver
    lacks): the next poll's request sends it back (box/gpus/section.py)."""
    gpu_vendor: str | None = None
    processes_uptime_s: float | None = None
    """The box's uptime when its process table was read (the processes' cpu_s): what CPU%
    since the previous poll divides by (the host's uptime_s is read before the GPU query,
    whose own time varies from poll to poll)."""
