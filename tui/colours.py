"""Colours for Rich Text built in Python (table cells, plots): read from the theme's variables
(STYLE 8), never hard-coded, so `t` and user themes recolour everything."""

from __future__ import annotations

from gpuwatch.remote.model.finding import Severity
from textual.app import App
from textual.color import Color

from .format import RUN_GLYPH, SEVERITY_GLYPH, STATUS_GLYPH

__all__ = ["RUN_GLYPH", "SEVERITY_GLYPH", "STATUS_GLYPH", "colour", "contrast_ratio", "rgb",
           "severity_colour"]

SEVERITY_VARIABLE = {Severity.CRITICAL: "error", Severity.WARNING: "warning",
                     Severity.INFO: "primary"}
STATUS_VARIABLE = {"ok": "success", "stale": "warning", "unreachable": "error",
                   "waiting": "text-muted"}
RUN_WORDS = {"unknown": "not running"}
"""A run's status in words where the status's own name would read as jargon ("? unknown"): a
configured run gpuwatch never saw running is not called dead (it may not have started yet), but
it is not "not seen" either when its log, curves or checkpoints are there to see."""
RUN_VARIABLE = {"running": "success", "finished": "primary", "dead": "error",
                "unknown": "text-muted", "left behind": "warning"}


def colour(app: App[object], name: str) -> str:
    """A theme variable as a colour Rich understands (#rrggbb); muted grey if unknown."""
    variables = app.theme_variables
    if name == "text-muted":  # "auto 60%" in CSS; as a plain colour: 60 % fg over bg
        try:
            fg = Color.parse(variables.get("foreground", "#888888"))
            bg = Color.parse(variables.get("background", "#000000"))
            return bg.blend(fg, 0.6).hex6
        except Exception:
            return "grey50"
    value = variables.get(name)
    if value is None:
        return "grey50"
    try:
        return Color.parse(value).hex6
    except Exception:  # a variable such as "$text 60%" that is not a plain colour
        return "grey50"


def rgb(app: App[object], name: str) -> tuple[int, int, int]:
    """A theme variable as an (r, g, b) tuple, what plotext takes for 24-bit colour."""
    value = app.theme_variables.get(name)
    try:
        return Color.parse(value).rgb if value else (128, 128, 128)
    except Exception:
        return (128, 128, 128)


def severity_colour(app: App[object], severity: Severity) -> str:
    return colour(app, SEVERITY_VARIABLE[severity])


def contrast_ratio(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2's contrast ratio of two sRGB colours: 1 (the same) to 21 (black on white)."""

    def luminance(rgb: tuple[int, int, int]) -> float:
        def channel(v: int) -> float:
            c = v / 255
            return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
        r, g, b = rgb
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)

    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)
