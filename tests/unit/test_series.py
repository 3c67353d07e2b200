"""The client's memory of a run: bounded series, merging by step, decimation, status, and the
numbers a person asks for (cadence, work at risk, log age). No probe here: samples are built."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.series import (
    FLEET_POINTS,
    MAX_POINTS,
    MIN_POINTS,
    RunSeries,
    TagSeries,
    apply_budget,
    decimate,
    json_value,
    points_share,
    run_request,
    run_status,
)
from gpuwatch.remote.model.snapshot import Checkpoint, EventFile, LogInfo, RunSample, Scalars
from gpuwatch.remote.wire.raw_events import RAW_CAP

SCHEMA = Path(__file__).parents[2] / "remote" / "gpuwatch-1.schema.json"
T0 = 1_700_000_000.0


def sample(pids: tuple[int, ...] = (), done: bool | None = None, *,
           ckpts: tuple[float, ...] = (), log_mtime: float | None = None,
           files: tuple[EventFile, ...] = ()) -> RunSample:
    return RunSample(
        name="r", pids=pids,
        log=None if log_mtime is None else LogInfo("/w/train.log", 10, log_mtime, "tail\n"),
        events_path="/w/runs" if files else None, event_files=files, events_capped=False,
        metrics=(), checkpoints=tuple(Checkpoint(f"/w/ckpt-{t:.0f}", t, 100) for t in ckpts),
        checkpoints_total=len(ckpts), leftovers=(), done=done, done_mtime=None,
        errors=MappingProxyType({}))


def event_file(path: str, first_wall: float | None, points: list[tuple[int, float, float]],
               tag: str = "loss", offset: int = 100) -> EventFile:
    steps, values, walls = zip(*points, strict=True) if points else ((), (), ())
    return EventFile(path=path, bytes=offset, mtime=T0, offset=offset, start=0,
                     stopped="eof", first_wall_time=first_wall, reset=False,
                     scalars=MappingProxyType({tag: Scalars(steps, values, walls)}), errors=())


# ---------------------------------------------------------------- decimation

def test_decimate_keeps_a_single_point_spike():
    points = [(s, 1.0 + 0.001 * math.sin(s), T0 + s) for s in range(10_000)]
    points[7_777] = (7_777, 50.0, T0 + 7_777)
    points[2_222] = (2_222, -3.0, T0 + 2_222)
    kept = decimate(points, 100)
    assert len(kept) <= 2 * 100 + 2
    assert (7_777, 50.0, T0 + 7_777) in kept and (2_222, -3.0, T0 + 2_222) in kept
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert [p[0] for p in kept] == sorted(p[0] for p in kept)


def test_decimate_keeps_non_finite_points_and_small_inputs():
    points = [(s, 1.0, T0) for s in range(1000)]
    points[500] = (500, float("nan"), T0)
    kept = decimate(points, 10)
    assert any(math.isnan(p[1]) for p in kept)
    assert decimate(points[:20], 10) == points[:20]


# ---------------------------------------------------------------- one tag

def test_bounded_series_never_exceeds_its_bound_and_keeps_old_spikes():
    series = TagSeries(bound=1000)
    rng = random.Random(4)
    spike_step = 123
    for chunk in range(200):
        points = [(s, rng.random(), T0 + s) for s in range(chunk * 500, (chunk + 1) * 500)]
        if chunk == 0:
            points[spike_step] = (spike_step, 99.0, T0)
        series.merge(points)
        assert len(series) <= 1000
    assert series.last_step == 200 * 500 - 1
    assert 99.0 in series.values  # survived many compactions
    assert series.steps.tolist() == sorted(series.steps)
    assert series.steps[-300:].tolist() == list(range(99_700, 100_000))  # recent: full
    one_batch = TagSeries(bound=1000)
    one_batch.merge((s, float(s % 7), T0) for s in range(300_000))
    assert len(one_batch) <= 1000 and one_batch.last_step == 299_999


def test_points_share_of_the_fleet_budget():
    assert points_share(1) == points_share(FLEET_POINTS // MAX_POINTS) == MAX_POINTS
    assert points_share(100) == FLEET_POINTS // 100 == 20_000
    assert points_share(640) == MIN_POINTS  # 3,125 would be under what the store keeps
    assert points_share(0) == MAX_POINTS


def test_a_fleet_of_runs_shares_one_budget_of_points():
    """8 runs of 10 tags that no longer grow (finished runs): each call shrinks the biggest
    tags over the share, about `work` points' worth, until all fit; each keeps the newest half
    of its share at full resolution and its old spike. A run that appears later gets the
    share at once, and a tag that still grows shrinks on its own."""
    budget, work = 400_000, 30_000

    def grow(run: RunSeries, start: int, n: int, offset: int) -> None:
        files = tuple(event_file(f"/w/{run.name}/events.out.tfevents.1.{tag}", T0,
                                 [(s, 9.0 if s == 7 else 1.0 / (s + 1), T0 + s)
                                  for s in range(start, start + n)], tag=f"t{tag}",
                                 offset=offset)
                      for tag in range(10))
        run.update(replace(sample((1,), files=files), name=run.name), T0 + start + n)

    runs = [RunSeries(f"r{i}") for i in range(8)]
    for run in runs:
        grow(run, 0, 6000, 100)
    calls = 0
    while any(len(t) > 5000 for r in runs for t in r.tags()):
        assert apply_budget(runs, budget, work) == 5000  # 400,000 over 80 tags
        calls += 1
        shrunk = sum(len(t) <= 5000 for r in runs for t in r.tags())
        assert shrunk == min(80, 5 * calls)  # 30,000 points of work: five tags a call
    for tag in (t for r in runs for t in r.tags()):
        assert tag.steps[-2500:].tolist() == list(range(3500, 6000))  # newest: every point
        assert 7 in tag.steps.tolist() and 9.0 in tag.values.tolist()  # the old spike

    late = RunSeries("late")
    grow(late, 0, 10, 100)
    share = apply_budget([*runs, late], budget, work)
    assert share == budget // 90 and late.max_points == share  # 90 tags now
    assert all(t.bound == share for r in [*runs, late] for t in r.tags())
    grow(late, 10, 6000, 200)  # still growing: over its bound at no call
    assert all(len(t) <= share for t in late.tags())


def test_step_going_back_drops_the_abandoned_points_and_marks_a_restart():
    series = TagSeries()
    markers: list[tuple[int, float]] = []
    series.merge([(s, 1.0, T0 + s) for s in range(100)], 1.0, markers)
    series.merge([(s, 2.0, T0 + 1000 + s) for s in range(60, 80)], 1.0, markers)
    assert series.steps.tolist() == list(range(80))
    assert set(series.values[60:]) == {2.0} and markers == [(60, T0 + 1060)]


def test_older_file_arriving_late_fills_in_only_before_the_takeover():
    series = TagSeries()
    series.merge([(s, 2.0, T0 + 500) for s in range(50, 80)], generation=T0 + 500)
    series.merge([(s, 1.0, T0) for s in range(0, 70)], generation=T0)  # the pre-restart file
    assert series.steps.tolist() == list(range(80))
    assert set(series.values[:50]) == {1.0} and set(series.values[50:]) == {2.0}


# ---------------------------------------------------------------- status

@pytest.mark.parametrize(("pids", "done", "seen", "status"), [
    ((1,), None, False, "running"),
    ((1,), True, True, "running"),  # still writing its last files
    ((), True, True, "finished"),
    ((), True, False, "finished"),  # seed 004: a finished run is not a dead one
    ((), False, True, "dead"),
    ((), None, True, "dead"),
    ((), False, False, "unknown"),
    ((), None, False, "unknown"),
])
def test_run_status(pids, done, seen, status):
    assert run_status(pids, done, seen) == status


def test_status_transitions_and_work_at_risk():
    run = RunSeries("r")
    run.update(sample(), T0)
    assert run.status == "unknown" and run.work_at_risk_s() is None
    run.update(sample((42,), False, ckpts=(T0, T0 + 600, T0 + 1200, T0 + 1900),
                      log_mtime=T0 + 2000), T0 + 2100)
    assert run.status == "running" and run.cadence_s == 600
    assert run.work_at_risk_s() == 200 and run.work_at_risk_s(T0 + 2500) == 600
    assert run.log_age_s() == 100
    run.update(sample((), False, ckpts=(T0 + 1200, T0 + 1900), log_mtime=T0 + 2050), T0 + 3000)
    assert run.status == "dead"
    assert run.work_at_risk_s() == 200  # lost: from the checkpoint to when it was last seen
    assert run.cadence_s == 600  # rotation deleted the old ones; the history remembers them
    run.update(sample((), True, ckpts=(T0 + 1900,)), T0 + 4000)
    assert run.status == "finished" and run.work_at_risk_s() == 0.0


def test_a_run_resumed_from_its_checkpoint_has_only_its_own_work_unsaved():
    """Relaunched from checkpoint T0+1900 at T0+3500: a minute later, a crash would lose that
    minute, not the 28 minutes since the checkpoint was written (the TUI said "6 m of work
    unsaved" seconds after a relaunch)."""
    run = RunSeries("r")
    run.update(sample((42,), False, ckpts=(T0 + 1300, T0 + 1900)), T0 + 2000, started_at=T0)
    run.update(sample((), False, ckpts=(T0 + 1300, T0 + 1900)), T0 + 3000)
    assert run.status == "dead" and run.work_at_risk_s() == 100
    run.update(sample((43,), False, ckpts=(T0 + 1300, T0 + 1900)), T0 + 3560,
               started_at=T0 + 3500)
    assert run.status == "running" and run.work_at_risk_s() == 60
    assert run.work_at_risk_s(T0 + 3700) == 200
    run.update(sample((43,), False, ckpts=(T0 + 1900, T0 + 3800)), T0 + 3900,
               started_at=T0 + 3500)
    assert run.work_at_risk_s() == 100  # its own checkpoint since: from that one


# ---------------------------------------------------------------- a run's events

def test_run_series_offsets_restarts_and_json():
    run = RunSeries("r")
    a = event_file("/w/runs/events.out.tfevents.1.a", T0,
                   [(s, 1.0, T0 + s) for s in range(100)], offset=4000)
    run.update(sample((1,), files=(a,)), T0 + 100)
    assert run.request_state() == {"offsets": {a.path: 4000}, "raw": True}
    b = event_file("/w/runs/events.out.tfevents.2.b", T0 + 500,
                   [(s, float("nan") if s == 90 else 2.0, T0 + 500 + s) for s in range(40, 91)],
                   offset=900)
    a_again = event_file(a.path, None, [], offset=4000)  # nothing new in it
    run.update(sample((1,), files=(a_again, b)), T0 + 600)
    assert run.series["loss"].steps.tolist() == list(range(91))
    assert list(run.restarts) == [(40, T0 + 540)]
    assert run.request_state()["offsets"] == {a.path: 4000, b.path: 900}
    out = run.to_json()
    assert out["series"] == {"loss": {"last_step": 90, "last_value": "nan", "points": 91}}
    import jsonschema  # the test extra has it: never skipped
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(out, {"$defs": schema["$defs"], "$ref": "#/$defs/run"})
    run.update(sample((1,), files=(b,)), T0 + 700)  # a's file was deleted on the box
    assert run.request_state()["offsets"] == {b.path: 900}


def test_state_round_trip_and_garbage():
    run = RunSeries("r")
    a = event_file("/w/runs/e.tfevents", T0, [(1, 1.0, T0)], offset=77)
    run.update(sample((5,), files=(a,), log_mtime=T0), T0)
    back = RunSeries.from_state("r", json.loads(json.dumps(run.state())))
    assert run.request_state().pop("raw") is True
    assert "raw" not in back.request_state()  # after a restore, the first poll ships the decoder
    assert back.request_state() == {k: v for k, v in run.request_state().items() if k != "raw"}
    assert back.seen_running
    back.update(sample(), T0 + 10)
    assert back.status == "dead"  # the store remembered it running
    junk = RunSeries.from_state("r", {"offsets": {"x": -1, "y": "z"}, "log_seen": 3,
                                      "seen_running": "yes", "cursors": []})
    assert junk.request_state() == {} and not junk.seen_running


def test_json_value():
    assert [json_value(v) for v in (1.5, float("nan"), float("inf"), -math.inf, None)] == [
        1.5, "nan", "inf", "-inf", None]


def test_run_request_resolves_paths_and_carries_state():
    config = RunConfig("llama", process="train.py", workdir="/data/llama", log="train.log",
                       events="runs", metrics=("outputs/trainer_state.json", "/abs/m.jsonl"),
                       checkpoints="outputs/checkpoint-*", done="~/DONE")
    assert run_request(config) == {
        "name": "llama", "process": "train.py", "workdir": "/data/llama",
        "log": "/data/llama/train.log",
        "events": "/data/llama/runs", "checkpoints": "/data/llama/outputs/checkpoint-*",
        "done": "~/DONE", "exit": "/data/llama/.gpuwatch/exit-llama.json",
        "metrics": ["/data/llama/outputs/trainer_state.json", "/abs/m.jsonl"]}
    series = RunSeries("llama")
    series.offsets["/data/llama/runs/e.tfevents"] = 10
    series.log_seen = [5, T0]
    entry = run_request(config, series)
    assert entry["offsets"] == {"/data/llama/runs/e.tfevents": 10}
    assert entry["log_seen"] == [5, T0]


def test_events_raw_only_while_nothing_big_is_left():
    """The next poll may go without the event decoder once an answer came and no event
    file has more left than the probe sends raw; a pending read (a budget, the raw cap, a
    damaged length) asks for the decoder again."""
    run = RunSeries("r")
    assert "raw" not in run.request_state()  # the run's first poll: the decoder
    done = event_file("/w/runs/e.tfevents", T0, [(1, 1.0, T0)], offset=77)
    run.update(sample((5,), files=(done,)), T0)
    assert run.request_state()["raw"] is True
    cut = replace(done, stopped="bytes")
    run.update(sample((5,), files=(cut,)), T0 + 5)
    assert "raw" not in run.request_state()
    behind = replace(done, bytes=done.offset + RAW_CAP + 1)  # grew past the cap since
    run.update(sample((5,), files=(behind,)), T0 + 10)
    assert "raw" not in run.request_state()
    run.update(sample((5,), files=(done,)), T0 + 15)
    assert run.request_state()["raw"] is True
