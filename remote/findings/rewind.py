"""The way back: the anomaly a run's curves show last (its loss went NaN, diverged, spiked)
and the newest checkpoint written before it began.

The latest checkpoint of a run that went wrong may already hold the bad state (a NaN in the
weights, an optimiser state blown up by a spike); PaLM's authors restarted "from a checkpoint
roughly 100 steps before the spike started" and skipped the batches in between (Chowdhery et
al., "PaLM: Scaling Language Modeling with Pathways", 2022, §5.1). This module names that
checkpoint for the curve findings, for a relaunch (`{checkpoint_before_anomaly}`) and for the
watchdog, which never restarts into a checkpoint written after the loss went NaN.

A checkpoint's step is read from its name by the conventions of the trainers (HF's
checkpoint-500, Lightning's epoch=3-step=1200.ckpt, step_1200, iter_0001200, model_5000.pt);
a name that holds only an epoch or a version (best_model-v3.ckpt) has no step, and is placed
by its time against the time the anomaly's last good step was written.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .curves import CurveTracker

if TYPE_CHECKING:
    from ..model.series import RunSeries
    from ..model.snapshot import Checkpoint

_STEP_NAMED = (
    re.compile(r"(?:^|[^a-z])(?:global_?)?step[-_=]?([0-9]+)", re.I),  # step=1200, global_step5
    re.compile(r"checkpoint[-_]([0-9]+)", re.I),  # HF's checkpoint-500
    re.compile(r"(?:^|[^a-z])iter(?:ation)?s?[-_=]?([0-9]+)", re.I),  # Megatron's iter_0001200
)
_NO_STEP = re.compile(r"epoch|(?:^|[-_])v[0-9]+(?:\.|$)|last|best", re.I)
_TRAILING = re.compile(r"([0-9]+)(?:\.[A-Za-z][A-Za-z0-9_]*)*$")


def checkpoint_step(path: str) -> int | None:
    """The training step a checkpoint's name says it holds; None where the name says none."""
    name = os.path.basename(path.rstrip("/"))
    for pattern in _STEP_NAMED:
        found = pattern.search(name)
        if found:
            return int(found.group(1))
    if _NO_STEP.search(name):
        return None
    found = _TRAILING.search(name)
    return int(found.group(1)) if found else None


def checkpoint_before(checkpoints: tuple[Checkpoint, ...] | list[Checkpoint], step: int,
                      wall: float) -> Checkpoint | None:
    """The newest checkpoint written before `step` (the first step of an anomaly): by the
    step in its name; where names say no step, by its time against `wall` (when the last
    good point before the anomaly was written; NaN: not known)."""
    named = [(s, c) for c in checkpoints if (s := checkpoint_step(c.path)) is not None]
    if named:
        before = [(s, c) for s, c in named if s < step]
        return max(before, key=lambda sc: (sc[0], sc[1].mtime))[1] if before else None
    older = [c for c in checkpoints if math.isfinite(wall) and c.mtime <= wall]
    return max(older, key=lambda c: c.mtime) if older else None


def written_after(checkpoint: Checkpoint, step: int, wall: float) -> bool:
    """Whether a checkpoint was written at or after `step` (by the step in its name; else
    after `wall`, the time of the last good point before it; unknown: False)."""
    named = checkpoint_step(checkpoint.path)
    if named is not None:
        return named >= step
    return math.isfinite(wall) and checkpoint.mtime > wall


@dataclass(frozen=True, slots=True)
class Anomaly:
    """What went wrong last on a run's curves, and from which step."""

    kind: str
    """nan | diverging | spikes | spike"""
    tag: str
    step: int
    """The first step of the anomaly (the NaN; where the rising window began; the first
    spike of a burst)."""
    wall: float
    """When the last good point before it was written (NaN where not known)."""
    words: str
    """The anomaly in words, for a plan or a message."""


def latest_anomaly(run: RunSeries, trackers: dict[str, CurveTracker], loss: str | None,
                   recent_points: int, repeat: int) -> Anomaly | None:
    """The anomaly that began last among the run's watched curves: a NaN not recovered
    from for a window, the loss diverging (now, or its latest episode with no new best
    since), a burst of `repeat` spikes within `recent_points` points, or a lone spike among
    the last window of points. None when the curves show none."""
    found: list[Anomaly] = []
    for tag, t in trackers.items():
        if t.bad_step is not None and t.since_bad < t.window.maxlen:  # type: ignore[operator]
            what = "NaN" if math.isnan(t.bad_value) else "infinite"
            wall = t.before_bad[2] if t.before_bad else math.nan
            found.append(Anomaly("nan", tag, t.bad_step, wall,
                                 f"{tag} became {what} at step {t.bad_step}"))
        if tag != loss:
            continue
        episode = t.diverged
        if episode is not None and (t.diverging or t.best_step is None
                                    or t.best_step <= episode[0]):
            found.append(Anomaly("diverging", tag, episode[4], _wall_before(run, episode[4]),
                                 f"{tag} diverging, rising since step {episode[0]} (from "
                                 f"step {episode[4]} at the earliest)"))
        spikes = list(t.spikes)
        if spikes:
            last = spikes[-1]
            burst = [s for s in spikes if last[4] - recent_points <= s[4] <= last[4]]
            if len(burst) >= repeat and t.finite - last[4] <= recent_points:
                first = burst[0][0]
                found.append(Anomaly("spikes", tag, first, _wall_before(run, first),
                                     f"{len(burst)} spikes of {tag} from step {first}"))
            elif t.finite - last[4] <= t.window.maxlen:  # type: ignore[operator]
                found.append(Anomaly("spike", tag, last[0], _wall_before(run, last[0]),
                                     f"{tag} spiked at step {last[0]}"))
    return max(found, key=lambda a: a.step) if found else None


def _wall_before(run: RunSeries, step: int) -> float:
    """When a step before `step` was written, by the run's progress marks (a metrics file's
    mtime with the step it held); NaN where none is known."""
    marks = [t for t, s in run.step_marks if s < step]
    return max(marks) if marks else math.nan
