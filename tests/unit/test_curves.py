"""The curve tracker (remote/findings/curves.py): any sequence of values, finite or not, fed in
any pieces, gives the tracker one batch feed gives; its state survives the store; it never
raises, whatever the values or a damaged state. Which tag is the loss, and the config keys."""

from __future__ import annotations

import json
import math

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import ConfigError
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.findings.curve_tags import tags_of
from gpuwatch.remote.findings.curves import CurveParams, CurveTracker, noisy_band
from gpuwatch.remote.findings.run_curves import RunCurves
from gpuwatch.remote.model.series import RunSeries, TagSeries
from hypothesis import given, settings
from hypothesis import strategies as st

values = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(min_value=-10, max_value=10),
                   st.sampled_from([0.0, 1e-300, -0.0, 1e308, math.nan, math.inf]))
walls = st.one_of(st.just(math.nan), st.floats(min_value=0, max_value=2e9))
series = st.lists(st.tuples(st.integers(0, 3), values, walls), max_size=120)
params = st.builds(CurveParams, window=st.integers(4, 12))


def points(raw: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    out, step = [], 0
    for gap, value, wall in raw:
        step += gap  # a gap of 0 repeats a step: the tracker keeps the first
        out.append((step, value, wall))
    return out


def same(a: CurveTracker, b: CurveTracker) -> bool:
    return json.dumps(a.state(), sort_keys=True) == json.dumps(b.state(), sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(series, st.lists(st.integers(1, 30), max_size=20), params)
def test_incremental_is_batch(raw: list[tuple[int, float, float]], cuts: list[int],
                              p: CurveParams) -> None:
    pts = points(raw)
    batch = CurveTracker(p)
    batch.feed(pts)
    pieces, at = CurveTracker(p), 0
    for n in [*cuts, len(pts)]:
        pieces.feed(pts[at:at + n])
        at += n
    pieces.feed(pts[at:])
    assert same(batch, pieces)


@settings(max_examples=300, deadline=None)
@given(series, st.integers(0, 120), params)
def test_the_state_carries_over_as_if_never_stopped(raw: list[tuple[int, float, float]],
                                                    cut: int, p: CurveParams) -> None:
    """A cron `--once` stores the state and the next one goes on from it."""
    pts = points(raw)
    whole = CurveTracker(p)
    whole.feed(pts)
    first = CurveTracker(p)
    first.feed(pts[:cut])
    stored = json.loads(json.dumps(first.state()))  # through the store's JSON
    resumed = CurveTracker.from_state(stored, p)
    assert resumed is not None
    resumed.feed(pts[cut:])
    assert same(whole, resumed)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=30))
def test_a_damaged_state_is_dropped_never_raised(data: object) -> None:
    t = CurveTracker.from_state(data)
    assert t is None or isinstance(t, CurveTracker)


def test_a_quantised_flat_loss_has_no_spike() -> None:
    """HF logs losses to 4 decimals: at 0.0003 the MAD is 0, and 0.0004 is no spike."""
    t = CurveTracker()
    t.feed((s, 0.0003 if s % 7 else 0.0004, math.nan) for s in range(200))
    assert list(t.spikes) == [] and not t.diverging
    assert noisy_band([0.0003, 0.0003, 0.0004]) == (0.0003, pytest.approx(0.0001))


def test_a_tenfold_spike_and_a_nan_are_remembered_with_their_steps() -> None:
    t = CurveTracker()
    t.feed((s, 1.0 + 0.01 * (s % 3), 100.0 + s) for s in range(50))
    t.feed([(50, 10.0, 150.0), (51, math.nan, 151.0), (52, 1.0, 152.0)])
    assert [s[0] for s in t.spikes] == [50]
    assert (t.bad_step, t.before_bad, t.since_bad) == (51, (50, 10.0, 150.0), 1)
    assert t.point_interval_s() == 1.0


def test_a_rise_beyond_the_noise_of_the_level_diverges() -> None:
    t = CurveTracker()
    t.feed((s, 1.0 / (1 + s / 50) + 0.02 * ((s * 7919) % 13 - 6) / 6, math.nan)
           for s in range(300))
    assert not t.diverging
    t.feed((s, 0.2 + 0.01 * (s - 300), math.nan) for s in range(300, 340))
    assert t.diverging and t.rise_k() >= t.p.diverge_k and t.above_since is not None


def _run_with(event_tags: tuple[str, ...] = (), metric_tags: dict[str, tuple[str, ...]] | None
              = None) -> RunSeries:
    run = RunSeries("r")
    for tag in event_tags:
        run.event_series[tag] = TagSeries()
        run.event_series[tag].merge([(1, 1.0, 1.0)])
    for path, tags in (metric_tags or {}).items():
        run.metric_series[path] = {}
        for tag in tags:
            run.metric_series[path][tag] = TagSeries()
            run.metric_series[path][tag].merge([(1, 1.0, math.nan)], by_step=True)
    return run


def test_which_tag_is_the_loss() -> None:
    hf = {"/o/checkpoint-500/trainer_state.json": ("loss", "eval_loss", "train_loss",
                                                   "train_runtime", "grad_norm")}
    _, loss, ev, watch = tags_of(_run_with(metric_tags=hf), (None, None))
    assert (loss, ev) == ("loss", "eval_loss") and "train_loss" not in watch  # HF's summary
    _, loss, ev, _ = tags_of(_run_with(("train/loss", "val/loss"), hf), (None, None))
    assert (loss, ev) == ("train/loss", "val/loss")  # an event file's first: it has times
    lightning = {"/l/metrics.csv": ("train_loss", "val_loss", "epoch")}
    _, loss, ev, _ = tags_of(_run_with(metric_tags=lightning), (None, None))
    assert (loss, ev) == ("train_loss", "val_loss")
    gan = {"/g/metrics.csv": ("train_disc_loss", "train_gen_loss")}
    _, loss, ev, watch = tags_of(_run_with(metric_tags=gan), (None, None))
    assert (loss, ev) == (None, None) and watch == ["train_disc_loss", "train_gen_loss"]
    _, loss, ev, watch = tags_of(_run_with(("objective", "heldout")), ("objective", "heldout"))
    assert (loss, ev, watch) == ("objective", "heldout", ["objective", "heldout"])
    _, loss, _, _ = tags_of(_run_with(("loss",)), ("objective", None))
    assert loss is None  # the configured tag, or none: never a guess beside it


def test_loss_tag_and_eval_tag_in_the_config() -> None:
    text = ('[hosts.g]\nssh = "local"\n[hosts.g.runs.r]\nprocess = "train.py"\n'
            'loss_tag = "objective"\neval_tag = "heldout/nll"\n')
    host = parse_config(text).host("g")
    assert host is not None and (host.runs[0].loss_tag, host.runs[0].eval_tag) == (
        "objective", "heldout/nll")
    with pytest.raises(ConfigError, match="loss_tag"):
        parse_config(text.replace('"objective"', "3"))
    with pytest.raises(ConfigError, match="curve_window"):
        parse_config(text + "[thresholds]\ncurve_window = 2\n")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=30))
def test_a_damaged_run_state_starts_anew(data: object) -> None:
    curves = RunCurves.from_state({"v": 1, "trackers": data, "clock": data, "marks": data,
                                   "restart": data}, Thresholds())
    assert isinstance(curves.trackers, dict)
