"""Screens kept between visits, and restyled only when the styles changed.

Opening a host used to build its HostScreen anew on every Enter: Textual composed, registered and
styled about 300 widgets (most of Enter's CPU), then restyled the whole screen again when it
resumed. Now each host's screen is built once and kept (installed) for the next visit, where its
panes are handed the host's data again only if that changed; the last KEEP hosts' screens are
kept, the one before is let go.

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

if TYPE_CHECKING:
    from textual.app import App

    from .host import HostScreen

KEEP = 8
"""Host screens kept between visits (each holds a few hundred widgets)."""


class KeptScreen(Screen[None]):
    """A screen that resumes without Textual's full restyle when the theme is the one it was
    last styled in (the module's docstring says why that is enough)."""

    _styled_in: str | None = None

    def mark_styled(self) -> None:
        """Its widgets are (or are being) styled in the theme that is on now."""
        self._styled_in = self.app.theme

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
