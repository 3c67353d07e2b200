"""Screens kept between visits, and restyled only when the styles changed.

Opening a host used to build its HostScreen anew on every Enter: Textual composed, registered and
styled about 300 widgets (most of Enter's CPU), then restyled the whole screen again when it
resumed. Now each host's screen is built once and kept (installed) for the next visit, where its
panes are handed the host's data again only if that changed; the last KEEP hosts' screens are
kept, the one before is let go. A host the fleet's cursor rests on has its screen built ahead, and
then the hosts in the rows around it, nearest first, one at a time, while there is room among the
kept screens (a guess never lets go of a screen the user opened), so that even a first Enter
(there, or a few rows up or down; in a fleet of up to KEEP hosts, anywhere) only lays it out
and paints it. Nothing is built ahead while a host's view is shown.

Textual restyles every widget of a screen each time it resumes, in case the stylesheet changed
while it was away. The only thing that changes the stylesheet here is the theme (`t`, the app's
`theme`), so a kept screen resumes without the restyle when it was last styled in the theme that
is on now, and with it when not (also when Textual would not, as a modal closes: the app restyles
only the visible screen on a theme change, tui/theme_css.py); a screen's widgets are styled as
they mount, so a new screen skips it too. A class change in between (the host view's -wide /
-narrow) restyles what it touches by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from textual import events, on
from textual.geometry import Region
from textual.screen import Screen
from textual.timer import Timer

from ..textual_compat import lay_out_screen, mount_off_stack, visible_widgets

if TYPE_CHECKING:
    from textual.app import App


KEEP = 8
"""Host screens kept between visits (each holds about 40 widgets and their drawings)."""
PREPARE_AFTER_S = 0.5
"""How long the fleet's cursor rests on a host before its screen is built ahead (and then its
neighbours' screens, one at a time)."""
BETWEEN_BUILDS_S = 0.05
"""The pause between two screens built ahead, for keys and polls to go first."""


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
            lay_out_screen(self, self.app.size)

    async def render_ahead(self, then: Callable[[], None] | None = None) -> None:
        """Built ahead and laid out: render what its first paint shows into the widgets' own
        caches, one widget at a time, the loop let go between two (the loss plot, the largest,
        takes about 20 ms), so that its first paint mostly puts those lines together. Textual's
        compositor renders each visible widget so (render_lines over its region). `then` is
        called at the end."""
        if self.is_current or not self.is_attached:
            if then is not None:
                then()
            return
        for widget, region in visible_widgets(self):
            if self.is_current or not self.is_attached:
                break
            if widget.is_attached:
                widget.render_lines(Region(0, 0, region.width, region.height))
            await asyncio.sleep(0)  # keys and polls go between two widgets
        if then is not None:
            then()

    @on(events.ScreenResume)
    def restyle_if_the_theme_changed(self, event: events.ScreenResume) -> None:
        # Runs before Screen's own handler (Textual calls each class's handlers, subclass
        # first), which then restyles or not as the event says (Textual says no when a modal
        # closes: a theme change under it, tui/theme_css.py, still restyles).
        event.refresh_styles = self._styled_in != self.app.theme
        self.mark_styled()


class HostViews:
    """One HostScreen per host, built on the first visit and kept for the next ones (the last
    KEEP hosts)."""

    def __init__(self, app: App[Any], make: Callable[[str], KeptScreen], keep: int = KEEP) -> None:
        self.app = app
        self.make = make
        self.keep = keep
        self._screens: dict[str, KeptScreen] = {}  # least recently opened first
        self._timer: Timer | None = None
        self._queue: list[str] = []
        """Hosts whose screens are to be built ahead, next first."""
        self._cursor: str | None = None
        """The host the fleet's cursor rests on: the only one built ahead even when that
        lets go of the least recently opened screen (a guess at the rows around it does
        not)."""

    def prepare_soon(self, host: str, around: Sequence[str] = ()) -> None:
        """Build `host`'s screen ahead if the cursor rests on it, then those of the hosts
        `around` it (the rows next to it: Down or Up and Enter finds them built), one at a
        time. A first Enter on a host built ahead only lays it out and paints it. The cursor
        moving on starts again from its new host; a build under way finishes first."""
        if self._timer is not None:
            self._timer.stop()
        self._cursor = host
        self._queue = [host, *around]
        self._timer = self.app.set_timer(PREPARE_AFTER_S, self._build_next)

    def cancel(self) -> None:
        """No more screens built ahead until the cursor moves or rests again (a build under
        way finishes)."""
        if self._timer is not None:
            self._timer.stop()
        self._queue = []

    def _build_next(self) -> None:
        cursor = self._cursor
        while self._queue:
            host = self._queue.pop(0)
            if host in self._screens:
                continue
            if host != cursor and len(self._screens) >= self.keep:
                self._queue = []  # a guess never lets go of a screen the user opened
                return
            self.prepare(host, then=self._built)
            return

    def _built(self) -> None:
        if self._queue:
            self._timer = self.app.set_timer(BETWEEN_BUILDS_S, self._build_next)

    def prepare(self, host: str, then: Callable[[], None] | None = None) -> None:
        """Compose and mount `host`'s screen now, off the screen stack (as Textual does when
        a screen is pushed, less the showing); `then` is called once it is laid out."""
        if host in self._screens or not self.app.is_running:
            return
        screen = self.get(host)
        mount_off_stack(self.app, screen)

        def lay_out() -> None:
            screen.lay_out_ahead()
            screen.call_later(screen.render_ahead, then)

        screen.call_later(lay_out)

    def get(self, host: str) -> KeptScreen:
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
