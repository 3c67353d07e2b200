"""gpuwatch's box simulator: a stand-in for GPU boxes this machine does not have.

A ``Box`` is a folder with fixture /proc and /sys trees, a simulated ``nvidia-smi`` and
``dmesg`` in its bin/, and their state in sim/ (tests/harness/README.md is the layout contract).
Tests and ``gpuwatch --demo`` point the probe at it through ``Box.env()``; it never pretends to
be hardware: the stand-ins say so in their --version output and their source.
"""

from gpuwatch.remote.sim.box import Box, SimProcess, training_process
from gpuwatch.remote.sim.presets import (
    DEPRECATED,
    NOT_SUPPORTED,
    PRESETS,
    Preset,
    h100_mig,
    h100_sxm,
    old_driver,
    rtx_2080_super,
)
from gpuwatch.remote.sim.scenario import Frame, Scenario, training_then_xid, util_without_clock

__all__ = [
    "DEPRECATED",
    "NOT_SUPPORTED",
    "PRESETS",
    "Box",
    "Frame",
    "Preset",
    "Scenario",
    "SimProcess",
    "h100_mig",
    "h100_sxm",
    "old_driver",
    "rtx_2080_super",
    "training_process",
    "training_then_xid",
    "util_without_clock",
]
