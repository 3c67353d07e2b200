"""Durations on the command line (`--since 8h`): a number and a unit, or several in a row from
the largest unit down (`1h30m`). Parsed strictly: anything else is an error that says what a
duration looks like. Textual-free, like every verb's module."""

from __future__ import annotations

import argparse
import math
import re

UNITS = {"w": 604_800, "d": 86_400, "h": 3600, "m": 60, "s": 1}
MAX_S = 10 * 365 * 86_400
"""Ten years: further back than any store keeps."""
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
HELP = "a number and a unit (s, m, h, d, w), such as 30m, 8h, 2d or 1h30m"


def parse_duration(text: str) -> float:
    """Seconds of a duration such as 30m, 8h, 2d, 1.5h or 1h30m. Raises ValueError saying
    what was wrong and what a duration looks like."""
    said = text.strip()
    if not said:
        raise ValueError(f"an empty duration: expected {HELP}")
    total, at, last = 0.0, 0, None
    for m in _PART.finditer(said):
        if m.start() != at:
            break
        unit = UNITS[m.group(2)]
        if last is not None and unit >= last:
            raise ValueError(f"{text!r}: units go from the largest down, each once "
                             f"(1h30m, not 30m1h): expected {HELP}")
        total += float(m.group(1)) * unit
        at, last = m.end(), unit
    if at != len(said) or last is None:
        raise ValueError(f"{text!r} is not a duration: expected {HELP}")
    if total <= 0:
        raise ValueError(f"{text!r}: a duration must be longer than 0")
    if not math.isfinite(total) or total > MAX_S:
        raise ValueError(f"{text!r}: at most 10 years back")
    return total


def duration_arg(text: str) -> float:
    """parse_duration for argparse (its error becomes a usage error, exit 64)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
