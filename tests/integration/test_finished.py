"""Seed 004: a finished run is not a dead one. Runs whose processes end are judged from what the
frameworks write (HF's trainer_state.json, Lightning's metrics.csv, hparams.yaml and checkpoint
names, the frameworks' own completion lines) and, for a run gpuwatch relaunched, from the exit
status its launch wrapper records — through `--once` with the store in between, poll by poll
while the files grow, and over a real sshd for the wrapper.

transformers and lightning are not installed here (each pulls in torch): trainer_state.json is
written as transformers' TrainerState.save_to_json writes it (dataclasses.asdict, json.dumps with
indent=2 and sort_keys, a newline; the 4.4x field set), metrics.csv with csv.DictWriter as
Lightning's CSVLogger writes it, hparams.yaml as its save_hparams_to_yaml leaves plain integers."""

from __future__ import annotations

import csv
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from findings_helpers import Watched, host_config, touch
from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.box import act as actions_box
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.model.discovery import exit_record_path
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.series import completion_line
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from harness import real_box
from harness.captures import capture
from harness.cli import gpuwatch_on_box
from harness.real_box import PY, Rig, alive, poll
from harness.waiting import wait_for

RUN_SCHEMA_ADDITIONS: dict[str, Any] = {
    "progress": {
        "type": "object", "required": ["step", "max_steps", "epoch", "max_epochs", "eta_s"],
        "additionalProperties": False,
        "properties": {"step": {"$ref": "#/$defs/int"}, "max_steps": {"$ref": "#/$defs/int"},
                       "epoch": {"$ref": "#/$defs/num"}, "max_epochs": {"$ref": "#/$defs/num"},
                       "eta_s": {"$ref": "#/$defs/num"},
                       "steps_per_s": {"$ref": "#/$defs/num"}}},
    "finished_by": {"type": "string"},
}
"""What the lead adds to the schema's run object (both optional); the test validates with it."""


def schema() -> dict[str, Any]:
    doc = load_schema()
    run = doc["$defs"]["run"]["properties"]
    for key, value in RUN_SCHEMA_ADDITIONS.items():
        run.setdefault(key, value)
    causes = doc["$defs"]["run"]["properties"]["diagnosis"]["oneOf"][1]["properties"]["cause"]
    if "exited" not in causes["enum"]:
        causes["enum"].append("exited")
    return doc


# ---------------------------------------------------------------- the frameworks' files

def trainer_state(path: Path, step: int, max_steps: int, *, final: bool = False,
                  mtime: float | None = None) -> None:
    """A checkpoint's trainer_state.json as transformers' TrainerState.save_to_json writes it."""
    epochs = 3
    history: list[dict[str, Any]] = [
        {"epoch": s * epochs / max_steps, "grad_norm": 1.25,
         "learning_rate": 5e-05 * (1 - s / max_steps), "loss": 2.0 - s / 1000, "step": s}
        for s in range(10, step + 1, 10)]
    if final:  # what Trainer.train() logs as it returns (it then saves the state: save_state())
        history.append({"epoch": float(epochs), "step": step, "total_flos": 1.2e15,
                        "train_loss": 1.85, "train_runtime": 612.3,
                        "train_samples_per_second": 39.2, "train_steps_per_second": 0.49})
    state = {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
             "epoch": step * epochs / max_steps, "eval_steps": 500, "global_step": step,
             "is_hyper_param_search": False, "is_local_process_zero": True,
             "is_world_process_zero": True, "log_history": history, "logging_steps": 10,
             "max_steps": max_steps, "num_input_tokens_seen": 0, "num_train_epochs": epochs,
             "save_steps": 100, "stateful_callbacks": {"TrainerControl": {
                 "args": {"should_epoch_stop": False, "should_evaluate": False,
                          "should_log": False, "should_save": True,
                          "should_training_stop": step >= max_steps}, "attributes": {}}},
             "total_flos": 1.2e15 * step / max_steps, "train_batch_size": 8, "trial_name": None,
             "trial_params": None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    (path.parent / "model.safetensors").write_bytes(b"w" * 64)
    if mtime is not None:
        for item in (path, path.parent / "model.safetensors"):
            os.utime(item, (mtime, mtime))


def lightning_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """metrics.csv as Lightning's CSVLogger (ExperimentWriter.save) writes it: the whole file
    rewritten with csv.DictWriter over every key logged so far."""
    keys = sorted({k for row in rows for k in row})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def epoch_rows(epoch: int, steps_per_epoch: int = 100) -> list[dict[str, Any]]:
    first = epoch * steps_per_epoch
    rows: list[dict[str, Any]] = [{"epoch": epoch, "step": s, "train_loss": 1.0 / (s + 1)}
                                  for s in range(first + 49, first + steps_per_epoch, 50)]
    rows.append({"epoch": epoch, "step": first + steps_per_epoch - 1, "val_loss": 0.5})
    return rows


# ---------------------------------------------------------------- HF through --once

def box_at(tmp_path: Path) -> Box:
    return Box(tmp_path / "box", h100_sxm(2), btime=int(time.time()) - 86_400,
               uptime_s=86_400.0)


def hf_config(works: dict[str, Path]) -> str:
    text = '[hosts.local]\nssh = "local"\n'
    for name, work in works.items():
        text += (f'[hosts.local.runs.{name}]\nprocess = "{name}.py"\nworkdir = "{work}"\n'
                 'log = "train.log"\nmetrics = ["out/checkpoint-*/trainer_state.json"]\n'
                 'checkpoints = "out/checkpoint-*"\n')
    return text


def once(tmp_path: Path, box: Box, config: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    out = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, schema())
    (host,) = doc["hosts"]
    return out.returncode, {r["name"]: r for r in host["runs"]}, \
        {(f["code"], f.get("run")): f for f in host["findings"]}


def test_hf_run_that_reaches_max_steps_is_finished_and_a_killed_one_dead(tmp_path: Path) -> None:
    """Two HF runs polled by cron `--once` while their checkpoints grow: one exits after its
    last step (finished, no run.dead, exit 0, progress at its end), the other is killed at step
    200 of 300 (still a critical run.dead)."""
    box = box_at(tmp_path)
    works = {name: tmp_path / name for name in ("done_run", "cut_run")}
    t0 = time.time() - 150
    for i, (name, work) in enumerate(works.items()):
        work.mkdir()
        (work / "train.log").write_text(" 33%|███▎      | 100/300 [01:40<03:20]\n")
        box.add_process(training_process(600 + i, script=f"{name}.py", workdir=str(work),
                                         gpu=i, nohup=True))
        trainer_state(work / "out" / "checkpoint-100" / "trainer_state.json", 100, 300,
                      mtime=t0)
    config = hf_config(works)
    code, runs, findings = once(tmp_path, box, config)
    assert code == 0 and runs["done_run"]["status"] == "running"
    assert runs["done_run"]["progress"] == {"step": 100, "max_steps": 300, "epoch": 1.0,
                                            "max_epochs": 3.0, "eta_s": None,
                                            "steps_per_s": None, "silent_s": None}  # no pace yet

    for work in works.values():  # the next checkpoint, 100 s later: a pace of 1 step/s
        trainer_state(work / "out" / "checkpoint-200" / "trainer_state.json", 200, 300,
                      mtime=t0 + 100)
    code, runs, findings = once(tmp_path, box, config)
    assert code == 0
    progress = runs["done_run"]["progress"]
    assert progress["step"] == 200 and progress["max_steps"] == 300
    # 100 steps left at 1 step/s, less the time since checkpoint-200 was written (~50 s)
    assert progress["eta_s"] == pytest.approx(100 - (time.time() - (t0 + 100)), abs=15)
    assert runs["cut_run"]["progress"]["step"] == 200

    # done_run: its last checkpoint (HF saves at max_steps), then Trainer.train() returns and
    # the process exits; cut_run is killed between checkpoints.
    trainer_state(works["done_run"] / "out" / "checkpoint-300" / "trainer_state.json", 300, 300)
    with (works["done_run"] / "train.log").open("a") as f:
        f.write("100%|██████████| 300/300 [05:00<00:00]\n")
    box.remove_process(600)
    box.remove_process(601)
    code, runs, findings = once(tmp_path, box, config)
    assert runs["done_run"]["status"] == "finished" and runs["done_run"]["diagnosis"] is None
    assert "global_step 300 of max_steps 300" in runs["done_run"]["finished_by"]
    assert runs["done_run"]["progress"]["step"] == 300
    assert ("run.dead", "done_run") not in findings
    assert runs["cut_run"]["status"] == "dead" and "finished_by" not in runs["cut_run"]
    assert findings[("run.dead", "cut_run")]["severity"] == "critical"
    assert runs["cut_run"]["diagnosis"]["cause"] == "killed"
    assert code == 1  # the killed run alone makes it critical

    code, runs, findings = once(tmp_path, box, config)  # a later cron run: still finished
    assert runs["done_run"]["status"] == "finished" and ("run.dead", "done_run") not in findings
    # still dead: critical until relaunched, finished or acknowledged (`gpuwatch ack`)
    assert findings[("run.dead", "cut_run")]["severity"] == "critical" and code == 1


def test_hf_closing_summary_counts_for_an_early_stopped_run(tmp_path: Path) -> None:
    """EarlyStoppingCallback ends training before max_steps: the summary entry with
    train_runtime that save_state() writes after Trainer.train() returns is its end."""
    box = box_at(tmp_path)
    work = tmp_path / "es"
    work.mkdir()
    box.add_process(training_process(600, script="es.py", workdir=str(work), nohup=True))
    w = Watched(box, host_config(f'[hosts.gpu1.runs.es]\nprocess = "es.py"\n'
                                 f'workdir = "{work}"\nmetrics = ["out/trainer_state.json"]\n'))
    trainer_state(work / "out" / "trainer_state.json", 120, 300)
    w.poll()
    assert w.history.runs["es"].status == "running"
    trainer_state(work / "out" / "trainer_state.json", 140, 300, final=True)
    box.remove_process(600)
    w.poll()
    series = w.history.runs["es"]
    assert series.status == "finished" and "train_runtime" in (series.finished_by() or "")
    assert "run.dead" not in w.codes() and w.history.deaths == {}


# ---------------------------------------------------------------- Lightning

def lightning_watch(tmp_path: Path, box: Box, name: str, pid: int,
                    hparams: str = "lr: 0.001\nmax_epochs: 3\n") -> tuple[Watched, Path]:
    work = tmp_path / name
    version = work / "lightning_logs" / "version_0"
    version.mkdir(parents=True)
    (version / "hparams.yaml").write_text(hparams)
    box.add_process(training_process(pid, script=f"{name}.py", workdir=str(work), nohup=True))
    w = Watched(box, host_config(
        f'[hosts.gpu1.runs.{name}]\nprocess = "{name}.py"\nworkdir = "{work}"\n'
        'metrics = ["lightning_logs/version_*/metrics.csv"]\n'
        'checkpoints = "lightning_logs/version_*/checkpoints/*.ckpt"\n'))
    return w, version


def test_lightning_run_with_a_checkpoint_of_its_final_epoch_is_finished(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w, version = lightning_watch(tmp_path, box, "pl_fit", 600)
    rows: list[dict[str, Any]] = []
    for epoch in range(3):  # polled while metrics.csv grows and the checkpoint rotates
        rows += epoch_rows(epoch)
        lightning_rows(version / "metrics.csv", rows)
        for old in (version / "checkpoints").glob("*.ckpt"):
            old.unlink()
        touch(version / "checkpoints" / f"epoch={epoch}-step={100 * (epoch + 1)}.ckpt",
              time.time(), b"ckpt")
        w.poll()
        series = w.history.runs["pl_fit"]
        progress = series.progress_json()
        assert progress is not None and progress["max_epochs"] == 3.0
        assert progress["epoch"] == float(epoch) and progress["step"] == 100 * epoch + 99
        assert series.status == "running" and w.codes().count("run.dead") == 0
    box.remove_process(600)
    w.poll()
    series = w.history.runs["pl_fit"]
    assert series.status == "finished", series.finished_by()
    assert "epoch=2-step=300.ckpt" in (series.finished_by() or "")
    assert "run.dead" not in w.codes()


def test_lightning_last_ckpt_after_the_final_epoch_began(tmp_path: Path) -> None:
    """save_last's last.ckpt carries no epoch in its name: it counts when it was saved after
    the final epoch's first rows were seen."""
    box = box_at(tmp_path)
    w, version = lightning_watch(tmp_path, box, "pl_last", 600, "max_epochs: 2\n")
    rows = epoch_rows(0)
    lightning_rows(version / "metrics.csv", rows)
    touch(version / "checkpoints" / "last.ckpt", time.time() - 30, b"ckpt")
    w.poll()
    rows += epoch_rows(1)
    lightning_rows(version / "metrics.csv", rows)
    os.utime(version / "metrics.csv", (time.time() - 10, time.time() - 10))
    w.poll()
    assert w.history.runs["pl_last"].status == "running"
    touch(version / "checkpoints" / "last.ckpt", time.time(), b"ckpt2")
    box.remove_process(600)
    w.poll()
    assert w.history.runs["pl_last"].status == "finished"
    assert "run.dead" not in w.codes()


def test_lightning_run_killed_mid_fit_is_still_dead(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w, version = lightning_watch(tmp_path, box, "pl_cut", 600)
    lightning_rows(version / "metrics.csv", epoch_rows(0) + epoch_rows(1)[:1])
    touch(version / "checkpoints" / "epoch=0-step=100.ckpt", time.time(), b"ckpt")
    touch(version / "checkpoints" / "last.ckpt", time.time() - 60, b"ckpt")
    w.poll()
    box.remove_process(600)
    w.poll()
    assert w.history.runs["pl_cut"].status == "dead"
    assert w.one("run.dead").severity == Severity.CRITICAL


# ---------------------------------------------------------------- a log's last words

HF_END = ("***** Running training *****\n  Num examples = 3,668\n"
          "{'loss': 0.4512, 'grad_norm': 3.1, 'learning_rate': 1.2e-06, 'epoch': 2.97}\n"
          "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)"
          "\n\n\n{'train_runtime': 228.0153, 'train_samples_per_second': 0.421, "
          "'train_steps_per_second': 0.026, 'train_loss': 2.0226850509643555, 'epoch': 1.0}\n")
PL_END = ("Epoch 19: 100%|██████████| 352/352 [00:22<00:00, 15.71it/s, v_num=1]\n"
          "INFO: `Trainer.fit` stopped: `max_epochs=20` reached.\n"
          "INFO:lightning.pytorch.utilities.rank_zero:`Trainer.fit` stopped: `max_epochs=20` "
          "reached.\n")


def test_completion_lines_of_real_logs() -> None:
    def tail(name: str) -> str:  # the last lines, as the probe sends a log's tail
        text = capture(f"metrics/train_stdout/{name}").read_text(errors="replace")
        return "\n".join(text.splitlines()[-40:])

    ended = completion_line(tail("deepspeed-data-efficiency__vit_cifar.log"))
    assert ended is not None and ended.endswith("Process 29248 exits successfully.")
    assert completion_line(tail("deepspeed-chat__llama7b_16gpu_crash.log")) is None
    assert (completion_line(HF_END) or "").startswith("{'train_runtime': 228.0153")
    saved_after = HF_END.replace("\n\n\n{'train_runtime'", "\nSaving model checkpoint to out\n"
                                 "{'train_runtime'").rsplit("{'train_runtime'", 1)[0]
    assert (completion_line(saved_after) or "").startswith("Training completed.")
    assert "max_epochs=20" in (completion_line(PL_END) or "")
    crashed = PL_END + "Traceback (most recent call last):\nRuntimeError: CUDA error: boom\n"
    assert completion_line(crashed) is None  # something after the end crashed
    # DeepSpeed's line counts only as the very last: a rank that exited 0 before another failed
    assert completion_line("[2023-04-18 03:20:47,467] [INFO] [launch.py:460:main] Process 7 "
                           "exits successfully.\n[2023-04-18 03:20:48,001] [INFO] "
                           "[launch.py:314:sigkill_handler] Killing subprocess 8\n") is None


def test_a_log_that_ends_with_the_completion_line_is_finished(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    work = tmp_path / "pl"
    work.mkdir()
    (work / "train.log").write_text("Epoch 3: 40%\n")
    box.add_process(training_process(600, script="pl.py", workdir=str(work), nohup=True))
    w = Watched(box, host_config(f'[hosts.gpu1.runs.pl]\nprocess = "pl.py"\n'
                                 f'workdir = "{work}"\nlog = "train.log"\n'))
    w.poll()
    with (work / "train.log").open("a") as f:
        f.write(PL_END)
    box.remove_process(600)
    w.poll()
    assert w.history.runs["pl"].status == "finished" and "run.dead" not in w.codes()


def test_evidence_older_than_the_latest_launch_does_not_count(tmp_path: Path) -> None:
    """A run that finished, then was started again by hand and killed before its first
    checkpoint: the old trainer_state.json's end is the earlier launch's, not this one's."""
    box = box_at(tmp_path)
    work = tmp_path / "again"
    work.mkdir()
    trainer_state(work / "out" / "checkpoint-300" / "trainer_state.json", 300, 300,
                  mtime=time.time() - 600)
    w = Watched(box, host_config(f'[hosts.gpu1.runs.again]\nprocess = "again.py"\n'
                                 f'workdir = "{work}"\n'
                                 'metrics = ["out/checkpoint-*/trainer_state.json"]\n'))
    w.poll()
    assert w.history.runs["again"].status == "finished"  # never seen running: it had ended
    box.add_process(training_process(600, script="again.py", workdir=str(work), nohup=True))
    w.poll()
    box.remove_process(600)
    w.poll()
    assert w.history.runs["again"].status == "dead"
    assert w.one("run.dead").severity == Severity.CRITICAL


def test_an_end_written_before_the_runs_processes_started_does_not_count(tmp_path: Path) -> None:
    """The same, where gpuwatch never saw the run idle (the TUI opened mid-run, or a cron
    interval spanning a quick restart): the processes' own start time tells the launches
    apart, so a resumed run that dies before its next save is dead, not finished."""
    box = box_at(tmp_path)
    work = tmp_path / "resumed"
    work.mkdir()
    trainer_state(work / "out" / "checkpoint-5000" / "trainer_state.json", 5000, 5000,
                  mtime=time.time() - 600)
    box.add_process(training_process(600, script="resumed.py", workdir=str(work), nohup=True,
                                     start_s=86_400.0 - 60))  # a minute ago, after that save
    w = Watched(box, host_config(f'[hosts.gpu1.runs.resumed]\nprocess = "resumed.py"\n'
                                 f'workdir = "{work}"\n'
                                 'metrics = ["out/checkpoint-*/trainer_state.json"]\n'))
    w.poll()
    assert w.history.runs["resumed"].status == "running"
    box.remove_process(600)
    w.poll()
    assert w.history.runs["resumed"].status == "dead"
    assert w.one("run.dead").severity == Severity.CRITICAL


# ---------------------------------------------------------------- the launch wrapper, over sshd

def test_the_box_and_the_client_name_the_exit_record_alike() -> None:
    for name in ("llama", "a b/c", "x" * 200, "", "ünï", "../up"):
        assert actions_box.exit_record_path("/w/", name) == exit_record_path("/w/", name)
        assert "/" not in actions_box.exit_record_path("/w", name)[len("/w/.gpuwatch/"):]


WORKER = """import os, sys, time
open("started", "w").write(str(os.getpid()))
while not os.path.exists("finish"):
    time.sleep(0.05)
sys.exit(int(open("finish").read() or 0))
"""


rig = real_box.rig  # a real sshd on loopback over a box whose /proc is this machine's


async def relaunched(rig: Rig, name: str) -> tuple[HostConfig, Path, HostHistory, int]:
    """Run `name` relaunched by gpuwatch (setsid) and seen running by a poll: a worker that
    exits with the status the test writes to its `finish` file."""
    work = rig.root / name
    work.mkdir()
    script = f"{name}_{os.getpid()}.py"
    (work / script).write_text(WORKER)
    run = RunConfig(name, process=script, workdir=str(work), log="train.log",
                    relaunch=f"{shlex.quote(PY)} {script}", detach="setsid")
    host = rig.host(run)
    history = HostHistory(host.name)
    await poll(host, history)
    plan = actions.plan_relaunch(host, name, history)
    assert plan.refusal is None, plan.refusal
    outcome = await actions.execute(plan, host, store=rig.store, readonly=False)
    assert outcome.ok is None, outcome.message
    wait_for(lambda: (work / "started").exists(), what="the relaunched worker")
    pid = int((work / "started").read_text())
    await poll(host, history)
    assert history.runs[name].status == "running" and history.runs[name].pids == (pid,)
    return host, work, history, pid


async def test_a_relaunched_run_that_exits_0_is_finished(rig: Rig) -> None:
    host, work, history, _ = await relaunched(rig, "ok_run")
    (work / "finish").write_text("0")
    wait_for(lambda: (work / ".gpuwatch" / "exit-ok_run.json").exists(), what="the record")
    await poll(host, history)
    series = history.runs["ok_run"]
    assert json.loads((work / ".gpuwatch" / "exit-ok_run.json").read_text()) == {
        "v": 1, "run": "ok_run", "code": 0}
    assert series.status == "finished" and series.exit_code() == 0
    assert "exit status 0" in (series.finished_by() or "") and history.deaths == {}
    refused = actions.plan_relaunch(host, "ok_run", history)
    assert refused.refusal is not None and "finished" in refused.refusal


async def test_a_relaunched_run_killed_by_sigkill_is_dead_for_certain(rig: Rig) -> None:
    host, work, history, pid = await relaunched(rig, "kill_run")
    os.kill(pid, 9)
    wait_for(lambda: (work / ".gpuwatch" / "exit-kill_run.json").exists(), what="the record")
    assert not alive(pid)
    await poll(host, history)
    series = history.runs["kill_run"]
    assert series.status == "dead" and series.exit_code() == 137
    d = history.deaths["kill_run"]
    assert d.cause == "killed" and d.evidence["signal"] == 9
    assert d.evidence["signal_name"] == "SIGKILL" and "SIGKILL" in d.summary
    assert series.finished_by() is None


async def test_a_relaunched_run_that_exits_3_says_so(rig: Rig) -> None:
    host, work, history, _ = await relaunched(rig, "bad_run")
    (work / "finish").write_text("3")
    wait_for(lambda: (work / ".gpuwatch" / "exit-bad_run.json").exists(), what="the record")
    await poll(host, history)
    d = history.deaths["bad_run"]
    assert history.runs["bad_run"].status == "dead"
    assert d.cause == "exited" and d.evidence["exit_code"] == 3 and d.evidence["signal"] is None
    assert "status 3" in d.summary


def test_the_tui_run_tab_shows_progress_and_eta(tmp_path: Path) -> None:
    """The host screen's run tab reads HostData.run_progress: step of max_steps and the ETA at
    the pace of the last two trainer_state.json writes."""
    from gpuwatch.tui.state import HostData

    box = box_at(tmp_path)
    work = tmp_path / "tab"
    work.mkdir()
    box.add_process(training_process(600, script="tab.py", workdir=str(work), nohup=True))
    host = host_config(f'[hosts.gpu1.runs.tab]\nprocess = "tab.py"\nworkdir = "{work}"\n'
                       'metrics = ["out/checkpoint-*/trainer_state.json"]\n')
    w = Watched(box, host)
    now = time.time()
    trainer_state(work / "out" / "checkpoint-100" / "trainer_state.json", 100, 1000,
                  mtime=now - 200)
    w.poll()
    data = HostData(host, w.history)
    assert data.run_progress("tab") == " 100/1000"
    trainer_state(work / "out" / "checkpoint-200" / "trainer_state.json", 200, 1000, mtime=now)
    w.poll()
    shown = data.run_progress("tab")  # 800 steps at 0.5 step/s, less the time since
    assert shown.startswith(" 200/1000 · ETA ") and 20 <= int(shown.split()[-1][:-1]) <= 26
