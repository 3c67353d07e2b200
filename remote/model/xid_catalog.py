"""NVIDIA's Xid catalog, as facts in our words: what each Xid code gpuwatch sees means, and the
immediate action NVIDIA's catalog gives for it.

Source: NVIDIA's Xid catalog for Ampere and later GPUs ("Analyzing Xid Errors with the Xid
Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), its "Resolution
Bucket (Immediate Action)" column for Xids 1-162, as NVIDIA's own NVSentinel carries it
(github.com/NVIDIA/NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/
xiderrorsmapping.csv @ 6f8b0fcf). CATALOG_VERSION names it in every message that cites it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

CATALOG_VERSION = "NVIDIA's Xid catalog (Xids 1-162)"


@dataclass(frozen=True, slots=True)
class XidAction:
    """One of the catalog's immediate actions, said for a person."""

    bucket: str
    """The catalog's name for it (RESTART_APP, RESET_GPU, ...)."""
    todo: str
    gpu_broken: bool
    """Until it is done, nothing new should start on that GPU (or box)."""


ACTIONS: Mapping[str, XidAction] = MappingProxyType({a.bucket: a for a in (
    XidAction("RESTART_APP", "restart the application (the GPU itself is fine)", False),
    XidAction("IGNORE", "nothing to do (informational)", False),
    XidAction("RESET_GPU", "reset the GPU (`nvidia-smi -r`, when nothing runs on it) or reboot "
              "before running on it again", True),
    XidAction("RESTART_BM", "reboot the machine: the GPU comes back only with a reboot", True),
    XidAction("RESTART_VM", "restart the virtual machine", True),
    XidAction("CHECK_MECHANICALS", "have the GPU's power and cooling checked (the provider)",
              False),
    XidAction("UPDATE_SWFW", "update the driver and the GPU's firmware", False),
    XidAction("CHECK_UVM", "check the nvidia-uvm driver and the application's use of unified "
              "memory", False),
    XidAction("WORKFLOW_XID_45", "look at the Xid logged just before it: this one is the "
              "driver cleaning up after it", False),
    XidAction("WORKFLOW_XID_48", "restart the application; reset the GPU if a row remap is "
              "pending, and have it replaced if the remap failed", True),
    XidAction("WORKFLOW_NVLINK_ERR", "reset the GPU; if it comes back, have its NVLink checked "
              "(the provider)", True),
    XidAction("WORKFLOW_NVLINK5_ERR", "reset the GPU; if it comes back, have its NVLink checked "
              "(the provider)", True),
    XidAction("XID_154", "do what the driver's new recovery action says (the Xid that came "
              "with it tells why)", False),
    XidAction("CONTACT_SUPPORT", "unexpected: if it repeats, report it to the provider or "
              "NVIDIA", False),
)})


def _codes(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split():
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return tuple(out)


# The catalog's immediate action of each Xid (every other code of 1-162: CONTACT_SUPPORT).
_BY_ACTION = {
    "RESTART_APP": "8 11 13 25 31 32 39-41 60 68-72 75-77 80 82-86 88 89 94 96-105 126-135 139",
    "IGNORE": "14 37 38 43 44 63 66 67 92 93 106 107 121 137 141 152 153 157 161",
    "RESET_GPU": "46 62 64 95 109 110 119 120 136 140 143 155 156 158 162",
    "RESTART_BM": "79 160",
    "RESTART_VM": "151",
    "CHECK_MECHANICALS": "54",
    "UPDATE_SWFW": "78",
    "CHECK_UVM": "159",
    "WORKFLOW_XID_45": "45",
    "WORKFLOW_XID_48": "48",
    "WORKFLOW_NVLINK_ERR": "74",
    "WORKFLOW_NVLINK5_ERR": "144-150",
    "XID_154": "154",
}
_catalog = dict.fromkeys(range(1, 163), "CONTACT_SUPPORT")
for _action, _spec in _BY_ACTION.items():
    _catalog.update(dict.fromkeys(_codes(_spec), _action))
CATALOG: Mapping[int, str] = MappingProxyType(_catalog)
"""Xid code → the catalog's immediate action."""

NAMES: Mapping[int, str] = MappingProxyType({
    8: "the GPU stopped processing (a channel timed out)",
    13: "graphics engine exception (usually the application: an illegal address or "
        "instruction)",
    31: "GPU memory page fault (usually the application: a bad address)",
    32: "invalid or corrupted push buffer stream",
    43: "the GPU stopped processing (the application's channel was reset)",
    45: "preemptive cleanup after another error",
    46: "the GPU timed out",
    48: "double-bit ECC error: the GPU's memory lost data",
    54: "power or clock reduced (auxiliary power)",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "memory page retirement or row remap recorded",
    64: "memory page retirement or row remap failed",
    68: "video decoder exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the application that touched the memory was stopped",
    95: "uncontained ECC error: every application on the GPU is affected",
    109: "context switch timeout",
    119: "GSP RPC timeout (the GPU's system processor did not answer)",
    120: "GSP error",
    121: "C2C link error",
    136: "link training failed",
    140: "an uncorrectable ECC error escaped containment",
    143: "GPU initialisation failed",
    144: "NVLink error (SAW)", 145: "NVLink error (RLW)", 146: "NVLink error (TLW)",
    147: "NVLink error (TREX)", 148: "NVLink error (NVLPW control)",
    149: "NVLink error (NETIR)", 150: "NVLink error (MSE)",
    154: "the GPU's recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event", 158: "GPU fatal timeout",
})
"""What the codes a training box meets mean, in our words (others: the catalog's action only)."""


@dataclass(frozen=True, slots=True)
class XidAdvice:
    code: int
    name: str | None
    action: XidAction | None
    """None: the code is not in the catalog."""

    def words(self) -> str:
        """'Xid 79 (the GPU has fallen off the bus): NVIDIA's catalog says reboot the
        machine ...'; a code the catalog lacks says so."""
        what = f"Xid {self.code}" + (f" ({self.name})" if self.name else "")
        if self.action is None:
            return f"{what}: not in {CATALOG_VERSION}"
        return f"{what}: {CATALOG_VERSION} says {self.action.todo}"


def xid_advice(code: int) -> XidAdvice:
    bucket = CATALOG.get(code)
    return XidAdvice(code, NAMES.get(code), None if bucket is None else ACTIONS[bucket])
