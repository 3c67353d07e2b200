"""TextPane: a Static that repaints only when what it shows changed.

Textual's Static.update always asks for a new layout (its height may change), and a layout of
the host view re-renders every pane: n / N, which change only the run's panes, repainted the GPU,
disk and findings panes too, for the same text. The panes built from Text go through here."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class TextPane(Static):
    _shown: Text | None = None

    def show_text(self, text: Text) -> None:
        if self._shown is not None and text == self._shown:
            return
        self._shown = text
        self.update(text)
