"""The one home of every private Textual API gpuwatch uses, each behind a public name here.

Textual is pinned to one minor series (pyproject.toml: the series
tests/tui/test_textual_compat.py passed on). That test names each internal below and fails, by
its name, when an upgrade renames, removes or changes the kind of one; it also fails when any
other module of the TUI reaches a private Textual name itself. An upgrade of the pin starts
there: where it fails, read what Textual does now and change the function here that relies on it.

The internals, and why each is needed:

- `App._exception` (`unhandled_exception`): Textual keeps the exception that ended the app but
  says only its return code; `gpuwatch` logs it and exits 70 (tui/cli/launch.py).
- `App._bindings.key_to_bindings` (`set_binding_description`): Textual has no public way to
  change the words of a binding while the app runs; the footer says "Resume" for `p` while
  polling is paused.
- `Stylesheet._variables`, `._rules`, `._rules_map`, `._require_parse`
  (`stylesheet_variables`, `use_parsed_rules`): the theme's stylesheet keeps what it parsed per
  theme (tui/theme_css.py) and hands a kept parse back to Textual as `Stylesheet.reparse` does
  with a fresh one.
- `App._css_update_count`, `Screen._css_update_count` (`mark_screen_restyled`): Textual restyles
  a screen as it is shown when its count lags the app's; a theme change that restyled the
  visible screen itself says so, as `App.refresh_css` does.
- `Screen._refresh_layout(size)` (`lay_out_screen`): lays a screen out at a size; a theme change
  and a screen built ahead, off the stack (tui/screens/kept.py), need it without a paint.
- `Screen._compositor.visible_widgets` (`visible_widgets`): the widgets a screen's first paint
  shows and their regions, rendered ahead into their own caches (tui/screens/kept.py).
- `App._load_screen_css(screen)`, `App._register(app, screen)` (`mount_off_stack`): what
  `App.push_screen` does to compose and mount a screen, less showing it (a host's screen built
  ahead, tui/screens/kept.py).
- `textual._context.active_message_pump` (`as_message_pump`): `Footer.compose` binds its keys to
  the current message pump, which must be the footer when it is composed from its screen's
  handler (tui/widgets/key_footer.py).
- `textual.widgets._footer.FooterKey` and `FooterKey._disabled` (`FooterKey`,
  `set_footer_key_disabled`): Textual exports no name for the footer's key widget; a footer whose
  keys only changed from enabled to greyed out tells its key widgets rather than building them
  anew (tui/widgets/key_footer.py).
- `Footer._bindings_ready` (`mark_footer_bindings_ready`): Footer composes nothing until it is
  set, which Textual does only in `Footer.bindings_changed`.
- the reactive machinery's `__watchers` entries on a watched node (`drop_detached_watchers`):
  Textual prunes a `data_bind` entry only when the bound value changes, so each FooterKey a
  recompose dropped stayed alive (Textual issue #6666).
- `LinuxDriver._sigtstp_application`, `._sigcont_application` (`SignalHooksDriver`): the
  driver's SIGTSTP / SIGCONT handlers, which Textual registers by these names; tui/driver.py
  resumes the terminal on SIGCONT only after a SIGTSTP.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from textual._context import active_message_pump
from textual.app import App
from textual.css.model import RuleSet
from textual.css.stylesheet import Stylesheet
from textual.geometry import Region, Size
from textual.message_pump import MessagePump
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

WATCHERS = "__watchers"
"""Where Textual's reactive machinery keeps `watch` / `data_bind` entries on the watched node."""


# -- the app ------------------------------------------------------------------------------------

def unhandled_exception(app: object) -> BaseException | None:
    """The first exception of the app's code that ended a Textual app (Textual printed it and
    set a non-zero return code), or None."""
    error = getattr(app, "_exception", None)
    return error if isinstance(error, BaseException) else None


# -- bindings -----------------------------------------------------------------------------------

def set_binding_description(app: App[Any], key: str, description: str) -> None:
    """The words the footer shows for the app's own bindings of `key` (not a screen's), then
    the footer told: `p` says "Resume" while polling is paused."""
    by_key = app._bindings.key_to_bindings
    by_key[key] = [replace(b, description=description) for b in by_key.get(key, [])]
    app.refresh_bindings()


# -- stylesheets and styling --------------------------------------------------------------------

def stylesheet_variables(sheet: Stylesheet) -> dict[str, str]:
    """The theme variables the stylesheet parses with now (Textual keeps no public copy)."""
    return sheet._variables


def use_parsed_rules(sheet: Stylesheet, rules: list[RuleSet]) -> None:
    """Make `rules`, parsed from the stylesheet's sources with its variables, its rules, as
    `Stylesheet.reparse` does with the rules it parses."""
    sheet._rules = rules
    sheet._rules_map = None
    sheet._require_parse = False


def mark_screen_restyled(app: App[Any], screen: Screen[Any]) -> None:
    """`screen` has been restyled with the app's stylesheet as it is now: Textual need not
    restyle it again when it is next shown."""
    screen._css_update_count = app._css_update_count


# -- screens ------------------------------------------------------------------------------------

def lay_out_screen(screen: Screen[Any], size: Size) -> None:
    """Lay `screen` out at `size` now (no paint)."""
    screen._refresh_layout(size)


def visible_widgets(screen: Screen[Any]) -> list[tuple[Widget, Region]]:
    """The widgets the screen's last layout shows, each with its region on the screen."""
    return [(widget, region)
            for widget, (region, _clip) in screen._compositor.visible_widgets.items()]


def mount_off_stack(app: App[Any], screen: Screen[Any]) -> None:
    """Compose and mount an installed `screen` as `App.push_screen` does, without pushing it:
    its CSS read, then the screen registered (which composes and mounts its widgets)."""
    app._load_screen_css(screen)
    app._register(app, screen)


# -- the footer ---------------------------------------------------------------------------------

@contextmanager
def as_message_pump(pump: MessagePump) -> Iterator[None]:
    """Within the block, Textual takes `pump` for the current message pump (what `data_bind`
    and `compose` read to find their parent)."""
    token = active_message_pump.set(pump)
    try:
        yield
    finally:
        active_message_pump.reset(token)


def set_footer_key_disabled(key: FooterKey, disabled: bool) -> None:
    """Grey out a footer key (or enable it), as FooterKey does when built so: what a click on
    it does and how it is drawn."""
    key._disabled = disabled
    key.set_class(disabled, "-disabled")


def mark_footer_bindings_ready(footer: Footer) -> None:
    """Let the footer compose its keys (Textual's Footer composes nothing before this)."""
    footer._bindings_ready = True


def drop_detached_watchers(node: Widget) -> None:
    """Forget the watcher entries on `node` (from `watch` or `data_bind`) whose watching node is
    no longer in the DOM (Textual issue #6666: they kept each one alive)."""
    watchers: dict[str, list[tuple[Any, Any]]] = getattr(node, WATCHERS, {})
    for entries in watchers.values():
        entries[:] = [(other, callback) for other, callback in entries
                      if other is node or getattr(other, "is_attached", True)]


# -- the terminal driver ------------------------------------------------------------------------

if sys.platform != "win32":  # Textual's LinuxDriver imports termios
    from textual.drivers.linux_driver import LinuxDriver

    class SignalHooksDriver(LinuxDriver):
        """Textual's LinuxDriver, whose SIGTSTP (Ctrl+Z) and SIGCONT (`fg`) handlers call
        `on_sigtstp` and `on_sigcont`, which do what Textual does (`textual_sigtstp`,
        `textual_sigcont`) until a subclass says otherwise."""

        def _sigtstp_application(self, *_args: Any) -> None:
            self.on_sigtstp()

        def _sigcont_application(self, *_args: Any) -> None:
            self.on_sigcont()

        def on_sigtstp(self) -> None:
            self.textual_sigtstp()

        def on_sigcont(self) -> None:
            self.textual_sigcont()

        def textual_sigtstp(self) -> None:
            """Textual's answer to SIGTSTP: the terminal given back, the process stopped here
            until SIGCONT."""
            LinuxDriver._sigtstp_application(self)

        def textual_sigcont(self) -> None:
            """Textual's answer to SIGCONT: the terminal taken again, output started."""
            LinuxDriver._sigcont_application(self)
