"""gpuwatch-okabe-ito: a colour-blind-safe palette (Okabe & Ito, "Color Universal Design",
2008): its eight colours stay distinct under protanopia, deuteranopia and tritanopia, so util
and SM clock, or good and bad, never hinge on telling red from green."""

from textual.theme import Theme

# Okabe–Ito: black #000000, orange #E69F00, sky blue #56B4E9, bluish green #009E73,
# yellow #F0E442, blue #0072B2, vermillion #D55E00, reddish purple #CC79A7.
THEME = Theme(
    name="gpuwatch-okabe-ito",
    primary="#56B4E9",
    secondary="#0072B2",
    accent="#E69F00",
    warning="#E69F00",
    error="#D55E00",
    success="#009E73",
    foreground="#F0F0F0",
    background="#101418",
    surface="#171C21",
    panel="#232A31",
    dark=True,
    variables={
        "util": "#009E73",
        "sm-clock": "#56B4E9",
        "power": "#E69F00",
        "temp": "#D55E00",
        "loss": "#56B4E9",
        "loss-smooth": "#E69F00",
        "restart": "#D55E00",
        "checkpoint": "#F0E442",
        "vram": "#CC79A7",
        "gauge-ok": "#009E73",
        "gauge-warn": "#E69F00",
        "gauge-bad": "#D55E00",
    },
)
