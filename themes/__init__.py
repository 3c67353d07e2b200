"""gpuwatch.themes: the Textual themes gpuwatch registers at start, one file each.

Besides Textual's colour system every theme sets the series colours the plots read
(`SERIES_VARIABLES`): plots take their colours from the theme, never from hex codes in widgets
(STYLE 8), so every theme, user themes included, can recolour them.
"""

from __future__ import annotations

from textual.theme import Theme

from .dark import THEME as DARK
from .high_contrast import THEME as HIGH_CONTRAST
from .light import THEME as LIGHT
from .okabe_ito import THEME as OKABE_ITO
from .user import UserThemes, load_user_themes

DEFAULT_THEME = DARK.name

BUILTIN: tuple[Theme, ...] = (DARK, LIGHT, HIGH_CONTRAST, OKABE_ITO)
"""Registered at start, in the order `t` cycles through them."""

SERIES_VARIABLES: dict[str, str] = dict(DARK.variables)
"""The variables every theme provides (the dark theme's values are the fallback for themes
that leave one out: Textual's own themes, a user theme that sets only a few)."""

__all__ = ["BUILTIN", "DARK", "DEFAULT_THEME", "HIGH_CONTRAST", "LIGHT", "OKABE_ITO",
           "SERIES_VARIABLES", "UserThemes", "load_user_themes"]
