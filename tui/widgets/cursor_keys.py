"""The cursor keys users bring from vim, htop, k9s and lazygit, for the row tables: j / k down
and up, g / Home the first row, G / End the last. Textual's DataTable binds Home and End to the
first and last column, which a row table does not have."""

from __future__ import annotations

from textual.binding import Binding, BindingType

CURSOR_KEYS: list[BindingType] = [
    Binding("j", "cursor_down", "Down", show=False),
    Binding("k", "cursor_up", "Up", show=False),
    Binding("g,home", "scroll_top", "First", show=False),
    Binding("G,end", "scroll_bottom", "Last", show=False),
]
