"""gpuwatch-light: for light terminals (and daylight)."""

from textual.theme import Theme

THEME = Theme(
    name="gpuwatch-light",
    primary="#0969DA",
    secondary="#54AEFF",
    accent="#BF8700",
    warning="#9A6700",
    error="#CF222E",
    success="#1A7F37",
    foreground="#1F2328",
    background="#FFFFFF",
    surface="#F6F8FA",
    panel="#EAEEF2",
    dark=False,
    variables={
        # the footer's keys: readable on its panel, and far from a disabled key's grey
        "footer-key-foreground": "#7D4E00",
        "util": "#1A7F37",
        "sm-clock": "#0969DA",
        "power": "#9A6700",
        "temp": "#CF222E",
        "loss": "#0969DA",
        "loss-smooth": "#BC4C00",
        "restart": "#CF222E",
        "checkpoint": "#1A7F37",
        "vram": "#8250DF",
        "gauge-ok": "#1A7F37",
        "gauge-warn": "#9A6700",
        "gauge-bad": "#CF222E",
    },
)
