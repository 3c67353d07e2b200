"""The validating reader under the probe's document (wire/document.py): its limits, and Node,
which reads a JSON value checking each field's kind and range, so a garbage document is a
ProbeError naming the place rather than a crash or a wrong number."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

PROBE_VERSION = 1

T = TypeVar("T")

# ---------------------------------------------------------------- limits on a box's document
# A box is not trusted: each limit is checked before the data is used (inflating, then a scan
# of the text, then json.loads), and a document over one is that host's ProbeError naming it.
# Each sits far above what the probe's own budgets produce (DEFAULT_LIMITS: a busy 8-GPU box
# with a run sends ~40 KB, under 300 containers and 4,000 values).

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""The largest document read, inflated (checked while inflating: a small zlib stream may
inflate to gigabytes)."""
MAX_DEPTH = 64
"""Nesting of objects and lists (the probe's documents nest 9 deep)."""
MAX_CONTAINERS = 250_000
"""Objects and lists in one document: ~70 bytes each once parsed (16 MiB of `{},` would be
400 MB)."""
MAX_VALUES = 2_000_000
"""Values in one document (commas): 16 MiB of `1.5,` parsed is 170 MB."""
MAX_STRING_BYTES = 256 * 1024
"""One string, as written in the document (the longest the probe sends: base64 raw event
records, 32 KiB)."""
MAX_NUMBER_DIGITS = 40
"""Digits in a row in one number (int64 has 19): Python reads a 4,000-digit int gladly."""
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Every integer field (int64: what SQLite and the series' columns hold)."""
FLOAT_MAX = 2.0**53
"""Every float field but scalar values: finite and within ±FLOAT_MAX (times, sizes and
percentages are all far inside; a value beyond it is the box's error, not a measurement)."""


# ---------------------------------------------------------------- validating reader

class BadDocument(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where, self.problem = where, problem


def kind_of(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not is_int(value):
        return f"an integer out of range ({len(str(abs(value)))} digits)"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            not is_number(value):
        return f"a number out of range ({value!r}; the limit is ±2^53)"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number")


def is_integer(value: object) -> bool:
    """An int of any size (JSON's true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    """An integer field's value: an int within int64."""
    return isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX


def is_str(value: object) -> bool:
    return isinstance(value, str)


def is_path(value: object) -> bool:
    """A path: a string, not empty (os.path calls on "" raise)."""
    return isinstance(value, str) and value != ""


def is_number(value: object) -> bool:
    """A numeric field's value: finite, within ±FLOAT_MAX (an int within int64 that far)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -FLOAT_MAX <= value <= FLOAT_MAX  # nan compares false; no int to float (overflow)


class Node:
    """A JSON object being read, with its place in the document for error messages."""

    __slots__ = ("data", "where")

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def child(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, test: Callable[[Any], bool], kind: str, optional: bool) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        if not test(value):
            raise BadDocument(self.child(key), f"expected {kind}, got {kind_of(value)}")
        return value

    def get_int(self, key: str) -> int:
        return int(self._get(key, is_int, "an integer", False))

    def opt_int(self, key: str) -> int | None:
        value = self._get(key, is_int, "an integer or null", True)
        return None if value is None else int(value)

    def opt_float(self, key: str) -> float | None:
        value = self._get(key, is_number, "a number or null", True)
        return None if value is None else float(value)

    def get_number(self, key: str) -> float:
        return float(self._get(key, is_number, "a number", False))

    def get_str(self, key: str) -> str:
        return str(self._get(key, is_str, "a string", False))

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, is_str, "a string or null", True)
        return None if value is None else str(value)

    def get_path(self, key: str) -> str:
        return str(self._get(key, is_path, "a path (a string, not empty)", False))

    def opt_path(self, key: str) -> str | None:
        value = self._get(key, is_path, "a path (a string, not empty) or null", True)
        return None if value is None else str(value)

    def get_bool(self, key: str) -> bool:
        return bool(self._get(key, lambda v: isinstance(v, bool), "a boolean", False))

    def opt_bool(self, key: str) -> bool | None:
        value = self._get(key, lambda v: isinstance(v, bool), "a boolean or null", True)
        return None if value is None else bool(value)

    def opt_list(self, key: str, test: Callable[[Any], bool], kind: str) -> tuple[Any, ...] | None:
        value = self._get(key, lambda v: isinstance(v, list), f"a list of {kind} or null", True)
        if value is None:
            return None
        if not all(map(test, value)):
            i, bad = next((i, v) for i, v in enumerate(value) if not test(v))
            raise BadDocument(f"{self.child(key)}[{i}]",
                              f"expected one of {kind}, got {kind_of(bad)}")
        return tuple(value)

    def node(self, key: str) -> Node:
        value = self._get(key, lambda v: isinstance(v, dict), "an object", False)
        return Node(value, self.child(key))

    def nodes(self, key: str) -> Iterator[Node]:
        items = self._get(key, lambda v: isinstance(v, list), "a list", True) or []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadDocument(f"{self.child(key)}[{i}]",
                                  f"expected an object, got {kind_of(item)}")
            yield Node(item, f"{self.child(key)}[{i}]")

    def counters(self, key: str) -> Mapping[str, int]:
        value = self._get(key, lambda v: isinstance(v, dict) and all(map(is_int, v.values())),
                          "an object of integers", False)
        return MappingProxyType(dict(value))

    def messages(self, key: str) -> Mapping[str, str]:
        value = self._get(key, lambda v: isinstance(v, dict) and all(map(is_str, v.values())),
                          "an object of messages", True)
        return MappingProxyType(dict(value or {}))

    def table(self, key: str) -> Iterator[Node]:
        """{"fields": [...], "rows": [[...], ...]} → one node per row."""
        tbl = self.node(key)
        fields = tbl._get("fields", lambda v: isinstance(v, list) and all(map(is_str, v)),
                          "a list of names", False)
        rows = tbl._get("rows", lambda v: isinstance(v, list), "a list", False)
        for i, row in enumerate(rows):
            where = f"{tbl.where}.rows[{i}]"
            if not isinstance(row, list) or len(row) != len(fields):
                raise BadDocument(where, f"expected a list of {len(fields)} values")
            yield Node(dict(zip(fields, row, strict=True)), where)
