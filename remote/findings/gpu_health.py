"""Findings about the GPUs' own health (gpu.*): uncorrected memory errors, memory rows waiting
for a reset or out of spares, and the recovery the driver asks for; each says what to do."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.finding import Finding, Severity
from ..model.gpu import recovery_action
from ..model.history import HostHistory
from ..model.snapshot import GpuSample, HostSnapshot, same_gpu_ids
from ..model.xid_catalog import CATALOG, NAMES
from .base import rule
from .diagnosis import xid_gpu


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


SLOWDOWN_WINDOW_S = 600.0
"""The window hw_slowdown is counted over (gpud counts it the same way: a rate, not a sample)."""
SLOWDOWN_RATE_PER_MIN = 1.0
"""Polls with a hardware slowdown per minute of the window that make it a finding (a poll
every 10 s: a sixth of them)."""
REPLAYS_RISE = 10
"""PCIe replays more than the first poll of the window that make it a finding."""


def _window(history: HostHistory, gpu: GpuSample) -> list[tuple[float, GpuSample]]:
    """This GPU's samples over the last SLOWDOWN_WINDOW_S of the current boot (box clock)."""
    now = history.current
    if now is None or now.taken_at is None:
        return []
    out = []
    for snap in history.snapshots:
        if snap.boot_id != now.boot_id or snap.taken_at is None or \
                now.taken_at - snap.taken_at > SLOWDOWN_WINDOW_S:
            continue
        for old in snap.gpus:
            if same_gpu_ids(gpu.uuid, gpu.pci_bus_id, gpu.index, old):
                out.append((snap.taken_at, old))
    return out


@rule({"gpu.hw_slowdown_rate": ("U23",)})
def gpu_hw_slowdown_rate(history: HostHistory) -> Iterable[Finding]:
    """U23: hw_slowdown (the board pulled the clocks down: power brake, over-temperature,
    a bad power supply) counted as a rate over a window, not judged on one sample."""
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        samples = _window(history, gpu)
        if len(samples) < 3:
            continue
        span_min = max((samples[-1][0] - samples[0][0]) / 60.0, 1.0)
        hits = sum(1 for _, g in samples if "hw_slowdown" in (g.throttle_reasons or ()))
        rate = hits / span_min
        if rate < SLOWDOWN_RATE_PER_MIN:
            continue
        yield Finding(
            "gpu.hw_slowdown_rate", Severity.WARNING,
            f"{_name(gpu)} had its clocks pulled down by the hardware (hw_slowdown) in {hits} "
            f"of {len(samples)} polls over the last {span_min:.0f} min ({rate:.1f}/min): its "
            f"power or cooling is failing it — expect a slower run; the provider has to check "
            f"the board",
            gpu=gpu.index,
            evidence={"polls": len(samples), "hw_slowdown_polls": hits,
                      "rate_per_min": round(rate, 2), "window_s": SLOWDOWN_WINDOW_S})


@rule({"gpu.pcie_degraded": ()})
def gpu_pcie_degraded(history: HostHistory) -> Iterable[Finding]:
    """A PCIe link below what the GPU and its slot can do (fewer lanes at any time; a lower
    generation while the GPU is busy: it drops at idle to save power), or a replay counter
    rising (the link retransmits: a bad riser, slot or cable). Sustained over sustain_polls."""
    now = history.current
    if now is None:
        return
    th = history.thresholds
    for gpu in now.gpus:
        samples = _window(history, gpu)[-max(2, th.sustain_polls):]
        links = [g.pcie for _, g in samples if g.pcie is not None]
        if len(links) < max(2, th.sustain_polls) or len(links) != len(samples):
            continue
        narrow = all(p.width is not None and p.width_max is not None and p.width < p.width_max
                     for p in links)
        slow = all(g.pcie is not None and g.pcie.gen is not None and g.pcie.gen_max is not None
                   and g.pcie.gen < g.pcie.gen_max and (g.util_pct or 0) >= 50
                   for _, g in samples)
        all_window = [g.pcie.replays for _, g in _window(history, gpu)
                      if g.pcie is not None and g.pcie.replays is not None]
        replays = all_window[-1] - all_window[0] if len(all_window) >= 2 else 0
        if not (narrow or slow or replays >= REPLAYS_RISE):
            continue
        link = links[-1]
        said = []
        if narrow:
            said.append(f"runs on x{link.width} of its x{link.width_max} lanes")
        if slow:
            said.append(f"runs at PCIe gen {link.gen} of {link.gen_max} while busy")
        if replays >= REPLAYS_RISE:
            said.append(f"retransmitted {replays} times (replays) in the last "
                        f"{SLOWDOWN_WINDOW_S / 60:.0f} min")
        slot = f" in slot {gpu.pci_bus_id}" if gpu.pci_bus_id else ""
        yield Finding(
            "gpu.pcie_degraded", Severity.WARNING,
            f"GPU {gpu.index}{slot} {' and '.join(said)}: host-to-GPU copies (data loading, "
            f"checkpoints) are slower; reseat the card or its riser, or ask the provider",
            gpu=gpu.index,
            evidence={"gen": link.gen, "gen_max": link.gen_max, "width": link.width,
                      "width_max": link.width_max, "replays_rise": replays,
                      "pci_bus_id": gpu.pci_bus_id})


REBOOT_XIDS = frozenset(code for code, bucket in CATALOG.items() if bucket == "RESTART_BM")
"""Xids after which the catalog says only a reboot brings the GPU back (79: fallen off the
bus): one logged since the box booted rules the GPU out until the boot id changes (U22)."""


def unusable_gpus(history: HostHistory) -> dict[int, str]:
    """GPUs nothing new should start on, by index, each with why in words: the driver asks for
    a reset, a reboot or draining (its recovery action); memory rows wait for a reset (a remap
    or page retirement pending) or ran out of spares (remap failed); or the kernel log says,
    since this boot, that it fell off the bus (an Xid only a reboot cures). A relaunch and the
    watchdog keep off them (actions/gpu_choice.py)."""
    now = history.current
    if now is None:
        return {}
    out: dict[int, str] = {}
    for gpu in now.gpus:
        action = recovery_action(gpu.recovery_action)
        remap = gpu.remap
        if action is not None and action.blocks_relaunch:
            out[gpu.index] = f"the driver asks for {action.words}"
        elif remap is not None and remap.failed:
            out[gpu.index] = "its memory ran out of spare rows (row remapping failed)"
        elif remap is not None and remap.needs_reset:
            out[gpu.index] = "has memory rows waiting for a GPU reset (remap pending)"
    for snap in history.snapshots:  # the kernel log of this boot, as far as history reaches
        if snap.boot_id != now.boot_id:
            continue
        for event in snap.kernel_events:
            if event.kind != "xid" or event.xid not in REBOOT_XIDS:
                continue
            index = xid_gpu(event, now, snap)
            if index is not None and index not in out:
                what = ("fell off the bus" if event.xid == 79 else
                        f"had {NAMES.get(event.xid, 'an error the catalog cures by a reboot')}")
                out[index] = (f"the kernel log says it {what} (Xid {event.xid}) since the box "
                              f"booted: only a reboot brings it back")
    return out
