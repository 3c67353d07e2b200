"""Training runs end to end: real files in a tmp workdir, the probe run as the SSH path runs it,
its answer parsed into RunSamples and folded into RunSeries, poll after poll.

Event files come from tensorboardX's own writer (its EventsWriter is the synchronous part of
SummaryWriter: records land before the next poll; SummaryWriter itself, closed, is used too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path

import pytest
from gpuwatch.remote.box import names as probe_module
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.series import RunSeries, run_request
from gpuwatch.remote.wire.bundle import (
    GLOB,
    METRICS,
    RUN_FILES,
    build_command,
    build_stdin,
    compressed_probe,
    modules_for,
)
from gpuwatch.remote.wire.document import parse_probe_output
from harness.probe_box import Box, box_request, build_box, python36
from harness.run_polls import ENV, QUIET, Watch, events_writer, probe, write_scalars
from tensorboardX import SummaryWriter


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "llama"
    path.mkdir()
    return path


# ---------------------------------------------------------------- event files

def test_event_file_read_incrementally_across_polls(workdir: Path):
    writer = events_writer(workdir / "runs")
    write_scalars(writer, "train/loss", [(s, 2.0 / (s + 1)) for s in range(5)])
    watch = Watch(RunConfig("llama", workdir=str(workdir), events="runs"))

    first = watch.poll()
    (f,) = first.event_files
    assert f.start == 0 and f.offset == f.bytes and f.stopped == "eof"
    assert f.first_wall_time is not None and f.errors == ()
    assert f.scalars["train/loss"].steps == (0, 1, 2, 3, 4)
    assert watch.series.last_step("train/loss") == 4

    write_scalars(writer, "train/loss", [(5, 0.3), (6, float("nan")), (7, float("inf"))])
    second = watch.poll()
    (g,) = second.event_files
    assert g.start == f.offset and g.offset == g.bytes > f.offset
    cols = g.scalars["train/loss"]
    assert cols.steps == (5, 6, 7) and cols.values[0] == pytest.approx(0.3)
    assert watch.doc["runs"][0]["events"]["files"][0]["scalars"]["train/loss"]["values"][1:] \
        == ["nan", "inf"]
    assert watch.series.to_json()["series"]["train/loss"] == {
        "last_step": 7, "last_value": "inf", "points": 8}

    third = watch.poll()  # nothing new: one stat, no read
    (h,) = third.event_files
    assert h.start is None and h.scalars == {} and h.offset == g.offset
    assert set(watch.doc["runs"][0]["events"]["files"][0]) == {"path", "size", "mtime", "offset"}
    assert len(watch.series.series["train/loss"]) == 8


def test_the_box_decoder_finds_the_c_crc32c_in_site_packages(workdir: Path):
    """The probe runs under `python3 -S` (no site-packages at start-up: 3 ms of every poll, tens
    of ms in a conda env); where the event decoder goes, the loader loads site first, so the
    box's C crc32c (in this python's site-packages, as on a box) checks the records."""
    import crc32c  # noqa: F401  (a test dependency: the C path must be here to be checked)

    writer = events_writer(workdir / "runs")
    write_scalars(writer, "loss", [(s, 1.0 / (s + 1)) for s in range(3)])
    watch = Watch(RunConfig("r", workdir=str(workdir), events="runs"))
    watch.poll()
    assert "-S -c" in build_command(sys.executable)
    assert watch.doc["runs"][0]["events"]["files"][0]["crc"] == "c"


def test_summary_writer_files_in_subfolders(workdir: Path):
    with SummaryWriter(str(workdir / "runs" / "May04_22-14-51_box")) as w:
        for step in range(20):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_histogram("weights", [0.1, 0.2, 0.3], step)  # skipped, not a scalar
    (workdir / "runs" / "notes.txt").write_text("not an event file")
    watch = Watch(RunConfig("hf", workdir=str(workdir), events="runs"))
    sample = watch.poll()
    (f,) = sample.event_files  # notes.txt is not one
    assert "/runs/May04_22-14-51_box/events.out.tfevents." in f.path and f.stopped == "eof"
    assert watch.series.series["loss"].points()[-1][:2] == (19, pytest.approx(0.05))


def test_first_load_spreads_over_polls_within_the_byte_budget(workdir: Path):
    writer = events_writer(workdir / "runs")
    write_scalars(writer, "loss", [(s, float(s)) for s in range(400)])
    size = os.path.getsize(writer._file_name)
    watch = Watch(RunConfig("big", workdir=str(workdir), events="runs"),
                  limits={"events_bytes": size // 5})
    progress = []
    for _ in range(10):
        (f,) = watch.poll().event_files
        progress.append(f.progress)
        if not f.pending:
            break
    assert len(progress) >= 5 and progress == sorted(progress) and progress[-1] == 1.0
    assert watch.series.series["loss"].steps.tolist() == list(range(400))


def test_restart_newer_file_wins_and_is_marked(workdir: Path):
    old = events_writer(workdir / "runs", ".a")
    write_scalars(old, "loss", [(s, 1.0) for s in range(100)], wall=1_700_000_000)
    watch = Watch(RunConfig("r", workdir=str(workdir), events="runs"))
    watch.poll()
    time.sleep(1.1)  # tensorboardX names files by whole seconds
    new = events_writer(workdir / "runs", ".b")  # resumed from the checkpoint at step 50
    write_scalars(new, "loss", [(s, 2.0) for s in range(50, 121)], wall=1_700_000_900)
    watch.poll()
    loss = watch.series.series["loss"]
    assert loss.steps.tolist() == list(range(121))
    assert set(loss.values[:50]) == {1.0} and set(loss.values[50:]) == {2.0}
    assert list(watch.series.restarts) == [(50, 1_700_000_900)]


def test_parallel_writers_in_two_folders_stay_apart(workdir: Path):
    train, val = events_writer(workdir / "logs" / "train"), events_writer(workdir / "logs" /
                                                                          "validation")
    write_scalars(train, "epoch_loss", [(s, 1.0) for s in range(10)], wall=1_700_000_000)
    write_scalars(val, "epoch_loss", [(s, 3.0) for s in range(10)], wall=1_700_000_005)
    write_scalars(train, "epoch_loss", [(10, 0.5)], wall=1_700_000_010)
    watch = Watch(RunConfig("keras", workdir=str(workdir), events="logs"))
    watch.poll()
    series = watch.series.series
    assert {"epoch_loss", "validation/epoch_loss"} <= set(series)
    assert len(series["epoch_loss"]) == 11 and len(series["validation/epoch_loss"]) == 10
    assert not watch.series.restarts


def test_missing_events_folder_is_an_error_of_that_source(workdir: Path):
    (workdir / "train.log").write_text("step 1\n")
    watch = Watch(RunConfig("r", workdir=str(workdir), events="runs", log="train.log"))
    sample = watch.poll()
    assert sample.errors["events"].startswith("No such file or directory")
    assert sample.log is not None and sample.log.tail == "step 1\n"


# ---------------------------------------------------------------- metrics files

def trainer_state(path: Path, entries: int, start: int = 0) -> None:
    history = []
    for i in range(start, start + entries):
        step = 10 * (i + 1)
        history.append({"epoch": step / 1000, "grad_norm": 1.5, "learning_rate": 5e-5,
                        "loss": 2.0 - i / 100, "step": step})
        if i % 3 == 2:
            history.append({"epoch": step / 1000, "eval_loss": 1.9, "eval_runtime": 3.2,
                            "step": step})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": step, "log_history": history,
                                "best_metric": None}, indent=2))


def test_trainer_state_sends_only_new_entries(workdir: Path):
    state = workdir / "outputs" / "trainer_state.json"
    trainer_state(state, 6)
    watch = Watch(RunConfig("hf", workdir=str(workdir),
                            metrics=("outputs/trainer_state.json",)))
    (m,) = watch.poll().metrics
    assert m.kind == "trainer_state" and m.error is None
    assert m.scalars["loss"].steps == (10, 20, 30, 40, 50, 60)
    assert m.scalars["eval_loss"].steps == (30, 60) and m.scalars["loss"].wall_times is None
    (again,) = watch.poll().metrics  # unchanged size and mtime: not even parsed
    assert again.scalars == {}
    trainer_state(state, 9)
    os.utime(state, (time.time() + 5, time.time() + 5))
    (m3,) = watch.poll().metrics
    assert m3.scalars["loss"].steps == (70, 80, 90) and m3.scalars["eval_loss"].steps == (90,)
    assert watch.series.last_step("loss") == 90 and len(watch.series.series["loss"]) == 9


def test_trainer_state_glob_reads_the_newest_checkpoints_copy(workdir: Path):
    trainer_state(workdir / "out" / "checkpoint-30" / "trainer_state.json", 3)
    trainer_state(workdir / "out" / "checkpoint-60" / "trainer_state.json", 6)
    later = time.time() + 10
    os.utime(workdir / "out" / "checkpoint-60" / "trainer_state.json", (later, later))
    watch = Watch(RunConfig("hf", workdir=str(workdir),
                            metrics=("out/checkpoint-*/trainer_state.json",)))
    (m,) = watch.poll().metrics
    assert m.file is not None and m.file.endswith("checkpoint-60/trainer_state.json")
    assert m.path == f"{workdir}/out/checkpoint-*/trainer_state.json"
    assert m.scalars["loss"].steps[-1] == 60


def test_lightning_metrics_csv_incremental_with_empty_cells(workdir: Path):
    csv_path = workdir / "lightning_logs" / "version_0" / "metrics.csv"
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("epoch,step,train_loss,val_loss\n0,49,0.9,\n0,99,0.8,\n0,99,,0.85\n")
    watch = Watch(RunConfig("pl", workdir=str(workdir),
                            metrics=("lightning_logs/version_*/metrics.csv",)))
    (m,) = watch.poll().metrics
    assert m.kind == "csv" and m.scalars["train_loss"].steps == (49, 99)
    assert m.scalars["val_loss"].steps == (99,) and m.scalars["epoch"].values == (0.0, 0.0, 0.0)
    with csv_path.open("a") as f:
        f.write("1,149,0.7,\n1,199,0.6")  # the last row is still being written
    (m2,) = watch.poll().metrics
    assert m2.scalars["train_loss"].steps == (149,) and not m2.reset
    # a new metric: Lightning rewrites the whole file under a new header
    csv_path.write_text("epoch,lr,step,train_loss,val_loss\n0,0.1,49,0.9,\n0,0.1,99,0.8,\n")
    (m3,) = watch.poll().metrics
    assert m3.reset and m3.scalars["lr"].steps == (49, 99)
    assert watch.series.series["train_loss"].steps.tolist() == [49, 99]  # the newer file wins


def test_jsonl_partial_last_line_is_completed_later(workdir: Path):
    log = workdir / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 2.5, "note": "warmup"}\n{"step": 2, "loss": NaN}\n'
                   '{"step": 3, "lo')
    watch = Watch(RunConfig("j", workdir=str(workdir), metrics=("metrics.jsonl",)))
    (m,) = watch.poll().metrics
    assert m.scalars["loss"].steps == (1, 2) and str(m.scalars["loss"].values[1]) == "nan"
    assert "note" not in m.scalars and m.skipped == 0
    with log.open("a") as f:
        f.write('ss": 2.25}\n{"step": 4, "loss": 2.0}\n')
    (m2,) = watch.poll().metrics
    assert m2.scalars["loss"].steps == (3, 4) and m2.scalars["loss"].values == (2.25, 2.0)
    assert watch.series.series["loss"].steps.tolist() == [1, 2, 3, 4]


def test_the_metrics_readers_go_only_to_polls_that_read_metrics(workdir: Path):
    """The readers of trainer_state.json, CSV and JSONL (1.3 KB of a poll's upload)
    go only where a run names metrics files or discovery may find some; a probe that lacks
    them when a run names some says so in that source and reads the rest."""
    (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2}\n')
    (workdir / "train.log").write_text("step 2 loss 2.0\n")
    with_metrics = RunConfig("j", workdir=str(workdir), metrics=("metrics.jsonl",),
                             log="train.log")
    without = RunConfig("j", workdir=str(workdir), log="train.log")

    def request(run: RunConfig) -> dict:
        return {"v": 1, "want": {**QUIET, "discover": False}, "spawn": True, "cgroup": 2,
                "kernel_lines": 0, "runs": [run_request(run, None)]}

    assert modules_for(request(with_metrics)) == ("gpuwatch_probe", RUN_FILES, METRICS)
    assert modules_for(request(without)) == ("gpuwatch_probe", RUN_FILES)
    assert METRICS in modules_for({"v": 1})  # discovery may find some

    def poll(stdin: bytes) -> dict:
        result = subprocess.run(["sh", "-c", build_command(sys.executable)], input=stdin,
                                env=ENV, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr.decode()
        (run,) = json.loads(result.stdout)["runs"]
        return run

    read = poll(build_stdin(request(with_metrics), trim=True))
    assert read["metrics"][0]["scalars"]["loss"]["steps"] == [1, 2] and "errors" not in read
    assert poll(build_stdin(request(without), trim=True))["log"]["size"] > 0
    lacking = compressed_probe(("gpuwatch_probe", RUN_FILES))  # as if the client misjudged
    body = json.dumps(request(with_metrics)).encode()
    run = poll(b"%d\n" % len(lacking) + lacking + body)
    assert run["errors"] == {"metrics[0]": "the metrics readers were not sent with this poll"}
    assert run["log"]["size"] > 0


def test_malformed_metrics_files_are_errors_not_crashes(workdir: Path):
    (workdir / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss"')
    (workdir / "no_history.json").write_text('{"global_step": 3}')
    (workdir / "metrics.csv").write_text("time,loss\n0,1.0\n")  # neither step nor epoch
    (workdir / "m.jsonl").write_text('[1, 2]\n{"loss": 1}\nnot json\n{"step": "x"}\n'
                                     '{"step": 5, "loss": 1.5}\n')
    (workdir / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    (workdir / "train.log").write_text("fine\n")
    watch = Watch(RunConfig("bad", workdir=str(workdir), log="train.log", metrics=(
        "trainer_state.json", "no_history.json", "metrics.csv", "m.jsonl", "binary.jsonl",
        "missing.jsonl", "weird.txt")))
    sample = watch.poll()
    errors = {m.path.rsplit("/", 1)[-1]: m.error for m in sample.metrics}
    assert errors["trainer_state.json"].startswith("JSONDecodeError")
    assert errors["no_history.json"].endswith("has no log_history list")
    assert "has no step or epoch column" in errors["metrics.csv"]
    assert errors["m.jsonl"] is None and errors["binary.jsonl"] is None
    assert errors["missing.jsonl"].startswith("No such file or directory")
    assert errors["weird.txt"].startswith("unknown metrics format")
    jsonl = next(m for m in sample.metrics if m.path.endswith("/m.jsonl"))
    assert jsonl.skipped == 4 and jsonl.scalars["loss"].steps == (5,)
    assert set(sample.errors) == {"metrics[0]", "metrics[1]", "metrics[2]", "metrics[5]",
                                  "metrics[6]"}
    assert sample.log is not None and sample.log.tail == "fine\n"


# ---------------------------------------------------------------- log tail

def test_log_tail_is_bounded_data_never_markup(workdir: Path):
    lines = [f"step {i} loss 2.{i:03d}" for i in range(300)]
    body = "\n".join(lines).encode() + b"\n\xff\xfe broken utf-8 [bold red]x[/] \x1b[31mred\n"
    (workdir / "train.log").write_bytes(body)
    watch = Watch(RunConfig("r", workdir=str(workdir), log="train.log"))
    log = watch.poll().log
    assert log is not None and log.tail is not None and log.bytes == len(body)
    tail = log.tail.split("\n")
    assert tail[-1] == "" and len(tail) == 41  # 40 lines and the final newline
    assert tail[-2] == "\ufffd\ufffd broken utf-8 [bold red]x[/] \x1b[31mred"
    assert tail[0] == "step 261 loss 2.261"
    again = watch.poll().log  # unchanged: the tail is not sent again; the client keeps it
    assert again is not None and again.tail is None
    assert "tail" not in watch.doc["runs"][0]["log"] and watch.series.tail == log.tail


def test_log_tail_of_long_lines_cuts_at_a_line_start(workdir: Path):
    (workdir / "train.log").write_text("x" * 3000 + "\n" + "y" * 3000 + "\nlast\n")
    log = Watch(RunConfig("r", workdir=str(workdir), log="train.log")).poll().log
    assert log is not None and log.tail == "y" * 3000 + "\nlast\n"  # the cut x line is gone


# ---------------------------------------------------------------- checkpoints and done

def make_checkpoint(folder: Path, mtime: float, files: int = 3, size: int = 100) -> None:
    folder.mkdir(parents=True)
    for i in range(files):
        path = folder / f"shard-{i}.bin"
        path.write_bytes(b"\0" * size)
        os.utime(path, (mtime, mtime))
    os.utime(folder, (mtime - 5, mtime - 5))


def test_checkpoints_oldest_first_with_leftovers(workdir: Path):
    now = time.time()
    out = workdir / "outputs"
    for i, age in enumerate((3600, 2400, 1200)):
        make_checkpoint(out / f"checkpoint-{500 * (i + 1)}", now - age)
    (out / "tmp-checkpoint-2000").mkdir()  # HuggingFace's staging folder, never renamed (U6)
    (out / "checkpoint-1500" / "latest.pth.tmp").write_bytes(b"\0" * 10)  # torch.save's
    watch = Watch(RunConfig("hf", workdir=str(workdir), checkpoints="outputs/checkpoint-*"))
    sample = watch.poll()
    assert [c.path.rsplit("/", 1)[-1] for c in sample.checkpoints] == [
        "checkpoint-500", "checkpoint-1000", "checkpoint-1500"]
    assert [c.bytes for c in sample.checkpoints] == [300, 300, 300]  # junk is not the checkpoint
    assert sample.checkpoints[0].mtime == pytest.approx(now - 3600, abs=0.01)
    assert sorted(c.path.rsplit("/", 1)[-1] for c in sample.leftovers) == [
        "latest.pth.tmp", "tmp-checkpoint-2000"]
    assert sample.checkpoints_total == 3 and not any(c.capped for c in sample.checkpoints)
    series = watch.series
    assert series.cadence_s == pytest.approx(1200, abs=1)
    latest = series.latest_checkpoint
    assert latest is not None and latest.path.endswith("checkpoint-1500")
    assert series.status == "unknown" and series.work_at_risk_s() is None  # never seen running
    assert series.to_json()["checkpoints"][0] == {
        "path": f"{out}/checkpoint-500", "mtime": sample.checkpoints[0].mtime, "bytes": 300}


def test_checkpoint_size_walk_is_capped_newest_first(workdir: Path):
    now = time.time()
    make_checkpoint(workdir / "ckpt" / "step-1", now - 100, files=30)
    make_checkpoint(workdir / "ckpt" / "step-2", now, files=30)
    watch = Watch(RunConfig("r", workdir=str(workdir), checkpoints="ckpt/step-*"),
                  limits={"ckpt_files": 40})
    old, new = watch.poll().checkpoints
    assert (new.bytes, new.capped) == (3000, False)  # the one that matters is measured
    assert old.capped and old.bytes < 3000


def test_checkpoint_files_glob_keeps_tmp_apart(workdir: Path):
    (workdir / "ckpt").mkdir()
    for name in ("epoch_1.pth", "epoch_2.pth", "latest.pth.tmp", "model.partial"):
        (workdir / "ckpt" / name).write_bytes(b"\0" * 5)
    sample = Watch(RunConfig("r", workdir=str(workdir), checkpoints="ckpt/*")).poll()
    assert sorted(c.path.rsplit("/", 1)[-1] for c in sample.checkpoints) == [
        "epoch_1.pth", "epoch_2.pth"]
    assert sorted(c.path.rsplit("/", 1)[-1] for c in sample.leftovers) == [
        "latest.pth.tmp", "model.partial"]



# The probe's own glob (importing glob costs 3.7 ms of a poll: re, enum, contextlib): the
# stdlib's glob and fnmatch are the reference it is held to.
GLOB_NAMES = ["a", "ab", "abc", "b", "ba", ".hidden", ".h2", "a.py", "b.pt", "c-1", "c-2",
              "c-10", "x]y", "x[y", "[ab]", "a*b", "q?", "-", "!", "Z", "checkpoint-500",
              "tmp-checkpoint-600", ""]
GLOB_PATTERNS = ["*", "?", "??", "a*", "*b", "*b*", "a?c", "[ab]", "[!ab]", "[a-c]*", "[!a-c]*",
                 "[]x]*", "x[]]y", "x[[]y", "x[y", "[", "]", "[!]", "[!]]*", "[-]", "[a-]",
                 "[z-a]", "[!z-a]", "*[0-9]", "c-?", "c-[12]", "c-*0", "**", "*.*", ".*",
                 ".h*", "*.p[yt]", "a**c", "*a*b*", "checkpoint-*", "[c]heckpoint-[0-9]*",
                 "tmp*", "[*]", "[?]*", "q[?]", "\\*", "[\\]", "*-*-*"]


def test_glob_match_is_fnmatchcase():
    import fnmatch

    for pattern in GLOB_PATTERNS:
        for name in GLOB_NAMES:
            assert probe_module.glob_match(name, pattern) == fnmatch.fnmatchcase(name, pattern), \
                (name, pattern)


def test_expand_glob_finds_what_glob_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import glob

    for folder in ("runs/v1", "runs/v2", "runs/.old", "out/checkpoint-1", "out/checkpoint-22",
                   "out/tmp-checkpoint-3", "x[1]", "x1"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("runs/v1/ev.tfevents.1", "runs/v2/ev.tfevents.2", "runs/.old/ev.tfevents.0",
                 "runs/notes.txt", "out/checkpoint-1/model.pt", "out/checkpoint-22/model.pt",
                 "out/latest.pt.tmp", "out/.hid.pt", "x1/f", "x[1]/f"):
        (tmp_path / name).write_text("x")
    (tmp_path / "out" / "link").symlink_to(tmp_path / "runs")
    (tmp_path / "out" / "dangling").symlink_to(tmp_path / "nowhere")
    patterns = ["runs/*", "runs/*/", "runs/*/ev.*", "runs/.*/ev.*", "runs/v?/ev.tfevents.[0-9]",
                "out/checkpoint-*", "out/checkpoint-*/model.pt", "out/*/model.pt",
                "out/*", "out/.*", "out/*/", "out/li*/v1/ev.*", "out/d*", "x[1]/f", "x[[]1]/f",
                "*/v1", "*/*/ev.tfevents.1", "runs//v*", "out/checkpoint-*/missing",
                "nowhere/*", "run?/notes.txt", "*"]
    monkeypatch.chdir(tmp_path)
    for pattern in patterns:
        for path in (pattern, str(tmp_path / pattern)):
            want = sorted(glob.glob(path))
            assert probe_module.expand_glob(path, 100) == (want, False), path
            assert probe_module.glob_paths(path, 100) == (want, False), path
    # bounded: at most `cap`, and it says so
    many = tmp_path / "many"
    many.mkdir()
    for i in range(30):
        (many / f"ckpt-{i}").write_text("")
    for expand in (probe_module.expand_glob, probe_module.glob_paths):
        got, capped = expand(str(many / "ckpt-*"), 10)
        assert capped and len(got) == 10 and set(got) <= set(glob.glob(str(many / "ckpt-*")))
    assert probe_module.expand_glob(str(many / "ckpt-1"), 10) == ([str(many / "ckpt-1")], False)


def test_a_run_with_a_checkpoint_glob_does_not_import_re(workdir: Path):
    """The steady poll of a HuggingFace run (checkpoints `checkpoint-*`): re, glob and what
    they import stay out of the probe's process."""
    (workdir / "outputs" / "checkpoint-500").mkdir(parents=True)
    (workdir / "outputs" / "checkpoint-500" / "model.safetensors").write_bytes(b"\0" * 64)
    (workdir / "train.log").write_text("step 1 loss 2.0\n")
    run = RunConfig("r", workdir=str(workdir), log="train.log",
                    checkpoints="outputs/checkpoint-*")
    request = {"v": 1, "want": {**QUIET, "discover": False},
               "runs": [run_request(run, RunSeries("r"))]}
    assert modules_for(request)[:3] == ("gpuwatch_probe", RUN_FILES, GLOB)  # no GPU: no reader
    plain = {**request, "runs": [run_request(RunConfig("r", workdir=str(workdir),
                                                       checkpoints="outputs"), None)]}
    assert GLOB not in modules_for(plain)  # a plain path: no glob goes
    assert GLOB not in modules_for({"v": 1})  # discovery's first poll: the stdlib's glob
    result = subprocess.run(["sh", "-c", build_command(sys.executable).replace(
        " -S ", " -S -X importtime ", 1)], input=build_stdin(request, trim=True), env=ENV,
        capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "pwd" in imported  # the probe's own imports are listed
    assert not imported & {"re", "glob", "fnmatch", "enum", "contextlib"}, result.stderr.decode()
    doc = json.loads(result.stdout)
    checkpoints = doc["runs"][0]["checkpoints"]
    assert checkpoints["total"] == 1 and checkpoints["items"]["fields"][0] == "path"
    assert checkpoints["items"]["rows"][0][0] == str(workdir / "outputs" / "checkpoint-500")
    # a probe sent without its glob (as if the client misjudged) reads it with the stdlib's
    lacking = compressed_probe(("gpuwatch_probe", RUN_FILES))
    result = subprocess.run(["sh", "-c", build_command(sys.executable)], env=ENV,
                            input=b"%d\n" % len(lacking) + lacking + json.dumps(request).encode(),
                            capture_output=True, timeout=60)
    assert json.loads(result.stdout)["runs"][0]["checkpoints"] == checkpoints

def test_status_running_dead_finished(workdir: Path):
    tag = f"gpuwatch-test-{uuid.uuid4().hex[:8]}"
    (workdir / "outputs").mkdir()
    run = RunConfig("r", process=tag, workdir=str(workdir), done="outputs/DONE",
                    checkpoints="outputs/ckpt-*")
    make_checkpoint(workdir / "outputs" / "ckpt-1", time.time() - 600)
    watch = Watch(run)
    assert watch.poll().pids == () and watch.series.status == "unknown"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag],
                             cwd=workdir)  # a process of the run works in its workdir
    try:
        sample = watch.poll()
        assert sample.pids == (child.pid,) and sample.done is False
        assert watch.series.status == "running"
        # The checkpoint is 10 minutes older than this launch: a crash loses the launch's own
        # work (seconds), not the 10 minutes before it started.
        assert 0 <= watch.series.work_at_risk_s() < 30  # type: ignore[operator]
    finally:
        child.kill()
        child.wait()
    assert watch.poll().pids == () and watch.series.status == "dead"
    assert 0 <= watch.series.work_at_risk_s() < 30  # type: ignore[operator]  # what was lost
    (workdir / "outputs" / "DONE").write_text("")
    sample = watch.poll()
    assert sample.done is True and sample.done_mtime is not None
    assert watch.series.status == "finished" and watch.series.work_at_risk_s() == 0.0
    fresh = Watch(run)  # a run found finished, never seen running: finished, not dead
    fresh.poll()
    assert fresh.series.status == "finished"


def test_home_paths_expand_on_the_box(tmp_path: Path):
    home = tmp_path / "home"
    (home / "exp").mkdir(parents=True)
    (home / "exp" / "train.log").write_text("hello\n")
    watch = Watch(RunConfig("r", workdir="~/exp", log="train.log", done="~/exp/DONE"),
                  env={**ENV, "HOME": str(home)})
    assert run_request(watch.run)["log"] == "~/exp/train.log"
    sample = watch.poll()
    assert sample.log is not None and sample.log.path == f"{home}/exp/train.log"
    assert sample.done is False


# ---------------------------------------------------------------- budgets, old pythons, sim

def full_run(workdir: Path) -> RunConfig:
    writer = events_writer(workdir / "runs")
    for tag in ("train/loss", "train/lr", "train/grad_norm", "eval/loss"):
        write_scalars(writer, tag, [(s, 1.0 / (s + 1)) for s in range(200)])
    trainer_state(workdir / "outputs" / "trainer_state.json", 50)
    (workdir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(100)))
    (workdir / "train.log").write_text("".join(f"step {s} loss 0.5\n" for s in range(500)))
    for i in range(3):
        make_checkpoint(workdir / "outputs" / f"checkpoint-{i}", time.time() - 100 * i)
    return RunConfig("llama", process="train.py", workdir=str(workdir), log="train.log",
                     events="runs", metrics=("outputs/trainer_state.json", "metrics.jsonl"),
                     checkpoints="outputs/checkpoint-*", done="outputs/DONE")


def test_steady_state_poll_with_a_run_fits_the_8k_budget(tmp_path: Path):
    """The 8-GPU fixture box plus a fully configured run: once the client holds the offsets,
    cursors and log state, a poll with nothing new is still under 8 KB received."""
    box: Box = build_box(tmp_path / "box")
    run = full_run(tmp_path / "llama")
    (box.proc / "830" / "cwd").unlink()
    (box.proc / "830" / "cwd").symlink_to(tmp_path / "llama")  # the run works in its workdir
    series = RunSeries(run.name)

    def poll() -> bytes:
        request = box_request(box, compress=True, runs=[run_request(run, series)])
        out = probe(request, box.env())
        snap = parse_probe_output(out, "gpu1")
        series.update(snap.runs[0], snap.taken_at)
        return out

    first, steady = poll(), poll()
    plain = probe(box_request(box, compress=True), box.env())  # the same box, no run
    print(f"\nfirst poll {len(first)} B, steady {len(steady)} B, "
          f"without the run {len(plain)} B (compressed)")
    assert len(steady) <= 8 * 1024
    assert len(steady) - len(plain) < 1024
    doc = json.loads(zlib.decompress(steady))
    assert doc["errors"] == {} and doc["runs"][0]["pids"] == [830]


def test_runs_under_python_36(workdir: Path):
    watch = Watch(full_run(workdir))
    sample = watch.poll(python=python36())
    assert sample.errors == {} and watch.doc["runs"][0]["events"]["files"][0]["stopped"] == "eof"
    assert len(watch.series.series["train/loss"]) == 200
    assert len(watch.series.series["loss"]) == 50  # trainer_state's, shadowing none


def test_simulator_disk_hook(tmp_path: Path):
    sim = tmp_path / "sim"
    sim.mkdir()
    fake = {"bytes_total": 1000, "bytes_free": 10, "inodes_total": 50, "inodes_free": 1}
    (sim / "statvfs.json").write_text(json.dumps({"/data": fake}))
    doc = json.loads(probe({"v": 1, "want": QUIET, "disks": ["/data", "/"]},
                           {**ENV, "GPUWATCH_SIM_DIR": str(sim)}))
    assert {k: doc["disks"][0][k] for k in fake} == fake and doc["disks"][1]["bytes_total"] > 1000
    real = json.loads(probe({"v": 1, "want": QUIET, "disks": ["/data"]}))
    assert "bytes_free" not in real["disks"][0] or real["disks"][0]["bytes_free"] != 10
