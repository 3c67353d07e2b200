"""Property-based: whatever a box, a file or a tool prints, each parser raises nothing but its
documented error, and what the probe makes of a hostile file is a document the client reads.

- the probe-document parser (model.parse_probe_output: ProbeError only), and after it the
  judge (findings via once.judge), every report format and the store (nothing at all):
  real documents (the fixture box's, the real GPUs' captures) with fields swapped for hostile
  values, and their bytes damaged;
- the metrics readers (probe.collect_metrics over trainer_state.json, metrics.csv, JSONL):
  a bad entry is skipped, and the probe's answer parses;
- the event-file decoders (tfevents, tfevents_fast; raw_events on the client): DecodeError is
  theirs to report per record, never to raise;
- the nvidia-smi and kernel-log parsers (probe.parse_smi_csv and gpu_row, through the
  capture reader tests/harness/smi_capture.py; parse_kernel_log):
  never raise; every number they give is within what the client reads.

Derandomized and bounded (a few seconds each): the same examples on every run.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.box import tfevents
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import ProbeError
from gpuwatch.remote.report import document, prometheus_text, text_report, to_json_text
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.landing import judge, remember
from gpuwatch.remote.watch.landing import restore as history_from_store
from gpuwatch.remote.wire import raw_events, tfevents_fast
from gpuwatch.remote.wire.collect import PollOutcome
from gpuwatch.remote.wire.document import parse_probe_output
from gpuwatch.remote.wire.reader import MAX_DEPTH, MAX_NUMBER_DIGITS
from harness import smi_capture
from hostile_docs import CAPTURES, real_document
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(derandomize=True, max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
HOST = parse_config('[hosts.gpu1]\nssh = "local"\n[hosts.gpu1.runs.llama]\nevents = "/x"\n'
                    ).hosts[0]
INT64 = (-(2**63), 2**63 - 1)

HUGE_INTS = st.sampled_from([2**63, 2**64, -(2**63) - 1, 2**53 + 1, 10**39, 10**40, -(10**39),
                             2**63 - 1, -(2**63), 0, -1])
HOSTILE_STRINGS = st.sampled_from(["", "nan", "inf", "-inf", "²", "٣", "\x1b]2;x\x07",
                                   "[bold]x[/]", "../..", "/", "\\", '"', "\udcff"[:0] + "é",
                                   "9" * 60, "x" * 1000])
LEAF = st.one_of(
    HUGE_INTS, st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    HOSTILE_STRINGS, st.text(max_size=12), st.none(), st.booleans())
HOSTILE = st.recursive(LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def nesting(value: Any) -> int:
    """How many lists and objects deep `value` goes."""
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    return 0


def past_document_limits(doc: Any) -> bool:
    """Whether `doc` nests near the reader's MAX_DEPTH or holds an integer of more digits than
    its MAX_NUMBER_DIGITS: the limits that refuse a whole document, whatever field it is."""
    def digits(value: Any) -> int:
        if isinstance(value, dict):
            return max((digits(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return max((digits(v) for v in value), default=0)
        return len(str(abs(value))) if isinstance(value, int) else 0

    return nesting(doc) >= MAX_DEPTH - 2 or digits(doc) > MAX_NUMBER_DIGITS


def deep_value(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


VALUES = st.integers(0, 9).flatmap(
    lambda n: st.integers(60, 200).map(deep_value) if n == 0 else HOSTILE)
NUMBERS = st.one_of(
    HUGE_INTS, st.sampled_from([-(2**31), 2**31, 2**53, 2**62, math.nan, math.inf, -math.inf,
                                1e300, -1e300, 1e-300, -0.0, 0.5]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True))
"""What a numeric field gets: far more often read than refused, so the judge sees them."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The documents mutated: the fixture box's with a run, and the real GPUs' captures."""
    return [real_document(tmp_path_factory.mktemp("real")),
            *(json.loads(path.read_text()) for path in CAPTURES)]


def places(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document (its objects' keys and its lists' items), the root aside."""
    out = [at] if at else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += places(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += places(value, (*at, i))
    return out


def fields(doc: dict[str, Any]) -> list[list[tuple[Any, ...]]]:
    """The document's places grouped by field (list indices made one): a draw picks a field,
    then one of its places, so that the 200 points of a tag weigh as much as `ncpu`."""
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for path in places(doc):
        groups.setdefault(tuple("*" if isinstance(p, int) else p for p in path), []).append(path)
    return list(groups.values())


def value_at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mutated(data: st.DataObject, base: dict[str, Any]) -> dict[str, Any]:
    """One to three fields swapped for hostile values: numbers into numeric fields, three
    times in four, anything anywhere otherwise (the version aside: it only says "not ours")."""
    doc = copy.deepcopy(base)
    groups = [g for g in fields(doc) if g[0] != ("v",)]
    numeric = [g for g in groups if is_number(value_at(doc, g[0]))]
    for _ in range(data.draw(st.integers(1, 3))):
        number = data.draw(st.integers(0, 3)) > 0
        path = data.draw(st.sampled_from(data.draw(st.sampled_from(numeric if number
                                                                   else groups))))
        target = doc
        for step in path[:-1]:
            if not isinstance(target, (dict, list)) or (
                    isinstance(target, list) and not isinstance(step, int)):
                break
            try:
                target = target[step]
            except (KeyError, IndexError, TypeError):
                break
        else:
            if isinstance(target, dict) or (isinstance(target, list)
                                            and isinstance(path[-1], int)
                                            and path[-1] < len(target)):
                target[path[-1]] = data.draw(NUMBERS if number else VALUES)
    return doc


def judged_everywhere(data: bytes) -> None:
    """parse, then what --once does with a good document: judge, the three reports, the
    store; and what the next --once does: the store's history read back."""
    try:
        snapshot = parse_probe_output(data, "gpu1")
    except ProbeError:
        return
    outcome = PollOutcome(HOST, 1_795_617_700.0, 0.5, snapshot, data)
    history = HostHistory("gpu1")
    report = judge(history, outcome)
    json.loads(to_json_text(document([report], 1_795_617_700.0)))
    text_report([report], 1_795_617_700.0)
    prometheus_text([report])
    store = Store.open(":memory:")
    remember(store, outcome, history)
    again = history_from_store(store, HOST)
    judge(again, outcome)


# ---------------------------------------------------------------- the document, judge, report

@settings(SETTINGS, max_examples=250)
@given(st.data())
def test_a_mutated_document_is_read_or_a_probe_error_and_judging_never_raises(
        bases: list[dict[str, Any]], data: st.DataObject) -> None:
    doc = mutated(data, data.draw(st.sampled_from(bases)))
    text = json.dumps(doc).encode()  # NaN and Infinity too: json.loads reads them
    judged_everywhere(zlib.compress(text) if data.draw(st.booleans()) else text)


@SETTINGS
@given(st.data())
def test_damaged_document_bytes_are_a_probe_error_at_worst(
        bases: list[dict[str, Any]], data: st.DataObject) -> None:
    raw = bytearray(json.dumps(data.draw(st.sampled_from(bases))).encode())
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw)))
        what = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = data.draw(st.one_of(st.binary(max_size=8), st.sampled_from(
            [b"[" * 100, b"[" * 3000, b'{"a":' * 70, b'"', b"\\", b"9" * 50, b"NaN",
             b"-Infinity", b"1e999"])))
        if what == "insert":
            raw[at:at] = chunk
        elif what == "delete":
            del raw[at:at + len(chunk) + 1]
        else:
            raw[at:at + len(chunk)] = chunk
    judged_everywhere(bytes(raw))


@SETTINGS
@given(st.data())
def test_hostile_cpu_figures_are_none_and_never_the_hosts_error(
        bases: list[dict[str, Any]], data: st.DataObject) -> None:
    """Two polls of the fixture box, the processes' CPU ticks and the table's uptime of either
    swapped for anything: both documents still read (but one given a value past a limit of the
    whole document, nesting or digits, which is refused as such), and each process's cpu_s
    and CPU% is a number in range or None; judging and every report go on."""
    first = copy.deepcopy(bases[0])
    procs = first["processes"]
    at = procs["procs"]["fields"].index("cpu_ticks")
    second = copy.deepcopy(first)
    second["processes"]["uptime_s"] += data.draw(st.sampled_from([10, 0.1, 0, 3600]))
    for row in second["processes"]["procs"]["rows"]:
        row[at] += data.draw(st.integers(0, 10**6))
    for _ in range(data.draw(st.integers(1, 4))):
        doc = data.draw(st.sampled_from([first, second]))
        value = data.draw(st.one_of(NUMBERS, VALUES))
        rows = doc["processes"]["procs"]["rows"]
        if data.draw(st.booleans()):
            doc["processes"]["uptime_s"] = value
        else:
            rows[data.draw(st.integers(0, len(rows) - 1))][at] = value
    history = HostHistory("gpu1")
    for doc, at_s in ((first, 0.0), (second, 10.0)):
        data_bytes = json.dumps(doc).encode()
        try:
            parsed, refused = parse_probe_output(data_bytes, "gpu1"), ""
        except ProbeError as error:
            parsed, refused = None, str(error)
        if parsed is None:  # only a value past a limit of the whole document refuses it
            assert past_document_limits(doc) and (
                "MAX_DEPTH" in refused or "MAX_NUMBER_DIGITS" in refused), refused
            judged_everywhere(data_bytes)
            continue
        history.record(parsed, at_s)
        snap = history.snapshots[-1]
        ncpu = snap.ncpu or 1
        for p in snap.processes:
            assert p.cpu_s is None or (math.isfinite(p.cpu_s) and p.cpu_s >= 0)
            assert p.cpu_pct is None or 0 <= p.cpu_pct <= 100 * ncpu
        judged_everywhere(data_bytes)


# ---------------------------------------------------------------- metrics readers

CELL = st.one_of(
    st.integers(-10, 10**6).map(str), HUGE_INTS.map(str), st.sampled_from(
        ["", "nan", "inf", "-inf", "1e999", "-1e999", "1e308", "500.0", "0x10", "²", "1_000",
         "9" * 400, "1." + "0" * 400, " ", "-", "None", '"', "\x00"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr))
JSON_VALUE = st.one_of(VALUES, CELL)


def metrics_file(data: st.DataObject, folder: Path) -> Path:
    kind = data.draw(st.sampled_from(["csv", "jsonl", "trainer_state"]))
    if kind == "csv":
        header = ["step", *data.draw(st.lists(st.sampled_from(["loss", "lr", "epoch", "a,b"]),
                                              max_size=3))]
        rows = data.draw(st.lists(st.lists(CELL, min_size=len(header) - 1,
                                           max_size=len(header) + 1), max_size=12))
        path = folder / "metrics.csv"
        path.write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n",
                        errors="surrogatepass")
    elif kind == "jsonl":
        lines = data.draw(st.lists(st.one_of(
            st.dictionaries(st.sampled_from(["step", "loss", "lr"]), JSON_VALUE, max_size=3)
            .map(lambda d: json.dumps(d)),
            st.sampled_from(["{", "[" * 5000 + "]" * 5000, '{"step": 1e999}', "null"]),
            st.integers(0, 3000).map(lambda n: '{"step":' + "[" * n + "1" + "]" * n + "}")),
            max_size=12))
        path = folder / "metrics.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
    else:
        history = data.draw(st.lists(st.dictionaries(
            st.sampled_from(["step", "loss", "eval_loss", "epoch"]), JSON_VALUE, max_size=3),
            max_size=12))
        path = folder / "trainer_state.json"
        body = json.dumps({"log_history": history})
        if data.draw(st.booleans()):
            body = '{"log_history":' + "[" * 5000 + "]" * 5000 + "}"
        path.write_text(body)
    return path


@SETTINGS
@given(st.data())
def test_the_metrics_readers_skip_what_they_cannot_read_and_the_answer_parses(
        tmp_path: Path, data: st.DataObject) -> None:
    """A reader raises only ProbeFailure (or ValueError: a trainer_state.json that is not
    JSON): the source's error. What it answers, put in a document as the probe does, is read
    by the client: a hostile file never costs its host the whole document."""
    path = metrics_file(data, tmp_path)
    limits = dict(probe.DEFAULT_LIMITS)
    try:
        entries = probe.collect_metrics(str(path), None, limits)  # one answer a file read
    except probe.ProbeFailure:
        return
    except ValueError:  # json_loads': a trainer_state.json that is not JSON at all
        assert path.name == "trainer_state.json"
        return
    doc = {"v": 1, "errors": {}, "runs": [{"name": "r", "pids": [], "metrics": entries}]}
    snapshot = parse_probe_output(probe.json_dumps(doc).encode(), "box")
    assert len(snapshot.runs[0].metrics) == len(entries)
    for metrics in snapshot.runs[0].metrics:
        for cols in metrics.scalars.values():
            assert all(INT64[0] <= s <= INT64[1] for s in cols.steps)


# ---------------------------------------------------------------- event-file decoders

RECORD = st.builds(
    lambda tag, step, value: tfevents_record(tag, step, value),
    st.sampled_from(["loss", "lr", "é"]), st.one_of(st.integers(0, 1000), st.integers(*INT64)),
    st.floats(width=32, allow_nan=True, allow_infinity=True))


def tfevents_record(tag: str, step: int, value: float) -> bytes:
    """One scalar event as tensorboardX frames it (tests/test_tfevents.py's writer, by hand:
    protobuf fields wall_time 1, step 2, summary 5 -> value 1 -> tag 1, simple_value 2)."""
    import struct

    def varint(n: int) -> bytes:
        n &= (1 << 64) - 1
        out = b""
        while True:
            byte, n = n & 0x7F, n >> 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out

    name = tag.encode()
    val = b"\x0a" + varint(len(name)) + name + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + varint(len(val)) + val
    data = (b"\x09" + struct.pack("<d", 1.7e9) + b"\x10" + varint(step)
            + b"\x2a" + varint(len(summary)) + summary)
    head = struct.pack("<Q", len(data))
    return (head + struct.pack("<I", tfevents.masked_crc32c(head)) + data
            + struct.pack("<I", tfevents.masked_crc32c(data)))


def damaged(data: st.DataObject, raw: bytes) -> bytes:
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 4))):
        if not out:
            break
        at = data.draw(st.integers(0, len(out) - 1))
        what = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if what == "flip":
            out[at] ^= 1 << data.draw(st.integers(0, 7))
        elif what == "cut":
            del out[at:]
        else:
            out[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    return bytes(out)


@SETTINGS
@given(st.data())
def test_both_event_decoders_report_damage_and_never_raise(tmp_path: Path,
                                                           data: st.DataObject) -> None:
    raw = damaged(data, b"".join(data.draw(st.lists(RECORD, max_size=8))))
    if data.draw(st.booleans()):
        raw = data.draw(st.binary(max_size=200))
    path = tmp_path / "events.out.tfevents.1.x"
    path.write_bytes(raw)
    points, offset, errors, _ = tfevents.read_scalars(str(path))
    series, f_offset, f_errors, _ = tfevents_fast.read_columns(str(path))
    assert (f_offset, f_errors) == (offset, errors) and offset <= len(raw)
    assert all(INT64[0] <= p[1] <= INT64[1] for p in points)
    assert sum(len(s) for s in series.values()) == len(points)


@SETTINGS
@given(st.data())
def test_raw_event_records_decode_on_the_client_or_say_why(data: st.DataObject) -> None:
    """A probe without the decoder sends records raw (base64); a hostile entry (any start,
    damaged records, a bad head, a wrong type anywhere) is decoded or an error entry, and
    the document around it is read or a ProbeError."""
    raw = damaged(data, b"".join(data.draw(st.lists(RECORD, max_size=6))))
    entry: dict[str, Any] = {
        "path": data.draw(st.one_of(st.just("/r/events.out.tfevents.1.x"), VALUES)),
        "size": len(raw), "mtime": 1.7e9,
        "start": data.draw(st.one_of(st.integers(0, 100), HUGE_INTS, VALUES)),
        "stopped": data.draw(st.sampled_from(["eof", "partial", "bytes"])),
        "raw": data.draw(st.one_of(st.just(base64.b64encode(raw).decode()), VALUES)),
        "head": data.draw(st.one_of(st.none(), st.just(base64.b64encode(raw[:12]).decode()),
                                    VALUES))}
    out = raw_events.decode_raw_entry(dict(entry))
    assert isinstance(out, dict) and ("error" in out or "scalars" in out)
    doc = {"v": 1, "errors": {}, "runs": [{"name": "r", "pids": [], "events": {
        "path": "/r", "files": [entry]}}]}
    judged_everywhere(json.dumps(doc).encode())


# ---------------------------------------------------------------- nvidia-smi, kernel log

SMI_CELL = st.one_of(CELL, st.sampled_from(
    ["[N/A]", "[Not Supported]", "81559 MiB", "631.95 W", "100 %", "ERR!", "0x0000000000000004",
     "Enabled", "Active", "GPU-" + "f" * 36, "00000000:1B:00.0", "9" * 16 + " MiB"]),
    st.text(max_size=10))


@SETTINGS
@given(st.data())
def test_nvidia_smi_output_is_parsed_into_numbers_in_range(data: st.DataObject) -> None:
    fields = list(probe.SMI_GPU_QUERY)
    header = data.draw(st.booleans())
    lines = [", ".join(f"{f} [MiB]" if "memory" in f else f for f in fields)] if header else []
    for _ in range(data.draw(st.integers(0, 4))):
        lines.append(", ".join(data.draw(SMI_CELL) for _ in range(
            data.draw(st.integers(len(fields) - 1, len(fields) + 1)))))
    text = "\n".join(lines + data.draw(st.lists(st.text(max_size=30), max_size=2)))
    rows = smi_capture.gpu_rows(text, fields)  # the probe's own reader, past a header
    apps = smi_capture.app_rows(text, list(probe.SMI_APP_QUERY))
    for cell in (c for row in rows + apps for c in row.values()):
        if isinstance(cell, (int, float)) and not isinstance(cell, bool):
            assert math.isfinite(cell) and abs(cell) < 2**53, cell
    gpus = {"source": "nvidia-smi", "devices": probe.keyed_table(rows),
            "apps": probe.keyed_table(apps)}
    text = probe.json_dumps({"v": 1, "errors": {}, "gpus": gpus}).encode()
    try:  # a row the client cannot use (no index, a fraction where MiB are whole) is refused
        snapshot = parse_probe_output(text, "box")
    except ProbeError as exc:
        refused = exc
    else:
        assert len(snapshot.gpus) == len(rows)
        return
    assert refused.where.startswith(("gpus.devices.rows[", "gpus.apps.rows[")), refused


KERNEL_PREFIX = st.sampled_from([
    "", "[ 4521.118263] ", "[" + "9" * 400 + ".5] ", "[Mon Feb 31 10:00:00 2025] ",
    "[Tue Nov 25 10:00:00 9999] ", "2025-13-45T10:00:00,123+02:00 ", "2025-11-25T10:00:00Z ",
    "2025-11-25T10:00:00,1" + "0" * 400 + "+99:99 ", "6,1234,9" + "9" * 400 + ",-;",
    "kern  :warn  : 2025-11-25T10:00:00+0100 ", "host kernel: "])
KERNEL_NUMBER = st.one_of(st.integers(0, 200).map(str), HUGE_INTS.map(str),
                          st.sampled_from(["9" * 5000, "", "٣", "-1"]))


@SETTINGS
@given(st.data())
def test_kernel_log_lines_are_parsed_into_events_the_client_reads(data: st.DataObject) -> None:
    lines = []
    for _ in range(data.draw(st.integers(0, 8))):
        number, other = data.draw(KERNEL_NUMBER), data.draw(KERNEL_NUMBER)
        body = data.draw(st.sampled_from([
            f"NVRM: Xid (PCI:0000:3b:00): {number}, pid={other}, name=python, Ch 00000008",
            f"NVRM: Xid (PCI:0000:3b:00): {number}, pid='<unknown>', name=<unknown>, x",
            f"Out of memory: Killed process {number} (python) total-vm:1kB",
            f"Memory cgroup out of memory: Kill process {number} (w) score 1 or sacrifice",
            f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=w,pid={number},uid=0",
            "oom-kill:constraint=CONSTRAINT_NONE"]))
        lines.append(data.draw(KERNEL_PREFIX) + body + data.draw(st.text(max_size=5)))
    lines += data.draw(st.lists(st.text(max_size=40).map(lambda t: "Xid " + t), max_size=2))
    section = probe.parse_kernel_log(lines, 8, 160)
    for row in section["xid"]["rows"] + section["oom"]["rows"]:
        for cell in row:
            if isinstance(cell, (int, float)) and not isinstance(cell, bool):
                assert math.isfinite(cell) and abs(cell) < 2**63, cell
    kernel = {**section, "candidates": len(lines)}
    raw = {"xid": probe.table(probe.XID_FIELDS, []), "oom": probe.table(probe.OOM_FIELDS, []),
           "xid_counts": {}, "raw": lines, "raw_total": len(lines), "candidates": len(lines)}
    for sent in (kernel, raw):  # parsed on the box, or raw and parsed by the client
        snapshot = parse_probe_output(probe.json_dumps(
            {"v": 1, "errors": {}, "host": {"btime": 1_700_000_000, "clk_tck": 100},
             "kernel": sent}).encode(), "box")
        assert len(snapshot.kernel_events) == len(section["xid"]["rows"]) + len(
            section["oom"]["rows"])
