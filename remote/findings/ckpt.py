"""Findings about checkpoints (ckpt.*): overdue, partial saves left behind."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..units import duration, size
from .base import (
    live_runs,
    rule,
)


@rule({"ckpt.overdue": ("seed 001",)})
def ckpt_overdue(history: HostHistory) -> Iterable[Finding]:
    """Seed 001: no checkpoint for ckpt_overdue_factor × the run's own cadence (the median gap
    of its last checkpoints), and at least ckpt_overdue_min_s: a crash now loses all that."""
    th = history.thresholds
    for _now, at, sample in live_runs(history):
        series = history.runs.get(sample.name)
        if series is None:
            continue
        cadence, latest = series.cadence_s, series.latest_checkpoint
        if cadence is None or latest is None:
            continue
        age = at - latest.mtime
        limit = max(th.ckpt_overdue_factor * cadence, th.ckpt_overdue_min_s)
        if age < limit:
            continue
        yield Finding(
            "ckpt.overdue", Severity.WARNING,
            f"run {sample.name} last checkpointed {duration(age)} ago, {age / cadence:.1f}× its "
            f"usual {duration(cadence)}: a crash now loses all of that — check it still makes "
            "progress and that the checkpoint disk is not full",
            run=sample.name,
            evidence={"age_s": age, "cadence_s": cadence, "latest": latest.path,
                      "work_at_risk_s": series.work_at_risk_s(at)})


@rule({"ckpt.tmp_leftover": ("U6",)})
def ckpt_tmp_leftover(history: HostHistory) -> Iterable[Finding]:
    """U6: a `*.tmp` / `*.partial` / `tmp*` beside the checkpoints that nobody writes any more
    (untouched for tmp_stale_s, or the run is not running): a save that failed, often on a
    full disk, and space worth freeing."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    for sample in now.runs:
        stale = [c for c in sample.leftovers
                 if not sample.pids or now.taken_at is None
                 or now.taken_at - c.mtime >= th.tmp_stale_s]
        if not stale:
            continue
        total = sum(c.bytes for c in stale)
        yield Finding(
            "ckpt.tmp_leftover", Severity.WARNING,
            f"run {sample.name} has {len(stale)} partial checkpoint(s) ({size(total)}, e.g. "
            f"{stale[0].path}) left by a failed save — check the disk is not full, then delete "
            "them",
            run=sample.name,
            evidence={"paths": [c.path for c in stale], "bytes": total})
