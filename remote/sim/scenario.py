"""Scenarios: what happens to a simulated box tick after tick, for tests and the demo.

A scenario is a list of frames; a frame is a change to apply to a Box. Tests step it one poll
at a time (``step``); the demo plays it against the clock (``play_until``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.remote.sim.box import GPU_KNOBS, Box


@dataclass(frozen=True)
class Frame:
    """One tick's changes: GPU knobs (Box.set_gpu names), throttle reasons, log lines, ..."""

    gpus: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    throttle: Mapping[int, Sequence[str]] = field(default_factory=dict)
    dmesg: Sequence[str] = ()
    advance_s: float = 0.0
    action: Callable[[Box], None] | None = None

    def apply(self, box: Box) -> None:
        if self.advance_s:
            box.advance(self.advance_s)
        for index, knobs in self.gpus.items():
            fields = {k: v for k, v in knobs.items() if k not in GPU_KNOBS}  # nvidia-smi's
            box.set_gpu(index, fields, **{k: v for k, v in knobs.items() if k in GPU_KNOBS})
        for index, reasons in self.throttle.items():
            box.set_throttle(index, reasons)
        if self.dmesg:
            box.append_dmesg(*self.dmesg)
        if self.action is not None:
            self.action(box)


@dataclass
class Scenario:
    """Frames played in order, one per tick; interval_s maps ticks to seconds for the demo."""

    name: str
    frames: Sequence[Frame]
    interval_s: float = 10.0
    tick: int = 0

    def step(self, box: Box) -> bool:
        """Apply the next frame; False once every frame has been played."""
        if self.tick >= len(self.frames):
            return False
        self.frames[self.tick].apply(box)
        self.tick += 1
        return True

    def play_until(self, box: Box, elapsed_s: float) -> int:
        """Apply every frame due by elapsed_s (frame k is due at k * interval_s)."""
        played = 0
        while self.tick < len(self.frames) and self.tick * self.interval_s <= elapsed_s:
            self.step(box)
            played += 1
        return played


def util_without_clock(box: Box, gpu: int = 0, *, ticks: int = 6,
                       clock_fraction: float = 0.35) -> Scenario:
    """U21/U23: a GPU at 100 % "util" whose SM clock sits at clock_fraction of max under an
    active sw_power_cap, drawing far below its limit: busy-looking, slow in fact."""
    g = box.gpus[gpu]
    sm_max = int(g.get("clocks.max.sm") or 1980)
    limit = float(g.get("power.limit") or 700.0)
    healthy = Frame(gpus={gpu: {"util_pct": 100, "sm_clock_mhz": sm_max, "power_w": limit * 0.9,
                                "temp_c": 62, "pstate": "P0"}},
                    throttle={gpu: []}, advance_s=10.0)
    slow = Frame(gpus={gpu: {"util_pct": 100, "sm_clock_mhz": int(sm_max * clock_fraction),
                             "power_w": round(limit * 0.3, 2), "temp_c": 58}},
                 throttle={gpu: ["sw_power_cap"]}, advance_s=10.0)
    return Scenario("util without clock", [healthy, healthy] + [slow] * ticks)


def training_then_xid(box: Box, gpu: int = 0, *, code: int = 79, pid: int | None = None
                      ) -> Scenario:
    """A GPU that trains normally, then falls off the bus (Xid 79, U22): fields go [N/A]."""
    g = box.gpus[gpu]
    sm_max = int(g.get("clocks.max.sm") or 1980)
    busy = Frame(gpus={gpu: {"util_pct": 97, "sm_clock_mhz": sm_max, "power_w": 612.5,
                             "temp_c": 64}}, throttle={gpu: []}, advance_s=10.0)

    def fall_off(b: Box) -> None:
        b.xid(gpu, code, pid=pid, name="python" if pid else None)
        b.set_gpu(gpu, {"utilization.gpu": {"error": "Unknown Error"},
                        "clocks.current.sm": {"error": "Unknown Error"},
                        "power.draw": {"error": "Unknown Error"},
                        "temperature.gpu": {"error": "Unknown Error"}})

    return Scenario(f"xid {code}", [busy, busy, busy, Frame(advance_s=10.0, action=fall_off)])


def memory_errors(box: Box, gpu: int = 0) -> Scenario:
    """GPU memory going bad, as the driver says it (nvidia-smi's remapped_rows.*, ecc.errors.*,
    gpu_recovery_action): a healthy GPU, then an uncorrectable error whose row remap waits for
    a reset, then a bank out of spare rows: remap failure, and the driver asks for a reset."""
    healthy = Frame(gpus={gpu: {"ecc.errors.uncorrected.volatile.total": 0,
                                "remapped_rows.uncorrectable": 0, "remapped_rows.pending": False,
                                "remapped_rows.failure": False, "gpu_recovery_action": "None"}},
                    advance_s=10.0)
    pending = Frame(gpus={gpu: {"ecc.errors.uncorrected.volatile.total": 1,
                                "ecc.errors.uncorrected.aggregate.total": 1,
                                "remapped_rows.uncorrectable": 1,
                                "remapped_rows.pending": True}}, advance_s=10.0)
    failed = Frame(gpus={gpu: {"ecc.errors.uncorrected.volatile.total": 3,
                               "remapped_rows.failure": True,
                               "remapped_rows.histogram.max": 639,
                               "remapped_rows.histogram.high": 0,
                               "remapped_rows.histogram.partial": 0,
                               "remapped_rows.histogram.low": 0,
                               "remapped_rows.histogram.none": 1,
                               "gpu_recovery_action": "Reset"}}, advance_s=10.0)
    return Scenario("memory errors", [healthy, healthy, pending, pending, failed])
