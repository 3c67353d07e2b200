"""What the client keeps of one run between polls, as attributes, and what of it the store
keeps between `--once` runs (state, points_state) and reads back (from_state,
restore_points). The run's behaviour over those attributes is series.RunSeries."""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Self

from .death import MARKS
from .discovery import Discovery
from .snapshot import RunSample
from .tags import MAX_POINTS, MIN_POINTS, TagSeries

MAX_RESTARTS = 100


def run_status(pids: Sequence[int], done: bool | None, seen_running: bool) -> str:
    """running: processes alive. finished: the done marker exists and none are (seed 004).
    dead: seen running before (in this history or the store), now neither. unknown: never
    seen running and no marker (not started yet, or the `process` pattern matches nothing)."""
    if pids:
        return "running"
    if done:
        return "finished"
    return "dead" if seen_running else "unknown"


class RunState:
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
        self.discovery: Discovery | None = None  # a run nobody configured
        self.reaped = False
        """A discovered run whose only processes gpuwatch ended as VRAM zombies (a reap,
        actions.mark_reaped): gone, not a dead run (zombies.left_behind_runs), until it has
        processes again."""
        self.events_raw = False
        """The next poll may go without the event decoder (the probe sends new records
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
        self.pace_s: float | None = None
        """Seconds a step at the run's own recent pace: the median gap between its loss
        points' wall times (set each poll by the curves' rules; None without wall times)."""
        self.curves: Any = None
        """Its curves' trackers (findings.run_curves.RunCurves), made by the first evaluate."""
        self.curves_state: Any = None  # what the store kept of them, until then
        self.idle_at: float | None = None  # the box's clock at the latest poll without pids
        self.started_after: float | None = None
        """The latest poll without pids before the one that saw them: evidence of an end older
        than this is a previous launch's, not this one's."""

    # -- what the store keeps between `--once` runs
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
                "reaped": self.reaped, "end": self._end_state(),
                "curves": self.curves.state() if self.curves is not None else self.curves_state}

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
                   max_points: int = MAX_POINTS) -> Self:
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
        run.curves_state = state.get("curves")
        return run
