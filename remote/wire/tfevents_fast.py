"""The client's fast path for reading scalars from TensorBoard event files (Python 3.11).

``tfevents.read_scalars`` (stdlib, shipped to the box) decodes one record at a time, a few
microseconds each. Here the same loop runs, but at every record boundary a bulk matcher first
consumes as many records as it can that have the exact byte layout tensorboardX writes for
``add_scalar`` (a ``simple_value`` event):

    len(8) lencrc(4) | 09 wall(8) [10 step-varint] 2a s 0a v 0a n TAG 15 value(4) | crc(4)

with s = n + 9 and v = n + 7. One ``re.split`` over a 64 KiB window (cache-sized: larger
windows are slower) returns, per record, its header, data, wall time, step, tag literal, value
and stored CRC as byte strings in one C pass; everything after that is a handful of C-level
passes over lists (``map``, ``b"".join``, ``array``), not Python code per record.

Integrity is the general decoder's: a window's records are used only up to the first one that
fails any check, and that record is left to the general decoder (which reports it):
- the pieces tile the window from its start (every gap between matches is empty), so no match
  is taken from inside another record's payload;
- each record's 12 header bytes equal the header of its actual data length (length and
  length CRC), so the framing is the one the general decoder would walk;
- each record's data CRC (C ``crc32c``) matches; tags are only those the general decoder has
  already decoded as UTF-8 (it learns them), and the tag literal fixes s, v and n.
Steps are decoded for varints up to 3 bytes in bulk (steps < 2**21) and by the general
varint code otherwise (negative steps take 10 bytes). ``tests/test_tfevents.py`` checks with
hypothesis that both paths agree on generated streams, corrupt bytes included.
"""

from __future__ import annotations

import re
import struct
import time
from array import array
from collections.abc import Iterable
from itertools import compress, repeat
from typing import Any

from crc32c import crc32c

from ..box import tfevents, tfevents_proto

WINDOW_BYTES = 64 * 1024
MAX_TAGS = 512  # tags in the bulk matcher; more still decode, one record at a time
MAX_TAG_BYTES = 118  # keeps s = n + 9 and v = n + 7 one-byte varints
_K = 0xA282EAD8


class Series:
    """One tag's points in write order, as three parallel arrays."""

    __slots__ = ("steps", "values", "wall_times")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.wall_times = array("d")

    def __len__(self) -> int:
        return len(self.steps)

    def points(self) -> list[tuple[int, float, float]]:
        """[(step, value, wall_time), ...]: for tests and small outputs."""
        return list(zip(self.steps, self.values, self.wall_times, strict=True))


class _Headers(dict[int, bytes]):
    """data length -> the 12 header bytes a record of that length has."""

    def __missing__(self, length: int) -> bytes:
        head = struct.pack("<Q", length)
        head += struct.pack("<I", tfevents.masked_crc32c(head))
        self[length] = head
        return head


_HEADERS = _Headers()
_SELECTORS = tuple(b"\0" * i + b"\1" + b"\0" * (255 - i) for i in range(256))
"""_SELECTORS[i] translates a tag-id byte string into 1 where the id is i, else 0 (built once:
as 65,536 generator steps it took a small file's read 7 ms)."""


def _step_of(piece: bytes) -> int:
    """The step a step field (b"" or 0x10 + varint) holds, as the general decoder reads it."""
    if not piece:
        return 0
    value, _ = tfevents_proto._varint(piece, 1, len(piece))
    return tfevents_proto._signed64(value)


class ColumnSink:
    """Collects points per tag; ``append`` takes the general decoder's point tuples."""

    def __init__(self, tags: set[str] | None = None) -> None:
        self.series: dict[str, Series] = {}
        self.wanted = tags
        self.decoder = BulkDecoder(self)

    def append(self, point: tuple[str, int, float, float]) -> None:
        tag, step, value, wall = point
        self.decoder.learn(tag)  # learn every tag, wanted or not, so that all go the bulk way
        if self.wanted is not None and tag not in self.wanted:
            return
        series = self.series.get(tag)
        if series is None:
            series = self.series[tag] = Series()
        series.steps.append(step)
        series.values.append(value)
        series.wall_times.append(wall)


class BulkDecoder:
    """The bulk matcher for tensorboardX scalar records; learns tags as they are decoded."""

    def __init__(self, sink: ColumnSink) -> None:
        self.sink = sink
        self.tags: dict[bytes, str] = {}  # tag literal (2a s 0a v 0a n TAG 15) -> tag
        self.refused: set[str] = set()
        self.ids: dict[bytes, int] = {}  # tag literal -> one byte (only used with <= 8 tags)
        self.selectors = _SELECTORS
        self.pattern: re.Pattern[bytes] | None = None
        self.deadline_s: float | None = None

    def learn(self, tag: str) -> None:
        if tag in self.refused:
            return
        raw = tag.encode("utf-8")
        n = len(raw)
        literal = b"\x2a" + bytes((n + 9, 0x0A, n + 7, 0x0A, n)) + raw + b"\x15"
        if literal in self.tags:
            return
        if n > MAX_TAG_BYTES or len(self.tags) >= MAX_TAGS:
            self.refused.add(tag)
            return
        self.tags[literal] = tag
        self.ids[literal] = len(self.ids) % 256
        self.pattern = None

    def _compile(self) -> re.Pattern[bytes]:
        alternatives = b"|".join(re.escape(lit) for lit in self.tags)
        self.pattern = re.compile(
            rb"(.{12})(\x09(.{8})((?:\x10[\x80-\xff]{0,9}[\x00-\x7f])?)(" + alternatives
            + rb")(.{4}))(.{4})", re.DOTALL)
        return self.pattern

    def __call__(self, buf: bytes, pos: int, n: int, sink: Any) -> tuple[int, int]:
        """Consume the run of bulk-decodable records at buf[pos:n]: (new_pos, count)."""
        if not self.tags:
            return pos, 0
        pattern = self.pattern or self._compile()
        view = memoryview(buf)
        count = 0
        while pos < n:
            end = min(pos + WINDOW_BYTES, n)
            used, records, clean = self._window(pattern, view[pos:end])
            pos += used
            count += records
            if not clean or end == n:
                break  # a record the bulk matcher cannot take: the general decoder's turn
            if self.deadline_s is not None and time.monotonic() >= self.deadline_s:
                break
        return pos, count

    def _window(self, pattern: re.Pattern[bytes], window: memoryview) -> tuple[int, int, bool]:
        """Decode the leading run of good records: (bytes used, records, whole window used).

        The last piece may be a record cut by the window's end: that still counts as clean.
        """
        parts = pattern.split(window)
        gaps = parts[0::8]
        datas = parts[2::8]
        count = len(datas)
        if not count:
            return 0, 0, False
        good = count
        if any(gaps[:-1]):
            good = next(i for i, gap in enumerate(gaps) if gap)
        heads = parts[1::8]
        want = list(map(_HEADERS.__getitem__, map(len, datas)))
        if heads != want:
            good = min(good, _first_difference(heads, want))
        if tfevents._BIG_ENDIAN:  # pragma: no cover - the bulk masking assumes little-endian
            return 0, 0, False
        masked = _mask_all(array("I", map(crc32c, datas)).tobytes())
        stored = b"".join(parts[7::8])
        if masked != stored:
            good = min(good, _first_difference(array("I", masked), array("I", stored)))
        if good < count:
            if good == 0:
                return 0, 0, False
            datas = datas[:good]
            parts = parts[:8 * good + 1]
        walls = array("d", b"".join(parts[3::8]))
        values = array("f", b"".join(parts[6::8]))
        if tfevents._BIG_ENDIAN:
            walls.byteswap()
            values.byteswap()
        steps = _steps(parts[4::8])
        self._emit(parts[5::8], steps, values, walls)
        return sum(map(len, datas)) + 16 * len(datas), len(datas), good == count

    def _emit(self, literals: list[bytes], steps: array[int] | list[int],
              values: array[float], walls: array[float]) -> None:
        sink = self.sink
        wanted = sink.wanted
        ids = self.ids
        distinct = set(literals)
        period = len(distinct)
        if (1 < period < len(literals) and len(set(literals[:period])) == period
                and literals[period:] == literals[:-period]):
            # the tags take turns in one fixed order (a writer logging the same tags every
            # step): each tag's points are every period-th record, C slices
            for j in range(period):
                series = self._series(literals[j], wanted)
                if series is not None:
                    series.steps.extend(steps[j::period])
                    series.values.fromlist(values[j::period].tolist())  # float32 -> float64
                    series.wall_times.extend(walls[j::period])
            return
        if (len(distinct) == 1 or len(distinct) > 8
                or len({ids[x] for x in distinct}) < len(distinct)):
            groups: dict[bytes, Iterable[int] | None] = {}
            if len(distinct) == 1:
                groups[literals[0]] = None
            else:
                index: dict[bytes, list[int]] = {}
                for i, lit in enumerate(literals):
                    try:
                        index[lit].append(i)
                    except KeyError:
                        index[lit] = [i]
                groups.update(index)
            for lit, rows in groups.items():
                series = self._series(lit, wanted)
                if series is None:
                    continue
                if rows is None:
                    series.steps.extend(steps)
                    series.values.fromlist(values.tolist())
                    series.wall_times.extend(walls)
                else:
                    series.steps.extend(map(steps.__getitem__, rows))
                    series.values.extend(map(values.__getitem__, rows))
                    series.wall_times.extend(map(walls.__getitem__, rows))
            return
        # a few tags interleaved: one byte per record names its tag, and per tag a translate
        # turns that into a 0/1 selector for itertools.compress: all C loops
        tag_bytes = bytes(map(ids.__getitem__, literals))
        for lit in distinct:
            series = self._series(lit, wanted)
            if series is None:
                continue
            selector = tag_bytes.translate(self.selectors[ids[lit]])
            series.steps.extend(compress(steps, selector))
            series.values.extend(compress(values, selector))
            series.wall_times.extend(compress(walls, selector))

    def _series(self, literal: bytes, wanted: set[str] | None) -> Series | None:
        tag = self.tags[literal]
        if wanted is not None and tag not in wanted:
            return None
        series = self.sink.series.get(tag)
        if series is None:
            series = self.sink.series[tag] = Series()
        return series


def _first_difference(a: Iterable[Any], b: Iterable[Any]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def _steps(pieces: list[bytes]) -> array[int] | list[int]:
    """Decode step fields (b"" or 0x10 + varint) in bulk: 64-bit lanes of one big int."""
    if not pieces:
        return []
    n = len(pieces)
    raw = b"".join(map(bytes.ljust, pieces, _EIGHT, _ZERO))  # each field in a 64-bit lane
    if len(raw) != 8 * n:  # varints of 8+ bytes (steps >= 2**49, negative): one by one
        return [_step_of(p) for p in pieces]
    x = int.from_bytes(raw, "little")
    lanes = _STEP_LANES.get(n)
    if lanes is None:
        lanes = tuple(int.from_bytes(struct.pack("<Q", 0x7F << (7 * i)) * n, "little")
                      for i in range(7))
        if len(_STEP_LANES) > 64:
            _STEP_LANES.clear()
        _STEP_LANES[n] = lanes
    # varint byte i sits at bits 8 + 8i (after the key byte) and belongs at bits 7i
    out = 0
    for i, mask in enumerate(lanes):
        out |= (x >> (8 + i)) & mask
    return array("q", out.to_bytes(8 * n, "little"))


_STEP_LANES: dict[int, tuple[int, ...]] = {}
_EIGHT, _ZERO = repeat(8), repeat(b"\0")


def _mask_all(crcs: bytes) -> bytes:
    """TFRecord masking of many CRCs at once: `crcs` and the result are little-endian uint32s,
    worked on as 32-bit lanes of one big int (no Python loop). The rotation's bits that cross a
    lane are masked off; the addition goes in 16-bit halves, so no carry leaves its lane."""
    n = len(crcs) // 4
    lanes = _LANES.get(n)
    if lanes is None:
        lanes = tuple(int.from_bytes(struct.pack("<I", v) * n, "little")
                      for v in (0x1FFFF, 0xFFFE0000, 0xFFFF, _K & 0xFFFF, _K >> 16, 1))
        if len(_LANES) > 64:
            _LANES.clear()
        _LANES[n] = lanes
    low17, high15, half, delta_lo, delta_hi, one = lanes
    x = int.from_bytes(crcs, "little")
    x = ((x >> 15) & low17) | ((x << 17) & high15)  # rotate right by 15, in each lane
    lo = (x & half) + delta_lo  # at most 17 bits a lane
    hi = ((x >> 16) & half) + delta_hi + ((lo >> 16) & one)
    return ((lo & half) | ((hi & half) << 16)).to_bytes(4 * n, "little")


_LANES: dict[int, tuple[int, ...]] = {}


def read_columns(path: str, offset: int = 0, max_bytes: int = 1 << 62,
                 deadline_s: float | None = None, tags: set[str] | None = None,
                 ) -> tuple[dict[str, Series], int, list[dict[str, Any]], dict[str, Any]]:
    """``tfevents.read_scalars`` with the bulk path: ({tag: Series}, new_offset, errors, info).

    Same offsets, errors and info as the general decoder; points per tag in write order.
    """
    sink = ColumnSink(tags)
    sink.decoder.deadline_s = deadline_s
    _, new_offset, errors, info = tfevents.read_scalars(
        path, offset, max_bytes, deadline_s, None, sink=sink, fast=sink.decoder)
    return sink.series, new_offset, errors, info
