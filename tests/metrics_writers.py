"""Metrics files as their libraries write them, for tests (none of these libraries installs
here in reasonable time: each writer below is the library's own code path, cut to the file).

- HuggingFace's TrainerState.save_to_json: json.dumps(asdict(state), indent=2,
  sort_keys=True) + "\\n" into checkpoint-N/trainer_state.json, log_history entries as
  Trainer.log and Trainer.evaluate append them.
- Lightning's CSVLogger (lightning.fabric.loggers.csv_logs._ExperimentWriter.save):
  csv.DictWriter over the sorted keys seen so far; a new key rewrites the whole file under
  the new header (_rewrite_with_new_header); one folder version_N per run.
- Keras' CSVLogger.on_epoch_end: csv.DictWriter (excel dialect, \\r\\n) with "epoch" first and
  the sorted log keys; a key missing at an epoch is "NA"; append=True on a resume.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any


def hf_history(last_step: int, logging_steps: int = 500,
               eval_steps: int = 1000) -> list[dict[str, Any]]:
    """Trainer's log_history up to last_step: a train entry every logging_steps, an eval
    entry every eval_steps (after the train entry of that step, as Trainer logs them)."""
    history: list[dict[str, Any]] = []
    for step in range(logging_steps, last_step + 1, logging_steps):
        epoch = round(step / 4000, 4)
        history.append({"epoch": epoch, "grad_norm": 1.25, "learning_rate": 5e-05 * (
            1 - step / 10000), "loss": round(3.0 - step / 2000, 4), "step": step})
        if step % eval_steps == 0:
            history.append({"epoch": epoch, "eval_loss": round(2.9 - step / 2500, 4),
                            "eval_runtime": 12.5, "eval_samples_per_second": 80.1,
                            "eval_steps_per_second": 10.0, "step": step})
    return history


def save_trainer_state(folder: Path, history: list[dict[str, Any]], global_step: int,
                       max_steps: int = 10000, mtime: float | None = None) -> Path:
    """TrainerState.save_to_json into folder (a checkpoint-N/)."""
    state = {
        "best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
        "epoch": round(global_step / 4000, 4), "eval_steps": 1000,
        "global_step": global_step, "is_hyper_param_search": False,
        "is_local_process_zero": True, "is_world_process_zero": True,
        "log_history": history, "logging_steps": 500, "max_steps": max_steps,
        "num_input_tokens_seen": 0, "num_train_epochs": 3, "save_steps": 1000,
        "stateful_callbacks": {"TrainerControl": {"args": {
            "should_epoch_stop": False, "should_evaluate": False, "should_log": False,
            "should_save": True, "should_training_stop": False}, "attributes": {}}},
        "total_flos": 1.2e15, "train_batch_size": 8, "trial_name": None, "trial_params": None,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


class LightningCSV:
    """Lightning's CSVLogger experiment writer: log_metrics() then save() (every
    flush_logs_every_n_steps, and at the end)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.csv"
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.append({**metrics, "step": step})

    def save(self) -> None:
        if not self.metrics:
            return
        new_keys = set().union(*self.metrics) - set(self.metrics_keys)
        self.metrics_keys.extend(new_keys)
        self.metrics_keys.sort()
        file_exists = self.path.is_file()
        if new_keys and file_exists:  # _rewrite_with_new_header
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
            with open(self.path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(rows)
        with open(self.path, "a" if file_exists else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if not file_exists:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []


class KerasCSV:
    """Keras' CSVLogger callback, from on_train_begin through on_epoch_end."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path, self.keys = path, None  # type: Path, list[str] | None
        self.append_header = not (append and path.exists() and path.stat().st_size)
        self.file = open(path, "a" if append else "w", newline="")  # noqa: SIM115
        self.writer: csv.DictWriter[str] | None = None

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        if self.keys is None:
            self.keys = sorted(logs)
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=["epoch", *self.keys],
                                         dialect=csv.excel)
            if self.append_header:
                self.writer.writeheader()
        row = {"epoch": epoch, **{k: logs.get(k, "NA") for k in self.keys}}
        self.writer.writerow(row)
        self.file.flush()

    def close(self) -> None:
        self.file.close()
