"""LossPane: a run's scalar series with its tag picker and the plot's settings.

Keys (bound on the host screen): `[` / `]` previous / next tag, `s` / `S` less / more EMA
smoothing (TensorBoard's debiased EMA), `l` log-y, `x` step or clock-time axis. A click on the
tag line cycles the tag too. Restarts (a run resumed from an earlier step) are vertical lines;
checkpoints (◆) and the findings its screen hands in that name a step (a NaN, a spike) are
marks on the curve. The series is decimated here (min/max per bucket, spikes kept) to about two
points per column before it reaches the plot, and only when it changed. Step ticks are whole
steps; the time axis is this computer's time of day.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from dataclasses import dataclass, replace

from gpuwatch.remote.model.series import RunSeries, TagSeries
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from ..colours import colour
from ..format import ema, step_ticks, time_ticks, visible
from .loss_plot import CHECKPOINT_MARK, LossPlot, LossSeries, Mark

SMOOTHING = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)
DEFAULT_SMOOTHING = 2  # 0.6, TensorBoard's default
_STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")
TICK_CELLS = 12
"""About one x tick per this many columns."""


@dataclass(frozen=True)
class StepMark:
    """A finding at a step of the run, as its screen hands it in: glyph and theme variable."""

    step: int
    glyph: str
    variable: str


@dataclass
class LossSettings:
    tag: str | None = None
    smoothing: int = DEFAULT_SMOOTHING
    logy: bool = False
    wall: bool = False


class LossPane(Vertical, can_focus=True):
    """The tag line and the plot of the selected run."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.settings = LossSettings()
        self.run: RunSeries | None = None
        self.step_marks: tuple[StepMark, ...] = ()
        self._key: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="loss-tags", markup=False)
        yield LossPlot(id="loss-plot")

    def on_click(self, event: object) -> None:
        widget = getattr(event, "widget", None)
        if widget is not None and widget.id == "loss-tags":
            self.cycle_tag(1)

    # -- what the screen calls ---------------------------------------------------------------
    def show_run(self, run: RunSeries | None, marks: tuple[StepMark, ...] = ()) -> None:
        self.run = run
        self.step_marks = marks
        self.redraw()

    def tags(self) -> list[str]:
        return sorted(self.run.series) if self.run is not None else []

    def current_tag(self) -> str | None:
        tags = self.tags()
        if not tags:
            return None
        if self.settings.tag not in tags:
            losses = [t for t in tags if "loss" in t.lower()]
            self.settings.tag = losses[0] if losses else tags[0]
        return self.settings.tag

    def cycle_tag(self, delta: int) -> None:
        tags = self.tags()
        if tags:
            current = self.current_tag()
            i = tags.index(current) if current in tags else 0
            self.settings.tag = tags[(i + delta) % len(tags)]
            self.redraw(force=True)

    def change_smoothing(self, delta: int) -> None:
        self.settings.smoothing = max(0, min(len(SMOOTHING) - 1,
                                             self.settings.smoothing + delta))
        self.redraw(force=True)

    def toggle_logy(self) -> None:
        self.settings.logy = not self.settings.logy
        self.redraw(force=True)

    def toggle_axis(self) -> None:
        self.settings.wall = not self.settings.wall
        self.redraw(force=True)

    # -- drawing -----------------------------------------------------------------------------
    def redraw(self, force: bool = False) -> None:
        if not self.is_mounted:
            return
        run, tag = self.run, self.current_tag()
        series = run.series.get(tag) if run is not None and tag is not None else None
        skipped = run.skipped_lines() if run is not None else {}
        key = (id(run), tag, len(series) if series else 0,
               series.last_step if series else None,
               len(run.restarts) if run else 0, len(run.checkpoint_times) if run else 0,
               self.settings.smoothing, self.settings.logy, self.settings.wall,
               tuple(skipped.values()), self.step_marks)
        if not force and key == self._key:
            return
        self._key = key
        if isinstance(self.parent, Widget):  # the pane's bottom border: lines not read
            self.parent.border_subtitle = skipped_note(skipped)
        self.query_one("#loss-tags", Static).update(self.tag_line(tag, series))
        # Prepared (decimated to the width, ticks) by the plot as it is drawn, and again when
        # its width changes: the first paint draws it at its laid-out width, once.
        settings, marks = replace(self.settings), self.step_marks  # as they are now
        self.query_one(LossPlot).show_for_width(
            lambda width: self.prepare(run, tag, series, width, settings, marks))

    def tag_line(self, tag: str | None, series: TagSeries | None) -> Text:
        s = self.settings
        text = Text(no_wrap=True, overflow="ellipsis")
        tags = self.tags()
        if tag is None:
            text.append("no scalars yet", style=colour(self.app, "text-muted"))
            return text
        text.append("◂ ", style=colour(self.app, "text-muted"))
        text.append(visible(tag), style=f"bold {colour(self.app, 'loss')}")  # box text
        text.append(f" ▸ ({tags.index(tag) + 1}/{len(tags)})",
                    style=colour(self.app, "text-muted"))
        if series is not None and series.last_step is not None:
            text.append(f"  step {series.last_step}  last {_num(series.last_value)}")
        text.append(f"  EMA {SMOOTHING[s.smoothing]:g}",
                    style=colour(self.app, "loss-smooth"))
        text.append(f"  {'log' if s.logy else 'lin'}-y  x: {'time' if s.wall else 'step'}",
                    style=colour(self.app, "text-muted"))
        return text

    def prepare(self, run: RunSeries | None, tag: str | None, series: TagSeries | None,
                width: int, s: LossSettings, step_marks: tuple[StepMark, ...]) -> LossSeries:
        if run is None or series is None or len(series) == 0:
            return LossSeries(message="no points yet", logy=s.logy)
        points = series.decimated(width)  # about 2 points per column, spikes kept
        walls = [p[2] for p in points]
        use_wall = s.wall and any(math.isfinite(w) for w in walls)
        xs = walls if use_wall else [float(p[0]) for p in points]
        raw = [p[1] for p in points]
        keep = [i for i, x in enumerate(xs) if math.isfinite(x)]
        xs, raw = [xs[i] for i in keep], [raw[i] for i in keep]
        smooth = ema(raw, SMOOTHING[s.smoothing]) if s.smoothing else []
        curve = smooth or raw

        def x_of(step: int | None, wall: float | None) -> float | None:
            if use_wall:
                return None if wall is None or not math.isfinite(wall) else wall
            return None if step is None else float(step)

        def y_at(x: float) -> float:
            """The curve's value at x (the nearest point at or after it)."""
            i = min(bisect_left(xs, x), len(xs) - 1)
            return curve[i] if xs else math.nan

        restarts = [x for st, w in run.restarts if (x := x_of(st, w)) is not None]
        marks: list[Mark] = []
        for path, mtime in run.checkpoint_times.items():
            x = x_of(_step_of(path, mtime, series), mtime)
            if x is not None:
                marks.append(Mark(x, y_at(x), CHECKPOINT_MARK, "checkpoint"))
        for m in step_marks:
            x = x_of(m.step, _wall_of(m.step, series))
            if x is not None:
                marks.append(Mark(x, y_at(x), m.glyph, m.variable))
        count = max(2, width // TICK_CELLS)
        ticks: list[float] = []
        labels: list[str] = []
        if xs and use_wall:
            ticks, labels = time_ticks(min(xs), max(xs), count)
        elif xs:
            steps = step_ticks(min(xs), max(xs), count)
            ticks, labels = [float(t) for t in steps], [str(t) for t in steps]
        legend = f"   {CHECKPOINT_MARK} checkpoint" if run.checkpoint_times else ""
        glyphs = dict.fromkeys(m.glyph for m in step_marks)
        if glyphs:
            legend += f"   {' '.join(glyphs)} finding"
        return LossSeries(xs=xs, raw=raw, smooth=smooth, restarts=restarts, marks=marks,
                          xticks=ticks, xlabels=labels, logy=s.logy,
                          xlabel=("time of day" if use_wall else "step") + legend)


def _wall_of(step: int, series: TagSeries) -> float | None:
    """When the series reached `step` (its first point at or after it)."""
    steps = series.steps
    if not len(steps):
        return None
    i = min(bisect_left(steps, step), len(steps) - 1)
    wall = series.walls[i]
    return wall if math.isfinite(wall) else None


def skipped_note(skipped: dict[str, tuple[int, str | None]]) -> Text | None:
    """"3 lines skipped in log.jsonl: not JSON: …" per metrics source that skipped some (box
    text, shown as data), or None."""
    notes = []
    for path, (count, reason) in skipped.items():
        if count:
            name = path.rstrip("/").rsplit("/", 1)[-1]
            note = f"{count} line{'s' if count != 1 else ''} skipped in {name}"
            notes.append(f"{note}: {reason}" if reason else note)
    return Text(visible("; ".join(notes))) if notes else None


def _step_of(path: str, mtime: float, series: TagSeries) -> int | None:
    """A checkpoint's step: the number in its name (checkpoint-1200), else the step the series
    had reached when the checkpoint was written."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    m = _STEP_IN_NAME.search(name)
    if m:
        return int(m.group(1))
    walls = series.walls
    if not len(walls) or not math.isfinite(walls[0]):
        return None
    i = bisect_left(walls, mtime)
    return series.steps[min(i, len(series.steps) - 1)]


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
