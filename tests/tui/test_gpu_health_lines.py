"""The GPU pane's health lines: said only where a field says something (a healthy GPU's block
stays as it was), each with the colour of what it asks for."""

from __future__ import annotations

from dataclasses import replace

import tui_fixtures as fx
from gpuwatch.remote.model.gpu import EccCounts, MemoryRemap, PcieLink
from gpuwatch.tui.widgets.gpu_panel import health_lines


def test_a_healthy_gpu_says_nothing() -> None:
    healthy = replace(fx.gpu(0, 97, 1950), recovery_action="none", ecc=EccCounts(3, 0, 12, 0),
                      remap=MemoryRemap(0, 0, False, False, (640, 0, 0, 0, 0)),
                      pcie=PcieLink(3, 5, 16, 16, 0))  # gen 3 of 5 at 97 %: said below
    assert health_lines(replace(healthy, pcie=PcieLink(5, 5, 16, 16, 0))) == []
    assert health_lines(replace(healthy, util_pct=3.0)) == []  # gen drops at idle: not said
    assert health_lines(healthy) == [("⚠", "warning", "PCIe gen 3 of 5 while busy")]


def test_a_broken_gpu_says_each_thing_once() -> None:
    _, broken = fx.mig_gpus()
    assert health_lines(broken) == [
        ("✖", "error", "driver asks for a GPU reset"),
        ("⚠", "warning", "remap pending: rows wait for a GPU reset"),
        ("✖", "error", "ECC: 2 uncorrected since driver load"),
        ("⚠", "warning", "PCIe x8 of x16 lanes")]
    failed = replace(broken, recovery_action=None, ecc=EccCounts(0, 0, 0, 5),
                     remap=MemoryRemap(0, 8, True, True, (0, 0, 0, 0, 640)), pcie=None)
    assert health_lines(failed) == [  # a failure says more than the pending it also is
        ("✖", "error", "remap failed: no spare rows, replace it"),
        ("·", "text-muted", "ECC: 5 uncorrected in its life")]
