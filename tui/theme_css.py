"""What a theme change (`t`) costs Textual, cut to what the visible screen needs.

On each change of theme Textual parses the whole stylesheet again (Textual's widgets' CSS and
ours, about 25 ms here) and restyles every widget of every screen in the stack. Here the parsed
rules are kept per set of theme variables (`t` goes round a handful of themes), the next theme
of the cycle is parsed ahead, in the idle moment after a theme change or a host's first opening
(when every widget's CSS has been read), and the screens
under the visible one are restyled when they are next shown: they are KeptScreens
(screens/kept.py), which restyle on resume when the theme changed since they were styled.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.themes import DEFAULT_THEME
from textual.app import App, ScreenError
from textual.css.model import RuleSet
from textual.css.stylesheet import Stylesheet

from .screens.kept import KeptScreen
from .textual_compat import (
    lay_out_screen,
    mark_screen_restyled,
    stylesheet_variables,
    use_parsed_rules,
)

PREPARE_AFTER_S = 0.5
"""How long after a theme change (or a host's first opening) the next theme is parsed."""
PARSES_KEPT = 16
"""Parsed stylesheets kept (one a theme, and one more each time a new widget's CSS is added)."""


class ThemeStylesheet(Stylesheet):
    """Textual's stylesheet, its parses kept per (variables, sources)."""

    def __init__(self, *, variables: dict[str, str] | None = None) -> None:
        super().__init__(variables=variables)
        self._parsed: dict[tuple[object, ...], list[RuleSet]] = {}

    def _key(self, variables: dict[str, str]) -> tuple[object, ...]:
        return (tuple(sorted(variables.items())), tuple(self.source.items()))

    def _keep(self, key: tuple[object, ...], rules: list[RuleSet]) -> None:
        if len(self._parsed) >= PARSES_KEPT:
            del self._parsed[next(iter(self._parsed))]
        self._parsed[key] = rules

    def reparse(self) -> None:
        key = self._key(stylesheet_variables(self))
        rules = self._parsed.get(key)
        if rules is None:
            super().reparse()
            self._keep(key, self.rules)
            return
        use_parsed_rules(self, rules)

    def prepare(self, variables: dict[str, str]) -> None:
        """Parse the sources with these variables now, for a reparse with them to find."""
        key = self._key(variables)
        if key in self._parsed:
            return
        sheet = Stylesheet(variables=variables)
        for read_from, source in self.source.items():
            sheet.add_source(source.content, read_from=read_from,
                             is_default_css=source.is_defaults,
                             tie_breaker=source.tie_breaker, scope=source.scope)
        try:
            sheet.parse()
        except Exception:  # reparse will say what is wrong, when the theme is chosen
            return
        self._keep(key, sheet.rules)


class ThemeCssApp(App[None]):
    """An App whose theme changes restyle the visible screen only and find the next theme of
    the cycle parsed (the module says why)."""

    theme_names: list[str]
    """The themes `t` cycles through, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No source has been read yet (Textual reads the CSS when the app starts).
        self.stylesheet = ThemeStylesheet(variables=stylesheet_variables(self.stylesheet))
        self.theme_names = []

    def next_theme(self) -> str:
        names = self.theme_names or [DEFAULT_THEME]
        i = names.index(self.theme) if self.theme in names else -1
        return names[(i + 1) % len(names)]

    def prepare_next_theme(self) -> None:
        """The next theme's stylesheet parsed in a moment (after this key's repaint), so that
        `t` finds it parsed."""
        self.set_timer(PREPARE_AFTER_S, self._prepare_next_theme)

    def _prepare_next_theme(self) -> None:
        theme = self.get_theme(self.next_theme())
        if theme is None or not isinstance(self.stylesheet, ThemeStylesheet):
            return
        # As App.get_css_variables builds them for the theme on screen.
        variables = {**self.get_theme_variable_defaults(),
                     **{**theme.to_color_system().generate(), **theme.variables}}
        self.stylesheet.prepare(variables)

    def refresh_css(self, animate: bool = True) -> None:
        stylesheet = self.stylesheet
        stylesheet.set_variables(self.get_css_variables())
        stylesheet.reparse()
        stylesheet.update(self, animate=animate)
        try:
            if isinstance(self.screen, KeptScreen):
                self.screen.mark_styled()
            if self.screen.is_mounted:
                lay_out_screen(self.screen, self.size)
                mark_screen_restyled(self, self.screen)
        except ScreenError:
            pass
        for screen in self.screen_stack:
            if screen is not self.screen and not isinstance(screen, KeptScreen):
                stylesheet.update(screen, animate=animate)
                mark_screen_restyled(self, screen)
