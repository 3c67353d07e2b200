"""gpuwatch-dark: the default, a dark theme for a terminal left open all night."""

from textual.theme import Theme

THEME = Theme(
    name="gpuwatch-dark",
    primary="#4C9BE8",
    secondary="#2D5F8B",
    accent="#F2A93B",
    warning="#F2A93B",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D8DEE4",
    background="#11151A",
    surface="#181D24",
    panel="#222A33",
    dark=True,
    variables={
        "util": "#57AB5A",        # GPU utilisation ("a kernel ran", U21)
        "sm-clock": "#4C9BE8",    # SM clock as % of max: the other half of U21
        "power": "#F2A93B",
        "temp": "#E5534B",
        "loss": "#6CB6FF",        # raw series
        "loss-smooth": "#F2A93B",  # EMA-smoothed series
        "restart": "#E5534B",     # a run resumed from an earlier step
        "checkpoint": "#57AB5A",
        "vram": "#B083F0",
        "gauge-ok": "#57AB5A",
        "gauge-warn": "#F2A93B",
        "gauge-bad": "#E5534B",
    },
)
