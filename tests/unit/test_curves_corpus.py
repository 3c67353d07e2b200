"""The real-curve corpus (tests/data/curves/corpus; each curve's truth written in PROVENANCE.md
before gpuwatch judged it) replayed as live runs, at two granularities (about 6 and about 40
polls), through the box's readers and the real rules (tests/curves_corpus.py):

- a curve marked healthy raises no warning or critical at any poll of either replay;
- a stuck one gets run.plateau and nothing louder; an overfitting one is caught at warning;
- both replays of a curve raise the same loud findings (the verdict does not depend on where
  the polls cut the series);
- honest broken variants of the healthy curves (a NaN, a ×10 point, a climb to ten times the
  level, from 5/8 of the way on) are caught, the NaN and the ×10 at the poll that brings them.

The last test prints the false-alarm rate on the healthy curves and the recall on the broken
ones (`pytest -s` shows it)."""

from __future__ import annotations

import math
import statistics
from functools import cache
from pathlib import Path

import pytest
from curves_corpus import Entry, LiveFile, Replayed, corpus, granularities, replay
from gpuwatch.remote.model.finding import Severity

ENTRIES = {e.name: e for e in corpus()}
WARNING = int(Severity.WARNING)
CAUGHT = {"overfitting": {"run.overfitting", "run.diverging"}}
"""What catches each kind of failure: an eval that rises is overfitting while the train loss
falls, or the run getting worse (run.diverging on the eval) where it does not."""


def test_the_corpus_is_thirty_real_curves_with_a_truth_each() -> None:
    assert len(ENTRIES) >= 30
    kinds = {_kind(e) for e in ENTRIES.values()}
    assert kinds == {"hf", "csv", "jsonl", "events"}
    assert {e.truth for e in ENTRIES.values()} == {"healthy", "stuck", "overfitting"}


def _kind(e: Entry) -> str:
    if e.path.is_dir():
        return "events"
    return {"json": "hf", "csv": "csv", "jsonl": "jsonl"}[e.path.suffix.lstrip(".")]


@cache
def replays(name: str, tmp: Path) -> tuple[Replayed, Replayed]:
    entry = ENTRIES[name]
    n = len(LiveFile(entry, tmp / "count"))
    coarse, fine = granularities(n)
    return (replay(entry, tmp / "coarse", coarse), replay(entry, tmp / "fine", fine))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _loud(r: Replayed) -> set[str]:
    return r.codes(WARNING)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_curve_is_judged_as_its_truth_at_both_granularities(name: str,
                                                                  scratch: Path) -> None:
    entry = ENTRIES[name]
    coarse, fine = replays(name, scratch / name)
    for r in (coarse, fine):
        if entry.truth == "healthy":
            assert _loud(r) == set(), (entry.words, [f.message for f in r.loud()])
        elif entry.truth == "stuck":
            assert _loud(r) == set() and "run.plateau" in r.codes(), entry.words
        else:
            assert _loud(r) & CAUGHT[entry.truth], (entry.words, r.codes())
    assert _loud(coarse) == _loud(fine)


def test_the_failed_fine_tune_kind_is_caught_by_its_third_evaluation(scratch: Path) -> None:
    """Whisper large-v2 fine-tuned on Japanese: its eval loss rises from the very first
    evaluation (every 1,000 steps). Caught, in words that say how sure, at the poll that
    brings the third evaluation, in each replay."""
    entry = ENTRIES["hf_whisper_ja_overfits"]
    live = LiveFile(entry, scratch / "ja-count")
    evals = [i for i, e in enumerate(live.units) if "eval_loss" in e]
    for r in replays(entry.name, scratch / entry.name):
        third = next(i for i, n in enumerate(r.upto) if n > evals[2])
        assert r.first("run.overfitting", WARNING) == third
        (f,) = [f for f in r.polls[third] if f.code == "run.overfitting"]
        assert "eval_loss has risen at each of its 3 evaluations (0.321 → 0.3585 → 0.3937)" \
            in f.message
        assert "only 3 evaluations so far" in f.message and f.evidence["step"] == 1000


# ---------------------------------------------------------------- broken variants

LOSS_TAGS = ("loss", "train_loss", "train_loss_step", "train/loss")


def _loss_tag(entry: Entry, scratch: Path) -> str | None:
    """The healthy curve's train loss, where it has one of 60 points or more to break (the
    first of the names gpuwatch knows)."""
    live = LiveFile(entry, scratch)
    for tag in LOSS_TAGS:
        seen: list[float] = []
        if live.kind == "csv" and tag not in live.header.strip().split(","):
            continue
        live.edit(tag, lambda i, v, seen=seen: seen.append(v) or v)
        if len(seen) >= 60:
            return tag
    return None


def _mutable() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return sorted(n for n, e in ENTRIES.items() if e.truth == "healthy"
                      and _kind(e) != "events" and _loss_tag(e, Path(tmp) / n) is not None)


MUTABLE = _mutable()
RISE_POINTS = 160
"""A climb needs points: a window to show it and a window to sustain it, after 5/8."""


def _variant(name: str, scratch: Path, kind: str) -> tuple[Replayed, Replayed, str, int]:
    """The healthy curve `name` broken one way from 5/8 of its loss's points on; its two
    replays, the tag and the unit (entry, row, line) that holds the first broken point."""
    entry = ENTRIES[name]
    tag = _loss_tag(entry, scratch / f"{kind}-tag")
    assert tag is not None
    probe = LiveFile(entry, scratch / f"{kind}-probe")
    values: list[float] = []
    probe.edit(tag, lambda i, v: values.append(v) or v)
    at = len(values) * 5 // 8
    level = statistics.median(values[at - 20:at])
    n = len(values)

    def change(live: LiveFile) -> None:
        def broken(i: int, v: float) -> float:
            if kind == "nan":
                return math.nan if i >= at else v
            if kind == "spike":
                return 10 * max(v, level) if i == at else v
            return v if i < at else v + 9 * level * (i - at) / max(1, n - 1 - at)
        live.edit(tag, broken)

    holder = LiveFile(entry, scratch / f"{kind}-holder")
    change(holder)
    unit = _unit_of(holder, tag, at)
    size = len(holder)
    coarse, fine = granularities(size)
    return (replay(entry, scratch / f"{kind}-coarse", coarse, change),
            replay(entry, scratch / f"{kind}-fine", fine, change), tag, unit)


def _unit_of(live: LiveFile, tag: str, index: int) -> int:
    """The unit (0-based: entry, row, line) that holds the tag's `index`-th point."""
    seen = -1
    for u, unit in enumerate(live.units):
        if live.kind == "csv":
            has = _csv_has(live, unit, tag)
        else:
            has = tag in (unit if isinstance(unit, dict) else __import__("json").loads(unit))
        if has:
            seen += 1
            if seen == index:
                return u
    raise AssertionError((tag, index))


def _step_of(entry: Entry, unit: int) -> int:
    """The step a unit (entry, row, line) of a corpus file is logged at."""
    import csv
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        live = LiveFile(entry, Path(tmp))
    row = live.units[unit]
    if live.kind == "csv":
        cols = next(csv.reader([live.header]))
        return int(next(csv.reader([row]))[cols.index("step" if "step" in cols else "epoch")])
    return int((row if isinstance(row, dict) else json.loads(row))["step"])


def _csv_has(live: LiveFile, line: str, tag: str) -> bool:
    import csv

    cols = next(csv.reader([live.header]))
    cells = next(csv.reader([line]))
    at = cols.index(tag)
    return len(cells) > at and cells[at] != ""


def _poll_of(r: Replayed, unit: int) -> int:
    return next(i for i, n in enumerate(r.upto) if n > unit)


VARIANTS: dict[tuple[str, str], tuple[Replayed, Replayed, str, int]] = {}


def variant(name: str, kind: str, scratch: Path) -> tuple[Replayed, Replayed, str, int]:
    if (name, kind) not in VARIANTS:
        VARIANTS[(name, kind)] = _variant(name, scratch / f"{name}-{kind}", kind)
    return VARIANTS[(name, kind)]


def _points(entry: Entry) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tag = _loss_tag(entry, Path(tmp) / "t")
        seen: list[float] = []
        assert tag is not None
        LiveFile(entry, Path(tmp) / "p").edit(tag, lambda i, v: seen.append(v) or v)
        return len(seen)


KINDS = [(n, k) for n in MUTABLE for k in ("nan", "spike", "rise")
         if k != "rise" or _points(ENTRIES[n]) >= RISE_POINTS]


@pytest.mark.parametrize(("name", "kind"), KINDS)
def test_a_broken_variant_of_a_healthy_curve_is_caught(name: str, kind: str,
                                                       scratch: Path) -> None:
    coarse, fine, _tag, unit = variant(name, kind, scratch)
    for r in (coarse, fine):
        if kind == "nan":
            assert r.first("run.loss_nan", int(Severity.CRITICAL)) == _poll_of(r, unit)
        elif kind == "spike":  # the poll that brings it says it (a natural one may come before)
            said = [f for f in r.polls[_poll_of(r, unit)] if f.code == "run.loss_spike"]
            assert said and said[0].evidence["spikes"][-1] == _step_of(ENTRIES[name], unit), \
                [f.message for f in said]
            assert r.first("run.loss_spike") <= _poll_of(r, unit)  # type: ignore[operator]
        else:
            assert r.first("run.diverging", WARNING) is not None, r.codes()


# ---------------------------------------------------------------- the figures

def test_false_alarm_rate_and_recall(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    healthy = [n for n, e in ENTRIES.items() if e.truth == "healthy"]
    alarms = [n for n in healthy if any(_loud(r) for r in replays(n, scratch / n))]
    plateaus = [n for n in healthy if any("run.plateau" in r.codes() for r in replays(
        n, scratch / n))]
    broken = [n for n, e in ENTRIES.items() if e.truth in CAUGHT]
    caught = [n for n in broken if all(_loud(r) & CAUGHT[ENTRIES[n].truth]
                                       for r in replays(n, scratch / n))]
    stuck = [n for n, e in ENTRIES.items() if e.truth == "stuck"]
    flat = [n for n in stuck if all("run.plateau" in r.codes() for r in replays(n, scratch / n))]
    variants = KINDS
    want = {"nan": ("run.loss_nan", 2), "spike": ("run.loss_spike", 0),
            "rise": ("run.diverging", 1)}
    hit = [(n, k) for n, k in variants
           if all(r.first(*want[k]) is not None for r in variant(n, k, scratch)[:2])]
    with capsys.disabled():
        print(f"\ncorpus: {len(ENTRIES)} real curves, replayed at two granularities")
        print(f"  false alarms (warning or critical) on healthy curves: {len(alarms)}/"
              f"{len(healthy)} = {len(alarms) / len(healthy):.0%} {alarms or ''}")
        print(f"  run.plateau (info) on healthy curves: {len(plateaus)}/{len(healthy)} "
              f"{plateaus}")
        print(f"  recall on real broken curves: {len(caught)}/{len(broken)}; stuck curves "
              f"called a plateau: {len(flat)}/{len(stuck)}")
        print(f"  recall on broken variants (NaN, x10, climb): {len(hit)}/{len(variants)} "
              f"{sorted(set(variants) - set(hit)) or ''}")
    assert not alarms and len(caught) == len(broken) and len(flat) == len(stuck)
