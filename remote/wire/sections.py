"""The sections of the probe's document (wire/document.py) read into the model's snapshot types:
GPUs, processes, disks, the cgroup, the kernel log, the runs (scalars, checkpoints, exits)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..model.discovery import Discovery, parse_discovery
from ..model.gpu import (
    RECOVERY_ORDER,
    EccCounts,
    MemoryRemap,
    MigInstance,
    PcieLink,
    recovery_name,
)
from ..model.snapshot import (
    PROGRESS_KEYS,
    CgroupCounter,
    CgroupInfo,
    Checkpoint,
    DiskUsage,
    EventFile,
    ExitRecord,
    GpuProcess,
    GpuSample,
    KernelEvent,
    LogInfo,
    MetricsFile,
    ProcessCounts,
    ProcessInfo,
    RunSample,
    Scalars,
)
from .reader import (
    MAX_NUMBER_DIGITS,
    BadDocument,
    Node,
    is_int,
    is_integer,
    is_number,
    is_str,
    kind_of,
)

# ---------------------------------------------------------------- sections

def parse_gpu(row: Node, vendor: str = "nvidia") -> GpuSample:
    return GpuSample(
        index=row.get_int("index"), uuid=row.opt_str("uuid"), name=row.opt_str("name"),
        util_pct=row.opt_float("util_pct"), mem_used_mib=row.opt_int("mem_used_mib"),
        mem_total_mib=row.opt_int("mem_total_mib"), sm_clock_mhz=row.opt_int("sm_clock_mhz"),
        sm_clock_max_mhz=row.opt_int("sm_clock_max_mhz"), power_w=row.opt_float("power_w"),
        power_limit_w=row.opt_float("power_limit_w"), temp_c=row.opt_int("temp_c"),
        throttle_reasons=row.opt_list("throttle_reasons", is_str, "names"),
        mig=row.opt_bool("mig"), pci_bus_id=row.opt_str("pci_bus_id"),
        persistence=row.opt_bool("persistence"), ecc=_ecc(row), remap=_remap(row),
        recovery_action=_recovery(row), pcie=_pcie(row), vendor=vendor,
    )


def _flag(row: Node, name: str) -> bool | None:
    """A yes/no field: a boolean (nvidia-smi's source) or NVML's 0/1 (its field values)."""
    value = row.data.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return row.opt_bool(name)


def _recovery(row: Node) -> str | None:
    """The recovery action's name: nvidia-smi's words (model.gpu.recovery_name), or NVML's
    nvmlGpuRecoveryAction_t number (model.gpu.RECOVERY_ORDER; one it does not know, as
    `action_N`)."""
    value = row.data.get("recovery")
    if isinstance(value, int) and not isinstance(value, bool):
        return RECOVERY_ORDER[value] if 0 <= value < len(RECOVERY_ORDER) else f"action_{value}"
    words = row.opt_str("recovery")
    return None if words is None else recovery_name(words)


def _some(row: Node, *names: str) -> bool:
    return any(row.data.get(name) is not None for name in names)


def _ecc(row: Node) -> EccCounts | None:
    names = ("ecc_corr_vol", "ecc_unc_vol", "ecc_corr_agg", "ecc_unc_agg")
    if not _some(row, *names):  # ECC off, or a GPU without it
        return None
    return EccCounts(*(row.opt_int(name) for name in names))


def _remap(row: Node) -> MemoryRemap | None:
    names = ("remap_corr", "remap_unc", "remap_pending", "remap_failed", "remap_hist",
             "retired_sbe", "retired_dbe", "retired_pending")
    if not _some(row, *names):
        return None
    hist = row.opt_list("remap_hist", lambda v: v is None or is_int(v), "integers")
    return MemoryRemap(
        corrected=row.opt_int("remap_corr"), uncorrected=row.opt_int("remap_unc"),
        pending=_flag(row, "remap_pending"), failed=_flag(row, "remap_failed"),
        histogram=None if hist is None or len(hist) != 5 else tuple(
            None if v is None else int(v) for v in hist),
        retired_sbe=row.opt_int("retired_sbe"), retired_dbe=row.opt_int("retired_dbe"),
        retired_pending=_flag(row, "retired_pending"))


def _pcie(row: Node) -> PcieLink | None:
    names = ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "pcie_replays")
    if not _some(row, *names):
        return None
    return PcieLink(*(row.opt_int(name) for name in names))


def parse_gpu_processes(section: Node, gpus: tuple[GpuSample, ...]) -> tuple[GpuProcess, ...]:
    if "apps" not in section.data:  # nvidia-smi answered for the GPUs but not the processes
        return ()
    index_of = {gpu.uuid: gpu.index for gpu in gpus}
    return tuple(
        GpuProcess(gpu_index=index_of.get(row.opt_str("uuid")), uuid=row.opt_str("uuid"),
                   pid=row.get_int("pid"), gpu_mem_mib=row.opt_int("gpu_mem_mib"),
                   process_name=row.opt_str("process_name"), gpu_instance=row.opt_int("gi"),
                   compute_instance=row.opt_int("ci"))
        for row in section.table("apps"))


def parse_mig(section: Node, gpus: tuple[GpuSample, ...],
         apps: tuple[GpuProcess, ...]) -> tuple[GpuSample, ...]:
    """The GPUs with their MIG instances (the section's "mig" table) under them, each with the
    pids the driver places in it; the GPUs as they were where the probe sent none."""
    if "mig" not in section.data:
        return gpus
    under: dict[int, list[MigInstance]] = {}
    for row in section.table("mig"):
        gpu, gi, ci = row.get_int("gpu"), row.opt_int("gi"), row.opt_int("ci")
        pids = tuple(sorted({a.pid for a in apps if a.gpu_index == gpu and gi is not None
                             and (a.gpu_instance, a.compute_instance) == (gi, ci)}))
        under.setdefault(gpu, []).append(MigInstance(
            gpu_instance=gi, compute_instance=ci, device=row.opt_int("dev"),
            profile=row.opt_str("profile"), uuid=row.opt_str("uuid"),
            mem_used_mib=row.opt_int("mem_used_mib"), mem_total_mib=row.opt_int("mem_total_mib"),
            sm_count=row.opt_int("sm"), util_pct=row.opt_float("util_pct"), pids=pids))
    return tuple(replace(g, mig_instances=tuple(under[g.index])) if g.index in under else g
                 for g in gpus)


def gpu_use_of(apps: tuple[GpuProcess, ...]) -> dict[int, tuple[int | None, int | None]]:
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


def lenient_number(value: object) -> float | None:
    """A figure the rest of the document does not hang on, read leniently: a finite number
    from 0 up to FLOAT_MAX, else None (a hostile or broken value loses that figure only)."""
    if isinstance(value, int | float) and is_number(value) and value >= 0:
        return float(value)
    return None


def _cpu_s(row: Node, ticks_per_s: int | None) -> float | None:
    """A process's utime + stime in seconds, from its clock ticks and the box's ticks per
    second; None where either is missing or not a count."""
    ticks = lenient_number(row.data.get("cpu_ticks"))
    return None if ticks is None or ticks_per_s is None or ticks_per_s <= 0 \
        else ticks / ticks_per_s


def parse_process(row: Node, use: Mapping[int, tuple[int | None, int | None]],
             clock: tuple[int, int] | None,
             scripts: Mapping[int, tuple[str | None, float | None]],
             elastic: frozenset[int], ticks_per_s: int | None = None) -> ProcessInfo:
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
        nvidia_devs=row.opt_list("nvidia_devs", is_int, "integers"), run=row.opt_str("run"),
        gpu_index=gpu_index, gpu_mem_mib=gpu_mem_mib, script=scripts.get(pid, (None, None))[0],
        script_mtime=scripts.get(pid, (None, None))[1], elastic_rank=pid in elastic,
        cpu_s=_cpu_s(row, ticks_per_s),
    )


def parse_elastic(section: Node) -> frozenset[int]:
    """Pids of torchrun's ranks among the session leaders holding a GPU (U11); none from
    probes that do not say."""
    raw = section.data.get("elastic")
    return frozenset(p for p in raw if is_int(p)) if isinstance(raw, list) else frozenset()


def parse_scripts(section: Node) -> dict[int, tuple[str | None, float | None]]:
    """pid → (script, mtime) of run processes (U2, U42), from {script: [mtime, pid, ...]};
    {} from probes that do not say."""
    raw = section.data.get("scripts")
    out: dict[int, tuple[str | None, float | None]] = {}
    if not isinstance(raw, dict):
        return out
    for script, value in raw.items():
        if not (isinstance(value, list) and value and is_number(value[0])
                and all(is_int(p) for p in value[1:])):
            raise BadDocument(f"{section.where}.scripts", "expected {script: [mtime, pid, ...]}")
        for pid in value[1:]:
            out[int(pid)] = (str(script), float(value[0]))
    return out


def parse_counts(section: Node) -> ProcessCounts:
    skipped = section.opt_list("fd_skipped", is_int, "pids")
    return ProcessCounts(
        total=section.get_int("total"), kernel_threads=section.get_int("kernel_threads"),
        zombies=section.get_int("zombies"), not_listed=section.get_int("not_listed"),
        fd_unreadable=section.get_int("fd_unreadable"), fd_skipped=skipped or (),
        euid=section.opt_int("euid"))


def parse_disk(node: Node) -> DiskUsage:
    return DiskUsage(
        path=node.get_str("path"), mount=node.opt_str("mount"),
        bytes_total=node.opt_int("bytes_total"), bytes_free=node.opt_int("bytes_free"),
        inodes_total=node.opt_int("inodes_total"),
        inodes_free=node.opt_int("inodes_free"), error=node.opt_str("error"))


def parse_cgroup(section: Node) -> CgroupInfo:
    return CgroupInfo(
        version=section.get_int("version"), path=section.opt_str("path"),
        memory_current_bytes=section.opt_int("memory_current_bytes"),
        memory_max_bytes=section.opt_int("memory_max_bytes"),
        memory_events=section.counters("memory_events"),
        cpu_quota_us=section.opt_int("cpu_quota_us"),
        cpu_period_us=section.opt_int("cpu_period_us"),
        cpu_stat=section.counters("cpu_stat"),
        groups=_cgroup_groups(section) if section.data.get("groups") is not None else {})


def _cgroup_groups(section: Node) -> Mapping[str, CgroupCounter]:
    groups = {}
    for row in section.table("groups"):
        path = row.get_str("path")
        groups[path] = CgroupCounter(path, row.opt_int("oom_kill"),
                                     row.opt_int("memory_max_bytes"))
    return MappingProxyType(groups)


def parse_kernel_events(section: Node, btime: int | None) -> tuple[KernelEvent, ...]:
    def when(row: Node) -> tuple[float | None, float | None]:
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


def parse_xid_counts(section: Node) -> Mapping[int, int]:
    counts = section.counters("xid_counts")
    if not all(code.isascii() and code.isdigit() and len(code) < 10 for code in counts):
        raise BadDocument(f"{section.where}.xid_counts", "expected Xid codes as keys")
    return MappingProxyType({int(code): n for code, n in counts.items()})


def _value(value: Any) -> float:
    if isinstance(value, str):
        return _NON_FINITE[value]
    return float(value)  # an int of at most MAX_NUMBER_DIGITS digits: no OverflowError


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _is_value(value: object) -> bool:
    """A scalar's value: any number (a loss gone NaN or inf is news, not noise), or JSON's
    stand-in for a non-finite one ("nan", "inf", "-inf")."""
    return (is_integer(value) or isinstance(value, float)
            or (isinstance(value, str) and value in _NON_FINITE))


def _wall(value: Any) -> float:
    """A point's wall time; nan (no time) for null and for one out of range."""
    return float(value) if is_number(value) else float("nan")


class _Dropped:
    """Points of one source left out for a step out of range: counted, one message a tag."""

    def __init__(self) -> None:
        self.count = 0
        self.messages: list[str] = []

    def note(self, where: str, steps: list[int]) -> None:
        self.count += len(steps)
        self.messages.append(f"{where}: {len(steps)} point(s) dropped, step out of range "
                             f"(e.g. {str(steps[0])[:MAX_NUMBER_DIGITS]})")


def _scalars(node: Node, key: str, with_wall: bool, dropped: _Dropped) -> Mapping[str, Scalars]:
    """A source's columns by tag. A point whose step is out of int64 (what the series and the
    store hold) is dropped and counted in `dropped`, the tag's other points kept."""
    value = node.data.get(key)
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, dict):
        raise BadDocument(node.child(key), f"expected an object, got {kind_of(value)}")
    out = {}
    for tag, cols in value.items():
        where = f"{node.child(key)}.{tag}"
        col = Node(cols, where) if isinstance(cols, dict) else None
        if col is None:
            raise BadDocument(where, f"expected an object, got {kind_of(cols)}")
        steps = col.opt_list("steps", is_integer, "integers") or ()
        raw = col.opt_list("values", _is_value, "numbers") or ()
        walls = col.opt_list("wall_times", lambda v: v is None or is_integer(v)
                             or isinstance(v, float), "numbers") if with_wall else None
        if len(raw) != len(steps) or (walls is not None and len(walls) != len(steps)):
            raise BadDocument(where, "columns of different lengths")
        keep = [i for i, step in enumerate(steps) if is_int(step)]
        if len(keep) < len(steps):
            dropped.note(where, [s for s in steps if not is_int(s)])
        out[tag] = Scalars(
            steps=tuple(int(steps[i]) for i in keep), values=tuple(_value(raw[i]) for i in keep),
            wall_times=None if walls is None else tuple(_wall(walls[i]) for i in keep))
    return MappingProxyType(out)


def _event_file(node: Node) -> EventFile:
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
        errors=(node.opt_list("errors", is_str, "messages") or ()) + tuple(dropped.messages))


def _metrics_file(node: Node) -> MetricsFile:
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


def _progress(node: Node) -> Mapping[str, float | bool] | None:
    """A metrics file's "progress": the known keys that hold finite numbers, and "final"."""
    raw = node.data.get("progress")
    if not isinstance(raw, dict):
        return None
    out: dict[str, float | bool] = {k: float(raw[k]) for k in PROGRESS_KEYS
                                    if is_number(raw.get(k)) and math.isfinite(raw[k])}
    if raw.get("final") is True:
        out["final"] = True
    return MappingProxyType(out)


def _exit(node: Node) -> ExitRecord | None:
    if node.data.get("exit") is None:
        return None
    ex = node.node("exit")
    code = ex.opt_int("code")
    return ExitRecord(path=ex.get_str("path"), exists=ex.get_bool("exists"),
                      mtime=ex.opt_float("mtime"),
                      code=code if code is not None and 0 <= code <= 255 else None)


def _checkpoints(node: Node, key: str) -> tuple[Checkpoint, ...]:
    if node.data.get(key) is None:
        return ()
    return tuple(Checkpoint(path=row.get_path("path"), mtime=float(row.get_number("mtime")),
                            bytes=row.get_int("bytes"), capped=row.opt_bool("capped") or False)
                 for row in node.table(key))


def _run(node: Node) -> RunSample:
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
        pids=node.opt_list("pids", is_int, "pids") or (),
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


def _discovered(node: Node) -> Discovery | None:
    if node.data.get("discovered") is None:
        return None
    try:
        return parse_discovery(node.get_str("name"), node.data["discovered"])
    except ValueError as exc:
        raise BadDocument(node.child("discovered"), str(exc)) from None


def parse_discovered_runs(doc: Node, errors: dict[str, str]) -> tuple[RunSample, ...]:
    """The "discovered" section's runs (probe's discover.py), after the configured."""
    value = doc.data.get("discovered")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("discovered", Node(value, "discovered").get_str("error"))
        return ()
    return tuple(_run(node) for node in doc.nodes("discovered"))


def parse_runs(doc: Node, errors: dict[str, str]) -> tuple[RunSample, ...]:
    value = doc.data.get("runs")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("runs", Node(value, "runs").get_str("error"))
        return ()
    return tuple(_run(node) for node in doc.nodes("runs"))
