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

import itertools
import math
import os
from typing import Any

from ..config.schema import RunConfig
from .death import CKPT_EPOCH, CKPT_STEP, MARKS, completion_line
from .discovery import exit_record_path
from .run_state import MAX_RESTARTS, RunState, run_status
from .snapshot import Checkpoint, MetricsFile, RunSample
from .tags import (
    COMPACT_WORK,
    FLEET_POINTS,
    MAX_POINTS,
    MIN_POINTS,
    Point,
    TagSeries,
    apply_budget,
    decimate,
    decimate_indices,
    file_generation,
    json_value,
    points_share,
    tag_names,
)

RAW_CAP = 24 * 1024
"""probe.RAW_CAP, the most bytes of raw event records one poll brings (tests hold them equal; the
probe is not imported until a raw entry comes). Here, below the wire that reads them, because
the series also asks whether a file grew by more than one poll's worth."""
MAX_METRIC_TAGS = 1_000
"""Tags kept per metrics source: a file that names a new key on every line stays bounded."""
CADENCE_CHECKPOINTS = 6
SILENT_FACTOR = 2.0
"""A run that has written no progress for more than this many of its usual intervals between
writes is silent: its ETA is unknown, not a countdown to 0 s."""
"""The checkpoints whose gaps give a run's cadence (the median of the last five gaps)."""
STATUSES = ("running", "finished", "dead", "unknown")



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


# ---------------------------------------------------------------- one run

class RunSeries(RunState):
    """Everything the client keeps of one run between polls, bounded (run_state.py), and
    what a person asks of it."""

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
                "eta_s": self.eta_s(now),
                "steps_per_s": round(1 / self.pace_s, 6) if self.pace_s else None,
                "silent_s": self.silent_s(now) if self.pids else None}

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds to max_steps at the pace between the oldest and newest marks, less the time
        since the newest (the box's clock); else at the run's own pace between its logged
        steps (pace_s); None unless running with a known limit and pace, and None while the
        run has been silent for longer than it ever usually is (silent_s): a countdown that
        reached 0 s would read "about to finish" of a run that stalled."""
        limit = self.progress.get("max_steps")
        now = self.box_time if now is None else now
        if not self.pids or not limit or now is None:
            return None
        (t0, s0), (t1, s1) = (self.step_marks[0], self.step_marks[-1]) if self.step_marks \
            else ((0.0, 0), (0.0, 0))
        if t1 <= t0 or s1 <= s0:  # no pace from the writes yet: the loss points' own
            step = self._progress_step()
            if not self.pace_s or step is None:
                return None
            return round(max(0.0, (limit - step) * self.pace_s), 1)
        if self.silent_s(now) is not None:
            return None
        left = (limit - s1) * (t1 - t0) / (s1 - s0) - max(0.0, now - t1)
        return round(max(0.0, left), 1)

    def silent_s(self, now: float | None = None) -> float | None:
        """Seconds since the run last wrote its progress, where that is more than
        SILENT_FACTOR times its usual interval between writes (the median of its marks'
        gaps); None while it writes as usual (or no interval is known yet)."""
        now = self.box_time if now is None else now
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(self.step_marks) if b[0] > a[0]]
        if now is None or not gaps:
            return None
        usual = sorted(gaps)[len(gaps) // 2]
        quiet = now - self.step_marks[-1][0]
        return round(quiet, 1) if quiet > SILENT_FACTOR * usual else None

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
        """Seed 001: the work a crash would lose. Running: now − the latest checkpoint, or
        − the launch where the run started after it (a resumed run); dead: from then to when
        it was last seen running (what was lost);
        finished: 0; unknown or no checkpoint: None. `now` is the box's clock."""
        status, latest = self.status, self.latest_checkpoint
        if status == "finished":
            return 0.0
        if latest is None or status == "unknown":
            return None
        end = now if status == "running" else self.last_seen_running_at
        end = self.box_time if end is None else end
        # A run relaunched from its latest checkpoint has done only what it did since the
        # launch: that, not the time since the checkpoint was written, is what a crash loses.
        since = max(latest.mtime, self.started_after or latest.mtime)
        return None if end is None else max(0.0, end - since)

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


__all__ = [
    "CADENCE_CHECKPOINTS", "COMPACT_WORK", "FLEET_POINTS", "MAX_METRIC_TAGS", "MAX_POINTS",
    "MAX_RESTARTS", "MIN_POINTS", "SILENT_FACTOR", "STATUSES", "Point", "RunSeries",
    "TagSeries", "apply_budget", "completion_line", "decimate", "decimate_indices",
    "file_generation", "json_value", "points_share", "run_request", "run_status", "tag_names",
]
