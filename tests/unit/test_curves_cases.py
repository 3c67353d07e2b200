"""The curve findings on the cases people reported of them, each written as its trainer writes
it and replayed as a live run through the box's readers and the rules (tests/curves_corpus.py):

- a healthy loss falling over five decades whose points are routinely 3× their median (a
  physics-informed net) raises no warning, whatever the polls;
- a failed fine-tune with 5 train points and an eval loss rising from its first evaluation is
  called at its third evaluation, in words that say how sure;
- three spikes 25 points apart are a burst (a warning) wherever the polls cut them;
- no plateau while the eval loss still falls; a run stuck at its initial loss is called stuck
  long before half of it;
- a noisy eval that stands well above its minimum for 7 evaluations while the train loss falls
  is overfitting.

The curves are generated (seeded), their shapes from the reports; the corpus test holds the
rules to real curves."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from curves_corpus import Entry, Replayed, replay
from gpuwatch.remote.model.finding import Severity

WARNING = int(Severity.WARNING)


def trainer_state(tmp: Path, name: str, entries: list[dict[str, float]]) -> Entry:
    path = tmp / f"{name}.trainer_state.json"
    tmp.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"log_history": entries, "global_step": entries[-1]["step"]}))
    return Entry(name, path, "made", name)


def csv_log(tmp: Path, name: str, header: list[str], rows: list[list[float | str]]) -> Entry:
    path = tmp / f"{name}.metrics.csv"
    tmp.mkdir(parents=True, exist_ok=True)
    path.write_text(",".join(header) + "\n"
                    + "".join(",".join(str(c) for c in r) + "\n" for r in rows))
    return Entry(name, path, "made", name)


def pinn(seed: int = 1) -> list[dict[str, float]]:
    """A loss from 38 to 1e-4 over 150k steps (five decades), log-normal noise with σ 0.6
    (a point 3× its median is a 1.8σ draw: one in thirty), and a few real ×4 spikes."""
    rng = random.Random(seed)
    out = []
    for i in range(1500):
        step = 100 * (i + 1)
        level = math.exp(math.log(38) + (math.log(1e-4) - math.log(38)) * (i / 1499) ** 0.7)
        noise = math.exp(rng.gauss(0, 0.6))
        spike = 4.0 if i in (300, 777, 1201) else 1.0
        out.append({"step": step, "loss": level * noise * spike, "epoch": i / 100})
    return out


def test_a_five_decade_loss_with_right_skewed_noise_raises_no_warning(tmp_path: Path) -> None:
    entry = trainer_state(tmp_path, "pinn", pinn())
    for per_poll in (300, 47, 9):  # 5, 32 and 167 polls
        r = replay(entry, tmp_path / f"p{per_poll}", per_poll)
        assert r.codes(WARNING) == set(), [f.message for f in r.loud()]
        assert "run.diverging" not in r.codes()


def failed_fine_tune() -> list[dict[str, float]]:
    """The report: a Whisper fine-tune logging its train loss every 50 steps and evaluating
    every 100; the eval loss 2.55 → 3.3 → 4.5 from the first evaluation on, the train loss
    rising too."""
    train = [(50, 1.9), (100, 2.0), (150, 2.3), (200, 2.2), (250, 2.6), (300, 2.9)]
    evals = {100: 2.55, 200: 3.3, 300: 4.5}
    out: list[dict[str, float]] = []
    for step, loss in train:
        out.append({"step": step, "loss": loss, "epoch": step / 300})
        if step in evals:
            out.append({"step": step, "eval_loss": evals[step], "epoch": step / 300})
    return out


def test_a_failed_fine_tune_is_called_at_its_third_evaluation(tmp_path: Path) -> None:
    entry = trainer_state(tmp_path, "ft", failed_fine_tune())
    for per_poll in (1, 3):
        r = replay(entry, tmp_path / f"p{per_poll}", per_poll)
        third = next(i for i, n in enumerate(r.upto) if n >= 9)  # the entry of eval 4.5
        assert r.first("run.diverging", WARNING) == third, r.codes()
        (f,) = [f for f in r.polls[third] if f.code == "run.diverging"]
        assert "eval_loss has risen at each of its 3 evaluations (2.55 → 3.3 → 4.5)" \
            in f.message
        assert "only 3 evaluations so far" in f.message and "loss is not falling" in f.message
        assert f.evidence["tag"] == "eval_loss" and f.evidence["step"] == 100


def spiky(seed: int = 2) -> list[list[float | str]]:
    """A flat, noisy loss (σ 5%) with three ×3 spikes 25 points apart (points 400, 425,
    450), a row every 10 steps."""
    rng = random.Random(seed)
    rows: list[list[float | str]] = []
    for i in range(600):
        v = 0.8 * math.exp(rng.gauss(0, 0.05)) * (3 if i in (400, 425, 450) else 1)
        rows.append([10 * i, v])
    return rows


def test_a_burst_of_spikes_is_a_warning_wherever_the_polls_cut_it(tmp_path: Path) -> None:
    entry = csv_log(tmp_path, "spiky", ["step", "train_loss"], spiky())
    verdicts = []
    for per_poll in (413, 30, 24, 7):  # boundaries between the spikes, or none
        r = replay(entry, tmp_path / f"p{per_poll}", per_poll)
        brings = next(i for i, n in enumerate(r.upto) if n > 450)
        warned = [f for f in r.polls[brings] if f.code == "run.loss_spike"
                  and f.severity == Severity.WARNING]
        assert warned, (per_poll, [f.message for found in r.polls for f in found])
        assert warned[0].evidence["spikes"] == [4000, 4250, 4500]
        assert r.first("run.loss_spike", WARNING) == brings
        verdicts.append(r.codes(WARNING))
    assert all(v == {"run.loss_spike"} for v in verdicts)


def plateau_rows(eval_falls: bool) -> list[list[float | str]]:
    """A train loss that fell in its first 1,000 steps and is flat (noisy) after; an eval
    every 500 steps that keeps falling (0.24 → 0.21) or is flat too."""
    rng = random.Random(3)
    rows: list[list[float | str]] = []
    for i in range(1200):
        step = 10 * i
        train = 0.3 + 2.0 * math.exp(-step / 300) + rng.gauss(0, 0.01)
        ev: float | str = ""
        if step % 500 == 0 and step:
            ev = (0.24 - 0.03 * step / 12_000) if eval_falls else 0.24 + rng.gauss(0, 0.002)
        rows.append([step, train, ev])
    return rows


def test_no_plateau_while_the_eval_loss_still_falls(tmp_path: Path) -> None:
    falls = csv_log(tmp_path, "falls", ["step", "train_loss", "val_loss"], plateau_rows(True))
    r = replay(falls, tmp_path / "falls-run", 40)
    assert "run.plateau" not in r.codes()
    flat = csv_log(tmp_path, "flat", ["step", "train_loss", "val_loss"], plateau_rows(False))
    r = replay(flat, tmp_path / "flat-run", 40)
    first = r.first("run.plateau")
    assert first is not None and r.upto[first] < 600  # before half the run
    (f,) = [f for f in r.polls[first] if f.code == "run.plateau"]
    assert "has not learned since step" in f.message


def test_a_run_stuck_at_its_initial_loss_is_called_long_before_half_of_it(
        tmp_path: Path) -> None:
    """At its initial loss (2.30, ten classes) for 11,000 steps of a 40,000-step run."""
    rng = random.Random(4)
    rows: list[list[float | str]] = [[10 * i, 2.3026 + rng.gauss(0, 0.02)] for i in range(4000)]
    entry = csv_log(tmp_path, "stuck", ["step", "train_loss"], rows)
    r = replay(entry, tmp_path / "run", 100)
    first = r.first("run.plateau")
    assert first is not None and r.upto[first] <= 100  # by step 1,000 of 40,000
    assert r.codes(WARNING) == set()


def noisy_eval_rows(zigzag: float, epochs: int) -> list[list[float | str]]:
    """Eval every epoch (100 steps), zigzagging by `zigzag`; its lowest at epoch 12, then 27%
    above it while the train loss falls ninefold over 20 epochs (the report's numbers)."""
    rng = random.Random(5)
    rows: list[list[float | str]] = []
    for epoch in range(epochs):
        trend = 0.5 - 0.01 * epoch if epoch <= 12 else 0.38 * 1.27
        ev = trend * math.exp(rng.gauss(0, zigzag))
        train = 0.9 * math.exp(-epoch * math.log(9) / 19) * math.exp(rng.gauss(0, 0.02))
        for k in range(10):
            rows.append([epoch * 100 + k * 10, train * (1 + 0.01 * (5 - k)), ""])
        rows[-1][2] = ev
    return rows


@pytest.mark.parametrize(("zigzag", "by"), [(0.03, 7), (0.05, 10)])
def test_a_noisy_eval_well_above_its_minimum_while_train_falls_is_overfitting(
        tmp_path: Path, zigzag: float, by: int) -> None:
    """27% above its lowest for 7 evaluations is overfitting at once with a 3% zigzag; with
    5% (a sixth of the rise) it takes 10 evaluations: the rule is held to the corpus' noisy
    healthy evals (pl_ml_aos_*, pl_erav2_*), which stand as far above their lows for as long."""
    rows = noisy_eval_rows(zigzag, 13 + by)
    entry = csv_log(tmp_path, "noisy", ["step", "train_loss", "val_loss"], rows)
    for per_poll in (10, 50):
        r: Replayed = replay(entry, tmp_path / f"p{per_poll}", per_poll)
        assert "run.overfitting" in r.codes(WARNING), [f.message for found in r.polls
                                                      for f in found]
        f = next(f for found in r.polls for f in found if f.code == "run.overfitting")
        assert "above its lowest trend" in f.message and "kept falling" in f.message
