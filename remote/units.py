"""gpuwatch's one vocabulary for durations and sizes: every finding, toast, pane and verb says
"12 min" and "59.4 GiB" through these, so that a finding and the header never disagree on the
same figure (one said "12 min" where the other said "12 m"; the fleet said 159 GiB where the
GPU pane said 2 x 80).

Pure functions returning str; imports nothing of gpuwatch (it sits outside the layers, as
textsafe.py does), so the findings, the actions, the verbs and the TUI all use it.
"""

from __future__ import annotations

import math

__all__ = ["MIB", "duration", "mib", "mib_pair", "rate", "size"]

MIB = 1 << 20

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def duration(seconds: float | None) -> str:
    """5 s, 12 min, 2 h 10 min, 3.5 d: a span in the unit a person thinks in. Negative spans
    (a box's clock ahead of this one) read as 0 s; None or NaN as "?"."""
    if seconds is None or math.isnan(seconds):
        return "?"
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        h, m = divmod(int(s // 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    days = s / 86400
    return f"{days:.1f} d" if days < 10 else f"{days:.0f} d"


def size(n: float | None) -> str:
    """Bytes in the binary unit that shows them: 512 B, 130.5 KiB, 59.4 GiB, 3.5 TiB."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "?"
    value = float(n)
    for unit in _BINARY:
        if abs(value) < 1024 or unit == _BINARY[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def mib(n: float | None) -> str:
    """A figure the driver gives in MiB (VRAM) as size() says it: 60866 MiB is "59.4 GiB" in
    the fleet, the GPU pane, the process table and the kill dialog alike."""
    return "?" if n is None else size(n * MIB)


def mib_pair(used: float | None, total: float | None) -> str:
    """VRAM used of total, both from the driver's MiB, in the total's unit with three figures:
    "59.4/79.6 GiB" for one H100, "119/159 GiB" for two (2 x 79.6 GiB, never "2 x 80")."""
    if total is None:
        return "?"
    value = total * MIB
    unit = 0
    while abs(value) >= 1024 and unit < len(_BINARY) - 1:
        value /= 1024
        unit += 1
    places = 0 if unit == 0 or abs(value) >= 100 else 1
    scale = 1024 ** unit
    part = "?" if used is None else f"{used * MIB / scale:.{places}f}"
    return f"{part}/{value:.{places}f} {_BINARY[unit]}"


def rate(bytes_per_s: float | None) -> str:
    """A growth rate in the unit per hour a disk fills at: "12.3 GiB/h"."""
    if bytes_per_s is None:
        return "?"
    return f"{size(bytes_per_s * 3600)}/h"
