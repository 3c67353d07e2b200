"""Event-file records sent raw by a probe without the decoder, decoded on the client.

The raw path (probe.read_raw_records on the box, raw_events.decode_raw_entry here) must give
exactly the entry the decoder path (probe.read_event_file with tfevents on the box) gives for
the same bytes: scalars, offsets, first wall time, errors. Files are real ones, written by
tensorboardX and by TensorBoard's EventFileWriter (tensor scalars), as in test_tfevents.py.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.box import tfevents
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.series import RunSeries, run_request
from gpuwatch.remote.model.snapshot import HostSnapshot, RunSample
from gpuwatch.remote.wire import raw_events
from gpuwatch.remote.wire.bundle import (
    RAW_RECORDS,
    RUN_FILES,
    SMI,
    build_command,
    build_stdin,
    modules_for,
    payload,
)
from gpuwatch.remote.wire.document import parse_probe_output
from gpuwatch.remote.wire.raw_events import RAW_CAP, decode_raw_entry, expand_raw_events
from harness.event_records import event_files, tensor_event
from harness.probe_box import python36
from harness.run_polls import ENV, QUIET, events_writer, write_scalars
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util
from tensorboardX import SummaryWriter

LIMITS = dict(probe.DEFAULT_LIMITS)


def budget(size: int = LIMITS["events_bytes"]) -> dict[str, Any]:
    return {"bytes": size, "deadline": time.monotonic() + 3600}


def wire(entry: dict[str, Any]) -> dict[str, Any]:
    """As it crosses the wire: JSON."""
    return json.loads(json.dumps(entry, separators=(",", ":")))


def decoder_entry(path: Path, offset: int, size: int = LIMITS["events_bytes"]) -> dict[str, Any]:
    return wire(probe.read_event_file(str(path), os.stat(path), offset, budget(size), LIMITS))


def raw_entry(path: Path, offset: int, monkeypatch: pytest.MonkeyPatch,
              b: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a probe without the decoder sends (raw), before the client decodes it."""
    def missing() -> Any:
        raise ImportError("gpuwatch_tfevents was not sent with this poll")

    with monkeypatch.context() as m:
        m.setattr(probe, "load_tfevents", missing)
        return wire(probe.read_event_file(str(path), os.stat(path), offset, b or budget(),
                                          LIMITS))


def both(path: Path, offset: int, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    raw = raw_entry(path, offset, monkeypatch)
    assert "raw" in raw and "scalars" not in raw
    return decoder_entry(path, offset), wire(decode_raw_entry(raw))


# ---------------------------------------------------------------- files


def mixed_run(folder: Path) -> Path:
    """tensorboardX scalars with histograms, images, text and odd values between them."""
    w = SummaryWriter(str(folder))
    rng = np.random.default_rng(0)
    for step in range(30):
        w.add_scalar("train/loss", 1.0 / (step + 1), step)
        if step % 15 == 0:
            w.add_histogram("weights", rng.normal(size=50), step)
            w.add_image("sample", rng.random((3, 8, 8)), step)
            w.add_text("note", f"step {step}", step)
    w.add_scalar("weird", float("nan"), 30)
    w.add_scalar("weird", float("inf"), 31)
    w.add_scalar("unicode/ñ✓", 3.0, 1)
    w.close()
    (path,) = event_files(folder)
    return path


def tensor_run(folder: Path) -> Path:
    """TensorBoard's own writer: tensor scalars of several dtypes, and tensors that are not."""
    w = EventFileWriter(str(folder))
    w.add_event(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2"))
    for step in range(5):
        x = 1.0 / 3 + step
        w.add_event(tensor_event("f32", step, tensor_util.make_tensor_proto(np.float32(x)),
                                 10.0 + step))
        w.add_event(tensor_event("f16", step, tensor_util.make_tensor_proto(np.float16(x)),
                                 10.0 + step))
        w.add_event(tensor_event("text", step, tensor_util.make_tensor_proto("hi"), 1, "text"))
        w.add_event(tensor_event("h", step, tensor_util.make_tensor_proto(
            np.ones((3, 3), np.float32)), 1, "histograms"))
    w.close()
    (path,) = event_files(folder)
    return path


def scalar_file(folder: Path, n: int = 6) -> tuple[Path, bytes, list[int]]:
    w = SummaryWriter(str(folder))
    for i in range(n):
        w.add_scalar("loss", i * 0.5, i)
    w.close()
    (path,) = event_files(folder)
    return path, path.read_bytes(), [off for off, _ in tfevents.iter_records(str(path))]


# ---------------------------------------------------------------- the same entry either way


def test_constants_match_the_probe():
    assert raw_events.RAW_CAP == probe.RAW_CAP
    assert probe.DEFAULT_LIMITS["errors_per_source"] == raw_events.ERRORS_PER_SOURCE
    points = [("a", 1, 0.1, 1.5), ("a", 2, float("nan"), float("nan")), ("b", -3, -0.0, 2.0),
              ("b", 2 ** 40, float("inf"), 1e9 + 0.12345), ("a", 3, float("-inf"), 0.0),
              ("c", 0, 1 / 3, 1.7e9 + 1 / 3), ("c", 1, 7, 1.0)]
    mine, theirs = raw_events.columns(points), probe.columns(points, True)
    assert json.dumps(mine) == json.dumps(theirs)


@pytest.mark.parametrize("make", [mixed_run, tensor_run])
def test_raw_and_decoder_give_the_same_entry(tmp_path: Path, make: Any,
                                             monkeypatch: pytest.MonkeyPatch):
    path = make(tmp_path / "run")
    assert path.stat().st_size <= RAW_CAP
    dec, raw = both(path, 0, monkeypatch)
    assert raw == dec
    assert dec["stopped"] == "eof" and dec["offset"] == path.stat().st_size
    assert dec["scalars"] and "first_wall_time" in dec
    records = [off for off, _ in tfevents.iter_records(str(path))]
    for start in records[1:]:  # from any record boundary on
        assert both(path, start, monkeypatch)[1] == decoder_entry(path, start)


def test_truncated_last_record_is_left_for_the_next_poll(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    path, raw, starts = scalar_file(tmp_path)
    last = starts[-1]
    for cut in range(last + 1, len(raw)):  # every byte of the last record cut short
        path.write_bytes(raw[:cut])
        dec, got = both(path, 0, monkeypatch)
        assert got == dec, cut
        assert got["stopped"] == "partial" and got["offset"] == last
    path.write_bytes(raw)  # the writer finishes it: the next poll reads it from that offset
    dec, got = both(path, last, monkeypatch)
    assert got == dec and got["start"] == last and got["offset"] == len(raw)
    assert got["scalars"]["loss"]["steps"] == [5]


def test_a_flipped_data_byte_loses_that_record_only_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path, raw, starts = scalar_file(tmp_path)
    victim = starts[3]
    length = struct.unpack_from("<Q", raw, victim)[0]
    for i in range(victim + 12, victim + 12 + length + 4):  # data and its CRC
        bad = bytearray(raw)
        bad[i] ^= 0x40
        path.write_bytes(bytes(bad))
        dec, got = both(path, 0, monkeypatch)
        assert got == dec, i
        assert got["scalars"]["loss"]["steps"] == [0, 1, 3, 4, 5]  # record 3 held step 2
        assert got["error_count"] == 1 and "data CRC" in got["errors"][0]
        assert got["errors"][0].startswith(f"offset {victim}:")
        assert got["offset"] == len(raw)


def test_a_flipped_length_byte_stops_there_and_the_decoder_resynchronises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path, raw, starts = scalar_file(tmp_path)
    victim = starts[3]
    whole = decoder_entry(path, 0)["scalars"]["loss"]
    for i in range(victim, victim + 12):  # the length and its CRC
        bad = bytearray(raw)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        got = wire(decode_raw_entry(raw_entry(path, 0, monkeypatch)))
        # nothing from the damaged record on: the next poll ships the decoder from there
        assert got["offset"] == victim and got["stopped"] == "bytes", i
        assert got["scalars"]["loss"]["steps"] == [0, 1] and "errors" not in got
        then = decoder_entry(path, got["offset"])
        assert then["error_count"] == 1 and then["errors"][0].startswith(f"offset {victim}:")
        assert "length CRC" in then["errors"][0] and then["offset"] == len(raw)
        steps = got["scalars"]["loss"]["steps"] + then["scalars"]["loss"]["steps"]
        assert steps == [s for s in whole["steps"] if s != 2]
        assert decoder_entry(path, 0)["scalars"]["loss"]["steps"] == steps  # as box-side


def test_a_damaged_length_past_the_end_is_not_waited_on(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    """The last record's length bumped past the end of the file: the walk takes it for a record
    a live writer has not finished; its header, sent along, tells the client otherwise."""
    path, raw, starts = scalar_file(tmp_path)
    last = starts[-1]
    bad = bytearray(raw)
    bad[last + 1] ^= 0x10  # length + 4096: past the end
    path.write_bytes(bytes(bad))
    sent = raw_entry(path, 0, monkeypatch)
    assert sent["stopped"] == "partial" and "head" in sent
    got = decode_raw_entry(sent)
    assert got["offset"] == last and got["stopped"] == "bytes"  # pending: the decoder next
    path.write_bytes(raw[:-3])  # a real unfinished record: waited on, as the decoder does
    got = decode_raw_entry(raw_entry(path, 0, monkeypatch))
    assert got["stopped"] == "partial" and got["offset"] == last


def test_a_first_load_larger_than_the_cap_is_never_sent_raw(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    writer = events_writer(tmp_path / "runs")
    write_scalars(writer, "loss", [(s, 1.0) for s in range(2000)])  # ~100 KB
    (path,) = event_files(tmp_path / "runs")
    assert path.stat().st_size > RAW_CAP
    sent = raw_entry(path, 0, monkeypatch)
    assert sent["raw"] == "" and sent["stopped"] == "bytes" and sent["offset"] == 0
    got = decode_raw_entry(sent)
    assert got["offset"] == 0 and got["stopped"] == "bytes" and got["scalars"] == {}
    assert "first_wall_time" not in got


def test_damaged_raw_field_is_an_error_of_that_file():
    got = decode_raw_entry({"path": "/x/events", "size": 9, "mtime": 1.0, "start": 0,
                            "offset": 9, "stopped": "eof", "raw": "not base64!"})
    assert got == {"path": "/x/events", "error": "raw event records are not base64"}


def test_offsets_advance_exactly_and_the_cap_holds(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    writer = events_writer(tmp_path / "runs")
    write_scalars(writer, "loss", [(s, 1.0) for s in range(3)])
    (path,) = event_files(tmp_path / "runs")
    offset = decoder_entry(path, 0)["offset"]
    seen = [0, 1, 2]
    for round_ in range(4):
        write_scalars(writer, "loss", [(s, 0.5) for s in range(3 + round_ * 400,
                                                               3 + (round_ + 1) * 400)])
        size = path.stat().st_size
        while offset < size:
            b = budget()
            sent = raw_entry(path, offset, monkeypatch, b)
            got = decode_raw_entry(sent)
            assert got["start"] == offset and got["offset"] > offset
            assert got["offset"] - offset == len(base64.b64decode(sent["raw"])) <= RAW_CAP
            assert b["raw"] == RAW_CAP - (got["offset"] - offset)  # the poll's cap, spent
            assert got["offset"] in {o for o, _ in tfevents.iter_records(str(path))} | {size}
            assert got["stopped"] == ("eof" if got["offset"] == size else "bytes")
            seen += got["scalars"]["loss"]["steps"]
            offset = got["offset"]
    assert seen == list(range(3 + 4 * 400))


def test_the_raw_cap_is_shared_by_the_files_of_a_poll(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    paths = []
    for name in ("a", "b"):
        w = events_writer(tmp_path / name)
        write_scalars(w, "loss", [(s, 1.0) for s in range(400)])  # ~20 KB each
        (path,) = event_files(tmp_path / name)
        paths.append(path)
    b = budget()
    first = decode_raw_entry(raw_entry(paths[0], 0, monkeypatch, b))
    second = decode_raw_entry(raw_entry(paths[1], 0, monkeypatch, b))
    assert first["stopped"] == "eof" and second["stopped"] == "bytes"
    assert first["offset"] + second["offset"] <= RAW_CAP


def test_expand_replaces_raw_entries_of_configured_and_discovered_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path, _, _ = scalar_file(tmp_path)
    sent = raw_entry(path, 0, monkeypatch)
    doc = {"runs": [{"name": "a", "events": {"path": str(tmp_path), "files": [dict(sent)]}}],
           "discovered": [{"name": "b", "events": {"path": str(tmp_path),
                                                   "files": [dict(sent), {"path": "x",
                                                                          "error": "gone"}]}}]}
    expand_raw_events(doc)
    want = decoder_entry(path, 0)
    assert wire(doc["runs"][0]["events"]["files"][0]) == want
    assert wire(doc["discovered"][0]["events"]["files"][0]) == want
    assert doc["discovered"][0]["events"]["files"][1] == {"path": "x", "error": "gone"}


# ---------------------------------------------------------------- which poll ships the decoder


def test_modules_for_ships_the_decoder_only_when_needed():
    def request(run: dict[str, Any], key: str = "runs") -> dict[str, Any]:
        return {"v": 1, "want": {"discover": False, "nvml": False}, "spawn": True,
                "cgroup": 2, "kernel_lines": 0, key: [run]}

    events = {"name": "r", "events": "/data/runs"}
    assert "gpuwatch_tfevents" in modules_for(request(events))  # a run's first poll
    assert RAW_RECORDS not in modules_for(request(events))
    assert modules_for(request({**events, "raw": True})) == (
        "gpuwatch_probe", SMI, RUN_FILES, RAW_RECORDS)  # steady: no decoder, the raw reader
    assert modules_for(request({"name": "r", "log": "/x", "raw": True})) == (
        "gpuwatch_probe", SMI, RUN_FILES)  # no event files: neither
    assert "gpuwatch_tfevents" not in modules_for(request({**events, "raw": True},
                                                          "discovered_runs"))
    assert "gpuwatch_tfevents" in modules_for(request(events, "discovered_runs"))
    assert "gpuwatch_tfevents" not in modules_for(request({"name": "r", "log": "/x"}))
    searching = {"v": 1, "runs": [{**events, "raw": True}]}  # discovery may find new files
    assert "gpuwatch_tfevents" in modules_for(searching)


def test_the_raw_reader_goes_only_with_its_part():
    assert "def read_raw_records" in payload(("gpuwatch_probe", RUN_FILES, RAW_RECORDS))
    assert "def read_raw_records" not in payload(("gpuwatch_probe", RUN_FILES))
    assert "def read_event_file" in payload(("gpuwatch_probe", RUN_FILES))
    assert "def read_raw_records" not in payload(("gpuwatch_probe",))
    assert "def read_raw_records" in payload()


def test_series_says_raw_once_answered_and_nothing_big_is_left(tmp_path: Path):
    writer = events_writer(tmp_path / "runs")
    write_scalars(writer, "loss", [(s, 1.0) for s in range(5)])
    run = RunConfig("r", workdir=str(tmp_path), events="runs")
    series = RunSeries("r")
    assert "raw" not in run_request(run, series)
    poll(run, series)
    assert run_request(run, series)["raw"] is True


class Poller:
    """A configured run polled as the Collector does it: the bundle trimmed per request."""

    def __init__(self, run: RunConfig, python: str = sys.executable) -> None:
        self.run, self.python = run, python
        self.series = RunSeries(run.name)
        self.shipped: list[bool] = []  # the decoder went with the poll
        self.sizes: list[tuple[int, int]] = []  # bytes up, bytes down

    def poll(self) -> RunSample:
        request = {"v": 1, "want": {**QUIET, "discover": False}, "compress": True,
                   "runs": [run_request(self.run, self.series)]}
        self.shipped.append("gpuwatch_tfevents" in modules_for(request))
        out = run_probe(request, self.python)
        snap: HostSnapshot = parse_probe_output(out, "box")
        self.sizes.append((len(build_stdin(request, trim=True)), len(out)))
        self.doc = json.loads(zlib.decompress(out))
        (sample,) = snap.runs
        self.series.update(sample, snap.taken_at)
        return sample


def run_probe(request: dict[str, Any], python: str = sys.executable) -> bytes:
    import subprocess

    result = subprocess.run(["sh", "-c", build_command(python)],
                            input=build_stdin(request, trim=True), env=ENV,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def poll(run: RunConfig, series: RunSeries) -> RunSample:
    request = {"v": 1, "want": {**QUIET, "discover": False}, "compress": True,
               "runs": [run_request(run, series)]}
    snap = parse_probe_output(run_probe(request), "box")
    series.update(snap.runs[0], snap.taken_at)
    return snap.runs[0]


def test_growth_past_the_cap_is_read_over_several_polls_completely(tmp_path: Path):
    writer = events_writer(tmp_path / "runs")
    write_scalars(writer, "loss", [(s, 1.0 / (s + 1)) for s in range(100)])
    poller = Poller(RunConfig("r", workdir=str(tmp_path), events="runs"))
    first = poller.poll()  # the run's first poll: decoder
    assert poller.shipped == [True] and first.event_files[0].stopped == "eof"

    write_scalars(writer, "loss", [(s, 1.0 / (s + 1)) for s in range(100, 110)])
    small = poller.poll()  # steady: raw
    (f,) = small.event_files
    assert poller.shipped[-1] is False
    assert poller.doc["runs"][0]["events"]["files"][0].get("raw")
    assert f.start == first.event_files[0].offset and f.offset == f.bytes
    assert f.scalars["loss"].steps == tuple(range(100, 110))

    write_scalars(writer, "loss", [(s, 1.0 / (s + 1)) for s in range(110, 2110)])  # ~100 KB
    big = poller.poll()  # still raw: the client could not know; the cap holds
    (g,) = big.event_files
    assert poller.shipped[-1] is False and g.pending and g.offset - g.start <= RAW_CAP
    rest = poller.poll()  # more left: the decoder goes, and reads the rest
    assert poller.shipped[-1] is True and rest.event_files[0].offset == rest.event_files[0].bytes
    quiet = poller.poll()
    assert poller.shipped[-1] is False and quiet.event_files[0].start is None
    assert [p[0] for p in poller.series.series["loss"].points()] == list(range(2110))
    up_raw, down_raw = poller.sizes[1]
    up_dec = poller.sizes[3][0]
    assert up_dec - up_raw > 3000  # the decoder, left out of the steady polls
    print(f"\nraw poll: {up_raw} B up, {down_raw} B down; decoder poll: {up_dec} B up; "
          f"a 24 KB raw poll: {poller.sizes[2][1]} B down")


def test_raw_path_under_python_36(tmp_path: Path):
    writer = events_writer(tmp_path / "runs")
    write_scalars(writer, "loss", [(s, 1.0) for s in range(3)])
    poller = Poller(RunConfig("r", workdir=str(tmp_path), events="runs"), python=python36())
    poller.poll()
    write_scalars(writer, "loss", [(s, 1.0) for s in range(3, 6)])
    sample = poller.poll()
    assert poller.shipped == [True, False] and sample.errors == {}
    assert sample.event_files[0].scalars["loss"].steps == (3, 4, 5)
