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
import re
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config.schema import RunConfig
from ..findings.diagnosis import crash_line
from ..wire.raw_events import RAW_CAP
from .discovered import Discovery, exit_record_path
from .snapshot import Checkpoint, MetricsFile, RunSample

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
MAX_METRIC_TAGS = 1_000
"""Tags kept per metrics source: a file that names a new key on every line stays bounded."""
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


# ---------------------------------------------------------------- how a run ended (seed 004)

COMPLETION_LINES: tuple[tuple[re.Pattern[str], bool], ...] = (
    # HuggingFace Trainer.train(), as it returns (logger.info), and its closing summary dict
    (re.compile(r"Training completed\. Do not forget to share your model"), False),
    (re.compile(r"^\s*\{'train_runtime': "), False),
    # Lightning's fit loop: `Trainer.fit` stopped: `max_epochs=10` reached. (or max_steps)
    (re.compile(r"`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached"), False),
    # DeepSpeed's launcher, once per rank that exits 0; after a failing rank it goes on to
    # "Killing subprocess" lines: it counts only as the log's very last line
    (re.compile(r"\[launch\.py:\d+:main\] Process \d+ exits successfully\."), True),
)
"""The frameworks' own words for a run that reached its end, and whether the line must be the
log's last (else: in the tail with no crash line after it)."""
MARKS = 8
"""(file mtime, step) marks kept for a run's pace (its ETA)."""
CKPT_EPOCH = re.compile(r"(?:^|[-_])epoch=(\d+)")
CKPT_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


def completion_line(tail: str | None) -> str | None:
    """The framework's completion line in a log's tail, when nothing after it says the run
    crashed; None otherwise (diagnosis.crash_line: the same words that make a death)."""
    lines = [line.rstrip() for line in (tail or "").splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        for pattern, last_only in COMPLETION_LINES:
            if pattern.search(lines[i]) and (not last_only or i == len(lines) - 1):
                after = "\n".join(lines[i + 1:])
                return None if crash_line(after) else lines[i].strip()[:300]
    return None


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
    if run.workdir:  # where a relaunch by gpuwatch records how the run ended
        entry["exit"] = exit_record_path(run.workdir, run.name)
    if run.metrics:
        entry["metrics"] = [run.resolve(m) for m in run.metrics]
    if series is not None:
        entry.update(series.request_state())
    return entry


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
        self.skipped: dict[str, dict[str, list[Any]]] = {}  # path → file → [lines, reason]
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
        self.progress: dict[str, Any] = {}
        """Seed 004: the framework's latest word on how far the run is (MetricsFile.progress,
        with the file's "kind" and "mtime"), kept while the file is not re-read."""
        self.step_marks: list[tuple[float, int]] = []  # (file mtime, step): the run's pace
        self.final_epoch_at: float | None = None
        """A Lightning run: the metrics.csv mtime when its final epoch's rows first showed."""
        self.exit_record: tuple[int, float | None] | None = None
        """(status, when written) from the launch wrapper of a run gpuwatch relaunched."""
        self.log_end: tuple[str, float] | None = None
        """The framework's completion line at the log's end, and the log's mtime then."""
        self.idle_at: float | None = None  # the box's clock at the latest poll without pids
        self.started_after: float | None = None
        """The latest poll without pids before the one that saw them: evidence of an end older
        than this is a previous launch's, not this one's."""

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
    def update(self, sample: RunSample, box_time: float | None = None,
               started_at: float | None = None) -> None:
        """Fold in one poll's sample; box_time is the box's clock at the poll (taken_at),
        started_at when the run's oldest live process started (the box's clock too)."""
        self.last_sample, self.box_time = sample, box_time
        self.pids, self.done, self.errors = sample.pids, sample.done, sample.errors
        if sample.discovered is not None:
            self.discovery = sample.discovered.merged(self.discovery)
        if sample.pids:
            self.seen_running, self.reaped = True, False
            self.last_seen_running_at = box_time
            # Evidence of an end must be newer than this launch: than the last poll that saw
            # the run idle, and than its processes (a restart between two polls, unseen).
            marks = [t for t in (self.idle_at, started_at) if t is not None]
            self.started_after = max(marks) if marks else None
        else:
            self.idle_at = box_time
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
        self._update_end(sample)  # after the metrics: a CSV's step is its series' last

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
        """Each file's points into its source's series, merged by step (a re-read repeats
        none), files in order by the number in their names (file_generation)."""
        cursors: dict[str, list[Any]] = {}
        for m in sample.metrics:
            if m.error is not None:
                continue
            if m.cursor is not None:
                cursors.setdefault(m.path, []).append(m.cursor)
            self._count_skipped(m)
            generation = file_generation(m.path, m.file)
            streams = self.metric_series.setdefault(m.path, {})
            for tag, cols in m.scalars.items():
                series = streams.get(tag)
                if series is None:
                    if len(streams) >= MAX_METRIC_TAGS:
                        continue  # a file that names a new key every line: bounded
                    series = streams[tag] = TagSeries(self.max_points)
                series.merge(cols.points(), generation, by_step=True)
        self.cursors.update(cursors)  # a source that failed keeps what it had
        for path, files in self.skipped.items():  # files no longer read: forgotten
            if path in cursors:
                read = {m.file for m in sample.metrics if m.path == path and m.error is None}
                for gone in set(files) - read:
                    files.pop(gone)

    def _count_skipped(self, m: MetricsFile) -> None:
        """Lines skipped in a file, over every poll (a file read again from its start
        counts again from zero), and what was wrong with the first."""
        files = self.skipped.setdefault(m.path, {})
        key = m.file or m.path
        held = files.get(key)
        if held is None or m.reset:
            held = files[key] = [0, None]
        if m.skipped:
            held[0] = min(held[0] + m.skipped, 2**53)
            held[1] = held[1] or m.skip_reason

    def skipped_lines(self) -> dict[str, tuple[int, str | None]]:
        """Per metrics source: the lines skipped in its files and the first reason."""
        out: dict[str, tuple[int, str | None]] = {}
        for path, files in self.skipped.items():
            count = sum(n for n, _ in files.values())
            reason = next((r for n, r in files.values() if n and r), None)
            out[path] = (count, reason)
        return out

    def _update_end(self, sample: RunSample) -> None:
        """What says how the run ended or how far it got: the wrapper's exit record, the
        framework's progress in its metrics files, its completion line in the log."""
        record = sample.exit
        if record is not None:
            self.exit_record = (record.code, record.mtime) \
                if record.exists and record.code is not None else None
        if sample.log is not None and sample.log.tail is not None:
            line = completion_line(sample.log.tail)
            self.log_end = (line, sample.log.mtime) if line else None
        for m in sample.metrics:
            if m.progress is None or m.error is not None:
                continue
            self.progress = {**m.progress, "kind": m.kind, "mtime": m.mtime, "path": m.path}
            step = self._progress_step()
            if step is not None and m.mtime is not None:
                self._mark(m.mtime, step)
            epoch = self._last_epoch()
            final = self.progress.get("max_epochs")
            if final is not None and epoch is not None and epoch >= final - 1:
                if self.final_epoch_at is None:
                    self.final_epoch_at = m.mtime
            else:
                self.final_epoch_at = None

    def _mark(self, mtime: float, step: int) -> None:
        if self.step_marks and step < self.step_marks[-1][1]:
            self.step_marks = []  # resumed from an earlier step: the old pace is another run's
        if not self.step_marks or step > self.step_marks[-1][1]:
            self.step_marks = [*self.step_marks, (mtime, step)][-MARKS:]

    def _progress_step(self) -> int | None:
        """The run's step: HF's global_step, else the last step of the metrics file that
        carried the progress (Lightning's metrics.csv)."""
        step = self.progress.get("global_step")
        if step is not None:
            return int(step)
        streams = self.metric_series.get(str(self.progress.get("path")), {})
        return max((int(t.last_step) for t in streams.values() if t.last_step is not None),
                   default=None)

    def _last_epoch(self) -> float | None:
        if self.progress.get("epoch") is not None:
            return float(self.progress["epoch"])
        series = self.metric_series.get(str(self.progress.get("path")), {}).get("epoch")
        return series.last_value if series is not None else None

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
        """run_status, with what the frameworks and gpuwatch's launch wrapper wrote (seed 004):
        a run whose processes are gone is finished when its end says so, and dead for certain
        when its wrapper recorded another status (even one that exited before a poll saw it)."""
        if self.pids:
            return "running"
        if self.finished_by() is not None:
            return "finished"
        if self.exit_code() is not None:
            return "dead"
        return run_status(self.pids, self.done, self.seen_running)

    def exit_code(self) -> int | None:
        """The status the launch wrapper recorded for the latest launch; None when there is
        none, or it is older than the last poll that saw the run alive (a previous launch's,
        and this one was started some other way)."""
        if self.exit_record is None:
            return None
        code, written = self.exit_record
        seen = self.last_seen_running_at
        if seen is not None and (written is None or written < seen):
            return None
        return code

    def _fresh(self, mtime: float | None) -> bool:
        """Evidence written by this launch of the run, not by one before it."""
        return self.started_after is None or (mtime is not None and mtime > self.started_after)

    def finished_by(self) -> str | None:
        """What says the run reached its end, in words; None when nothing does (seed 004).
        Most certain first: the wrapper's exit status (any other status rules finished out),
        the done marker, HF's trainer_state.json, Lightning's checkpoints, the log's last
        words."""
        code = self.exit_code()
        if code is not None:
            return "its launch wrapper recorded exit status 0" if code == 0 else None
        if self.done:
            return "its done marker exists"
        return self._framework_end() or self._log_end()

    def _framework_end(self) -> str | None:
        p = self.progress
        if not p or not self._fresh(p.get("mtime")):
            return None
        if p.get("kind") == "trainer_state":
            step, limit = p.get("global_step"), p.get("max_steps")
            if p.get("final"):
                return ("trainer_state.json ends with the summary Trainer.train() logs as it "
                        "returns (train_runtime)")
            if step is not None and limit and step >= limit:
                return f"trainer_state.json says global_step {int(step)} of max_steps {int(limit)}"
            return None
        return self._lightning_end()

    def _lightning_end(self) -> str | None:
        """A checkpoint of the final epoch (or step) by ModelCheckpoint's name for it
        (epoch=9-step=15610.ckpt), or last.ckpt written after the final epoch's rows began."""
        max_epochs, max_steps = self.progress.get("max_epochs"), self.progress.get("max_steps")
        for ckpt in reversed(self.checkpoints):
            if not self._fresh(ckpt.mtime):
                continue
            name = os.path.basename(ckpt.path.rstrip("/"))
            epoch, step = CKPT_EPOCH.search(name), CKPT_STEP.search(name)
            if max_epochs and epoch and int(epoch.group(1)) >= max_epochs - 1:
                return f"checkpoint {name} is of its final epoch (max_epochs {int(max_epochs)})"
            if max_steps and step and int(step.group(1)) >= max_steps:
                return f"checkpoint {name} is of its last step (max_steps {int(max_steps)})"
            if name == "last.ckpt" and self.final_epoch_at is not None \
                    and ckpt.mtime >= self.final_epoch_at:
                return (f"last.ckpt was saved after its final epoch began (max_epochs "
                        f"{int(max_epochs or 0)})")
        return None

    def _log_end(self) -> str | None:
        if self.log_end is None or not self._fresh(self.log_end[1]):
            return None
        return f"its log ends with the framework's own completion line: {self.log_end[0]}"

    def progress_json(self, now: float | None = None) -> dict[str, Any] | None:
        """The schema's run `progress`, where the framework wrote its limit: the step (and
        epoch) against max_steps (max_epochs), and the time left at the pace of the last
        marks (while running); None where no limit is known."""
        p = self.progress
        max_steps = p.get("max_steps")
        max_epochs = p.get("num_train_epochs", p.get("max_epochs"))
        if not max_steps and not max_epochs:
            return None
        step = self._progress_step()
        return {"step": step, "max_steps": int(max_steps) if max_steps else None,
                "epoch": json_value(self._last_epoch()),
                "max_epochs": json_value(float(max_epochs)) if max_epochs else None,
                "eta_s": self.eta_s(now)}

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds to max_steps at the pace between the oldest and newest marks, less the time
        since the newest (the box's clock); None unless running with a known limit and pace."""
        limit = self.progress.get("max_steps")
        now = self.box_time if now is None else now
        if not self.pids or not limit or len(self.step_marks) < 2 or now is None:
            return None
        (t0, s0), (t1, s1) = self.step_marks[0], self.step_marks[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        left = (limit - s1) * (t1 - t0) / (s1 - s0) - max(0.0, now - t1)
        return round(max(0.0, left), 1)

    @property
    def series(self) -> dict[str, TagSeries]:
        """Every tag: event files first; a metrics file's tag where no event file has it."""
        merged = tag_names(self.metric_series)
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
            **self._end_json(now),
            **self.metrics_json(),
        }

    def _end_json(self, now: float | None) -> dict[str, Any]:
        """The additive run keys of seed 004: `progress` where a limit is known, `finished_by`
        where the run is finished."""
        out: dict[str, Any] = {}
        progress = self.progress_json(now)
        if progress is not None:
            out["progress"] = progress
        by = self.finished_by() if not self.pids else None
        if by is not None:
            out["finished_by"] = by
        return out

    def metrics_json(self) -> dict[str, Any]:
        """runs[].metrics, only for a run that reads metrics files: per source, the lines
        skipped in its files (over every poll) and what was wrong with the first."""
        if not self.skipped:
            return {}
        return {"metrics": [{"path": path, "skipped": count, "skip_reason": reason}
                            for path, (count, reason) in self.skipped_lines().items()]}

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
            except (TypeError, ValueError, OverflowError):  # a step beyond int64: dropped
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
                with contextlib.suppress(TypeError, ValueError, OverflowError):
                    self.restarts.append((int(marker[0]), float(marker[1])))

    def state(self) -> dict[str, Any]:
        """JSON-able: offsets, cursors and liveness memory (not the points: the store keeps
        those in its own bounded table)."""
        return {"offsets": self.offsets, "first_walls": self.first_walls,
                "cursors": self.cursors, "skipped": self.skipped, "log_seen": self.log_seen,
                "seen_running": self.seen_running,
                "last_seen_running_at": self.last_seen_running_at,
                "checkpoint_times": self.checkpoint_times,
                "discovery": self.discovery.to_state() if self.discovery else None,
                "reaped": self.reaped, "end": self._end_state()}

    def _end_state(self) -> dict[str, Any]:
        return {"progress": self.progress, "marks": self.step_marks,
                "final_epoch_at": self.final_epoch_at,
                "exit": list(self.exit_record) if self.exit_record else None,
                "log_end": list(self.log_end) if self.log_end else None,
                "idle_at": self.idle_at, "started_after": self.started_after}

    def _restore_end(self, data: Any) -> None:
        """Undo `_end_state`; anything malformed is dropped, never fatal."""
        if not isinstance(data, dict):
            return

        def number(v: Any) -> float | None:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            return float(v) if ok else None

        progress = data.get("progress")
        if isinstance(progress, dict):
            self.progress = {k: v for k, v in progress.items() if k in (
                "global_step", "max_steps", "epoch", "num_train_epochs", "max_epochs")
                and number(v) is not None}
            self.progress.update({k: progress[k] for k in ("kind", "path")
                                  if isinstance(progress.get(k), str)})
            if progress.get("final") is True:
                self.progress["final"] = True
            self.progress["mtime"] = number(progress.get("mtime"))
        marks = data.get("marks")
        if isinstance(marks, list):
            self.step_marks = [(float(m[0]), int(m[1])) for m in marks[-MARKS:]
                               if isinstance(m, list) and len(m) == 2
                               and number(m[0]) is not None and isinstance(m[1], int)]
        self.final_epoch_at = number(data.get("final_epoch_at"))
        record = data.get("exit")
        if isinstance(record, list) and len(record) == 2 and isinstance(record[0], int) \
                and 0 <= record[0] <= 255:
            self.exit_record = (record[0], number(record[1]))
        end = data.get("log_end")
        if isinstance(end, list) and len(end) == 2 and isinstance(end[0], str) \
                and number(end[1]) is not None:
            self.log_end = (end[0][:300], float(end[1]))
        self.idle_at, self.started_after = (number(data.get("idle_at")),
                                            number(data.get("started_after")))

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
        run.skipped = {path: {f: [int(held[0]), held[1] if isinstance(held[1], str) else None]
                              for f, held in files.items() if isinstance(f, str)
                              and isinstance(held, list) and len(held) == 2
                              and isinstance(held[0], int) and 0 <= held[0] <= 2**53}
                       for path, files in mapping("skipped", lambda v: isinstance(v, dict)).items()}
        run.checkpoint_times = {k: float(v)
                                for k, v in mapping("checkpoint_times", number).items()}
        seen = state.get("log_seen")
        run.log_seen = list(seen) if isinstance(seen, list) and len(seen) == 2 else None
        run.seen_running = state.get("seen_running") is True
        at = state.get("last_seen_running_at")
        run.last_seen_running_at = float(at) if isinstance(at, (int, float)) else None
        run.discovery = Discovery.from_state(name, state.get("discovery"))
        run.reaped = state.get("reaped") is True
        run._restore_end(state.get("end"))
        return run
