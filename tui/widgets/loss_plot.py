"""LossPlot: a run's scalar series in plotext, raw and EMA-smoothed, with its marks. It is handed
an already-decimated series and its ticks (STYLE 9): `replot()` only draws.

Marks are points on the curve, never vertical lines, so that none looks like a grid line: ◆ a
checkpoint (at the loss when it was saved), a severity glyph a finding that names a step; a
restart (a run resumed from an earlier step) is the one vertical line, in its own colour."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from ..colours import rgb

CHECKPOINT_MARK = "◆"
DRAWN_KEPT = 4
"""Drawings kept: n / N back to a run (or a tag) drawn a moment ago reuse its drawing."""


@dataclass(frozen=True)
class Mark:
    """A point on the curve: where, which glyph, in which theme variable's colour."""

    x: float
    y: float
    glyph: str
    variable: str


@dataclass(frozen=True)
class LossSeries:
    """What the plot draws, prepared by the pane (decimated, smoothed, x chosen, ticks)."""

    title: str = ""
    xs: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    smooth: list[float] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    xticks: list[float] = field(default_factory=list)
    xlabels: list[str] = field(default_factory=list)
    xlabel: str = "step"
    logy: bool = False
    message: str = ""


class LossPlot(PlotextPlot):
    """Draws a LossSeries, prepared for its width when it is drawn (`show_for_width`)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.series = LossSeries()
        self._drawn: list[tuple[tuple[object, ...], Text]] = []
        self._source: Callable[[int], LossSeries] | None = None
        self._prepared_for: int | None = None

    def width_for_points(self) -> int:
        return max(20, self.size.width)

    def render(self) -> RenderResult:
        """plotext's drawing (about 25 ms for a 1,000-point curve), kept for the same series at
        the same size in the same theme. A series handed in as a function of the width is
        prepared here, at the width it is drawn at: a host view's first paint draws it once,
        at its laid-out width, rather than at a guess and again when the first Resize came."""
        width = self.width_for_points()
        if self._source is not None and self._prepared_for != width:
            self.series = self._source(width)
            self._prepared_for = width
            self._configure()
        key = (self.series, self.size, self.app.theme)
        for drawn_key, text in self._drawn:
            if drawn_key == key:
                return text.copy()
        drawn = super().render()
        if isinstance(drawn, Text):
            self._drawn = [(key, drawn.copy()), *self._drawn[:DRAWN_KEPT - 1]]
        return drawn

    def on_mount(self) -> None:
        super().on_mount()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.replot())
        self.replot()

    def show(self, series: LossSeries) -> None:
        self._source = None
        self.series = series
        self.replot()

    def show_for_width(self, source: Callable[[int], LossSeries]) -> None:
        """Draw source(width) from its next paint on, prepared again when the width changes."""
        self._source = source
        self._prepared_for = None
        self.refresh()

    def replot(self) -> None:
        self._configure()
        self.refresh()

    def _configure(self) -> None:
        s, plt = self.series, self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel(s.xlabel)
        if s.title:
            plt.title(s.title)
        xs, raw, smooth = s.xs, s.raw, s.smooth
        if s.logy:
            keep = [i for i, v in enumerate(raw) if math.isfinite(v) and v > 0]
            xs = [xs[i] for i in keep]
            raw = [raw[i] for i in keep]
            smooth = [smooth[i] for i in keep if i < len(smooth)]
            plt.yscale("log")
        else:
            plt.yscale("linear")
        finite = [i for i, v in enumerate(raw) if math.isfinite(v)]
        if not finite:
            plt.yscale("linear")  # plotext cannot draw an empty log scale (it raised TypeError)
            plt.title(s.message or s.title or "no points yet")
            return
        fx = [xs[i] for i in finite]
        plt.plot(fx, [raw[i] for i in finite], color=rgb(self.app, "loss"), marker="braille")
        if smooth and len(smooth) == len(raw):
            sf = [i for i in finite if math.isfinite(smooth[i])]
            plt.plot([xs[i] for i in sf], [smooth[i] for i in sf],
                     color=rgb(self.app, "loss-smooth"), marker="braille")
        lo, hi = min(fx), max(fx)
        for x in s.restarts:
            if lo <= x <= hi:
                plt.vline(x, rgb(self.app, "restart"))
        for mark in s.marks:
            if lo <= mark.x <= hi and math.isfinite(mark.y) and (mark.y > 0 or not s.logy):
                plt.scatter([mark.x], [mark.y], marker=mark.glyph,
                            color=rgb(self.app, mark.variable))
        if s.xticks:
            plt.xticks(s.xticks, s.xlabels or None)
