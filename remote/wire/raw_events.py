"""Event-file records that a probe without the event decoder sent raw, decoded here.

In steady state a poll's probe goes without the TensorBoard event decoder (probe_bundle.
modules_for: about 4.6 KB of every poll's upload). The probe then walks each event file's
TFRecord framing from the client's offset by the lengths alone and sends the whole new records
as they are (probe.read_raw_records: "raw", base64; at most probe.RAW_CAP bytes a poll). This
module turns such an entry into the very entry the probe's decoder would have written
(probe.read_event_file), before the document is parsed (model.parse_probe_output), so that
nothing downstream (EventFile, RunSeries offsets, findings, the JSON report) tells them apart.

Integrity is the decoder's own: both CRCs of every record are checked here (tfevents.read_open
over the received bytes); a record whose data CRC fails is skipped and reported as the decoder
reports it on the box. The probe's walk trusts the lengths, so each length is checked against
its CRC first: from the first bad one on, nothing is decoded here, the offset stays there and
the entry says "bytes" (more to read), and the next poll ships the decoder, which
resynchronises as it always did (the same error at the same offset). The header of a record
cut short at the end of the file ("head") is checked too: a damaged length that points past the
end of the file would otherwise wait for ever as a live writer's unfinished record.
"""

from __future__ import annotations

import base64
import binascii
from types import ModuleType
from typing import Any

from ..model.series import RAW_CAP

__all__ = ["RAW_CAP", "decode_raw_entry", "expand_raw_events"]
ERRORS_PER_SOURCE = 8
"""probe.DEFAULT_LIMITS["errors_per_source"]: error messages kept per file."""


def _tfevents() -> ModuleType:
    from ..box import tfevents  # not on --once's start-up path: only when a raw entry comes

    return tfevents


def finite(value: Any) -> Any:
    """probe.finite: non-finite floats as "nan", "inf", "-inf"; floats to 9 digits."""
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return float(f"{value:.9g}")
    return value


def columns(points: list[tuple[str, int, float, float]]) -> dict[str, dict[str, list[Any]]]:
    """probe.columns(points, True) (tests hold them equal; the probe is no module of the
    client's): [(tag, step, value, wall), ...] → {tag: {"steps", "values", "wall_times"}}."""
    out: dict[str, dict[str, list[Any]]] = {}
    for tag, step, value, wall in points:
        col = out.get(tag)
        if col is None:
            col = out[tag] = {"steps": [], "values": [], "wall_times": []}
        col["steps"].append(step)
        col["values"].append(finite(value))
        col["wall_times"].append(round(wall, 3) if wall == wall else None)
    return out


class _Window:
    """The received bytes as the part of the file from `start` on (seek/read in file offsets)."""

    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.start, self.pos = data, start, 0

    def seek(self, at: int) -> None:
        self.pos = at - self.start

    def read(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += len(chunk)
        return chunk


def _framed(data: bytes) -> int:
    """How far the records of `data` hold together: the offset of the first record whose length
    fails its CRC (or does not fit), else len(data)."""
    tfevents, pos = _tfevents(), 0
    while pos + 12 <= len(data):
        length, stored = tfevents._HEADER.unpack_from(data, pos)
        if length >= tfevents.MAX_RECORD or not tfevents._length_crc_ok(data[pos:pos + 8], stored):
            return pos
        if pos + 16 + length > len(data):
            return pos
        pos += 16 + length
    return pos


def _head_ok(head: Any) -> bool:
    """Whether the header of the record cut short at the end of the file is a real one."""
    if not isinstance(head, str):
        return True  # fewer than 12 bytes there: the decoder waits for them too
    try:
        raw = base64.b64decode(head, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) < 12:
        return True
    tfevents = _tfevents()
    length, stored = tfevents._HEADER.unpack_from(raw, 0)
    return length < tfevents.MAX_RECORD and tfevents._length_crc_ok(raw[:8], stored)


def decode_raw_entry(entry: dict[str, Any],
                     errors_per_source: int = ERRORS_PER_SOURCE) -> dict[str, Any]:
    """A raw event-file entry of a probe document → the entry the decoder would have written."""
    out = {k: v for k, v in entry.items() if k not in ("raw", "head")}
    start, stopped, path = entry.get("start"), entry.get("stopped"), entry.get("path")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0 or \
            not isinstance(path, str):
        return {"path": str(path), "error": "raw event records without a start"}
    try:
        raw = entry.get("raw") or ""
        if not isinstance(raw, str):  # a number or a list: b64decode's TypeError
            raise ValueError
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return {"path": path, "error": "raw event records are not base64"}
    good = _framed(data)
    if good < len(data) or (stopped == "partial" and not _head_ok(entry.get("head"))):
        data, stopped = data[:good], "bytes"  # the decoder, shipped next poll, takes it on
    points, new_offset, errors, info = _tfevents().read_open(
        _Window(data, start), start + len(data), path, start, max_bytes=len(data) + 16)
    out.update({"start": start, "offset": new_offset, "stopped": stopped,
                "scalars": columns(points), "crc": info["crc"]})  # here, this side's CRC
    if info.get("first_wall_time") is not None:
        out["first_wall_time"] = round(info["first_wall_time"], 3)
    if errors:
        out["errors"] = [f"offset {e.get('offset')}: {e.get('message')}"
                         for e in errors[:errors_per_source]]
        out["error_count"] = len(errors)
    return out


def expand_raw_events(doc: Any) -> Any:
    """Every raw event-file entry of a probe document (configured and discovered runs) decoded
    in place; the document otherwise untouched."""
    if not isinstance(doc, dict):
        return doc
    for key in ("runs", "discovered"):
        runs = doc.get(key)
        if not isinstance(runs, list):
            continue
        for run in runs:
            events = run.get("events") if isinstance(run, dict) else None
            files = events.get("files") if isinstance(events, dict) else None
            if not isinstance(files, list):
                continue
            for i, entry in enumerate(files):
                if isinstance(entry, dict) and "raw" in entry:
                    files[i] = decode_raw_entry(entry)
    return doc
