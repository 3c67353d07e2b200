"""Findings about a run's GPUs compared with each other (run.straggler): the one GPU of a
multi-GPU run that holds the others back, seen from outside the run."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median

from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.snapshot import GpuSample, HostSnapshot
from .base import gpu_at, recent, rule

STRAGGLER_POLLS = 3
"""Polls in a row one GPU must lag its peers (U21: never one sample)."""
BUSY_UTIL_PCT = 50.0
"""The peers' median utilisation above which the run counts as busy."""
CLOCK_RATIO = 0.8
POWER_RATIO = 0.7
UTIL_GAP_PCT = 30.0


def _run_gpus(snap: HostSnapshot, run: str) -> dict[int, list[int]]:
    """GPU index → the pids of `run` on it (the GPU where each holds the most memory)."""
    out: dict[int, list[int]] = {}
    for p in snap.processes:
        if p.run == run and p.gpu_index is not None:
            out.setdefault(p.gpu_index, []).append(p.pid)
    return out


def _lag(gpu: GpuSample, peers: list[GpuSample]) -> list[str]:
    """How `gpu` lags the median of its peers, in words; [] where it does not."""
    said = []
    clocks = [g.sm_clock_mhz for g in peers if g.sm_clock_mhz]
    if gpu.sm_clock_mhz is not None and clocks and gpu.sm_clock_mhz < CLOCK_RATIO * median(
            clocks):
        said.append(f"SM clock {gpu.sm_clock_mhz} MHz vs {median(clocks):.0f}")
    powers = [g.power_w for g in peers if g.power_w]
    if gpu.power_w is not None and powers and gpu.power_w < POWER_RATIO * median(powers):
        said.append(f"power {gpu.power_w:.0f} W vs {median(powers):.0f}")
    utils = [g.util_pct for g in peers if g.util_pct is not None]
    if gpu.util_pct is not None and utils and gpu.util_pct < median(utils) - UTIL_GAP_PCT:
        said.append(f"util {gpu.util_pct:.0f}% vs {median(utils):.0f}%")
    return said


@rule({"run.straggler": ("U21", "U23")})
def run_straggler(history: HostHistory) -> Iterable[Finding]:
    """One GPU of a run whose SM clock, power or utilisation sits well below the median of the
    run's other GPUs while they are busy, in each of the last STRAGGLER_POLLS polls: in a
    synchronous (data-parallel) run every rank waits for it, so the whole run goes at its
    pace. Named with the rank's pid and the GPU's throttle reasons, where it has them."""
    now = history.current
    if now is None:
        return
    snaps = recent(history, STRAGGLER_POLLS)
    if len(snaps) < STRAGGLER_POLLS:
        return
    for run in sorted({p.run for p in now.processes if p.run}):
        placed = _run_gpus(now, run)
        if len(placed) < 2:
            continue
        lagging: dict[int, list[str]] = {}
        for index in placed:
            words: list[str] | None = None
            for snap in snaps:
                gpu = gpu_at(snap, index)
                peers = [g for i in placed if i != index and (g := gpu_at(snap, i)) is not None]
                busy = [g.util_pct for g in peers if g.util_pct is not None]
                if gpu is None or not peers or not busy or median(busy) < BUSY_UTIL_PCT:
                    words = None
                    break
                words = _lag(gpu, peers)
                if not words:
                    break
            if words:
                lagging[index] = words
        if len(lagging) != 1:  # none, or several: not one straggler (another finding's job)
            continue
        ((index, words),) = lagging.items()
        gpu = gpu_at(now, index)
        reasons = [r for r in (gpu.throttle_reasons or ()) if r != "gpu_idle"] if gpu else []
        why = f"; its throttle reasons: {', '.join(reasons)}" if reasons else ""
        pids = placed[index]
        yield Finding(
            "run.straggler", Severity.WARNING,
            f"GPU {index} (pid {', '.join(map(str, pids))}) holds run {run} back: "
            f"{', '.join(words)} of its {len(placed) - 1} peers, over {len(snaps)} polls{why}; "
            f"every rank waits for the slowest, so the run goes at its pace — check its "
            f"cooling and power (or move the run off it)",
            gpu=index, run=run,
            evidence={"lag": words, "pids": pids, "peers": sorted(i for i in placed
                                                                   if i != index),
                      "throttle_reasons": reasons, "polls": len(snaps)})
