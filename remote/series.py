"""A training run as the client remembers it across polls: scalar series, offsets, status.

The probe sends only what is new (event-file offsets and metrics cursors travel with each
request); `RunSeries` folds each poll's `RunSample` into bounded per-tag series and says what a
person asks of a run: is it running, finished or dead (seed 004: a finished run is not a dead
one), when did it last checkpoint and how much work is at risk (seed 001), how old is its log.

No Textual here; no clock either: times are the box's (snapshot.taken_at, file mtimes), so a
box whose clock drifts from this machine's still gives right ages.

Merging by step follows TensorBoard's purge of orphaned data: when a tag's step goes back
(a run resumed from an earlier checkpoint, in a new event file or the same one), the points at
and after that step are dropped and the newer ones take their place; the place is kept as a
restart marker (step, wall_time). An event file from another folder whose points overlap a
tag's in time is a parallel writer (Keras' train/ and validation/), not a restart: its tag is
kept apart as "folder/tag".
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .config import RunConfig
from .discovered import Discovery
from .model import Checkpoint, RunSample
from .raw_events import RAW_CAP

MAX_POINTS = 100_000
"""Points kept per tag (24 bytes each: 2.4 MB at most per tag)."""
FLEET_POINTS = 2_000_000
"""Points the TUI keeps over every tag of every run of every host (48 MB): a tag's share is
this over the number of tags, within [MIN_POINTS, MAX_POINTS] (points_share). A sweep of 64
runs logging 10 tags each reached 1.5 GB at MAX_POINTS a tag after a few days."""
MIN_POINTS = 4_000
"""No share goes below what the store keeps of a tag (RunSeries.points_state): far more than
a terminal plot's columns, and a restart never loses resolution to the budget."""
MAX_RESTARTS = 100
CADENCE_CHECKPOINTS = 6
"""The checkpoints whose gaps give a run's cadence (the median of the last five gaps)."""
STATUSES = ("running", "finished", "dead", "unknown")

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
              markers: list[tuple[int, float]] | None = None) -> None:
        """Fold in new points of one file (or metrics source), in write order.

        generation: the file's first wall time. A step going back (in a newer file or the
        same one) drops the points at and after it, the newer win, and notes a marker there.
        Points of a file older than the current writer's, arriving late (a first load spread
        over polls), fill in only before the step where the newer file took over.
        """
        batch = list(points)
        if not batch:
            return
        if generation < self.generation:
            self._fill_before(batch)
            return
        if generation > self.generation:
            self.generation, self.start = generation, batch[0][0]
        for step, value, wall in batch:
            if self.steps and step < self.steps[-1]:
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

    def _fill_before(self, batch: list[Point]) -> None:
        early = [p for p in batch if self.start is None or p[0] < self.start]
        if not early:
            return
        merged = sorted(self.points() + early, key=lambda p: p[0])  # stable: kept ones first
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


def apply_budget(runs: Iterable[RunSeries], budget: int = FLEET_POINTS,
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


def run_status(pids: Sequence[int], done: bool | None, seen_running: bool) -> str:
    """running: processes alive. finished: the done marker exists and none are (seed 004).
    dead: seen running before (in this history or the store), now neither. unknown: never
    seen running and no marker (not started yet, or the `process` pattern matches nothing)."""
    if pids:
        return "running"
    if done:
        return "finished"
    return "dead" if seen_running else "unknown"


def json_value(value: float | None) -> float | str | None:
    """A value for JSON: non-finite ones as "nan", "inf", "-inf" (JSON has none)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def run_request(run: RunConfig, series: RunSeries | None = None) -> dict[str, Any]:
    """A run's entry in the probe request: paths resolved against the workdir (absolute or
    ~, which the probe expands on the box), and what the last answer said (offsets, cursors,
    the log's size and mtime) so that only what is new comes back."""
    entry: dict[str, Any] = {"name": run.name}
    if run.process:
        entry["process"] = run.process
        if run.workdir:  # its processes are those in that folder (probe.match_runs)
            entry["workdir"] = run.workdir
    for key in ("log", "events", "checkpoints", "done"):
        path = run.resolve(getattr(run, key))
        if path:
            entry[key] = path
    if run.metrics:
        entry["metrics"] = [run.resolve(m) for m in run.metrics]
    if series is not None:
        entry.update(series.request_state())
    return entry


# ---------------------------------------------------------------- one run

class RunSeries:
    """Everything the client keeps of one run between polls, bounded."""

    def __init__(self, name: str, max_points: int = MAX_POINTS) -> None:
        self.name = name
        self.max_points = max_points
        self.event_series: dict[str, TagSeries] = {}
        self.metric_series: dict[str, dict[str, TagSeries]] = {}  # per metrics path
        self.routes: dict[tuple[str, str], str] = {}  # (folder, tag) → series name
        self.restarts: deque[tuple[int, float]] = deque(maxlen=MAX_RESTARTS)
        self.offsets: dict[str, int] = {}
        self.first_walls: dict[str, float] = {}
        self.cursors: dict[str, Any] = {}
        self.log_seen: list[Any] | None = None
        self.tail: str | None = None
        self.pids: tuple[int, ...] = ()
        self.done: bool | None = None
        self.seen_running = False
        self.last_seen_running_at: float | None = None
        self.last_sample: RunSample | None = None
        self.box_time: float | None = None
        self.checkpoint_times: dict[str, float] = {}  # seen over history: rotation deletes old
        self.errors: Mapping[str, str] = {}
        self.discovery: Discovery | None = None  # issue 8: a run nobody configured
        self.reaped = False
        """A discovered run whose only processes gpuwatch ended as VRAM zombies (a reap,
        actions.mark_reaped): gone, not a dead run (zombies.left_behind_runs), until it has
        processes again."""
        self.events_raw = False
        """Issue 3: the next poll may go without the event decoder (the probe sends new records
        raw): an answer came, and no event file has more left than one poll sends raw."""

    # -- what goes out
    def request_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.offsets:
            state["offsets"] = dict(self.offsets)
        if self.cursors:
            state["cursors"] = dict(self.cursors)
        if self.log_seen is not None:
            state["log_seen"] = list(self.log_seen)
        if self.events_raw:
            state["raw"] = True  # probe_bundle.modules_for: no decoder needed for this run
        return state

    # -- what comes back
    def update(self, sample: RunSample, box_time: float | None = None) -> None:
        """Fold in one poll's sample; box_time is the box's clock at the poll (taken_at)."""
        self.last_sample, self.box_time = sample, box_time
        self.pids, self.done, self.errors = sample.pids, sample.done, sample.errors
        if sample.discovered is not None:
            self.discovery = sample.discovered.merged(self.discovery)
        if sample.pids:
            self.seen_running, self.reaped = True, False
            self.last_seen_running_at = box_time
        if sample.log is not None:
            self.log_seen = [sample.log.bytes, sample.log.mtime]
            if sample.log.tail is not None:
                self.tail = sample.log.tail
        elif "log" in sample.errors:
            self.log_seen, self.tail = None, None
        self._update_events(sample)
        self.events_raw = not any(
            f.error is None and (f.pending or f.bytes - f.offset > RAW_CAP)
            for f in sample.event_files)
        self._update_metrics(sample)
        for ckpt in sample.checkpoints:
            self.checkpoint_times[ckpt.path] = ckpt.mtime
        if len(self.checkpoint_times) > 4 * CADENCE_CHECKPOINTS:
            newest = sorted(self.checkpoint_times.items(), key=lambda kv: kv[1])
            self.checkpoint_times = dict(newest[-2 * CADENCE_CHECKPOINTS:])

    def _update_events(self, sample: RunSample) -> None:
        if sample.events_path is None:
            return
        present = set()
        markers: list[tuple[int, float]] = []
        root = sample.events_path.rstrip("/")
        for f in sample.event_files:
            present.add(f.path)
            if f.error is not None:
                continue
            if f.reset:
                self.first_walls.pop(f.path, None)
            if f.first_wall_time is not None:
                self.first_walls[f.path] = f.first_wall_time
            self.offsets[f.path] = f.offset
            generation = self.first_walls.get(f.path, f.mtime)
            folder = os.path.relpath(os.path.dirname(f.path), root) if f.path != root else "."
            for tag, cols in f.scalars.items():
                points = list(cols.points())
                name = self._route(folder, tag, generation, points)
                self.event_series[name].merge(points, generation, markers)
        if "events" not in sample.errors:  # files gone from the box: forget their offsets
            for path in set(self.offsets) - present:
                self.offsets.pop(path)
                self.first_walls.pop(path, None)
        for marker in markers:
            if not self.restarts or self.restarts[-1][0] != marker[0]:
                self.restarts.append(marker)

    def _route(self, folder: str, tag: str, generation: float, points: list[Point]) -> str:
        """The series a file's tag goes to: the tag itself, unless another folder's file
        writes that tag at the same time (a parallel writer): then "folder/tag"."""
        known = self.routes.get((folder, tag))
        if known is not None:
            return known
        current = self.event_series.get(tag)
        name = tag
        if current is not None and current.owner not in (None, folder):
            first_wall = min((p[2] for p in points if not math.isnan(p[2])), default=generation)
            if first_wall <= current.last_wall:  # overlaps in time: not a restart
                name = tag if folder == "." else f"{folder}/{tag}"
                if name == tag:  # the root's own file is parallel to a folder's
                    name = f"./{tag}"
        series = self.event_series.get(name)
        if series is None:
            series = self.event_series[name] = TagSeries(self.max_points)
        if name == tag:
            series.owner = folder
        self.routes[(folder, tag)] = name
        return name

    def _update_metrics(self, sample: RunSample) -> None:
        for m in sample.metrics:
            if m.error is not None:
                continue
            if m.cursor is not None:
                self.cursors[m.path] = m.cursor
            streams = self.metric_series.setdefault(m.path, {})
            for tag, cols in m.scalars.items():
                series = streams.get(tag)
                if series is None:
                    series = streams[tag] = TagSeries(self.max_points)
                series.merge(cols.points(), 0.0)  # a step going back: newer wins, no marker

    def tags(self) -> list[TagSeries]:
        """Every series this run keeps (event files' and metrics files' alike)."""
        return [*self.event_series.values(),
                *(t for streams in self.metric_series.values() for t in streams.values())]

    def rebound(self, bound: int) -> None:
        """Keep at most `bound` points a tag from now on (the TUI's fleet budget)."""
        self.max_points = bound
        for series in self.tags():
            series.rebound(bound)

    # -- what a person asks
    @property
    def status(self) -> str:
        return run_status(self.pids, self.done, self.seen_running)

    @property
    def series(self) -> dict[str, TagSeries]:
        """Every tag: event files first; a metrics file's tag where no event file has it."""
        merged: dict[str, TagSeries] = {}
        for streams in self.metric_series.values():
            for tag, series in streams.items():
                merged.setdefault(tag, series)
        merged.update(self.event_series)
        return merged

    def last_step(self, tag: str) -> int | None:
        series = self.series.get(tag)
        return series.last_step if series else None

    def last_value(self, tag: str) -> float | None:
        series = self.series.get(tag)
        return series.last_value if series else None

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        return self.last_sample.checkpoints if self.last_sample else ()

    @property
    def leftovers(self) -> tuple[Checkpoint, ...]:
        return self.last_sample.leftovers if self.last_sample else ()

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return self.last_sample.latest_checkpoint if self.last_sample else None

    @property
    def cadence_s(self) -> float | None:
        """Median gap between the last few checkpoints (seen over the history, so a run that
        keeps only the newest two still has a cadence); None with fewer than two."""
        times = sorted(self.checkpoint_times.values())[-CADENCE_CHECKPOINTS:]
        gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
        if not gaps:
            return None
        import statistics  # with fractions, decimal and random: 3 ms of every `--once` start

        return statistics.median(gaps)

    def work_at_risk_s(self, now: float | None = None) -> float | None:
        """Seed 001: the work a crash would lose. Running: now − the latest checkpoint;
        dead: from that checkpoint to when it was last seen running (what was lost);
        finished: 0; unknown or no checkpoint: None. `now` is the box's clock."""
        status, latest = self.status, self.latest_checkpoint
        if status == "finished":
            return 0.0
        if latest is None or status == "unknown":
            return None
        end = now if status == "running" else self.last_seen_running_at
        end = self.box_time if end is None else end
        return None if end is None else max(0.0, end - latest.mtime)

    def log_age_s(self, now: float | None = None) -> float | None:
        sample = self.last_sample
        now = self.box_time if now is None else now
        if sample is None or sample.log is None or now is None:
            return None
        return max(0.0, now - sample.log.mtime)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The run object of `--once --json` (schema gpuwatch/1); diagnosis is the findings'."""
        latest = self.latest_checkpoint
        return {
            "name": self.name, "status": self.status, "pids": list(self.pids),
            "log_age_s": self.log_age_s(now),
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "latest_checkpoint": latest.path if latest else None,
            "series": {tag: {"last_step": s.last_step, "last_value": json_value(s.last_value),
                             "points": len(s)} for tag, s in sorted(self.series.items())},
            "diagnosis": None,
        }

    # -- what the store keeps between `--once` runs
    def points_state(self, per_tag: int = MIN_POINTS) -> dict[str, Any]:
        """The series themselves, decimated to at most about `per_tag` points per tag (spikes
        kept), with what routes new points to them; `restore_points` reads it back."""
        def tag_state(series: TagSeries) -> dict[str, Any]:
            points = series.points() if len(series) <= per_tag else series.decimated(per_tag // 2)
            return {"owner": series.owner, "generation": series.generation,
                    "start": series.start, "points": points}
        return {
            "events": {name: tag_state(s) for name, s in self.event_series.items()},
            "metrics": {path: {tag: tag_state(s) for tag, s in streams.items()}
                        for path, streams in self.metric_series.items()},
            "routes": [[folder, tag, name] for (folder, tag), name in self.routes.items()],
            "restarts": list(self.restarts),
        }

    def restore_points(self, data: Mapping[str, Any]) -> None:
        """Undo `points_state`; anything malformed is dropped, never fatal."""
        def tag_series(raw: Any) -> TagSeries | None:
            if not isinstance(raw, dict) or not isinstance(raw.get("points"), list):
                return None
            series = TagSeries(self.max_points)
            try:
                for step, value, wall in raw["points"]:
                    series._append(int(step), float(value), float(wall))
                series.generation = float(raw.get("generation", -math.inf))
                start = raw.get("start")
                series.start = int(start) if isinstance(start, int) else None
                owner = raw.get("owner")
                series.owner = owner if isinstance(owner, str) else None
            except (TypeError, ValueError):
                return None
            return series

        for name, raw in (data.get("events") or {}).items():
            if (series := tag_series(raw)) is not None:
                self.event_series[str(name)] = series
        for path, streams in (data.get("metrics") or {}).items():
            if isinstance(streams, dict):
                restored = {str(t): s for t, raw in streams.items()
                            if (s := tag_series(raw)) is not None}
                self.metric_series[str(path)] = restored
        for route in data.get("routes") or ():
            if isinstance(route, list) and len(route) == 3 and all(
                    isinstance(x, str) for x in route):
                self.routes[(route[0], route[1])] = route[2]
        for marker in data.get("restarts") or ():
            if isinstance(marker, list) and len(marker) == 2:
                with contextlib.suppress(TypeError, ValueError):
                    self.restarts.append((int(marker[0]), float(marker[1])))

    def state(self) -> dict[str, Any]:
        """JSON-able: offsets, cursors and liveness memory (not the points: the store keeps
        those in its own bounded table)."""
        return {"offsets": self.offsets, "first_walls": self.first_walls,
                "cursors": self.cursors, "log_seen": self.log_seen,
                "seen_running": self.seen_running,
                "last_seen_running_at": self.last_seen_running_at,
                "checkpoint_times": self.checkpoint_times,
                "discovery": self.discovery.to_state() if self.discovery else None,
                "reaped": self.reaped}

    @classmethod
    def from_state(cls, name: str, state: Mapping[str, Any],
                   max_points: int = MAX_POINTS) -> RunSeries:
        """Rebuilt from `state()`; anything malformed is dropped, never fatal."""
        run = cls(name, max_points)

        def mapping(key: str, test: Any) -> dict[str, Any]:
            value = state.get(key)
            if not isinstance(value, dict):
                return {}
            return {k: v for k, v in value.items() if isinstance(k, str) and test(v)}

        def number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        run.offsets = mapping("offsets", lambda v: isinstance(v, int) and number(v) and v >= 0)
        run.first_walls = {k: float(v) for k, v in mapping("first_walls", number).items()}
        run.cursors = mapping("cursors", lambda v: True)
        run.checkpoint_times = {k: float(v)
                                for k, v in mapping("checkpoint_times", number).items()}
        seen = state.get("log_seen")
        run.log_seen = list(seen) if isinstance(seen, list) and len(seen) == 2 else None
        run.seen_running = state.get("seen_running") is True
        at = state.get("last_seen_running_at")
        run.last_seen_running_at = float(at) if isinstance(at, (int, float)) else None
        run.discovery = Discovery.from_state(name, state.get("discovery"))
        run.reaped = state.get("reaped") is True
        return run
