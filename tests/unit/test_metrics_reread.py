"""Metrics files read again and again while their writers grow, rewrite and switch them:
no step twice in a tag, no history lost, the formats people use read right, skipped lines
counted where a person sees them. Files come from tests/metrics_writers.py (the writers'
own code paths); each poll runs the real probe (test_runs.Watch), `--once` goes through
the store between polls, and the TUI through its on_snapshot_ready."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jsonschema
import pytest
from gpuwatch.remote.box import names as probe_module
from gpuwatch.remote.config.schema import Config, HostConfig, RunConfig
from gpuwatch.remote.model.series import RunSeries, TagSeries, file_generation
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.store import Store
from gpuwatch.remote.wire.collect import Collector
from gpuwatch.tui.app import build_app
from harness.cli import gpuwatch
from harness.run_polls import Watch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metrics_writers import KerasCSV, LightningCSV, hf_history, save_trainer_state

PROPERTY = settings(derandomize=True, max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def steps(watch: Watch, tag: str) -> list[int]:
    return watch.series.series[tag].steps.tolist()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


# ---------------------------------------------------------------- trainer_state.json


def test_trainer_state_switching_checkpoints_repeats_no_step(workdir: Path) -> None:
    """checkpoint-1000's trainer_state.json, then checkpoint-2000's (the whole history again):
    eval_loss has its step-1000 point once, and the JSON says 2 points."""
    out = workdir / "out"
    t = time.time() - 100
    save_trainer_state(out / "checkpoint-1000", hf_history(1000), 1000, mtime=t)
    watch = Watch(RunConfig("hf", workdir=str(workdir),
                            metrics=("out/checkpoint-*/trainer_state.json",)))
    watch.poll()
    assert steps(watch, "eval_loss") == [1000] and steps(watch, "loss") == [500, 1000]
    save_trainer_state(out / "checkpoint-2000", hf_history(2000), 2000, mtime=t + 10)
    (m,) = watch.poll().metrics
    assert m.file is not None and m.file.endswith("checkpoint-2000/trainer_state.json")
    assert steps(watch, "eval_loss") == [1000, 2000]
    assert steps(watch, "loss") == [500, 1000, 1500, 2000]
    assert watch.series.to_json()["series"]["eval_loss"]["points"] == 2
    watch.poll()  # unchanged: nothing read, nothing doubled
    assert steps(watch, "eval_loss") == [1000, 2000]


def test_equal_mtimes_pick_the_checkpoint_with_the_higher_step(workdir: Path) -> None:
    """A copied or rsynced run: every trainer_state.json has the same mtime. checkpoint-10000
    is the newest, not checkpoint-9000 (which sorts after it by name)."""
    out, t = workdir / "out", time.time() - 50
    for step in (8000, 9000, 10000):
        save_trainer_state(out / f"checkpoint-{step}", hf_history(step), step, mtime=t)
    watch = Watch(RunConfig("hf", workdir=str(workdir),
                            metrics=("out/checkpoint-*/trainer_state.json",)))
    (m,) = watch.poll().metrics
    assert m.file is not None and m.file.endswith("checkpoint-10000/trainer_state.json")
    assert watch.series.last_step("loss") == 10000


def test_the_newest_checkpoint_deleted_loses_no_history(workdir: Path) -> None:
    """Rotation or a full disk takes checkpoint-2000 away: checkpoint-1000 is the newest
    again and is read from its start; the points up to 2000 stay, none doubles."""
    out, t = workdir / "out", time.time() - 100
    save_trainer_state(out / "checkpoint-1000", hf_history(1000), 1000, mtime=t)
    newest = save_trainer_state(out / "checkpoint-2000", hf_history(2000), 2000, mtime=t + 10)
    watch = Watch(RunConfig("hf", workdir=str(workdir),
                            metrics=("out/checkpoint-*/trainer_state.json",)))
    watch.poll()
    newest.unlink()
    (m,) = watch.poll().metrics
    assert m.file is not None and m.file.endswith("checkpoint-1000/trainer_state.json")
    assert m.scalars["loss"].steps == (500, 1000)  # read again, whole
    assert steps(watch, "loss") == [500, 1000, 1500, 2000]
    assert steps(watch, "eval_loss") == [1000, 2000]


# ---------------------------------------------------------------- Lightning's CSVLogger


def test_lightning_header_rewrite_repeats_no_step(workdir: Path) -> None:
    """A new metric makes CSVLogger rewrite metrics.csv under a new header: the file is read
    again from its start, and val_loss's one point at step 99 stays one."""
    logger = LightningCSV(workdir / "lightning_logs" / "version_0")
    watch = Watch(RunConfig("pl", workdir=str(workdir),
                            metrics=("lightning_logs/version_*/metrics.csv",)))
    logger.log_metrics({"train_loss": 0.9, "epoch": 0}, 49)
    logger.log_metrics({"train_loss": 0.8, "epoch": 0}, 99)
    logger.log_metrics({"val_loss": 0.85, "epoch": 0}, 99)
    logger.save()
    watch.poll()
    assert steps(watch, "val_loss") == [99] and steps(watch, "train_loss") == [49, 99]
    logger.log_metrics({"train_loss": 0.7, "lr": 0.01, "epoch": 1}, 149)  # a new column
    logger.save()
    (m,) = watch.poll().metrics
    assert m.reset and m.scalars["val_loss"].steps == (99,)
    assert steps(watch, "val_loss") == [99]
    assert steps(watch, "train_loss") == [49, 99, 149] and steps(watch, "epoch") == [49, 99, 149]
    for step in range(199, 1000, 50):  # grows, polled as it does
        logger.log_metrics({"train_loss": 1 / step, "lr": 0.01, "epoch": 2}, step)
        logger.save()
        watch.poll()
    series = watch.series.series["train_loss"].steps.tolist()
    assert series == sorted(set(series)) and series[-1] == 999 and len(series) == 20


def test_lightning_versions_of_a_resumed_run_are_read_in_order(workdir: Path) -> None:
    """A run resumed twice: version_0, version_1 (from step 300) ... version_10 (natural
    order: after version_9). Every version is read, the later ones replacing the steps they
    redo, under one poll's byte budget shared between them (a small one here)."""
    logs = workdir / "lightning_logs"
    starts = {0: 0, 1: 300, **{v: 300 + 100 * v for v in range(2, 11)}}
    for version, start in starts.items():
        logger = LightningCSV(logs / f"version_{version}")
        for step in range(start, start + 400, 10):
            logger.log_metrics({"train_loss": version + step / 1e4}, step)
        logger.save()
    watch = Watch(RunConfig("pl", workdir=str(workdir),
                            metrics=("lightning_logs/version_*/metrics.csv",)),
                  limits={"metrics_bytes": 4096})
    for _ in range(20):
        if not any(m.pending for m in watch.poll().metrics):
            break
    files = [m.file for m in watch.poll().metrics]
    assert [f.split("/")[-2] for f in files if f] == [f"version_{v}" for v in range(11)]
    loss = watch.series.series["train_loss"]
    assert loss.steps.tolist() == list(range(0, 1700, 10))
    by_step = dict(zip(loss.steps, loss.values, strict=True))
    assert by_step[290] == pytest.approx(0.029)  # version_0's, before version_1 resumed
    assert by_step[300] == pytest.approx(1.03)  # version_1 redid 300
    assert by_step[1690] == pytest.approx(10.169)  # version_10, the last


# ---------------------------------------------------------------- Keras, JSONL


def test_keras_csvlogger_epoch_is_the_step(workdir: Path) -> None:
    path = workdir / "training.log.csv"
    keras = KerasCSV(path)
    for epoch in range(3):
        keras.on_epoch_end(epoch, {"loss": 1.0 / (epoch + 1), "accuracy": 0.5 + epoch / 10,
                                   "val_loss": 1.1 / (epoch + 1)})
    watch = Watch(RunConfig("k", workdir=str(workdir), metrics=("training.log.csv",)))
    (m,) = watch.poll().metrics
    assert m.error is None and m.skipped == 0 and "epoch" not in m.scalars
    assert m.scalars["val_loss"].steps == (0, 1, 2)
    keras.close()
    resumed = KerasCSV(path, append=True)  # a resumed fit, no second header
    resumed.on_epoch_end(3, {"loss": 0.2, "accuracy": 0.9, "val_loss": 0.3})
    resumed.close()
    watch.poll()
    assert steps(watch, "loss") == [0, 1, 2, 3] and watch.series.last_value("loss") == 0.2


def test_jsonl_nested_and_other_step_keys(workdir: Path) -> None:
    lines = [{"global_step": 10, "train": {"loss": 2.0, "lr": 1e-4}, "epoch": 0.1},
             {"global_step": 20, "train": {"loss": 1.5}, "eval": {"loss": 1.7, "acc": {
                 "top1": 0.5}}},
             {"iteration": 30, "loss": 1.2},
             {"epoch": 4, "val_acc": 0.8},
             {"epoch": 4.5, "val_acc": 0.9},  # an epoch that is no step: skipped, counted
             {"train": {"loss": 1.0}}]  # no step at all
    path = workdir / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    watch = Watch(RunConfig("j", workdir=str(workdir), metrics=("log.jsonl",)))
    (m,) = watch.poll().metrics
    assert m.scalars["train/loss"].steps == (10, 20) and m.scalars["eval/acc/top1"].steps == (20,)
    assert m.scalars["epoch"].steps == (10,) and "global_step" not in m.scalars
    assert m.scalars["loss"].steps == (30,) and m.scalars["val_acc"].steps == (4,)
    assert m.skipped == 2
    assert m.skip_reason == "a line without an integer step or global_step or iteration or epoch"


def test_a_huge_line_is_skipped_once_and_a_huge_cell_is_one_bad_row(workdir: Path) -> None:
    """A line longer than a poll's byte budget is skipped to its end over as many polls as
    it takes and counted once; a CSV cell over csv's field limit is that row's problem."""
    path = workdir / "m.jsonl"
    path.write_text('{"step": 1, "loss": 1}\n{"step": 2, "x": "' + "a" * 20000 + '"}\n'
                    '{"step": 3, "loss": 0.5}\n')
    big = workdir / "metrics.csv"
    big.write_text("step,loss\n1,0.9\n2," + "9" * 140_000 + "\n3,0.8\n")
    watch = Watch(RunConfig("j", workdir=str(workdir), metrics=("m.jsonl", "metrics.csv")),
                  limits={"metrics_bytes": 4096})
    for _ in range(40):
        watch.poll()
    assert steps(watch, "loss") == [1, 3]
    assert watch.series.skipped_lines()[str(path)] == (1, "a line over 4096 bytes")
    assert steps(watch, "metrics/loss") == [1, 3]  # the CSV's long row: over the budget too
    assert watch.series.skipped_lines()[str(big)] == (1, "a line over 4096 bytes")
    watch = Watch(RunConfig("c", workdir=str(workdir), metrics=("metrics.csv",)))
    (m,) = watch.poll().metrics  # the default budget reads the row: csv refuses the cell
    assert m.error is None and m.scalars["loss"].steps == (1, 3) and m.skipped == 1
    assert m.skip_reason is not None and "field larger than field limit" in m.skip_reason


def test_the_same_tag_in_two_files_hides_neither(workdir: Path) -> None:
    (workdir / "train.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    (workdir / "eval.jsonl").write_text('{"step": 2, "loss": 1.5}\n')
    watch = Watch(RunConfig("j", workdir=str(workdir), metrics=("train.jsonl", "eval.jsonl")))
    watch.poll()
    assert steps(watch, "loss") == [1, 2] and steps(watch, "eval/loss") == [2]
    assert watch.series.last_value("eval/loss") == 1.5


# ---------------------------------------------------------------- --once, through the store


def test_once_across_cron_runs_switch_rewrite_and_skipped_lines(tmp_path: Path) -> None:
    work = tmp_path / "work"
    out = work / "out"
    t = time.time() - 100
    save_trainer_state(out / "checkpoint-1000", hf_history(1000), 1000, mtime=t)
    logger = LightningCSV(work / "lightning_logs" / "version_0")
    logger.log_metrics({"val_loss": 0.85, "epoch": 0}, 99)
    logger.save()
    (work / "extra.jsonl").write_text('{"step": 1, "loss_x": 1}\nnot json\n')
    config = (f'[hosts.me]\nssh = "local"\n[hosts.me.runs.job]\nworkdir = "{work}"\n'
              'metrics = ["out/checkpoint-*/trainer_state.json", '
              '"lightning_logs/version_*/metrics.csv", "extra.jsonl"]\n')
    schema = load_schema()  # runs[].metrics: the text the schema gains (README, report)
    schema["$defs"]["run"]["properties"]["metrics"] = {"type": "array", "items": {
        "type": "object", "required": ["path", "skipped", "skip_reason"],
        "additionalProperties": False, "properties": {
            "path": {"type": "string"}, "skipped": {"type": "integer", "minimum": 0},
            "skip_reason": {"type": ["string", "null"]}}}}

    def once() -> dict:
        result = gpuwatch(tmp_path, "--once", "--json", config=config)
        assert result.returncode in (0, 1), result.stderr
        doc = json.loads(result.stdout)
        jsonschema.validate(doc, schema)
        (run,) = doc["hosts"][0]["runs"]
        return run

    first = once()
    assert first["series"]["eval_loss"]["points"] == 1
    save_trainer_state(out / "checkpoint-2000", hf_history(2000), 2000, mtime=t + 10)
    logger.log_metrics({"train_loss": 0.7, "epoch": 0}, 99)  # a new column: a rewrite
    logger.save()
    with open(work / "extra.jsonl", "a") as f:
        f.write('{"step": 2, "loss_x": 0.5}\n[1]\n')
    second = once()
    assert second["series"]["eval_loss"] == {"last_step": 2000, "last_value": 2.1,
                                             "points": 2}
    assert second["series"]["val_loss"]["points"] == 1
    assert second["series"]["loss_x"]["points"] == 2
    skipped = {m["path"].rsplit("/", 1)[-1]: m for m in second["metrics"]}
    assert skipped["extra.jsonl"]["skipped"] == 2
    assert skipped["extra.jsonl"]["skip_reason"].startswith("not JSON")
    assert skipped["metrics.csv"]["skipped"] == 0
    third = once()  # nothing new: the same answer, nothing doubled
    assert third["series"] == second["series"] and third["metrics"] == second["metrics"]


# ---------------------------------------------------------------- the TUI's path


async def test_the_tui_merges_re_reads_and_shows_skipped_lines(tmp_path: Path) -> None:
    from test_tui import SIZE, feed, open_host

    out = tmp_path / "out"
    t = time.time() - 100
    save_trainer_state(out / "checkpoint-1000", hf_history(1000), 1000, mtime=t)
    (tmp_path / "m.jsonl").write_text('{"step": 5, "acc": 0.5}\n{"bad": 1}\n')
    run = RunConfig("hf", workdir=str(tmp_path),
                    metrics=("out/checkpoint-*/trainer_state.json", "m.jsonl"))
    host = HostConfig(name="local", ssh="local", runs=(run,))
    store = Store.open(tmp_path / "state.sqlite3")
    app = build_app(Config(hosts=(host,)), store=store, poll=False)
    collector = Collector()
    async with app.run_test(size=SIZE) as pilot:
        history = app.hosts["local"].history
        for step in (1000, 2000, 3000):
            save_trainer_state(out / f"checkpoint-{step}", hf_history(step), step,
                               mtime=t + step / 100)
            for _ in range(2):  # each state polled twice: the second reads nothing new
                await feed(pilot, [await collector.poll(host, history.runs)])
        series = history.runs["hf"].series
        assert series["eval_loss"].steps.tolist() == [1000, 2000, 3000]
        assert series["loss"].steps.tolist() == list(range(500, 3001, 500))
        await open_host(pilot, "local")
        subtitle = str(app.screen.query_one("#pane-loss").border_subtitle)
        assert subtitle == "1 line skipped in m.jsonl: a line without an integer step or " \
                           "global_step or iteration or epoch"


# ---------------------------------------------------------------- properties


@st.composite
def re_reads(draw: st.DrawFn) -> tuple[list[tuple[int, float]], list[tuple[int, int]]]:
    """A history (steps strictly increasing, some logged twice at one step as Lightning's
    epoch column is) and the reads of it: each the prefix up to some length, from its
    start (a switch or a rewrite) or from where the last read stopped."""
    gaps = draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
    history, step = [], 0
    for i, gap in enumerate(gaps):
        step += gap if i else 0
        history.append((step, float(i)))
    reads, done = [], 0
    for end in draw(st.lists(st.integers(1, len(history)), min_size=1, max_size=8)):
        start = 0 if draw(st.booleans()) or end < done else done
        reads.append((start, end))
        done = end
    return history, reads


@PROPERTY
@given(re_reads())
def test_property_re_reads_merge_by_step(case) -> None:
    history, reads = case
    series = TagSeries(bound=10_000)
    for start, end in reads:
        series.merge([(s, v, float("nan")) for s, v in history[start:end]], 0.0, by_step=True)
    got = series.steps.tolist()
    assert got == sorted(set(got))  # never two points for one step
    end = reads[-1][1]
    last = {s: v for s, v in history[:end]}  # the last word on each step
    assert dict(zip(got, series.values, strict=True)) == last


LINE = st.one_of(
    st.text(max_size=60),
    st.dictionaries(st.sampled_from(["step", "global_step", "iteration", "epoch", "loss",
                                     "train", "x" * 250]),
                    st.one_of(st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5),
                              st.none(), st.booleans(),
                              st.dictionaries(st.text(max_size=4), st.floats(), max_size=3)),
                    max_size=5).map(lambda d: json.dumps(d)),
    st.just("[" * 5000 + "]" * 5000),
)


@PROPERTY
@given(st.lists(LINE, max_size=12), st.sampled_from([64, 256, 1 << 20]))
def test_property_jsonl_reader_is_bounded_and_total(tmp_path_factory, lines, budget) -> None:
    """Any lines: the reader never raises, every complete line is a point source or counted
    as skipped, tags are bounded, and polling again at the cursor reaches the end."""
    path = tmp_path_factory.mktemp("j") / "m.jsonl"
    path.write_text("".join(line.replace("\n", " ").replace("\r", " ") + "\n"
                            for line in lines))
    limits = dict(probe_module.DEFAULT_LIMITS, metrics_bytes=budget)
    cursor, skipped = None, 0
    for _ in range(len(lines) + path.stat().st_size // budget + 5):
        out, points = probe_module.read_jsonl(str(path), os.stat(path), cursor, limits)
        cursor, skipped = out["cursor"], skipped + out.get("skipped", 0)
        assert all(len(tag) <= probe_module.METRICS_TAG_CHARS for tag, *_ in points)
        if cursor[1] == path.stat().st_size:
            break
    assert cursor[1] == path.stat().st_size
    assert skipped <= sum(1 for line in lines if line.strip())


@PROPERTY
@given(st.lists(st.integers(0, 10**30), min_size=1, max_size=10, unique=True))
def test_property_names_order_by_their_numbers(numbers) -> None:
    names = [f"/o/checkpoint-{n}/trainer_state.json" for n in numbers]
    assert sorted(names, key=probe_module.name_numbers) == \
        [f"/o/checkpoint-{n}/trainer_state.json" for n in sorted(numbers)]
    pattern = "~/o/checkpoint-*/trainer_state.json"
    gens = [file_generation(pattern, name) for name in names]
    small = [n for n in numbers if n < 10**15]
    assert [file_generation(pattern, f"/o/checkpoint-{n}/trainer_state.json")
            for n in sorted(small)] == sorted(float(n) for n in small)
    assert all(g >= 0 for g in gens)


def test_run_series_state_keeps_skipped_counts() -> None:
    run = RunSeries("r")
    run.skipped = {"/a.jsonl": {"/a.jsonl": [3, "not JSON"]}}
    back = RunSeries.from_state("r", json.loads(json.dumps(run.state())))
    assert back.skipped_lines() == {"/a.jsonl": (3, "not JSON")}
    bad = RunSeries.from_state("r", {"skipped": {"/a": {"/a": ["x", 1], "/b": [-1, None],
                                                         "/c": [2**60, None]}}})
    assert bad.skipped_lines() == {"/a": (0, None)}
