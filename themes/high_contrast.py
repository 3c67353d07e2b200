"""gpuwatch-high-contrast: pure black and white with saturated accents, for low vision and
washed-out projectors."""

from textual.theme import Theme

THEME = Theme(
    name="gpuwatch-high-contrast",
    primary="#FFFF00",
    secondary="#00FFFF",
    accent="#FF00FF",
    warning="#FFFF00",
    error="#FF3030",
    success="#00FF00",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#1A1A1A",
    dark=True,
    luminosity_spread=0.3,
    text_alpha=1.0,
    variables={
        # the footer's keys: readable on its panel, and far from a disabled key's grey
        "footer-key-foreground": "#FFFF00",
        "util": "#00FF00",
        "sm-clock": "#00FFFF",
        "power": "#FFFF00",
        "temp": "#FF3030",
        "loss": "#FFFFFF",
        "loss-smooth": "#FFFF00",
        "restart": "#FF3030",
        "checkpoint": "#00FF00",
        "vram": "#FF00FF",
        "gauge-ok": "#00FF00",
        "gauge-warn": "#FFFF00",
        "gauge-bad": "#FF3030",
    },
)
