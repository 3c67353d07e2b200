"""One tag's points, bounded: merged by step (TensorBoard's purge of orphaned data on a
restart), decimated for display and storage keeping spikes, and the TUI's fleet-wide budget
of points shared over every tag (apply_budget). Used by the run's series (series.py)."""

from __future__ import annotations

import itertools
import math
import os
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

MAX_POINTS = 100_000
"""Points kept per tag (24 bytes each: 2.4 MB at most per tag)."""
FLEET_POINTS = 2_000_000
"""Points the TUI keeps over every tag of every run of every host (48 MB): a tag's share is
this over the number of tags, within [MIN_POINTS, MAX_POINTS] (points_share). A sweep of 64
runs logging 10 tags each reached 1.5 GB at MAX_POINTS a tag after a few days."""
MIN_POINTS = 4_000
"""No share goes below what the store keeps of a tag (RunSeries.points_state): far more than
a terminal plot's columns, and a restart never loses resolution to the budget."""

Point = tuple[int, float, float]
"""(step, value, wall_time); wall_time is nan for sources without time."""

# ---------------------------------------------------------------- decimation

def _keep(values: Sequence[float], lo: int, hi: int, keep: set[int]) -> None:
    """Into keep: the indices of the min and max finite value of values[lo:hi], and of its
    first non-finite one (a loss gone NaN is the spike a person must see)."""
    low = high = odd = -1
    for i in range(lo, hi):
        v = values[i]
        if not math.isfinite(v):
            if odd < 0:
                odd = i
        else:
            if low < 0 or v < values[low]:
                low = i
            if high < 0 or v > values[high]:
                high = i
    keep.update(i for i in (low, high, odd) if i >= 0)


def decimate_indices(values: Sequence[float], n_buckets: int) -> list[int]:
    """Indices of the points `decimate` keeps, in order."""
    n = len(values)
    if n_buckets <= 0 or n <= 2 * n_buckets:
        return list(range(n))
    keep = {0, n - 1}
    for b in range(n_buckets):
        _keep(values, b * n // n_buckets, (b + 1) * n // n_buckets, keep)
    return sorted(keep)


def decimate(points: Sequence[Point], n_buckets: int) -> list[Point]:
    """At most about 2·n_buckets points for a plot: per equal-count bucket the minimum and the
    maximum (and the first non-finite point), plus the first and last points.

    Min/max rather than LTTB: LTTB keeps one point per bucket chosen by triangle area, so a
    one-sample spike sharing a bucket with a bigger swing can vanish; min/max keeps every
    bucket's extremes by construction, is one pass, and is what a terminal plot draws anyway
    (one column per bucket spanning its min..max).
    """
    values = [p[1] for p in points]
    return [points[i] for i in decimate_indices(values, n_buckets)]


# ---------------------------------------------------------------- one tag

class TagSeries:
    """One tag's points, sorted by step, in compact columns, never more than `bound`.

    Over the bound, all but the newest bound/2 points are decimated (min/max per bucket):
    recent points keep full resolution, old spikes survive, memory stays bounded.
    """

    __slots__ = ("bound", "generation", "last_wall", "owner", "start", "steps", "values",
                 "walls")

    def __init__(self, bound: int = MAX_POINTS) -> None:
        self.bound = max(64, bound)
        self.steps = array("q")
        self.values = array("d")
        self.walls = array("d")
        self.generation = -math.inf  # the first wall time of the file that writes it now
        self.start: int | None = None  # the first step that file wrote
        self.owner: str | None = None  # that file's folder (RunSeries routes by it)
        self.last_wall = -math.inf

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    @property
    def last_value(self) -> float | None:
        return self.values[-1] if self.values else None

    def points(self) -> list[Point]:
        return list(zip(self.steps, self.values, self.walls, strict=True))

    def decimated(self, n_buckets: int) -> list[Point]:
        return [(self.steps[i], self.values[i], self.walls[i])
                for i in decimate_indices(self.values, n_buckets)]

    def merge(self, points: Iterable[Point], generation: float = 0.0,
              markers: list[tuple[int, float]] | None = None, by_step: bool = False) -> None:
        """Fold in new points of one file (or metrics source), in write order.

        generation: the file's first wall time. A step going back (in a newer file or the
        same one) drops the points at and after it, the newer win, and notes a marker there.
        Points of a file older than the current writer's, arriving late (a first load spread
        over polls), fill in only before the step where the newer file took over.

        by_step (metrics files): a step is one point, never two. A metrics file is re-read
        from its start when it switches (checkpoint-1000's trainer_state.json to
        checkpoint-2000's) or is rewritten (Lightning's new column): a point at the last
        step replaces it rather than repeating it. An event file may log a step twice
        (TensorBoard keeps both), so event files keep that.
        """
        batch = list(points)
        if not batch:
            return
        if generation < self.generation:
            self._fill_before(batch, by_step)
            return
        if generation > self.generation:
            self.generation, self.start = generation, batch[0][0]
        for step, value, wall in batch:
            if self.steps and (step < self.steps[-1] or (by_step and step == self.steps[-1])):
                del self.steps[bisect_left(self.steps, step):]
                del self.values[len(self.steps):], self.walls[len(self.steps):]
                if markers is not None:
                    markers.append((step, wall))
            self._append(step, value, wall)
        self.shrink()

    def rebound(self, bound: int) -> None:
        """A new bound; a series over it shrinks on its next merge or shrink() (a fleet's
        budget changing does not compact every tag at once on the event loop)."""
        self.bound = max(64, bound)

    def shrink(self) -> None:
        if len(self.steps) > self.bound:
            self._compact()

    def _append(self, step: int, value: float, wall: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        self.walls.append(wall)
        if not math.isnan(wall):
            self.last_wall = max(self.last_wall, wall)

    def _fill_before(self, batch: list[Point], by_step: bool = False) -> None:
        early = [p for p in batch if self.start is None or p[0] < self.start]
        if not early:
            return
        merged = sorted(self.points() + early, key=lambda p: p[0])  # stable: kept ones first
        if by_step:  # one point a step: the last word on it (the re-read) wins
            merged = [p for p, after in itertools.zip_longest(merged, merged[1:])
                      if after is None or after[0] != p[0]]
        self.steps, self.values, self.walls = array("q"), array("d"), array("d")
        for step, value, wall in merged:
            self._append(step, value, wall)
        self.shrink()

    def _compact(self) -> None:
        """The newest bound/2 points stay; all older ones become at most about 3·bound/8
        (min, max and the first non-finite point of bound/8 buckets): under the bound in one
        pass whatever the batch size."""
        old = len(self.steps) - self.bound // 2
        keep = decimate_indices(self.values[:old], self.bound // 8)
        keep += range(old, len(self.steps))
        self.steps = array("q", (self.steps[i] for i in keep))
        self.values = array("d", (self.values[i] for i in keep))
        self.walls = array("d", (self.walls[i] for i in keep))


# ---------------------------------------------------------------- run status


def points_share(n_tags: int, budget: int = FLEET_POINTS) -> int:
    """Each tag's share of a budget of points over n_tags tags."""
    return max(MIN_POINTS, min(MAX_POINTS, budget // max(1, n_tags)))


COMPACT_WORK = 200_000
"""Points apply_budget shrinks at most in one call (~50 ms here), biggest tags first: a share
that drops does not stall the TUI's event loop; the next polls' calls do the rest."""


class Budgeted(Protocol):
    """What apply_budget needs of a run (series.RunSeries)."""

    max_points: int

    def tags(self) -> list[TagSeries]: ...

    def rebound(self, bound: int) -> None: ...


def apply_budget(runs: Iterable[Budgeted], budget: int = FLEET_POINTS,
                 work: int = COMPACT_WORK) -> int:
    """Give every tag of `runs` its share of `budget` points (the TUI's whole fleet) and
    shrink the tags over it, about `work` points' worth per call (a tag that still grows
    shrinks on its own as it does; one that no longer does, a finished run's, only here).
    The share."""
    runs = list(runs)
    share = points_share(sum(len(run.tags()) for run in runs), budget)
    over: list[TagSeries] = []
    for run in runs:
        if run.max_points != share:
            run.rebound(share)
        over += [tag for tag in run.tags() if len(tag) > tag.bound]
    for tag in sorted(over, key=len, reverse=True):
        if work <= 0:
            break
        work -= len(tag)
        tag.shrink()
    return share


def json_value(value: float | None) -> float | str | None:
    """A value for JSON: non-finite ones as "nan", "inf", "-inf" (JSON has none)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def file_generation(pattern: str, file: str | None) -> float:
    """Where a metrics file stands among its glob's matches: the last number in the part of
    its path the glob's first wildcard matched (version_3 → 3, checkpoint-2000 → 2000); 0
    for a plain path. The probe reads a glob's files in this order; a TagSeries uses it so
    that an older file read again (checkpoint-2000 deleted, checkpoint-1000 newest again)
    only fills in before where the newer one took over, and loses nothing. Paths are
    compared from their ends (the pattern may start with ~); at most 15 digits are read
    (exact in a float)."""
    if file is None:
        return 0.0
    for part, name in zip(reversed(pattern.split("/")), reversed(file.split("/")),
                          strict=False):
        if any(c in part for c in "*?["):
            digits = "".join(c if "0" <= c <= "9" else " " for c in name).split()
            return float(digits[-1].lstrip("0")[-15:] or 0) if digits else 0.0
    return 0.0


def tag_names(sources: Mapping[str, Mapping[str, TagSeries]]) -> dict[str, TagSeries]:
    """Every metrics source's tags under one name each. A tag two sources write (loss in
    train.jsonl and in eval.jsonl) is not hidden: the first source keeps the plain name,
    the next ones are named after their file ("eval/loss"), or "metrics[i]/loss" where two
    files share a name."""
    stems = [os.path.splitext(os.path.basename(path))[0] for path in sources]
    named: dict[str, TagSeries] = {}
    for i, (stem, streams) in enumerate(zip(stems, sources.values(), strict=True)):
        label = stem if stems.count(stem) == 1 and stem else f"metrics[{i}]"
        for tag, series in streams.items():
            for name in (tag, f"{label}/{tag}", f"metrics[{i}]/{tag}"):
                if name not in named:
                    named[name] = series
                    break
    return named
