"""Screens kept between visits, and restyled only when the styles changed.

Opening a host used to build its HostScreen anew on every Enter: Textual composed, registered and
styled about 300 widgets (most of Enter's CPU), then restyled the whole screen again when it
resumed. Now each host's screen is built once and kept (installed) for the next visit, where its
panes are handed the host's data again only if that changed; the last KEEP hosts' screens are
kept, the one before is let go. A host the fleet's cursor rests on has its screen built ahead, so
that even its first Enter only lays it out and paints it.

Textual restyles every widget of a screen each time it resumes, in case the stylesheet changed
while it was away. The only thing that changes the stylesheet here is the theme (`t`, the app's
`theme`), so a kept screen resumes without the restyle when it was last styled in the theme that
is on now, and with it when not (also when Textual would not, as a modal closes: the app restyles
only the visible screen on a theme change, tui/theme_css.py); a screen's widgets are styled as
they mount, so a new screen skips it too. A class change in between (the host view's -wide /
-narrow) restyles what it touches by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import events
from textual.screen import Screen
from textual.timer import Timer

if TYPE_CHECKING:
    from textual.app import App

    from .host import HostScreen

KEEP = 8
"""Host screens kept between visits (each holds about 40 widgets and their drawings)."""
PREPARE_AFTER_S = 1.0
"""How long the fleet's cursor rests on a host before its screen is built ahead."""


class KeptScreen(Screen[None]):
    """A screen that resumes without Textual's full restyle when the theme is the one it was
    last styled in (the module's docstring says why that is enough)."""

    _styled_in: str | None = None

    def mark_styled(self) -> None:
        """Its widgets are (or are being) styled in the theme that is on now."""
        self._styled_in = self.app.theme

    def lay_out_ahead(self) -> None:
        """Built ahead, off the stack: lay it out at the app's size now (nothing is painted),
        so that its widgets learn their sizes, and size what they draw (the loss curve's
        points), before its first paint rather than just after it."""
        if not self.is_current and self.is_attached:
            self._refresh_layout(self.app.size)

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        # Runs before Screen's own handler (Textual dispatches down the MRO), which then
        # restyles or not as the event says (Textual says no when a modal closes: a theme
        # change under it, tui/theme_css.py, still restyles).
        event.refresh_styles = self._styled_in != self.app.theme
        self.mark_styled()


class HostViews:
    """One HostScreen per host, built on the first visit and kept for the next ones (the last
    KEEP hosts)."""

    def __init__(self, app: App[Any], make: type[HostScreen], keep: int = KEEP) -> None:
        self.app = app
        self.make = make
        self.keep = keep
        self._screens: dict[str, HostScreen] = {}  # least recently opened first
        self._timer: Timer | None = None

    def prepare_soon(self, host: str) -> None:
        """Build `host`'s screen ahead if the cursor rests on it (its first Enter then only
        lays it out and paints it)."""
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.app.set_timer(PREPARE_AFTER_S, lambda: self.prepare(host))

    def prepare(self, host: str) -> None:
        """Compose and mount `host`'s screen now, off the screen stack (as Textual does when
        a screen is pushed, less the showing)."""
        if host in self._screens or not self.app.is_running:
            return
        screen = self.get(host)
        self.app._load_screen_css(screen)
        self.app._register(self.app, screen)
        screen.call_later(screen.lay_out_ahead)

    def get(self, host: str) -> HostScreen:
        screen = self._screens.pop(host, None)
        if screen is None:
            screen = self.make(host)
            self.app.install_screen(screen, f"host:{host}")
        self._screens[host] = screen
        for name, old in list(self._screens.items()):
            if len(self._screens) <= self.keep:
                break
            if old is not screen and old not in self.app.screen_stack:
                del self._screens[name]
                self.app.uninstall_screen(old)
                if old.is_running:
                    old.remove()
        return screen
