"""The way back (remote/findings/rewind.py): after a NaN, a burst of spikes or a divergence, the
findings, the relaunch plan and `{checkpoint_before_anomaly}` name the newest checkpoint
written before the anomaly began, not the latest, which may hold the bad state; the watchdog
never restarts into a checkpoint written after the loss went NaN. A real corpus curve (QLoRA
on Guanaco, trainer_state.json every 10 steps) is broken from step 6,000 and replayed as a live
run with checkpoints beside it; the run then dies and is planned again."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
from curves_corpus import LiveFile, LiveRun, entry
from gpuwatch.remote.actions.plan import plan_relaunch
from gpuwatch.remote.actions.restart import resumes_after_nan
from gpuwatch.remote.findings.rewind import checkpoint_before, checkpoint_step
from gpuwatch.remote.findings.run_curves import checkpoint_before_anomaly
from gpuwatch.remote.model.snapshot import Checkpoint
from hypothesis import given
from hypothesis import strategies as st

BEFORE, AFTER = "checkpoint-5000", "checkpoint-6500"


def broken_run(tmp: Path, kind: str, template: str) -> LiveRun:
    """QLoRA's curve broken from step 6000 (`kind`: nan | spikes | rise), written in 8 polls,
    with checkpoints at steps 5000 and 6500; the run dies after the last poll (at step 9000;
    at 6300, soon after the spikes: a burst the run left behind long ago is not its way)."""
    live = LiveFile(entry("hf_qlora_guanaco"), tmp / "run")
    steps = [e["step"] for e in live.units if "loss" in e]

    def broken(i: int, v: float) -> float:
        step = steps[i]
        if kind == "nan":
            return math.nan if step >= 6000 else v
        if kind == "spikes":
            return 10 * v if step in (6000, 6100, 6200) else v
        return v if step < 6000 else v * (1 + 40 * (step - 6000) / 4000)
    live.edit("loss", broken)
    # it dies unfinished: at step 9000, or soon after the spikes
    end = 6300 if kind == "spikes" else 9000
    live.units = [e for e in live.units if e.get("step", 0) <= end and "train_runtime" not in e]
    extra = f'checkpoints = "ckpt/checkpoint-*"\nrelaunch = "{template}"\n'
    run = LiveRun(tmp, live, extra=extra)
    clock = time.time() - 3600
    for name in (BEFORE, AFTER):
        (tmp / "run" / "ckpt" / name).mkdir(parents=True)
        (tmp / "run" / "ckpt" / name / "model.pt").write_bytes(b"w")
    for i in range(1, 9):
        clock += 60
        live.upto(math.ceil(len(live) * i / 8), clock - 1)
        for age, name in ((40, BEFORE), (20, AFTER)):  # saved as the run writes them
            os.utime(tmp / "run" / "ckpt" / name / "model.pt", (clock - age, clock - age))
        run.poll(clock)
    run.kill()
    run.poll(clock + 60)
    return run


@pytest.mark.parametrize("kind", ["nan", "spikes", "rise"])
def test_the_relaunch_plan_resumes_from_the_checkpoint_before_the_anomaly(
        tmp_path: Path, kind: str) -> None:
    run = broken_run(tmp_path, kind, "python train.py --resume {checkpoint_before_anomaly}")
    series = run.history.runs["corpus"]
    ckpt, anomaly = checkpoint_before_anomaly(run.history, series)
    assert anomaly is not None and ckpt is not None and ckpt.path.endswith(BEFORE)
    assert 5000 < anomaly.step <= 6200
    plan = plan_relaunch(run.host, "corpus", run.history)
    assert plan.refusal is None, plan.refusal
    assert plan.command is not None and plan.command.endswith(f"ckpt/{BEFORE}")
    text = plan.describe()
    assert f"resumes from {ckpt.path}, the newest checkpoint written before" in text
    assert f"step {anomaly.step}" in text
    assert resumes_after_nan(run.history, "corpus", plan) is None


def test_the_nan_finding_and_the_plan_from_the_latest_say_the_way_back(tmp_path: Path) -> None:
    run = broken_run(tmp_path, "nan", "python train.py --resume {latest_checkpoint}")
    plan = plan_relaunch(run.host, "corpus", run.history)
    assert plan.command is not None and plan.command.endswith(f"ckpt/{AFTER}")
    text = plan.describe()
    assert "loss became NaN at step 6000, and its latest checkpoint" in text
    assert f"{AFTER} was written after that" in text and "the newest before it is" in text
    assert "{checkpoint_before_anomaly}" in text
    held = resumes_after_nan(run.history, "corpus", plan)
    assert held is not None and f"ckpt/{BEFORE}" in held and "resume the NaN" in held


def test_the_nan_finding_names_the_checkpoint_before_it(tmp_path: Path) -> None:
    live = LiveFile(entry("hf_qlora_guanaco"), tmp_path / "run")
    steps = [e["step"] for e in live.units if "loss" in e]
    live.edit("loss", lambda i, v: math.nan if steps[i] >= 6000 else v)
    run = LiveRun(tmp_path, live, extra='checkpoints = "ckpt/checkpoint-*"\n')
    for age, name in ((60, BEFORE), (30, AFTER)):
        (tmp_path / "run" / "ckpt" / name).mkdir(parents=True)
        (tmp_path / "run" / "ckpt" / name / "model.pt").write_bytes(b"w")
        os.utime(tmp_path / "run" / "ckpt" / name / "model.pt", (time.time() - age,) * 2)
    live.upto(len(live), time.time() - 5)
    found = [f for f in run.poll(time.time()) if f.code == "run.loss_nan"]
    assert found and found[0].evidence["checkpoint_before"].endswith(BEFORE)
    assert f"relaunch from {found[0].evidence['checkpoint_before']}, the newest checkpoint " \
           "written before it (not the latest" in found[0].message


def test_checkpoint_steps_by_the_trainers_names() -> None:
    names = {"checkpoint-500": 500, "epoch=3-step=1200.ckpt": 1200, "step_1200.pt": 1200,
             "iter_0001200": 1200, "global_step500": 500, "model_5000.pt": 5000,
             "last.ckpt": None, "best_model-v3.ckpt": None, "epoch=7.ckpt": None,
             "/runs/a1/ckpt/checkpoint-900/": 900, "weights.pt": None}
    assert {n: checkpoint_step(n) for n in names} == names


def test_a_checkpoint_without_a_step_is_placed_by_its_time() -> None:
    cks = (Checkpoint("/c/last.ckpt", 300.0, 1), Checkpoint("/c/best.ckpt", 100.0, 1))
    assert checkpoint_before(cks, 10, 200.0) == cks[1]
    assert checkpoint_before(cks, 10, math.nan) is None
    named = (Checkpoint("/c/checkpoint-100", 1.0, 1), Checkpoint("/c/checkpoint-300", 2.0, 1))
    assert checkpoint_before(named, 300, math.nan) == named[0]  # the step's own is after it
    assert checkpoint_before(named, 100, math.nan) is None


@given(st.text(max_size=60))
def test_any_name_has_a_step_or_none(name: str) -> None:
    """Whatever the name (any characters, other scripts' digits): a step it holds, or none."""
    step = checkpoint_step(name)
    assert step is None or (step >= 0 and str(step) in name)
