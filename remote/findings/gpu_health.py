"""Findings about the GPUs' own health (gpu.*): uncorrected memory errors, memory rows waiting
for a reset or out of spares, and the recovery the driver asks for; each says what to do."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.finding import Finding, Severity
from ..model.gpu import recovery_action
from ..model.history import HostHistory
from ..model.snapshot import GpuSample, HostSnapshot, same_gpu_ids
from .base import rule


def _before(history: HostHistory, gpu: GpuSample) -> GpuSample | None:
    """The same GPU in the previous poll that read it (by uuid or bus id, U22)."""
    snaps = list(history.snapshots)
    for snap in reversed(snaps[:-1]):
        for old in snap.gpus:
            if same_gpu_ids(gpu.uuid, gpu.pci_bus_id, gpu.index, old):
                return old
    return None


def _holders(now: HostSnapshot, gpu: GpuSample) -> list[int]:
    return sorted({p.pid for p in now.gpu_processes if p.gpu_index == gpu.index})


def _name(gpu: GpuSample) -> str:
    return f"GPU {gpu.index}" + (f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else "")


@rule({"gpu.ecc_uncorrected": ("U22",)})
def gpu_ecc_uncorrected(history: HostHistory) -> Iterable[Finding]:
    """An uncorrected ECC error lost data: whatever touched that memory got an error (Xid 48,
    63, 94 or 95) or wrong numbers. Critical on the poll it appears (the count rose), a warning
    while the count since the driver loaded stands (it clears only with a reset or reboot)."""
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        count = gpu.ecc.uncorrected_volatile if gpu.ecc is not None else None
        if not count:
            continue
        old = _before(history, gpu)
        before = old.ecc.uncorrected_volatile if old is not None and old.ecc else None
        rose = before is None or count > before
        holders = _holders(now, gpu)
        who = (f"; pids {', '.join(map(str, holders))} on it may have crashed or computed "
               f"with bad memory" if holders and rose else "")
        yield Finding(
            "gpu.ecc_uncorrected", Severity.CRITICAL if rose else Severity.WARNING,
            f"{_name(gpu)} has had {count} uncorrected memory (ECC) error"
            f"{'s' if count != 1 else ''} since the driver loaded{who}: check its checkpoint "
            f"and its loss, then reset the GPU (or reboot) when nothing runs on it; if errors "
            f"come back, have the GPU replaced",
            gpu=gpu.index,
            evidence={"uncorrected_volatile": count, "before": before,
                      "uncorrected_aggregate": gpu.ecc.uncorrected_aggregate if gpu.ecc
                      else None, "pids": holders})


@rule({"gpu.remap_pending": ("U22",)})
def gpu_remap_pending(history: HostHistory) -> Iterable[Finding]:
    """A row remap (Ampere on) or page retirement (older GPUs) waits for the GPU's next reset:
    until then the bad memory is still in use."""
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        if gpu.remap is None or not gpu.remap.needs_reset or (
                gpu.remap.failed and not gpu.remap.retired_pending):
            continue  # a failure says more (gpu.remap_failed)
        holders = _holders(now, gpu)
        when = (f"when its run ({', '.join(map(str, holders))}) has stopped" if holders
                else "now (nothing runs on it)")
        what = "rows" if gpu.remap.pending else "pages"
        yield Finding(
            "gpu.remap_pending", Severity.WARNING,
            f"{_name(gpu)} has memory {what} waiting to be set aside: reset the GPU {when} "
            f"(`nvidia-smi -r -i {gpu.index}`, as root) or reboot the box; until then the bad "
            f"memory is still used",
            gpu=gpu.index,
            evidence={"remap_pending": gpu.remap.pending,
                      "retired_pages_pending": gpu.remap.retired_pending,
                      "remapped_uncorrectable": gpu.remap.uncorrected, "pids": holders})


@rule({"gpu.remap_failed": ("U22",)})
def gpu_remap_failed(history: HostHistory) -> Iterable[Finding]:
    """Row remapping failed: a bank had no spare row left. The memory cannot be repaired in
    the field: the GPU is for replacement (NVIDIA's guidance: RMA)."""
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        if gpu.remap is None or not gpu.remap.failed:
            continue
        yield Finding(
            "gpu.remap_failed", Severity.CRITICAL,
            f"{_name(gpu)} ran out of spare memory rows (row remapping failed): its memory "
            f"cannot be repaired; move the work off it and have the GPU replaced (ask the "
            f"provider, or NVIDIA for an RMA)",
            gpu=gpu.index,
            evidence={"remap_failed": True, "histogram": gpu.remap.histogram,
                      "remapped_uncorrectable": gpu.remap.uncorrected})


@rule({"gpu.recovery_action": ("U22",)})
def gpu_recovery_action(history: HostHistory) -> Iterable[Finding]:
    """The driver says the GPU needs a recovery (NVML's GPU recovery action, driver 570 on):
    a reset, a reboot, or draining first. Nothing new should start on it until it is done."""
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        action = recovery_action(gpu.recovery_action)
        if action is None or not action.blocks_relaunch:
            continue
        yield Finding(
            "gpu.recovery_action", Severity.CRITICAL,
            f"the driver says {_name(gpu)} needs {action.words}: {action.fix}; start nothing "
            f"new on it until then",
            gpu=gpu.index,
            evidence={"recovery_action": gpu.recovery_action, "pids": _holders(now, gpu)})
