"""A GPU's health and partitions as plain data, whatever the vendor: memory errors (ECC), the
rows or pages the memory set aside, the recovery the driver asks for, the PCIe link, and the
MIG instances a GPU is split into.

Read from the probe's GPU rows (wire/sections.py); None wherever the driver did not say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error counts: corrected ones are harmless by themselves; an uncorrected one lost
    data (the process that touched it got an error, Xid 48/63/94/95). Volatile: since the
    driver loaded; aggregate: the GPU's lifetime."""

    corrected_volatile: int | None
    uncorrected_volatile: int | None
    corrected_aggregate: int | None
    uncorrected_aggregate: int | None

    def to_json(self) -> dict[str, Any]:
        return {"corrected_volatile": self.corrected_volatile,
                "uncorrected_volatile": self.uncorrected_volatile,
                "corrected_aggregate": self.corrected_aggregate,
                "uncorrected_aggregate": self.uncorrected_aggregate}


@dataclass(frozen=True, slots=True)
class MemoryRemap:
    """How the GPU's memory set bad cells aside: rows remapped to spares (A100 and later), or
    pages retired (older GPUs). A remap pending takes effect at the next GPU reset; a remap
    failure means no spare row was left: the GPU needs replacing."""

    corrected: int | None
    """Rows remapped for repeated corrected errors."""
    uncorrected: int | None
    """Rows remapped for an uncorrected error."""
    pending: bool | None
    failed: bool | None
    histogram: tuple[int | None, ...] | None = None
    """Banks with max / high / partial / low / no spare rows left (nvidia-smi's order)."""
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    """Pages waiting to be retired, at the next driver reload (older GPUs)."""

    @property
    def needs_reset(self) -> bool:
        return bool(self.pending or self.retired_pending)

    def to_json(self) -> dict[str, Any]:
        return {"corrected": self.corrected, "uncorrected": self.uncorrected,
                "pending": self.pending, "failed": self.failed,
                "histogram": None if self.histogram is None else dict(
                    zip(HISTOGRAM, self.histogram, strict=True)),
                "retired_pages_sbe": self.retired_sbe, "retired_pages_dbe": self.retired_dbe,
                "retired_pages_pending": self.retired_pending}


HISTOGRAM = ("max", "high", "partial", "low", "none")


@dataclass(frozen=True, slots=True)
class PcieLink:
    """The GPU's PCIe link now and at most (the most both the GPU and its slot can do).
    Generation drops at idle to save power; a link below its max under load, or a replay
    counter that rises, is a bad riser, slot or cable."""

    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None
    replays: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"gen": self.gen, "gen_max": self.gen_max, "width": self.width,
                "width_max": self.width_max, "replays": self.replays}


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """What one of the driver's recovery actions asks of a person."""

    words: str
    fix: str
    blocks_relaunch: bool


RECOVERY_ACTIONS: Mapping[str, RecoveryAction] = MappingProxyType({
    "none": RecoveryAction("nothing", "", False),
    "gpu_reset": RecoveryAction(
        "a GPU reset", "stop what runs on it and reset the GPU (`nvidia-smi -r -i N`), or "
        "reboot the box", True),
    "node_reboot": RecoveryAction("a reboot of the box", "reboot the box", True),
    "system_reboot": RecoveryAction("a reboot of the box", "reboot the box", True),
    "bus_reset": RecoveryAction(
        "a PCIe bus reset", "reset the GPU's PCIe bus, or reboot the box", True),
    "drain_p2p": RecoveryAction(
        "draining peer-to-peer traffic", "let its peer-to-peer jobs finish and start no new "
        "one on it; then reset the GPU", True),
    "drain_and_reset": RecoveryAction(
        "draining, then a reset", "let what runs on it finish, start nothing new, then reset "
        "the GPU", True),
    "imex_recover": RecoveryAction(
        "recovery of its IMEX domain", "restart the IMEX daemon of its NVLink domain", True),
})
"""The driver's recovery actions (NVML's nvmlGpuRecoveryAction_t, nvidia-smi's
gpu_recovery_action), by the probe's names."""


RECOVERY_ORDER = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset",
                  "imex_recover", "bus_reset", "system_reboot")
"""NVML's nvmlGpuRecoveryAction_t values 0..7, by name (the NVML source sends the number)."""


RECOVERY_WORDS = MappingProxyType({"reset": "gpu_reset", "reboot": "node_reboot"})
"""nvidia-smi's gpu_recovery_action words that are not the name of their action."""


def recovery_name(words: str) -> str:
    """nvidia-smi's gpu_recovery_action words ('None' on driver 580, as captured; 'Reset',
    'Reboot', 'Drain P2P', ...) → a name of RECOVERY_ACTIONS; words it does not know kept,
    as lower_case."""
    word = "_".join(words.lower().replace("-", " ").split())[:40]
    return RECOVERY_WORDS.get(word, word)


def recovery_action(name: str | None) -> RecoveryAction | None:
    """What `name` asks for; an action this gpuwatch does not know asks for a person."""
    if name is None:
        return None
    return RECOVERY_ACTIONS.get(name) or RecoveryAction(
        name.replace("_", " "), "see the driver's documentation for this recovery action", True)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance of a GPU with MIG on: a compute instance (ci) of a GPU instance (gi),
    which owns a share of the memory (its compute instances share it) and of the SMs. The
    driver reports no utilisation for it (util_pct None: "not reported under MIG")."""

    gpu_instance: int | None
    compute_instance: int | None
    device: int | None
    """The MIG device's index under its GPU (nvidia-smi -L's "Device N")."""
    profile: str | None
    """"3g.40gb": 3 of 7 compute slices and 40 GB; "1c.3g.71gb": 1 compute slice of a 3g."""
    uuid: str | None
    """MIG-...: what CUDA_VISIBLE_DEVICES names it by."""
    mem_used_mib: int | None
    mem_total_mib: int | None
    sm_count: int | None
    util_pct: float | None = None
    pids: tuple[int, ...] = ()
    """The compute processes running in it, as the driver places them."""

    @property
    def name(self) -> str:
        """'GI 2/CI 0' (how nvidia-smi's tables name it)."""
        return f"GI {_id(self.gpu_instance)}/CI {_id(self.compute_instance)}"

    def to_json(self) -> dict[str, Any]:
        return {"gpu_instance": self.gpu_instance, "compute_instance": self.compute_instance,
                "device": self.device, "profile": self.profile, "uuid": self.uuid,
                "mem_used_mib": self.mem_used_mib, "mem_total_mib": self.mem_total_mib,
                "sm_count": self.sm_count, "util_pct": self.util_pct, "pids": list(self.pids)}


def _id(value: int | None) -> str:
    return "?" if value is None else str(value)


MIG_UTIL_NOT_REPORTED = "not reported under MIG"
"""What is said where a MIG GPU's or instance's utilisation would be: the driver gives none."""
