"""No document from a box can crash gpuwatch or take its memory: the limits on a probe
document (model.py), checked before the data is used, and numbers out of range (a step
beyond int64 in a metrics file) kept out of the series, the store and the report.

The three hostile documents of the issue are tried at the parser, and end to end through a
real `--once` over `local` hosts whose `python` prints them (beside a good host, polled and
reported as usual); so is a run whose metrics files hold a step of 2^63 and more.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.series import RunSeries
from gpuwatch.remote.model.snapshot import ProbeError
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.watch.landing import judge
from gpuwatch.remote.wire import document as model
from gpuwatch.remote.wire.collect import PollOutcome
from gpuwatch.remote.wire.document import parse_probe_output
from gpuwatch.tui.cli.check import _document
from harness.cli import box_env, gpuwatch
from hostile_docs import big_number, deep, fake_python, real_document, zlib_bomb


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return real_document(tmp_path_factory.mktemp("real"))


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return zlib_bomb()


def probe_error(data: bytes) -> ProbeError:
    with pytest.raises(ProbeError) as caught:
        parse_probe_output(data, "bad")
    return caught.value


def encoded(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# ---------------------------------------------------------------- (a), (b), (c) at the parser

@pytest.mark.parametrize("compress", [False, True], ids=["json", "zlib"])
def test_a_document_nested_300000_deep_is_a_probe_error_naming_the_depth(compress: bool) -> None:
    data = deep()
    error = probe_error(zlib.compress(data) if compress else data)
    assert f"nested deeper than the limit of {model.MAX_DEPTH}" in str(error)


def test_nesting_within_the_limit_and_brackets_inside_strings_are_read(
        doc: dict[str, Any]) -> None:
    """The depth is counted outside strings: a log tail full of brackets and escaped quotes
    (`\\"[[[`) is data, and a document nested to the limit is read."""
    run = doc["runs"][0]
    tail = '\\"' + "[" * 500 + '\\\\"{' * 100 + "]"
    snap = parse_probe_output(encoded({**doc, "runs": [
        {**run, "log": {**run["log"], "tail": tail}}]}), "good")
    assert snap.runs[0].log is not None and snap.runs[0].log.tail == tail
    nested: Any = 1
    for _ in range(model.MAX_DEPTH - 5):  # within doc, runs, the run, metrics, the file
        nested = [nested]
    metrics = [{**run["metrics"][0], "cursor": nested}]
    snap = parse_probe_output(encoded({**doc, "runs": [{**run, "metrics": metrics}]}), "good")
    assert snap.runs[0].metrics[0].cursor == nested
    metrics = [{**run["metrics"][0], "cursor": [nested]}]  # one more: over the limit
    assert "MAX_DEPTH" in str(probe_error(encoded({**doc, "runs": [{**run, "metrics": metrics}]})))
    hidden = ('{"v":1,"x":' + '["]]]]",' * (model.MAX_DEPTH + 1) + "1"
              + "]" * (model.MAX_DEPTH + 1) + "}")  # closing brackets in strings hide nothing
    assert "MAX_DEPTH" in str(probe_error(hidden.encode()))


@pytest.mark.parametrize("digits", [41, 400, 4000])
def test_a_number_with_hundreds_of_digits_is_a_probe_error_naming_the_limit(
        doc: dict[str, Any], digits: int) -> None:
    error = probe_error(big_number(doc, digits))
    assert f"more than the limit of {model.MAX_NUMBER_DIGITS} digits" in str(error)
    probe_error(zlib.compress(big_number(doc, digits)))


def test_digits_inside_strings_are_text(doc: dict[str, Any]) -> None:
    host = {**doc["host"], "hostname": "9" * 300}
    assert parse_probe_output(encoded({**doc, "host": host}), "good").hostname == "9" * 300


@pytest.mark.parametrize(("section", "key", "value"), [
    ("host", "ncpu", 2**63), ("host", "btime", -(2**63) - 1), ("host", "ncpu", 10**39),
    ("host", "time", 1e300), ("host", "uptime_s", 2**60),
])
def test_a_numeric_field_out_of_range_is_a_probe_error_naming_the_field(
        doc: dict[str, Any], section: str, key: str, value: int | float) -> None:
    error = probe_error(encoded({**doc, section: {**doc[section], key: value}}))
    assert error.where == f"{section}.{key}" and "out of range" in error.problem


def test_non_finite_floats_in_fields_are_probe_errors(doc: dict[str, Any]) -> None:
    """json.loads reads NaN and Infinity: a field's float must be finite (a time of inf
    crashed the TUI's age formatting and the JSON report)."""
    text = encoded(doc).replace(b'"uptime_s":86400.25', b'"uptime_s":Infinity')
    assert probe_error(text).where == "host.uptime_s"


def test_a_zlib_bomb_is_refused_while_inflating_in_bounded_memory(bomb: bytes) -> None:
    """(c) 256 MiB inflated from a few hundred KB: refused after MAX_DOCUMENT_BYTES, never
    inflated whole (memory peaks near the limit, not near 256 MiB)."""
    assert len(bomb) < 1024 * 1024
    tracemalloc.start()
    try:
        error = probe_error(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"larger than the limit of {model.MAX_DOCUMENT_BYTES >> 20} MiB" in str(error)
    assert "inflated" in str(error)
    assert peak < 2 * model.MAX_DOCUMENT_BYTES


def test_a_cut_zlib_stream_and_other_limits_are_probe_errors(doc: dict[str, Any]) -> None:
    whole = zlib.compress(encoded(doc))
    assert "cut short" in str(probe_error(whole[:len(whole) // 2]))
    long = {**doc, "host": {**doc["host"], "hostname": "x" * (model.MAX_STRING_BYTES + 1)}}
    assert "MAX_STRING_BYTES" in str(probe_error(encoded(long)))
    many = b'{"v":1,"x":[' + b"[]," * model.MAX_CONTAINERS + b"1]}"
    assert "MAX_CONTAINERS" in str(probe_error(many))
    values = b'{"v":1,"x":[' + b"0," * model.MAX_VALUES + b"1]}"
    assert "MAX_VALUES" in str(probe_error(values))
    assert parse_probe_output(encoded(doc), "good").hostname == doc["host"]["hostname"]


def test_gpuwatch_check_reads_the_document_through_the_limits(bomb: bytes) -> None:
    host = parse_config('[hosts.bad]\nssh = "local"\n').hosts[0]
    assert _document(PollOutcome(host, 0.0, 0.1, None, bomb)) == {}


# ---------------------------------------------------------------- case 2: numbers out of range

def judged(doc: dict[str, Any]) -> HostHistory:
    """The document parsed, judged and reported as `--once` does (json report included)."""
    from gpuwatch.remote.report import document, prometheus_text, text_report, to_json_text
    from gpuwatch.remote.store import Store

    host = parse_config('[hosts.gpu1]\nssh = "local"\n[hosts.gpu1.runs.llama]\n'
                        'events = "/x"\n').hosts[0]
    data = encoded(doc)
    outcome = PollOutcome(host, 1_795_617_700.0, 0.5, parse_probe_output(data, "gpu1"), data)
    history = HostHistory("gpu1")
    report = judge(history, outcome)
    jsonschema.validate(json.loads(to_json_text(document([report], 1.0))), load_schema())
    text_report([report], 1.0)
    prometheus_text([report])
    from gpuwatch.remote.watch.landing import remember

    remember(Store.open(":memory:"), outcome, history)
    return history


@pytest.mark.parametrize("step", [2**63, 2**64, -(2**63) - 1, 10**30])
def test_a_step_beyond_int64_drops_that_point_only(doc: dict[str, Any], step: int) -> None:
    """A step the series' int64 columns and SQLite cannot hold: that point is left out and
    said (the file's errors, its skipped count); the tag's other points are kept."""
    run = doc["runs"][0]
    files = [dict(f) for f in run["events"]["files"]]
    loss = files[0]["scalars"]["train/loss"]
    files[0]["scalars"] = {**files[0]["scalars"], "train/loss": {
        **loss, "steps": [*loss["steps"][:-1], step]}}
    metrics = [dict(m) for m in run["metrics"]]
    csv = next(m for m in metrics if m["kind"] == "csv")
    csv["scalars"] = {tag: {**col, "steps": [col["steps"][0], step]}
                      for tag, col in csv["scalars"].items()}
    hostile = {**doc, "runs": [{**run, "events": {**run["events"], "files": files},
                                "metrics": metrics}]}
    history = judged(hostile)
    (sample,) = [r for r in history.snapshots[-1].runs if r.name == "llama"]
    event_file = sample.event_files[0]
    assert event_file.scalars["train/loss"].steps == tuple(loss["steps"][:-1])
    assert any("step out of range" in e for e in event_file.errors)
    (csv_file,) = [m for m in sample.metrics if m.kind == "csv"]
    assert csv_file.skipped == len(csv["scalars"]) and csv_file.errors
    assert all(col.steps == (1,) for col in csv_file.scalars.values())
    series = history.runs["llama"]
    assert series.last_step("train/loss") == loss["steps"][-2]


def test_an_empty_event_file_path_is_a_probe_error(doc: dict[str, Any]) -> None:
    """An empty path made the series' os.path.relpath raise ValueError while judging."""
    run = doc["runs"][0]
    for events in ({**run["events"], "path": ""},
                   {**run["events"], "files": [{**run["events"]["files"][0], "path": ""}]}):
        error = probe_error(encoded({**doc, "runs": [{**run, "events": events}]}))
        assert "a path (a string, not empty)" in error.problem


def test_the_store_drops_a_stored_point_beyond_int64() -> None:
    """A store written before the limits (or by hand) with a step of 2^63: that tag is
    dropped on restore, not an OverflowError at start-up."""
    series = RunSeries("r")
    series.restore_points({"events": {"bad": {"points": [[2**63, 1.0, 0.0]]},
                                      "good": {"points": [[5, 1.0, 0.0]]}},
                           "metrics": {"m.csv": {"huge": {"points": [[1, 10**400, 0.0]]}}}})
    assert list(series.event_series) == ["good"] and series.metric_series == {"m.csv": {}}


# ---------------------------------------------------------------- end to end: `--once`

PEAK = ("import sys\nfrom gpuwatch.tui.cli import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
        "    peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "    sys.stderr.write('PEAK ' + peak[0].split()[1] + '\\n')\n")
"""`gpuwatch` (cli.main, as the console script runs it) that writes its peak RSS (VmHWM, KiB)
last on stderr. Not getrusage: a child's ru_maxrss starts from its parent's (pytest's) at the
fork, which hides the child's own peak."""


def run_once(tmp_path: Path, env: dict[str, str], config: str) -> tuple[int, dict[str, Any], int]:
    """`gpuwatch --once --json` in a child: (exit code, report, its peak RSS in KiB)."""
    state = tmp_path / f"state-{len(list(tmp_path.glob('state-*')))}"
    (tmp_path / "c.toml").write_text(config)
    full_env = {"PATH": env["PATH"], "HOME": str(tmp_path), "XDG_STATE_HOME": str(state),
                "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **env}
    out = subprocess.run([sys.executable, "-c", PEAK, "--config", str(tmp_path / "c.toml"),
                          "--once", "--json"], env=full_env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout, out.stderr
    peak = out.stderr.rstrip().rsplit("\n", 1)[-1]
    assert peak.startswith("PEAK "), out.stderr
    return out.returncode, json.loads(out.stdout), int(peak.split()[1])


def test_once_over_hostile_hosts_reports_the_good_host_in_bounded_memory(
        tmp_path: Path, doc: dict[str, Any], bomb: bytes) -> None:
    """(a), (b), (c) each on a host of their own beside a good one: the good host is polled
    and reported as usual, each hostile host is that host's `probe` error naming the limit
    (exit 2), and the client's peak RSS stays within 2x that of a normal `--once`."""
    box = Box(tmp_path / "box", h100_sxm(2))
    env = box_env(box)
    hostile = {"deep": deep(), "bignum": big_number(doc), "bomb": bomb}
    good = "".join(f'[hosts.{name}]\nssh = "local"\n' for name in ("good", *hostile))
    code, report, normal_rss = run_once(tmp_path, env, good)
    assert code == 0 and all(h["ok"] for h in report["hosts"])
    config = '[hosts.good]\nssh = "local"\n' + "".join(
        f'[hosts.{name}]\nssh = "local"\npython = "{fake_python(tmp_path / name, data)}"\n'
        for name, data in hostile.items())
    code, report, rss = run_once(tmp_path, env, config)
    jsonschema.validate(report, load_schema())
    hosts = {h["name"]: h for h in report["hosts"]}
    assert code == 2
    assert hosts["good"]["ok"] and len(hosts["good"]["gpus"]) == 2
    limits = {"deep": "MAX_DEPTH", "bignum": "MAX_NUMBER_DIGITS", "bomb": "MAX_DOCUMENT_BYTES"}
    for name, limit in limits.items():
        assert not hosts[name]["ok"] and hosts[name]["error"]["kind"] == "probe"
        assert limit in hosts[name]["error"]["message"]
    print(f"\npeak RSS: normal --once {normal_rss} KiB, with the hostile hosts {rss} KiB")
    assert rss <= 2 * normal_rss, (rss, normal_rss)


def test_once_with_metrics_steps_beyond_int64_reports_the_run(tmp_path: Path) -> None:
    """Case 2: a metrics.csv and a trainer_state.json with a step of 2^63 (and a JSONL one of
    2^64) were an OverflowError in the series code, exit 1, no report. Now those points are
    left out, the others kept, and a second `--once` (the store's series read back) too."""
    box = Box(tmp_path / "box", h100_sxm(1))
    work = tmp_path / "work"
    work.mkdir()
    (work / "metrics.csv").write_text(f"step,loss\n1,0.9\n{2**63},0.5\n2,0.8\n")
    (work / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 10, "eval_loss": 2.0}, {"step": 2**63 + 5, "eval_loss": 1.0},
        {"step": 20, "eval_loss": 1.5}]}))
    (work / "log.jsonl").write_text(f'{{"step": {2**64}, "acc": 1}}\n{{"step": 3, "acc": 0.5}}\n')
    config = (f'[hosts.local]\nssh = "local"\n[hosts.local.runs.r]\nworkdir = "{work}"\n'
              'metrics = ["metrics.csv", "trainer_state.json", "log.jsonl"]\n')
    for attempt in range(2):
        out = gpuwatch(tmp_path, "--once", "--json", env=box_env(box), config=config)
        assert out.returncode in (0, 1), out.stderr  # healthy, or a finding: never a crash
        assert "Traceback" not in out.stderr
        report = json.loads(out.stdout)
        jsonschema.validate(report, load_schema())
        (host,) = report["hosts"]
        (run,) = host["runs"]
        series = run["series"]
        assert series["loss"]["last_step"] == 2 + attempt, series
        assert series["loss"]["points"] == 2 + attempt
        assert series["eval_loss"]["last_step"] == 20 and series["eval_loss"]["points"] == 2
        assert series["acc"]["last_step"] == 3 and series["acc"]["points"] == 1
        (work / "metrics.csv").write_text(f"step,loss\n1,0.9\n{2**63},0.5\n2,0.8\n3,0.7\n")
