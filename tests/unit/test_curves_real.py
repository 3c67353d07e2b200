"""The curves' findings on real curves (tests/data/curves, PROVENANCE.md there), replayed into a
simulated box's run folder a poll at a time and read by the real probe: healthy curves raise no
warning or critical, and each anomaly injected into them is caught at the first poll that
brings it (the TUI and `--once` judge through this same `evaluate`; test_curves_once.py runs
`--once` itself with the store in between)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from curves_data import HEALTHY, Replay
from findings_helpers import Watched, host_config
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.sim import Box, h100_sxm, training_process

CURVE_CODES = {"run.loss_nan", "run.diverging", "run.loss_spike", "run.plateau",
               "run.overfitting", "run.hung", "run.slowed"}
POLLS = 8


def box(tmp_path: Path) -> Box:
    b = Box(tmp_path / "box", h100_sxm(1), btime=int(time.time()) - 86_400, uptime_s=86_400.0)
    b.add_process(training_process(600, workdir=str(tmp_path / "run"), nohup=True,
                                   start_s=3600.0))
    return b


def watched(tmp_path: Path, replay: Replay, extra: str = "") -> Watched:
    toml = (f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\nworkdir = "{tmp_path / "run"}"\n'
            + replay.toml() + extra)
    return Watched(box(tmp_path), host_config(toml))


def replay_polls(tmp_path: Path, name: str, polls: int = POLLS,
                 change: Callable[[Replay], None] | None = None,
                 ) -> tuple[Replay, list[list[Finding]]]:
    """The curve written in `polls` equal parts, a poll after each; the findings of each."""
    replay = Replay(name, tmp_path / "run")
    if change is not None:
        change(replay)
    w = watched(tmp_path, replay)
    out = []
    for i in range(1, polls + 1):
        replay.upto(math.ceil(len(replay) * i / polls))
        out.append([f for f in w.poll() if f.code in CURVE_CODES])
    return replay, out


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_real_curves_raise_no_alarm(tmp_path: Path, name: str) -> None:
    _, polls = replay_polls(tmp_path, name)
    loud = [f for found in polls for f in found if f.severity >= Severity.WARNING]
    assert loud == []


def test_a_real_overfitting_run_is_called_overfitting_and_nothing_worse(tmp_path: Path) -> None:
    """Whisper-small fine-tuned on a small set: its eval loss rises at every evaluation while
    its train loss falls (a true positive, PROVENANCE.md)."""
    _, polls = replay_polls(tmp_path, "hf_whisper_hi_overfits")
    loud = {f.code for found in polls for f in found if f.severity >= Severity.WARNING}
    assert loud == {"run.overfitting"}
    f = next(f for f in polls[-1] if f.code == "run.overfitting")
    assert f.evidence["tag"] == "eval_loss" and f.evidence["step"] == 1000
    assert "eval_loss has risen at each of its 5 evaluations (0.3075 → 0.3558" in f.message


def first_poll(polls: list[list[Finding]], code: str) -> int | None:
    return next((i for i, found in enumerate(polls) if any(f.code == code for f in found)), None)


def poll_of(replay: Replay, tag: str, step: int) -> int:
    """The poll (0-based) whose part of the curve holds `step`."""
    order = replay.steps(tag)
    n = len(replay)
    index = {"hf": lambda: next(i for i, e in enumerate(replay.entries)
                            if e.get("step") == step and tag in e),
             "csv": lambda: next(i for i, r in enumerate(replay.rows)
                             if int(r[replay.header.index("step")]) == step),
             "events": lambda: next(i for i, e in enumerate(replay.events)
                                if e[0] == step and e[1] == tag)}[replay.kind]()
    assert step in order
    return next(i for i in range(POLLS) if index < math.ceil(n * (i + 1) / POLLS))


LOSS = {"hf_whisper_flemish": "loss", "hf_whisper_tiny": "loss", "mlp_digits": "train/loss",
        "lightning_histogene": "train_loss"}


@pytest.mark.parametrize("name", list(LOSS))
def test_nan_is_caught_at_the_poll_that_brings_it(tmp_path: Path, name: str) -> None:
    tag = LOSS[name]
    probe = Replay(name, tmp_path / "probe")
    steps = probe.steps(tag)
    at = steps[len(steps) * 5 // 8 + 1]
    replay, polls = replay_polls(
        tmp_path, name, change=lambda r: r.edit(tag, lambda s, v: math.nan if s >= at else v))
    assert first_poll(polls, "run.loss_nan") == poll_of(replay, tag, at)
    f = next(f for f in polls[-1] if f.code == "run.loss_nan" and f.evidence["tag"] == tag)
    assert f.severity == Severity.CRITICAL and f.evidence["step"] == at
    assert f.evidence["last_finite_step"] == steps[steps.index(at) - 1]
    assert f"became NaN at step {at}" in f.message


@pytest.mark.parametrize("name", list(LOSS))
def test_a_tenfold_spike_is_caught_at_the_poll_that_brings_it(tmp_path: Path,
                                                              name: str) -> None:
    tag = LOSS[name]
    steps = Replay(name, tmp_path / "probe").steps(tag)
    at = steps[len(steps) * 5 // 8 + 1]
    replay, polls = replay_polls(
        tmp_path, name, change=lambda r: r.edit(tag, lambda s, v: 10 * v if s == at else v))
    assert first_poll(polls, "run.loss_spike") == poll_of(replay, tag, at)
    f = next(f for f in polls[poll_of(replay, tag, at)] if f.code == "run.loss_spike")
    assert f.evidence["step"] == at and f.evidence["tag"] == tag
    assert not any(f.code == "run.diverging" for found in polls for f in found)


@pytest.mark.parametrize(("name", "climb"), [("hf_whisper_flemish", 9), ("hf_whisper_tiny", 2),
                                             ("mlp_digits", 2)])
def test_a_rising_segment_is_caught_at_the_poll_that_brings_it(tmp_path: Path, name: str,
                                                               climb: int) -> None:
    """From 5/8 of the way on, the loss climbs linearly by `climb` times its level there (the
    median of the 20 points before), on top of the curve's own course and noise. The level
    is judged on the log scale against its own noise: Flemish Whisper's 100-step averages
    vary tenfold at that stage (0.004 to 0.11), so a doubling of its level is not beyond
    them; a climb to ten times is."""
    tag = LOSS[name]
    probe = Replay(name, tmp_path / "probe")
    steps = probe.steps(tag)
    start, end = steps[len(steps) * 5 // 8], steps[-1]
    values: list[float] = []
    probe.edit(tag, lambda s, v: values.append(v) or v)
    level = statistics.median(values[len(steps) * 5 // 8 - 20:len(steps) * 5 // 8])

    def rise(s: int, v: float) -> float:
        return v if s < start else v + climb * level * (s - start) / (end - start)

    replay, polls = replay_polls(tmp_path, name, change=lambda r: r.edit(tag, rise))
    seen = first_poll(polls, "run.diverging")
    # it has appeared once the climb reached the level itself (half way): by the next poll
    assert seen is not None and seen <= poll_of(replay, tag, steps[len(steps) * 13 // 16]) + 1
    assert not any(f.code == "run.diverging" for found in polls[:poll_of(replay, tag, start)]
                   for f in found)
    f = next(f for f in polls[-1] if f.code == "run.diverging")
    assert f.evidence["tag"] == tag and f.evidence["step"] >= start


def test_eval_rising_while_train_falls_is_overfitting(tmp_path: Path) -> None:
    """The MLP's eval loss made to climb from step 300 on (+15 % an evaluation)."""
    def change(r: Replay) -> None:
        r.edit("eval/loss", lambda s, v: v * (1 + 0.15 * max(0, (s - 300) // 20)))

    replay, polls = replay_polls(tmp_path, "mlp_digits", change=change)
    seen = first_poll(polls, "run.overfitting")
    # the third evaluation above the minimum (step 360) makes it "several": that poll or,
    # where the early steep evaluations still make the noise wide, the next one
    assert seen is not None and poll_of(replay, "eval/loss", 360) <= seen \
        <= poll_of(replay, "eval/loss", 360) + 1
    f = next(f for f in polls[seen] if f.code == "run.overfitting")
    assert f.severity == Severity.WARNING and f.evidence["tag"] == "eval/loss"
    assert f.evidence["train_tag"] == "train/loss"


def test_the_tuis_path_catches_it_at_the_same_poll(tmp_path: Path) -> None:
    """The TUI's pipeline (watch.history_from_store, judge each poll, remember: the runs'
    series saved only every third poll, as the TUI does at most once a minute), and the host's
    JSON from that report: a NaN at step 450 of the MLP's curve at the poll that brings it."""
    import jsonschema
    from gpuwatch.remote.report import host_json, load_schema
    from gpuwatch.remote.store import Store
    from gpuwatch.remote.watch.landing import judge, remember
    from gpuwatch.remote.watch.landing import restore as history_from_store
    from gpuwatch.remote.wire.collect import PollOutcome

    replay = Replay("mlp_digits", tmp_path / "run")
    replay.edit("train/loss", lambda s, v: math.nan if s == 450 else v)
    w = watched(tmp_path, replay)
    store = Store.open(tmp_path / "store.db")
    w.history = history_from_store(store, w.host)
    schema = load_schema()
    seen = []
    for i in range(1, POLLS + 1):
        replay.upto(math.ceil(len(replay) * i / POLLS))
        outcome = PollOutcome(w.host, time.time(), 0.1, w.snapshot(), b"{}")
        report = judge(w.history, outcome)
        remember(store, outcome, w.history, save_runs=i % 3 == 0)
        doc = host_json(report)
        jsonschema.validate(doc, {"$defs": schema["$defs"], "$ref": "#/$defs/host"})
        seen.append([f for f in doc["findings"] if f["code"] == "run.loss_nan"])
    first = next(i for i, found in enumerate(seen) if found)
    assert first == poll_of(replay, "train/loss", 450)
    (nan,) = seen[first]
    assert nan["evidence"]["step"] == 450 and nan["evidence"]["tag"] == "train/loss"
    assert "became NaN at step 450" in nan["message"]
