"""run.hung and run.slowed: the step clock against the run's own pace, with its processes and
GPUs. A simulated box holds the run's process (alive, on its GPU) while the MLP's real curve is
written by tensorboardX; then the writer pauses. Not hung while a checkpoint is being written,
nor when only the log is silent (block-buffered stdout stays run.log_buffered, info)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from curves_data import Replay
from findings_helpers import Watched, host_config, touch
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.sim import Box, h100_sxm, training_process


def setup(tmp_path: Path, extra: str = "", **th: float) -> tuple[Box, Replay, Watched]:
    box = Box(tmp_path / "box", h100_sxm(1), btime=int(time.time()) - 86_400,
              uptime_s=86_400.0)
    box.add_process(training_process(600, workdir=str(tmp_path / "run"), nohup=True,
                                     start_s=3600.0))
    box.add_compute_app(0, 600, "python", 30_000)
    box.set_gpu(0, util_pct=100, power_w=95.0, mem_used_mib=30_000)  # an NCCL spin: busy, cool
    replay = Replay("mlp_digits", tmp_path / "run")
    toml = (f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\nworkdir = "{tmp_path / "run"}"\n'
            + replay.toml() + extra)
    return box, replay, Watched(box, host_config(toml), thresholds=Thresholds(**th))


def test_a_paused_writer_of_a_live_run_is_hung(tmp_path: Path) -> None:
    _box, replay, w = setup(tmp_path)
    replay.upto(len(replay))  # the last step's wall time is now
    last = time.time()
    assert "run.hung" not in w.codes() and "run.hung" not in [f.code for f in w.poll()]
    w.poll(at=last + 300)  # 5 min: over 10 of its 0.5 s steps, under the 10 min floor
    assert "run.hung" not in w.codes()
    w.poll(at=last + 2400)  # 40 min: hung; run.stalled (nothing written) gives way to it
    f = w.one("run.hung")
    assert f.severity == Severity.CRITICAL and f.evidence["step"] == 600
    assert f.evidence["tag"] == "train/loss" and f.evidence["interval_s"] == 0.5
    assert f.evidence["gpus"][0]["util_pct"] == 100 and f.evidence["states"] == {600: "R"}
    assert "its last step, 600, came 40 min ago, against its usual 0.5 s" in f.message
    assert "GPU 0 100% at 95 W" in f.message
    assert "run.stalled" not in w.codes()
    replay.wall += 2400  # the writer goes on: no longer hung at the next poll
    replay.events += [(601, "train/loss", 0.05)]
    replay.upto(len(replay))
    w.poll(at=last + 2400 + 1)
    assert "run.hung" not in w.codes()


def test_not_hung_while_a_checkpoint_is_being_written(tmp_path: Path) -> None:
    _box, replay, w = setup(tmp_path, 'checkpoints = "ckpt/*.pt"\n')
    replay.upto(len(replay))
    last = time.time()
    w.poll()
    ckpt = touch(tmp_path / "run" / "ckpt" / "step-600.pt", last + 2300, b"x" * 4096)
    w.poll(at=last + 2400)
    assert "run.hung" not in w.codes()
    touch(ckpt, last)  # the save ended long ago: hung
    w.poll(at=last + 2400)
    assert w.one("run.hung").evidence["quiet_s"] >= 2399


def test_a_block_buffered_log_is_no_hang(tmp_path: Path) -> None:
    """The log silent for 20 minutes while the events advance: run.log_buffered, info."""
    _box, replay, w = setup(tmp_path, 'log = "train.log"\n')
    touch(tmp_path / "run" / "train.log", time.time() - 1200, b"step 1\n")
    for n in (200, 400, 600):
        replay.upto(n)
        w.poll()
    assert "run.hung" not in w.codes()
    assert w.one("run.log_buffered").severity == Severity.INFO


def test_slowed_names_what_changed_at_the_same_time(tmp_path: Path) -> None:
    """0.5 s a step, then 10 s a step for the last 40 steps: slowed, and the GPU throttled and
    another process arrived on it between the polls."""
    box, replay, w = setup(tmp_path)
    replay.events = [e for e in replay.events if e[0] <= 560]
    replay.upto(len(replay))
    w.poll()
    assert "run.slowed" not in w.codes()
    box.set_throttle(0, ["hw_thermal_slowdown"])
    box.add_process(training_process(700, script="other.py", workdir=str(tmp_path / "o")))
    box.add_compute_app(0, 700, "python", 10_000)
    slow = Replay("mlp_digits", tmp_path / "scratch")
    start = replay.wall + 0.5 * 560
    tail = [e for e in slow.events if 560 < e[0] <= 600 and e[1] == "train/loss"]
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(replay.path), filename_suffix=".slow")
    for step, tag, value in tail:
        writer.add_scalar(tag, value, step, walltime=start + 10.0 * (step - 560))
    writer.close()
    w.poll(at=time.time() + 400)
    f = w.one("run.slowed")
    assert f.severity == Severity.WARNING and f.evidence["usual_s_per_step"] == 0.5
    assert f.evidence["s_per_step"] == 10.0 and f.evidence["slow_points"] == 40
    assert any("throttled (hw_thermal_slowdown)" in c for c in f.evidence["changed"])
    assert any("another process on GPU 0 (pid 700" in c for c in f.evidence["changed"])


def test_eta_from_the_runs_own_pace(tmp_path: Path) -> None:
    """HF's Trainer writes TensorBoard events and, at each save, trainer_state.json: before two
    saves give a pace, the loss points' own (0.5 s a step) gives the ETA."""
    state = tmp_path / "run" / "out" / "trainer_state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"global_step": 600, "max_steps": 1000, "log_history": '
                     '[{"step": 600, "loss": 0.1}]}')
    _box, replay, w = setup(tmp_path, f'metrics = ["{state}"]\n')
    replay.upto(len(replay))
    w.poll()
    progress = w.history.runs["llama"].progress_json()
    assert progress is not None and progress["steps_per_s"] == 2.0
    assert progress["eta_s"] == 200.0 and progress["max_steps"] == 1000


def test_the_eta_of_a_silent_run_is_unknown_not_zero(tmp_path: Path) -> None:
    """trainer_state.json saved every 10 minutes (100 steps each, of 1,000): while the saves
    come, the ETA counts down between them; once none came for more than twice that, the ETA
    is unknown and the silence is said (not "0 s left" of a run 600 steps from its end)."""
    state = tmp_path / "run" / "out" / "trainer_state.json"
    state.parent.mkdir(parents=True)
    _box, _replay, w = setup(tmp_path, f'metrics = ["{state}"]\n')
    t0 = time.time() - 3 * 600 - 7200
    for i, step in enumerate((100, 200, 300, 400)):
        state.write_text(f'{{"global_step": {step}, "max_steps": 1000, "log_history": '
                         f'[{{"step": {step}, "loss": 0.1}}]}}')
        touch(state, t0 + 600 * i)
        w.poll(at=t0 + 600 * i + 300)
    progress = w.history.runs["llama"].progress_json(t0 + 1800 + 300)
    assert progress is not None and progress["silent_s"] is None
    assert progress["eta_s"] == 600 * 6 - 300  # 600 steps at 1 step / 6 s, 5 min since
    w.poll(at=t0 + 1800 + 1300)  # 1,300 s since the last save: more than twice 600 s
    progress = w.history.runs["llama"].progress_json(t0 + 1800 + 1300)
    assert progress is not None and progress["eta_s"] is None
    assert progress["silent_s"] == 1300.0


def test_a_run_that_paused_as_long_before_is_not_hung_yet(tmp_path: Path) -> None:
    """A 15-minute evaluation at step 300 (no log configured): a 20-minute silence later is
    within 1.5× that pause, a 25-minute one is not."""
    _box, replay, w = setup(tmp_path)
    replay.wall -= 900  # the points after step 300 come 15 minutes later than 0.5 s a step
    replay.upto(len([e for e in replay.events if e[0] <= 300]))
    replay.wall += 900
    replay.upto(len(replay))
    last = time.time()
    w.poll()
    w.poll(at=last + 1200)
    assert "run.hung" not in w.codes()
    w.poll(at=last + 1500)
    f = w.one("run.hung")
    assert f.evidence["longest_pause_s"] == 900.5 and f.evidence["limit_s"] == 1350.75


def test_a_run_whose_step_was_never_seen_to_move_is_not_hung(tmp_path: Path) -> None:
    """HF's trainer_state.json is written at each save (every 30 minutes, say): first seen 20
    minutes after one, the run has no pace of its own yet, and is not called hung."""
    box = Box(tmp_path / "box", h100_sxm(1), btime=int(time.time()) - 86_400,
              uptime_s=86_400.0)
    box.add_process(training_process(600, workdir=str(tmp_path / "run"), nohup=True,
                                     start_s=7200.0))
    replay = Replay("hf_whisper_flemish", tmp_path / "run")
    toml = (f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\nworkdir = "{tmp_path / "run"}"\n'
            + replay.toml())
    w = Watched(box, host_config(toml))
    replay.upto(len(replay) // 2)
    touch(replay.path, time.time() - 1200)
    w.poll()
    assert "run.hung" not in w.codes()
    replay.upto(len(replay) * 3 // 4)  # the next save: its step moved, 20 minutes on
    w.poll()
    w.poll(at=time.time() + 4 * 3600)  # then 4 hours without one: over 10 × 20 minutes
    assert w.one("run.hung").evidence["interval_s"] >= 1199


def test_a_resume_from_before_the_nan_is_judged_anew(tmp_path: Path) -> None:
    """The loss went NaN at step 500; the run is relaunched from its step-400 checkpoint (a
    new event file going back): the trackers start again from the merged curve, the NaN gone."""
    _box, replay, w = setup(tmp_path, 'checkpoints = "ckpt/checkpoint-*"\n')
    for step in (400, 550):  # the one to resume from is the newest before the NaN
        touch(tmp_path / "run" / "ckpt" / f"checkpoint-{step}" / "model.pt", time.time())
    replay.edit("train/loss", lambda s, v: math.nan if s >= 500 else v)
    replay.upto(len(replay))
    w.poll()
    f = w.one("run.loss_nan")
    assert f.evidence["step"] == 500 and f.evidence["last_finite_step"] == 499
    assert f.evidence["checkpoint_before"] == str(tmp_path / "run" / "ckpt" / "checkpoint-400")
    assert "checkpoint-400, the newest checkpoint written before it (not the latest" in f.message
    time.sleep(1.1)  # the resumed writer's file gets a later name (epoch seconds)
    resumed = Replay("mlp_digits", tmp_path / "scratch")
    resumed.events = [e for e in resumed.events if e[0] > 400]
    resumed.wall = replay.wall + 600
    resumed.path.mkdir(parents=True)
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(replay.path), filename_suffix=".resumed")
    for step, tag, value in resumed.events:
        writer.add_scalar(tag, value, step, walltime=resumed.wall + 0.5 * step)
    writer.close()
    w.poll()
    assert "run.loss_nan" not in w.codes()
    curves = w.history.runs["llama"].curves
    assert curves.trackers["train/loss"].bad_step is None
    assert curves.trackers["train/loss"].last_step == 600 and curves.restart[0] > 400
