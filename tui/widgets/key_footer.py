"""KeyFooter: Textual's Footer, rebuilt only when the keys it shows change, without the leak.

The app asks for a bindings refresh after every poll (a poll can enable `z` or `r`), and Textual's
Footer answers every such refresh by recomposing: a new FooterKey widget per key. Each FooterKey
binds `compact` to the footer (`data_bind`), which leaves a watcher entry on the footer that
Textual only prunes when `compact` changes, which it never does (Textual issue #6666). So each
old key widget, styles and caches included, stayed alive: at two polls a second plus 64 hosts
every 10 s that was ~190 leaked widgets a second, the whole of the soak's growing RSS.

Here a refresh recomposes only when what the footer shows (each key, its label, enabled or
not) differs from what it shows now, and after a recompose the watcher entries of key widgets
that are gone are dropped.

Where the keys do not fit the width (the host view at 80 columns), the least needed give way,
in GIVE_WAY's order, rather than the row being cut at its right edge: `?` (which lists every
key) and `q` always stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from ..textual_compat import (
    FooterKey,
    as_message_pump,
    drop_detached_watchers,
    mark_footer_bindings_ready,
    set_footer_key_disabled,
)

GIVE_WAY = ("replay", "jobs", "users", "cycle_theme", "axis", "logy", "smoothing(1)", "pause",
            "fold", "poll_now", "poll_here", "attention", "pane(0)", "ack", "pin", "tag(1)",
            "filter", "sort", "back")
"""Actions whose keys leave a footer too narrow for them, first to go first."""


class KeyFooter(Footer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: tuple[tuple[Any, ...], ...] | None = None
        self._composed_width = 0

    def bindings_changed(self, screen: Screen[Any]) -> None:
        mark_footer_bindings_ready(self)
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    def compose(self) -> ComposeResult:
        shown = list(super().compose())
        width = self.size.width or self.app.size.width
        self._composed_width = width
        keys = [w for w in shown if isinstance(w, FooterKey)]

        def need(widgets: Sequence[Widget]) -> int:
            return sum(cell_len(w.key_display) + 1 + cell_len(w.description) + 1
                       for w in widgets if isinstance(w, FooterKey))

        for action in GIVE_WAY:
            if need(keys) <= width:
                break
            keys = [k for k in keys if k.action != action]
        yield from (w for w in shown if not isinstance(w, FooterKey) or w in keys)

    async def show_keys_now(self) -> None:
        """Compose the keys now, for the screen's next paint (its first, when called as it
        resumes), rather than in a recompose after that paint (Textual's Footer composes
        nothing until the bindings change, so a new screen showed an empty footer first)."""
        mark_footer_bindings_ready(self)
        # Called from the screen's handler: Footer.compose's data_bind takes its parent from
        # Textual's current message pump, which must be this footer.
        with as_message_pump(self):
            await self._recompose_if_changed()

    def on_resize(self) -> None:
        if self.size.width == self._composed_width:
            return  # its first Resize, at the width it was composed for (the app's)
        self._shown = None  # another width: maybe more keys fit, maybe fewer
        self.call_after_refresh(self._recompose_if_changed)

    def _keys(self) -> tuple[tuple[Any, ...], ...]:
        """What compose would show: the shown bindings with their state, in order."""
        return tuple((binding.key, binding.action, binding.description, enabled, tooltip,
                      binding.group)
                     for _node, binding, enabled, tooltip in self.screen.active_bindings.values()
                     if binding.show)

    async def _recompose_if_changed(self) -> None:
        # Only the top screen's footer: the app's check_action answers for the top screen, so
        # a footer under it would show that screen's keys, and the key widgets it dropped would
        # stay in its screen's last layout until it is shown again. It catches up on resume.
        if not self.is_attached or not self.screen.is_active:
            return
        keys = self._keys()
        if keys == self._shown:
            return
        shown, self._shown = self._shown, keys
        if shown is not None and [k[:3] + k[4:] for k in keys] == [k[:3] + k[4:] for k in shown]:
            # Only which keys are enabled changed (n / N to a stopped run enables r): the key
            # widgets are told, not rebuilt (a rebuild was most of the cost of n).
            enabled = {(k[0], k[1]): k[3] for k in keys}
            for widget in self.query(FooterKey):
                set_footer_key_disabled(widget, not enabled.get((widget.key, widget.action), True))
            return
        await self.recompose()
        drop_detached_watchers(self)  # Textual #6666: those of the key widgets just dropped
