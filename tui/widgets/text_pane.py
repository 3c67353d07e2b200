"""TextPane: a Static whose text is built for the width it is painted at, and repainted only
when that text changed.

A pane that fits its text to its width (sparklines, gauges' bars, facts that give way) used to
build it when its data arrived, before the layout had given it a width, and again on the Resize
that came ~0.25 s after the first paint: the host view opened in one layout and reflowed into
another. Here the widget hands in a builder, `build(width) -> Text`, and Textual calls it while
it lays the pane out (`get_content_height` tells the width) and paints it, so the first paint is
at the final width. Textual's Static.update always asks for a new layout, which re-renders every
pane of the host view: the same text handed in again is ignored."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.geometry import Size
from textual.visual import VisualType
from textual.widgets import Static

Build = Callable[[int], Text]


class TextPane(Static):
    _build: Build | None = None
    _built: tuple[int, Text] | None = None
    _layout_width = 0

    @property
    def pane_width(self) -> int:
        """The width the text is built for: the laid-out width, or the one layout is trying."""
        return self.size.width or self._layout_width

    def show_built(self, build: Build) -> None:
        width = self.pane_width
        text = build(width) if width else None
        self._build = build
        if text is not None and self._built is not None and self._built == (width, text):
            return  # the same text: no layout, no repaint
        self._built = None if text is None else (width, text)
        self.clear_cached_dimensions()
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._layout_width = width
        return super().get_content_height(container, viewport, width)

    def render(self) -> VisualType:
        if self._build is None:
            return super().render()
        width = self.pane_width
        if self._built is None or self._built[0] != width:
            self._built = (width, self._build(width))
        return self._built[1]
