"""Values of a document read as what they should be, or absent: a string, a tuple of strings,
an int that fits SQLite, a finite float, a mapping. What the box sent (a discovery, a launch
record) is data of any shape; each field that is not what it should be reads as absent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


INT_MAX = 2**63 - 1
"""model.INT_MAX (model imports this module): an int field beyond int64 reads as absent (the
launch record's pid and start ticks go to SQLite)."""
FLOAT_MAX = 2.0**53
"""model.FLOAT_MAX: a float field that is not finite, or beyond it, reads as absent."""


def integer(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and \
        -INT_MAX - 1 <= value <= INT_MAX
    return value if ok else None


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        -FLOAT_MAX <= value <= FLOAT_MAX  # nan compares false: absent too
    return float(value) if ok else None
