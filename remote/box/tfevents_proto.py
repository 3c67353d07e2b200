"""Minimal protobuf wire decoding of a TensorBoard Event, for tfevents.py (see its docstring:
the field numbers read, what counts as a scalar). Stdlib only, Python 3.6+: it goes to the box
with tfevents.py (bundle: the gpuwatch_tfevents part), installed before it.
"""

import struct

MYPY = False
if MYPY:  # pragma: no cover - typing names for the type comments; not imported on the box
    from collections.abc import Callable, Iterator  # noqa: F401 (used in type comments)
    from typing import Any  # noqa: F401

_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_F16 = struct.Struct("<e")

# TensorProto dtypes (tensorboard/compat/proto/types.proto)
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_BFLOAT16, DT_HALF = 1, 2, 3, 9, 14, 19
_FLOAT_DTYPES = (DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16)
_CONTENT_SIZE = {DT_FLOAT: 4, DT_DOUBLE: 8, DT_HALF: 2, DT_BFLOAT16: 2, DT_INT32: 4, DT_INT64: 8}

_EVENT_ONEOF_OTHERS = (3, 4, 6, 7, 8, 9)  # Event.what members other than summary (5)
_VALUE_ONEOF = (2, 3, 4, 5, 6, 8)  # Summary.Value.value members



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
