"""The event-file decoder: real writers in, TensorBoard's EventFileLoader as the oracle.

Files are written by tensorboardX's SummaryWriter and by TensorBoard's own EventFileWriter
(tensor-based scalars: float, double, half, bfloat16). Both gpuwatch paths (the stdlib one the
probe runs, and the client's bulk path) must read what the oracle reads, bit for bit, and must
agree with each other on anything, corrupt bytes included.
"""

from __future__ import annotations

import math
import os
import random
import struct
import time
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from gpuwatch.remote.box import tfevents
from gpuwatch.remote.wire import tfevents_fast
from harness.event_records import event_files, tensor_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_masked
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util
from tensorboardX import SummaryWriter

Point = tuple[str, int, float, float]

# --------------------------------------------------------------------------------- helpers


def oracle(path: Path) -> list[Point]:
    """What TensorBoard reads: scalars-plugin values after its compat layers."""
    out = []
    for event in EventFileLoader(str(path)).Load():
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name != "scalars":
                continue
            array = tensor_util.make_ndarray(value.tensor)
            if array.size != 1:  # a writer's mistake the scalars plugin cannot plot
                continue
            out.append((value.tag, event.step, float(array.item()), event.wall_time))
    return out


def general(path: Path, **kw: Any) -> tuple[list[Point], int, list[dict[str, Any]], dict]:
    return tfevents.read_scalars(str(path), max_bytes=1 << 40, **kw)


def per_tag(points: list[Point]) -> dict[str, list[tuple[int, float, float]]]:
    out: dict[str, list[tuple[int, float, float]]] = {}
    for tag, step, value, wall in points:
        out.setdefault(tag, []).append((step, value, wall))
    return out


def fast_per_tag(series: dict[str, tfevents_fast.Series]) -> dict[str, list]:
    return {tag: s.points() for tag, s in series.items()}


def bits(v: float) -> bytes:
    """Compare values bit-exactly (nan == nan)."""
    return struct.pack("<d", v)


def assert_same_points(got: list[Point], want: list[Point]) -> None:
    assert [(t, s, bits(v), w) for t, s, v, w in got] == \
        [(t, s, bits(v), w) for t, s, v, w in want]


def assert_paths_agree(path: Path, **kw: Any) -> tuple[list[Point], int, list, dict]:
    """The bulk path returns what the general one does (points per tag, offset, errors)."""
    points, offset, errors, info = tfevents.read_scalars(str(path), **kw)
    series, f_offset, f_errors, f_info = tfevents_fast.read_columns(str(path), **kw)
    assert (f_offset, f_errors) == (offset, errors)
    assert {k: [(s, bits(v), w) for s, v, w in pts] for k, pts in fast_per_tag(series).items()} \
        == {k: [(s, bits(v), w) for s, v, w in pts] for k, pts in per_tag(points).items()}
    assert f_info == info
    return points, offset, errors, info


def frame(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return (head + struct.pack("<I", tfevents.masked_crc32c(head)) + data
            + struct.pack("<I", tfevents.masked_crc32c(data)))


def scalar_event(tag: str, step: int, value: float, wall: float) -> bytes:
    """The bytes tensorboardX writes for add_scalar."""
    return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])).SerializeToString()


def scalars_metadata() -> summary_pb2.SummaryMetadata:
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


# ----------------------------------------------------------------------------------- CRC


def test_crc_matches_tensorboard_and_c() -> None:
    for n in (0, 1, 7, 8, 63, 64, 65, 1000):
        data = os.urandom(n)
        assert tfevents.crc32c_py(data) == crc32c.crc32c(data)
        assert tfevents.masked_crc32c(data) == tb_masked(data)


@given(st.binary(max_size=300))
def test_pure_python_crc_is_crc32c(data: bytes) -> None:
    assert tfevents.crc32c_py(data) == crc32c.crc32c(data)


# ----------------------------------------------------------------- real writers vs oracle


@pytest.fixture
def tbx_run(tmp_path: Path) -> Path:
    w = SummaryWriter(str(tmp_path / "run"))
    rng = np.random.default_rng(0)
    for step in range(60):
        w.add_scalar("train/loss", 1.0 / (step + 1), step)
        w.add_scalar("lr", 0.1 * 0.99 ** step, step, walltime=1.7e9 + step)
        if step % 10 == 0:
            w.add_histogram("weights", rng.normal(size=500), step)
            w.add_image("sample", rng.random((3, 8, 8)), step)
            w.add_text("note", f"step {step}", step)
            w.add_scalars("acc", {"train": step / 60, "val": step / 70}, step)
    w.add_scalar("weird", float("nan"), 60)
    w.add_scalar("weird", float("inf"), 61)
    w.add_scalar("weird", float("-inf"), 62)
    w.add_scalar("weird", -0.0, 63)
    w.add_scalar("big_step", 1.0, 2 ** 40)
    w.add_scalar("neg_step", 2.0, -3)
    w.add_scalar("unicode/ñ✓", 3.0, 1)
    w.close()
    return tmp_path / "run"


def test_tensorboardx_files_match_the_oracle(tbx_run: Path) -> None:
    files = event_files(tbx_run)
    assert len(files) == 3  # the run and add_scalars' two sub-runs
    total = 0
    for path in files:
        want = oracle(path)
        points, offset, errors, info = assert_paths_agree(path)
        assert_same_points(points, want)
        assert errors == [] and offset == path.stat().st_size and info["stopped"] == "eof"
        assert info["first_wall_time"] is not None
        total += len(points)
    assert total == 60 * 2 + 6 * 2 + 7


def test_tensorboard_tensor_scalars_match_the_oracle(tmp_path: Path) -> None:
    w = EventFileWriter(str(tmp_path))
    shape1 = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])
    w.add_event(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2"))
    for step in range(5):
        x = 1.0 / 3 + step
        protos = {
            "f32": tensor_util.make_tensor_proto(np.float32(x)),
            "f64": tensor_util.make_tensor_proto(np.float64(x)),
            "f16": tensor_util.make_tensor_proto(np.float16(x)),
            "f32_val": tensor_pb2.TensorProto(dtype=1, float_val=[x]),
            "f64_val": tensor_pb2.TensorProto(dtype=2, double_val=[x], tensor_shape=shape1),
            "f16_val": tensor_pb2.TensorProto(
                dtype=19, half_val=[int(np.float16(x).view(np.uint16))]),
            "i64": tensor_pb2.TensorProto(dtype=9, int64_val=[-7 - step]),
        }
        for tag, proto in protos.items():
            w.add_event(tensor_event(tag, step, proto, 10.0 + step))
        # not scalars: a text tensor, a histogram-plugin tensor, a vector under "scalars"
        w.add_event(tensor_event("text", step, tensor_util.make_tensor_proto("hi"), 1, "text"))
        w.add_event(tensor_event("h", step, tensor_util.make_tensor_proto(
            np.ones((3, 3), np.float32)), 1, "histograms"))
        w.add_event(tensor_event("vec", step, tensor_util.make_tensor_proto(
            np.ones(2, np.float32)), 1))
    w.close()
    (path,) = event_files(tmp_path)
    want = oracle(path)
    points, _, errors, _ = assert_paths_agree(path)
    assert errors == []
    assert_same_points(points, want)
    assert {p[0] for p in points} == {"f32", "f64", "f16", "f32_val", "f64_val", "f16_val", "i64"}


def test_bfloat16_and_metadata_only_first_and_oneof_semantics(tmp_path: Path) -> None:
    bf = struct.unpack("<I", struct.pack("<f", 1.5))[0] >> 16
    events = [
        tensor_event("bf16", 1, tensor_pb2.TensorProto(dtype=14, half_val=[bf]), 1.0),
        # TF2 writes the metadata with a tag's first event only
        tensor_event("tf2", 1, tensor_util.make_tensor_proto(np.float32(2.5)), 1.0),
        tensor_event("tf2", 2, tensor_util.make_tensor_proto(np.float32(3.5)), 2.0, None),
    ]
    raw = b"".join(frame(e.SerializeToString()) for e in events)
    # a summary replaced by a later oneof member (file_version) yields nothing
    replaced = scalar_event("gone", 1, 1.0, 1.0) + event_pb2.Event(
        file_version="x").SerializeToString()
    raw += frame(replaced)
    path = tmp_path / "events.out.tfevents.1"
    path.write_bytes(raw)
    points, _, errors, _ = assert_paths_agree(path)
    assert errors == []
    assert points == [("bf16", 1, 1.5, 1.0), ("tf2", 1, 2.5, 1.0), ("tf2", 2, 3.5, 2.0)]


def test_large_image_is_skipped_without_reading_it(tmp_path: Path) -> None:
    w = SummaryWriter(str(tmp_path))
    w.add_scalar("a", 1.0, 1)
    w.add_image("big", np.random.default_rng(1).random((3, 256, 256)), 1)
    w.add_scalar("a", 2.0, 2)
    w.close()
    (path,) = event_files(tmp_path)
    points, offset, errors, info = assert_paths_agree(path, max_bytes=4096)
    assert info["skipped_unread"] == 1 and info["bytes_read"] <= 4096
    assert info["stopped"] == "bytes"  # the budget was spent before the skipped image
    rest, offset, errors2, _ = assert_paths_agree(path, offset=offset, max_bytes=4096)
    assert_same_points(points + rest, oracle(path))
    errors += errors2
    assert errors == [] and offset == path.stat().st_size


# ---------------------------------------------------------------------- incremental reads


def _records(tmp_path: Path, n: int = 6) -> tuple[Path, bytes, list[int]]:
    w = SummaryWriter(str(tmp_path))
    for i in range(n):
        w.add_scalar("loss", i * 0.5, i)
    w.close()
    (path,) = event_files(tmp_path)
    raw = path.read_bytes()
    return path, raw, [off for off, _ in tfevents.iter_records(str(path))]


def test_cut_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    path, raw, starts = _records(tmp_path)
    last = starts[-1]
    for cut in range(last, len(raw)):
        path.write_bytes(raw[:cut])
        points, offset, errors, info = assert_paths_agree(path)
        assert errors == [] and offset == last, cut
        assert [p[1] for p in points] == [0, 1, 2, 3, 4]
        assert info["stopped"] == ("eof" if cut == last else "partial")
        with path.open("ab") as f:  # the writer finishes the record
            f.write(raw[cut:])
        more, offset2, errors2, _ = assert_paths_agree(path, offset=offset)
        assert errors2 == [] and offset2 == len(raw) and [p[1] for p in more] == [5]


def test_budget_spreads_a_first_load_over_calls(tmp_path: Path) -> None:
    path, raw, _ = _records(tmp_path, 200)
    everything = general(path)[0]
    for reader in ("general", "fast"):
        offset, got, calls = 0, [], 0
        while True:
            if reader == "general":
                points, offset, errors, info = tfevents.read_scalars(str(path), offset, 1000)
            else:
                series, offset, errors, info = tfevents_fast.read_columns(str(path), offset, 1000)
                points = [("loss", *p) for p in series["loss"].points()] if series else []
            got += points
            calls += 1
            assert errors == [] and info["bytes_read"] <= 1000
            if info["stopped"] != "bytes":
                break
        assert got == everything and calls > 5 and offset == len(raw)


def test_deadline_stops_at_a_record_boundary_but_progresses(tmp_path: Path) -> None:
    path, raw, starts = _records(tmp_path, 50)
    points, offset, _, info = tfevents.read_scalars(str(path), 0, deadline_s=time.monotonic() - 1)
    assert info["stopped"] == "time" and offset in starts and offset > 0
    rest, end, _, _ = tfevents.read_scalars(str(path), offset)
    assert len(points) + len(rest) == 50 and end == len(raw)


def test_appended_events_are_read_from_the_saved_offset(tmp_path: Path) -> None:
    path, _raw, _ = _records(tmp_path, 10)
    _, offset, _, _ = general(path)
    with path.open("ab") as f:
        f.write(frame(scalar_event("loss", 10, 5.0, 1.0)))
    points, end, _errors, info = assert_paths_agree(path, offset=offset)
    assert points == [("loss", 10, 5.0, 1.0)] and info["bytes_read"] == end - offset


def test_shrunk_file_is_reported(tmp_path: Path) -> None:
    path, raw, _ = _records(tmp_path)
    _, _, _, info = tfevents.read_scalars(str(path), len(raw) + 10)
    assert info["stopped"] == "shrunk"


# ------------------------------------------------------------------------------ corruption


def test_a_flipped_data_byte_loses_that_record_only(tmp_path: Path) -> None:
    path, raw, starts = _records(tmp_path)
    victim = starts[3]
    good = general(path)[0]
    length = struct.unpack_from("<Q", raw, victim)[0]
    for i in range(victim + 12, victim + 12 + length + 4):  # data and its CRC
        bad = bytearray(raw)
        bad[i] ^= 0x40
        path.write_bytes(bytes(bad))
        points, offset, errors, _ = assert_paths_agree(path)
        assert points == good[:2] + good[3:], i  # record 3 holds the scalar of step 2
        assert [e["offset"] for e in errors] == [victim] and "data CRC" in errors[0]["message"]
        assert offset == len(raw)


def test_a_flipped_length_byte_resynchronises(tmp_path: Path) -> None:
    path, raw, starts = _records(tmp_path)
    victim = starts[3]
    good = general(path)[0]
    for i in range(victim, victim + 12):  # length and its CRC
        bad = bytearray(raw)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        points, offset, errors, _ = assert_paths_agree(path)
        assert points == good[:2] + good[3:], i
        assert len(errors) == 1 and errors[0]["offset"] == victim
        assert "length CRC" in errors[0]["message"] and offset == len(raw)


def test_garbage_between_records_is_skipped(tmp_path: Path) -> None:
    raw = frame(scalar_event("a", 1, 1.0, 1.0)) + os.urandom(300) + \
        frame(scalar_event("a", 2, 2.0, 2.0))
    path = tmp_path / "events.out.tfevents.x"
    path.write_bytes(raw)
    points, _, errors, _ = assert_paths_agree(path)
    assert [p[1] for p in points] == [1, 2] and len(errors) == 1


def test_undecodable_event_with_a_good_crc_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.x"
    path.write_bytes(frame(b"\x0a\xff\xff") + frame(scalar_event("a", 1, 1.0, 1.0)))
    points, _, errors, _ = assert_paths_agree(path)
    assert points == [("a", 1, 1.0, 1.0)] and "undecodable" in errors[0]["message"]


# ------------------------------------------------------------------ merge of several files


def test_merge_series_newer_file_wins_and_restarts_are_kept() -> None:
    old = [("loss", s, float(s), 100.0 + s) for s in range(0, 100, 10)]
    new = [("loss", s, -float(s), 500.0 + s) for s in range(50, 80, 10)]
    other = [("lr", 0, 1.0, 100.0)]
    series, restarts = tfevents.merge_series(
        [("events.b", 500.0, new), ("events.a", 100.0, old + other), ("events.c", None, [])])
    assert [p[0] for p in series["loss"]] == [0, 10, 20, 30, 40, 50, 60, 70]
    assert series["loss"][-1] == (70, -70.0, 570.0) and series["lr"] == [(0, 1.0, 100.0)]
    assert restarts == [(50, 500.0)]


# ------------------------------------------------------------------------ property tests

TAGS = ["loss", "lr", "a/very/long/tag/" + "x" * 40, "ñ"]


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, set[tuple[str, int, bytes, float]]]:
    """A written stream (mostly tensorboardX-layout scalars) and the set of its points."""
    chunks, written = [], set()
    for _ in range(draw(st.integers(1, 25))):
        tag = draw(st.sampled_from(TAGS))
        step = draw(st.one_of(st.integers(0, 300), st.integers(-2 ** 63, 2 ** 63 - 1)))
        value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
        wall = draw(st.floats(1e9, 2e9))
        kind = draw(st.sampled_from(["tbx", "tbx", "tbx", "tensor", "histo", "junk"]))
        if kind == "tbx":
            data = scalar_event(tag, step, value, wall)
        elif kind == "tensor":
            data = tensor_event(tag, step, tensor_pb2.TensorProto(dtype=2, double_val=[value]),
                                wall).SerializeToString()
        elif kind == "histo":
            data = event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, histo={"min": value})]
            )).SerializeToString()
        else:
            chunks.append(draw(st.binary(max_size=40)))
            continue
        if kind != "histo":
            written.add((tag, step, bits(value), wall))
        chunks.append(frame(data))
    return b"".join(chunks), written


@st.composite
def mutations(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        what = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        i = draw(st.integers(0, len(data) - 1))
        if what == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif what == "cut":
            del data[i:]
        elif what == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=20))
        else:
            del data[i:i + draw(st.integers(1, 20))]
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fast_and_general_agree_and_never_invent_values(tmp_path: Path, data: st.DataObject
                                                        ) -> None:
    raw, written = data.draw(event_streams())
    mutated = data.draw(mutations(raw))
    path = tmp_path / "events.out.tfevents.prop"
    path.write_bytes(mutated)
    points, offset, _errors, _info = assert_paths_agree(path)
    for tag, step, value, wall in points:
        assert (tag, step, bits(value), wall) in written
    assert offset <= len(mutated)


@st.composite
def tags_in_turn(draw: st.DrawFn) -> bytes:
    """tensorboardX-layout scalars whose tags take turns in one order (the bulk path's sliced
    case), the order now and then broken by a record of another tag or an extra one."""
    tags = draw(st.lists(st.sampled_from(TAGS), min_size=2, max_size=len(TAGS), unique=True))
    chunks = []
    for step in range(draw(st.integers(1, 60))):
        turn = list(tags)
        if draw(st.integers(0, 9)) == 0:
            turn.insert(draw(st.integers(0, len(turn))), draw(st.sampled_from(TAGS)))
        for tag in turn:
            value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
            chunks.append(frame(scalar_event(tag, step, value, 1.7e9 + step)))
    return b"".join(chunks)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_tags_in_turn_agree_with_the_general_decoder(tmp_path: Path, data: st.DataObject
                                                     ) -> None:
    raw = data.draw(tags_in_turn())
    path = tmp_path / "events.out.tfevents.turns"
    path.write_bytes(data.draw(mutations(raw)))
    assert_paths_agree(path)
    assert_paths_agree(path, tags={"loss", "ñ"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600))
def test_random_bytes_never_crash(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "events.out.tfevents.rand"
    path.write_bytes(raw)
    _points, offset, errors, _info = assert_paths_agree(path)
    assert offset <= len(raw)
    for e in errors:
        assert set(e) == {"file", "offset", "message"}


def test_decode_event_rejects_malformed_protobuf() -> None:
    rng = random.Random(5)
    good = scalar_event("loss", 3, 1.0, 2.0)
    for _ in range(2000):
        cut = good[:rng.randrange(len(good))]
        try:
            wall, _step, values = tfevents.decode_event(cut)
        except tfevents.DecodeError:
            continue
        for tag, value in values:  # a prefix that parses can only hold what was written
            assert (tag, value) == ("loss", 1.0) and not math.isnan(wall)


def test_bulk_path_takes_the_tensorboardx_records(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, raw, _ = _records(tmp_path, 300)
    calls = []
    real = tfevents.decode_event
    monkeypatch.setattr(tfevents, "decode_event", lambda d: calls.append(1) or real(d))
    series, offset, _errors, info = tfevents_fast.read_columns(str(path))
    assert len(series["loss"]) == 300 and offset == len(raw) and info["records"] == 301
    assert len(calls) <= 2  # file_version and the first "loss": the rest went in bulk
