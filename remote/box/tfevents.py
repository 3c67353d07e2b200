"""Incremental scalar reader for TensorBoard event files: stdlib only, Python 3.6+.

This module is shipped to the box inside the probe (DESIGN §2), so it imports only the
stdlib, uses no syntax newer than 3.6, and is self-contained (no relative imports, no
``from __future__``): the probe bundle may inline its source. On the client the same code is
the general decoder behind ``tfevents_fast`` and the oracle the fast path is tested against.

File format (tensorflow/core/lib/io/record_writer.cc; tensorboard's summary/writer/
record_writer.py):
a sequence of TFRecords, each

    uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32); ``data`` is a
serialized ``tensorboard.Event`` (compat/proto/event.proto). Field numbers used here:

    Event:          wall_time 1 (double), step 2 (int64), oneof {file_version 3, graph_def 4,
                    summary 5, log_message 6, session_log 7, tagged_run_metadata 8,
                    meta_graph_def 9}, source_metadata 10
    Summary:        value 1 (repeated Value)
    Value:          tag 1, metadata 9 (SummaryMetadata), node_name 7, oneof {simple_value 2
                    (float), obsolete_old_style_histogram 3, image 4, histo 5, audio 6,
                    tensor 8 (TensorProto)}
    SummaryMetadata: plugin_data 1 -> PluginData.plugin_name 1
    TensorProto:    dtype 1, tensor_shape 2 (-> dim 2 -> size 1; unknown_rank 3),
                    tensor_content 4, float_val 5, double_val 6, int_val 7, int64_val 10,
                    half_val 13 (float16 bits in int32)

What counts as a scalar (as TensorBoard's data_compat + scalars plugin see it): a Value whose
oneof is ``simple_value``; or a ``tensor`` holding exactly one element when the metadata's plugin
is ``scalars`` (float, double, half, bfloat16, int32, int64) or absent (float types only; TF2
writes the metadata only with a tag's first event). Everything else (histograms, images,
audio, text and other plugin tensors, graphs, meta graphs, session logs) is skipped by length
without decoding its payload. Protobuf semantics are followed where a writer could differ:
a repeated singular message merges, the last scalar field wins, a later oneof member
replaces an earlier one, unknown fields and mismatched wire types are skipped.

Integrity (never turn a damaged record into a wrong value silently):
- the length CRC is checked for every record; on a mismatch the framing is unreliable, so the
  reader resynchronises: it scans forward for the next offset whose 8 length bytes (upper 4
  zero) match the CRC that follows them, reports one error for the skipped span, and goes on;
- the data CRC is checked for every record that is decoded, with the C ``crc32c`` package
  when it imports, else with the pure-Python table CRC here (about 10 MB/s; a 47-byte scalar
  record costs about 2 us to check, the same order as decoding it, so the box keeps full
  integrity and pays with throughput, which the byte and time budgets bound per poll);
- a record larger than ``LARGE_RECORD`` whose field headers show that it holds no scalar (an
  image, an audio clip, a big histogram, a graph) is skipped without reading its payload, so
  without a data CRC: nothing is reported from it, its framing is covered by the length CRC,
  and ``info["skipped_unread"]`` counts such records. A corrupted byte can therefore only
  hide a scalar inside such a record if it lands on one of the few header bytes walked, and
  then only when the record is larger than any scalar event a real writer produces.
- a record cut short at the end of the file (a live writer) is not an error: the offset stays
  before it and the next call reads it when it is complete.
"""

import os
import struct
import sys
import time
from array import array

MYPY = False
if MYPY:  # pragma: no cover - typing names for the type comments; not imported on the box
    from collections.abc import Callable, Iterator  # noqa: F401 (used in type comments)
    from typing import Any  # noqa: F401

try:  # the client depends on it; on a box it is there only by chance
    from crc32c import crc32c as _c_crc32c  # type: ignore[import-not-found,unused-ignore]
except Exception:  # ImportError, or an old/broken build
    _c_crc32c = None  # type: ignore[assignment]

CRC_IMPL = "c" if _c_crc32c is not None else "python"
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
LARGE_RECORD = 64 * 1024  # above this a record is classified from its headers before reading
RESYNC_MAX_BYTES = 16 * 1024 * 1024  # how far one resynchronisation scans before giving up
MAX_RECORD = 1 << 31  # protobuf messages are < 2 GiB; a larger length is corruption

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_HEADER = struct.Struct("<QI")
_U32_LE = struct.Struct("<I")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_F16 = struct.Struct("<e")
_BIG_ENDIAN = sys.byteorder == "big"

# TensorProto dtypes (tensorboard/compat/proto/types.proto)
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_BFLOAT16, DT_HALF = 1, 2, 3, 9, 14, 19
_FLOAT_DTYPES = (DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16)
_CONTENT_SIZE = {DT_FLOAT: 4, DT_DOUBLE: 8, DT_HALF: 2, DT_BFLOAT16: 2, DT_INT32: 4, DT_INT64: 8}

_EVENT_ONEOF_OTHERS = (3, 4, 6, 7, 8, 9)  # Event.what members other than summary (5)
_VALUE_ONEOF = (2, 3, 4, 5, 6, 8)  # Summary.Value.value members


# ---------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)

_T0 = []  # type: list
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _T0.append(_c)
del _i, _c
_T16 = []  # type: list  # slicing-by-4 with 16-bit tables, built on first long input


def _tables16():
    # type: () -> list[list[int]]
    if not _T16:
        t1 = [(c >> 8) ^ _T0[c & 0xFF] for c in _T0]
        t2 = [(c >> 8) ^ _T0[c & 0xFF] for c in t1]
        t3 = [(c >> 8) ^ _T0[c & 0xFF] for c in t2]
        # index = hi << 8 | lo: the first byte of each 16-bit half goes through the later table
        _T16.append([a ^ b for b in t2 for a in t3])
        _T16.append([a ^ b for b in _T0 for a in t1])
    return _T16


def crc32c_py(data, crc=0):
    # type: (bytes, int) -> int
    """CRC-32C of ``data`` in pure Python (about 10 MB/s): the stdlib has none."""
    c = crc ^ _U32
    n = len(data)
    k = n & ~3 if n >= 64 else 0
    t = _T0
    if k:
        lo, hi = _tables16()
        words = array("I", bytes(data[:k]))
        if _BIG_ENDIAN:
            words.byteswap()
        for w in words:
            x = w ^ c
            c = lo[x & 0xFFFF] ^ hi[x >> 16]
    for i in range(k, n):
        c = t[(c ^ data[i]) & 0xFF] ^ (c >> 8)
    return c ^ _U32


crc32c = _c_crc32c if _c_crc32c is not None else crc32c_py


def masked_crc32c(data):
    # type: (bytes) -> int
    """The CRC a TFRecord stores: CRC-32C rotated right by 15 bits plus 0xa282ead8."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & _U32


_LENGTH_CRC = {}  # type: dict  # length -> masked CRC of its 8 bytes: scalar events repeat few lengths


def _length_crc_ok(header8, stored):
    # type: (bytes, int) -> bool
    want = _LENGTH_CRC.get(header8)
    if want is None:
        want = masked_crc32c(header8)
        if len(_LENGTH_CRC) < 4096:
            _LENGTH_CRC[header8] = want
    return want == stored


# ---------------------------------------------------------------------------------------------
# Minimal protobuf wire decoding


class DecodeError(ValueError):
    """The record's bytes are not a well-formed Event."""


def _varint(buf, pos, end):
    # type: (bytes, int, int) -> tuple[int, int]
    if pos >= end:
        raise DecodeError("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def _skip(buf, pos, end, field, wire):
    # type: (bytes, int, int, int, int) -> int
    """Position after a field whose key has been read."""
    if wire == 0:
        _, pos = _varint(buf, pos, end)
        return pos
    if wire == 1:
        pos += 8
    elif wire == 2:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wire == 5:
        pos += 4
    elif wire == 3:  # a (deprecated) group: skip to its matching end-group key
        while True:
            key, pos = _varint(buf, pos, end)
            if key & 7 == 4:
                if key >> 3 != field:
                    raise DecodeError("mismatched end-group")
                return pos
            if key >> 3 == 0:
                raise DecodeError("field number 0")
            pos = _skip(buf, pos, end, key >> 3, key & 7)
    else:
        raise DecodeError(f"invalid wire type {wire}")
    if pos > end:
        raise DecodeError("truncated field")
    return pos


def _fields(buf, pos, end):
    # type: (bytes, int, int) -> Iterator[tuple[int, int, int, int]]
    """Yield (field, wire, start, stop) for each field of the message in buf[pos:end].

    For wire type 2, start..stop is the payload; otherwise it is the value's bytes.
    """
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field = key >> 3
        wire = key & 7
        if field == 0:
            raise DecodeError("field number 0")
        if wire == 2:
            n, start = _varint(buf, pos, end)
            pos = start + n
            if pos > end:
                raise DecodeError("truncated length-delimited field")
            yield field, 2, start, pos
        else:
            start = pos
            pos = _skip(buf, pos, end, field, wire)
            yield field, wire, start, pos


def _signed64(v):
    # type: (int) -> int
    return v - (1 << 64) if v >= (1 << 63) else v


def _plugin_name(buf, spans):
    # type: (bytes, list[tuple[int, int]]) -> str | None
    name = None
    for start, stop in spans:  # a repeated singular message merges: the last name wins
        for field, wire, s, e in _fields(buf, start, stop):
            if field == 1 and wire == 2:
                for f2, w2, s2, e2 in _fields(buf, s, e):
                    if f2 == 1 and w2 == 2:
                        name = bytes(buf[s2:e2]).decode("utf-8")
    return name


def _packed(buf, start, stop, wire, want_wire, fmt_size, unpack, out):
    # type: (bytes, int, int, int, int, int, Any, list[Any]) -> None
    """Append the values of a repeated numeric field, packed (wire 2) or not."""
    if wire == want_wire:
        out.append(unpack(buf, start)[0] if fmt_size else _varint(buf, start, stop)[0])
    elif wire == 2:
        if fmt_size:
            if (stop - start) % fmt_size:
                raise DecodeError("packed field length not a multiple of its width")
            for p in range(start, stop, fmt_size):
                out.append(unpack(buf, p)[0])
        else:
            p = start
            while p < stop:
                v, p = _varint(buf, p, stop)
                out.append(v)


def _unpack_f32(buf, pos):
    # type: (bytes, int) -> tuple[float]
    return _F32.unpack_from(buf, pos)


def _unpack_f64(buf, pos):
    # type: (bytes, int) -> tuple[float]
    return _F64.unpack_from(buf, pos)


def _half(bits):
    # type: (int) -> float
    return _F16.unpack(struct.pack("<H", bits & 0xFFFF))[0]


def _bfloat16(bits):
    # type: (int) -> float
    return _F32.unpack(struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def _tensor_scalar(buf, spans, plugin):
    # type: (bytes, list[tuple[int, int]], str | None) -> float | None
    """The single value of a scalar TensorProto, or None when it is not a scalar we report."""
    dtype = 0
    dims = []
    unknown_rank = False
    content = None
    floats = []  # type: list[Any]
    doubles = []  # type: list[Any]
    ints = []  # type: list[Any]  # int_val and half_val (both int32 varints)
    halfs = []  # type: list[Any]
    int64s = []  # type: list[Any]
    for start, stop in spans:
        for field, wire, s, e in _fields(buf, start, stop):
            if field == 1 and wire == 0:
                dtype = _varint(buf, s, e)[0]
            elif field == 2 and wire == 2:
                for f2, w2, s2, e2 in _fields(buf, s, e):
                    if f2 == 2 and w2 == 2:
                        size = 0
                        for f3, w3, s3, e3 in _fields(buf, s2, e2):
                            if f3 == 1 and w3 == 0:
                                size = _signed64(_varint(buf, s3, e3)[0])
                        dims.append(size)
                    elif f2 == 3 and w2 == 0:
                        unknown_rank = _varint(buf, s2, e2)[0] != 0
            elif field == 4 and wire == 2:
                content = bytes(buf[s:e])
            elif field == 5:
                _packed(buf, s, e, wire, 5, 4, _unpack_f32, floats)
            elif field == 6:
                _packed(buf, s, e, wire, 1, 8, _unpack_f64, doubles)
            elif field == 7:
                _packed(buf, s, e, wire, 0, 0, None, ints)
            elif field == 10:
                _packed(buf, s, e, wire, 0, 0, None, int64s)
            elif field == 13:
                _packed(buf, s, e, wire, 0, 0, None, halfs)
    if plugin is None:
        if dtype not in _FLOAT_DTYPES:
            return None
    elif dtype not in _CONTENT_SIZE:
        return None
    if unknown_rank:
        return None
    for d in dims:
        if d != 1:
            return None
    if content:
        if len(content) != _CONTENT_SIZE[dtype]:
            return None
        if dtype == DT_FLOAT:
            return _F32.unpack(content)[0]
        if dtype == DT_DOUBLE:
            return _F64.unpack(content)[0]
        if dtype == DT_HALF:
            return _F16.unpack(content)[0]
        if dtype == DT_BFLOAT16:
            return _bfloat16(struct.unpack("<H", content)[0])
        if dtype == DT_INT32:
            return float(struct.unpack("<i", content)[0])
        return float(struct.unpack("<q", content)[0])
    if dtype == DT_FLOAT:
        vals = floats
    elif dtype == DT_DOUBLE:
        vals = doubles
    elif dtype in (DT_HALF, DT_BFLOAT16):
        vals = [(_half if dtype == DT_HALF else _bfloat16)(v) for v in halfs]
    elif dtype == DT_INT32:
        vals = [float(_int32(v)) for v in ints]
    else:
        vals = [float(_signed64(v)) for v in int64s]
    if len(vals) != 1:
        return None  # no value (e.g. hparams' empty tensors) or not one element
    return vals[0]


def _int32(v):
    # type: (int) -> int
    v &= _U32
    return v - (1 << 32) if v >= (1 << 31) else v


def _summary_values(buf, start, stop, out):
    # type: (bytes, int, int, list[tuple[str, float]]) -> None
    """Append (tag, value) for each scalar Value of the Summary in buf[start:stop]."""
    for field, wire, s, e in _fields(buf, start, stop):
        if field != 1 or wire != 2:
            continue
        tag = b""
        kind = 0
        simple = 0.0
        tensor_spans = []  # type: list[tuple[int, int]]
        meta_spans = []
        for f2, w2, s2, e2 in _fields(buf, s, e):
            if f2 == 1 and w2 == 2:
                tag = buf[s2:e2]
            elif f2 == 2 and w2 == 5:
                simple = _F32.unpack_from(buf, s2)[0]
                kind = 2
            elif f2 == 8 and w2 == 2:
                if kind != 8:
                    tensor_spans = []
                kind = 8
                tensor_spans.append((s2, e2))
            elif f2 == 9 and w2 == 2:
                meta_spans.append((s2, e2))
            elif f2 in _VALUE_ONEOF and w2 == 2:
                kind = f2
        if kind == 2:
            value = simple
        elif kind == 8:
            plugin = _plugin_name(buf, meta_spans) if meta_spans else None
            if plugin == "":
                plugin = None
            if plugin is not None and plugin != "scalars":
                continue
            scalar = _tensor_scalar(buf, tensor_spans, plugin)
            if scalar is None:
                continue
            value = scalar
        else:
            continue
        try:
            out.append((bytes(tag).decode("utf-8"), value))
        except UnicodeDecodeError:
            raise DecodeError("tag is not UTF-8") from None


def decode_event(data):
    # type: (bytes) -> tuple[float, int, list[tuple[str, float]]]
    """Decode one serialized Event: (wall_time, step, [(tag, value), ...]) of its scalars.

    Raises DecodeError (a ValueError) when the bytes are not a well-formed Event.
    """
    buf = data if isinstance(data, bytes) else bytes(data)
    end = len(buf)
    wall = 0.0
    step = 0
    values = []  # type: list[tuple[str, float]]
    oneof = 0
    try:
        for field, wire, s, e in _fields(buf, 0, end):
            if field == 1 and wire == 1:
                wall = _F64.unpack_from(buf, s)[0]
            elif field == 2 and wire == 0:
                step = _signed64(_varint(buf, s, e)[0])
            elif field == 5 and wire == 2:
                if oneof != 5:
                    values = []
                oneof = 5
                _summary_values(buf, s, e, values)
            elif wire == 2 and field in _EVENT_ONEOF_OTHERS:
                oneof = field
                values = []
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise DecodeError(str(exc)) from exc
    return wall, step, values


def _may_hold_scalar(read, start, length):
    # type: (Callable[[int, int], bytes], int, int) -> bool
    """Whether the Event at file offset start (length bytes) may hold a scalar.

    Walks only field headers (reading a few bytes at a time through ``read(offset, n)``)
    so a multi-megabyte image or graph is classified without reading its payload. Any
    doubt answers True: the record is then read, CRC-checked and decoded in full.
    """
    try:
        end = start + length
        pos = start
        summaries = []  # type: list[tuple[int, int]]
        oneof = 0
        while pos < end:
            key, klen = _varint(read(pos, 10), 0, min(10, end - pos))
            pos += klen
            field, wire = key >> 3, key & 7
            if wire != 2:
                if wire not in (0, 1, 5):
                    return True
                head = read(pos, 10)
                pos = _skip(head, 0, len(head), field, wire) + pos
                continue
            n, nlen = _varint(read(pos, 10), 0, min(10, end - pos))
            pos += nlen
            if field == 5:
                if oneof != 5:
                    summaries = []
                oneof = 5
                summaries.append((pos, pos + n))
            elif field in _EVENT_ONEOF_OTHERS:
                oneof = field
                summaries = []
            pos += n
        if pos != end:
            return True
        for s_start, s_end in summaries:
            pos = s_start
            while pos < s_end:
                key, klen = _varint(read(pos, 10), 0, min(10, s_end - pos))
                pos += klen
                if key != 0x0A:  # not Summary.value: let the full decoder judge
                    return True
                n, nlen = _varint(read(pos, 10), 0, min(10, s_end - pos))
                pos += nlen
                if _value_may_hold_scalar(read, pos, pos + n):
                    return True
                pos += n
        return False
    except (DecodeError, struct.error, IndexError):
        return True


def _value_may_hold_scalar(read, start, end):
    # type: (Callable[[int, int], bytes], int, int) -> bool
    pos = start
    kind = 0
    meta = []
    while pos < end:
        key, klen = _varint(read(pos, 10), 0, min(10, end - pos))
        pos += klen
        field, wire = key >> 3, key & 7
        if wire != 2:
            return True  # simple_value (wire 5) or something unusual: decode it in full
        n, nlen = _varint(read(pos, 10), 0, min(10, end - pos))
        pos += nlen
        if field == 9:
            if n > 4096:
                return True
            meta.append(read(pos, n))
        elif field in _VALUE_ONEOF:
            kind = field
        pos += n
    if pos != end or kind == 2:
        return True
    if kind != 8:
        return False
    names = [_plugin_name(m, [(0, len(m))]) for m in meta]
    plugin = names[-1] if names else None
    return plugin in (None, "", "scalars")


# ---------------------------------------------------------------------------------------------
# Reading a file incrementally


def read_scalars(path, offset=0, max_bytes=DEFAULT_MAX_BYTES, deadline_s=None, tags=None,
                 sink=None, fast=None):
    # type: (str, int, int, float | None, set[str] | None, Any, Any) -> tuple[Any, int, list[dict[str, Any]], dict[str, Any]]
    """Read the scalars written to ``path`` from byte ``offset`` on.

    Returns ``(points, new_offset, errors, info)``:
    - points: [(tag, step, value, wall_time), ...] in write order (non-finite kept);
    - new_offset: the offset after the last complete record read (pass it back next time);
      a record a live writer has not finished is left for the next call, not an error;
    - errors: [{"file", "offset", "message"}, ...] for corrupt records, each skipped;
    - info: {"file", "size", "start", "offset", "bytes_read", "records", "skipped_unread",
      "stopped" ("eof" | "partial" | "bytes" | "time" | "shrunk"), "crc" ("c" | "python"),
      "first_wall_time" (when offset was 0 and the first record decoded, else None)}.

    ``max_bytes`` bounds the bytes read per call (a first load of a large file spreads
    over calls; one record larger than it is still read whole so that reading progresses);
    ``deadline_s`` (seconds, from time.monotonic) stops at the first record boundary after
    it, once at least one record was read (so reading always progresses). ``tags`` (a set)
    keeps only those tags. ``sink`` receives points through
    ``sink.append(point)`` instead of the returned list; ``fast(buf, pos, n, sink)`` may
    consume a run of records at ``pos`` and return the position after them (tfevents_fast).
    """
    with open(path, "rb") as f:
        return read_open(f, os.fstat(f.fileno()).st_size, path, offset, max_bytes, deadline_s,
                         tags, sink, fast)


def read_open(f, size, path, offset=0, max_bytes=DEFAULT_MAX_BYTES, deadline_s=None, tags=None,
              sink=None, fast=None):
    # type: (Any, int, str, int, int, float | None, set[str] | None, Any, Any) -> tuple[Any, int, list[dict[str, Any]], dict[str, Any]]
    """read_scalars on an open file `f` (seek, read) of `size` bytes, named `path`: the client
    decodes the records a probe without the decoder sent raw with it (raw_events.py)."""
    points = [] if sink is None else sink
    errors = []  # type: list[dict[str, Any]]
    info = {"file": path, "size": size, "start": offset, "offset": offset, "bytes_read": 0,
            "records": 0, "skipped_unread": 0, "stopped": "eof", "crc": CRC_IMPL,
            "first_wall_time": None}  # type: dict[str, Any]
    if offset > size:
        info["stopped"] = "shrunk"
        return points, offset, errors, info
    budget = max(int(max_bytes), 16)

    def read(at, n):
        # type: (int, int) -> bytes
        f.seek(at)
        return f.read(n)

    base = offset  # file offset of buf[0]
    buf = read(base, min(budget, size - base))
    budget -= len(buf)
    info["bytes_read"] += len(buf)
    n = len(buf)
    pos = 0
    records = 0
    stopped = "eof"
    while True:
        if fast is not None and pos < n and base + pos != 0:
            new_pos, count = fast(buf, pos, n, points)
            if count:
                records += count
                pos = new_pos
        if (deadline_s is not None and records and pos < n
                and time.monotonic() >= deadline_s):
            stopped = "time"
            break
        if pos + 12 > n:
            at_eof = base + n >= size
            stopped = ("eof" if pos == n else "partial") if at_eof else "bytes"
            break
        length, stored = _HEADER.unpack_from(buf, pos)
        if length >= MAX_RECORD or not _length_crc_ok(buf[pos:pos + 8], stored):
            pos, buf, n, extra = _resync(buf, pos, n, base, size, read, errors, path)
            info["bytes_read"] += extra
            continue
        rec_end = pos + 16 + length
        if base + rec_end > size:
            stopped = "partial"  # a live writer has not finished this record
            break
        if length > LARGE_RECORD and not _may_hold_scalar(read, base + pos + 12, length):
            info["skipped_unread"] += 1
            records += 1
            if rec_end > n:  # continue from a fresh buffer after the skipped payload
                base += rec_end
                buf = read(base, max(0, min(budget, size - base)))
                budget -= len(buf)
                info["bytes_read"] += len(buf)
                n = len(buf)
                pos = 0
            else:
                pos = rec_end
            continue
        if rec_end > n:
            if pos > 0:
                stopped = "bytes"
                break
            # one record bigger than the budget: read it whole so that reading progresses
            buf = buf + read(base + n, rec_end - n)
            info["bytes_read"] += len(buf) - n
            n = len(buf)
            budget = 0
        data_end = pos + 12 + length
        data = buf[pos + 12:data_end]
        if masked_crc32c(data) != _U32_LE.unpack_from(buf, data_end)[0]:
            errors.append({"file": path, "offset": base + pos,
                           "message": f"data CRC mismatch; record of {length} bytes skipped"})
            pos = rec_end
            continue
        try:
            wall, step, values = decode_event(data)
        except DecodeError as exc:
            errors.append({"file": path, "offset": base + pos,
                           "message": f"undecodable event ({exc}); record skipped"})
            pos = rec_end
            continue
        if base + pos == 0:
            info["first_wall_time"] = wall
        for tag, value in values:
            if tags is None or tag in tags:
                points.append((tag, step, value, wall))
        records += 1
        pos = rec_end
    new_offset = base + pos
    info["offset"] = new_offset
    info["records"] = records
    info["stopped"] = stopped
    return points, new_offset, errors, info


def _resync(buf, pos, n, base, size, read, errors, path):
    # type: (bytes, int, int, int, int, Callable[[int, int], bytes], list[dict[str, Any]], str) -> tuple[int, bytes, int, int]
    """After a bad length header at buf[pos]: the next offset whose header validates.

    Returns (pos, buf, n, extra_bytes_read). Scans at most RESYNC_MAX_BYTES, reading more of
    the file when the buffer ends first. Candidates are offsets whose length has its upper
    four bytes zero (no record is 4 GiB) and whose length CRC matches: a random 12-byte
    window passes with probability 2**-32 at most.
    """
    bad = pos
    extra = 0
    p = pos + 1
    limit = pos + RESYNC_MAX_BYTES
    while True:
        hit = buf.find(b"\x00\x00\x00\x00", p + 4)
        while hit != -1 and hit - 4 + 12 <= n:
            cand = hit - 4
            if cand >= p:
                length, stored = _HEADER.unpack_from(buf, cand)
                if length < MAX_RECORD and _length_crc_ok(buf[cand:cand + 8], stored):
                    errors.append({"file": path, "offset": base + bad,
                                   "message": f"length CRC mismatch; skipped {cand - bad} bytes "
                                   "to the next valid record"})
                    return cand, buf, n, extra
            hit = buf.find(b"\x00\x00\x00\x00", hit + 1)
        checked = max(p, n - 11)  # offsets below this were all tried
        if base + n >= size or checked >= limit:
            errors.append({"file": path, "offset": base + bad,
                           "message": "length CRC mismatch; no valid record in the next "
                           f"{checked - bad} bytes"})
            return checked, buf, n, extra
        more = read(base + n, min(1 << 20, size - base - n))
        if not more:
            return checked, buf, n, extra
        extra += len(more)
        p = checked
        buf = buf + more
        n = len(buf)


def iter_records(path):
    # type: (str) -> Iterator[tuple[int, bytes]]
    """Yield (offset, data) for each complete record (no CRC check): for tests and tools."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0
    while pos + 12 <= len(buf):
        length = _HEADER.unpack_from(buf, pos)[0]
        if pos + 16 + length > len(buf):
            return
        yield pos, buf[pos + 12:pos + 12 + length]
        pos += 16 + length


# ---------------------------------------------------------------------------------------------
# Several files of one run


def merge_series(files):
    # type: (list[tuple[str, float | None, list[tuple[str, int, float, float]]]]) -> tuple[dict[str, list[tuple[int, float, float]]], list[tuple[int, float]]]
    """Merge the scalars of one run's event files into one series per tag.

    ``files``: [(name, first_wall_time or None, points), ...] with points as read_scalars
    returns them. Files are ordered oldest first by first wall time (files without one, by
    name, after those with one... by name among equals). Where a newer file's series for a
    tag starts at step s, the older points of that tag at steps >= s are dropped (TensorBoard's
    purge of orphaned data after a restart from a checkpoint): the newer file wins where steps
    overlap, and a curve never shows an abandoned trajectory past the resume point.

    Returns (series, restarts): series = {tag: [(step, value, wall_time), ...]} by step
    (write order among equal steps of one file); restarts = [(step, wall_time), ...], one
    per file after the first that has points: where it took over.
    """
    def key(item):
        # type: (tuple[str, float | None, Any]) -> tuple[bool, float, str]
        name, first_wall, _ = item
        return (first_wall is None, first_wall if first_wall is not None else 0.0, name)

    ordered = sorted(files, key=key)
    series = {}  # type: dict
    restarts = []
    seen_points = False
    for _name, first_wall, points in ordered:
        if not points:
            continue
        per_tag = {}  # type: dict
        for tag, step, value, wall in points:
            per_tag.setdefault(tag, []).append((step, value, wall))
        if seen_points:
            first = min(points, key=lambda p: p[1])
            restarts.append((first[1], first_wall if first_wall is not None else points[0][3]))
        seen_points = True
        for tag, new in per_tag.items():
            new_first = min(p[0] for p in new)
            old = series.get(tag, [])
            kept = [p for p in old if p[0] < new_first]
            series[tag] = kept + sorted(new, key=lambda p: p[0])
    return series, restarts
