"""Which of a run's tags is its loss, which its eval loss, which are watched for NaN.

By name (the names trainers give them), unless the run's config says (`loss_tag`,
`eval_tag`); HF's end-of-training summary in trainer_state.json is never a curve.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model.series import RunSeries, TagSeries

LOSS_NAMES = ("loss", "train/loss", "train_loss", "Loss/train", "loss/train", "train/loss_step",
              "train_loss_step", "training_loss", "train/loss_epoch", "train_loss_epoch")
"""The names trainers give their training loss (HF, Lightning, Keras, torch tutorials), in
order of preference."""
EVAL_NAMES = ("eval_loss", "eval/loss", "val_loss", "val/loss", "validation_loss",
              "valid_loss", "Loss/val", "Loss/validation", "loss/val", "val_loss_epoch")
HF_SUMMARY = frozenset({"train_loss", "train_runtime", "train_samples_per_second",
                        "train_steps_per_second", "total_flos"})
"""The keys of the summary Trainer.train() appends to trainer_state.json's log_history as it
returns: the run's average train_loss is no point of its training curve."""
MAX_WATCHED = 32
"""Tags watched for NaN per run (every tag with "loss" in its name, the loss and eval tags)."""
def candidate_tags(run: RunSeries) -> dict[str, TagSeries]:
    """Every tag of the run by its name, less HF's end-of-training summary keys."""
    summary = {id(t) for path, streams in run.metric_series.items()
               if os.path.basename(path) == "trainer_state.json"
               for tag, t in streams.items() if tag in HF_SUMMARY}
    return {name: t for name, t in run.series.items() if id(t) not in summary}


def pick(tags: Mapping[str, Any], wanted: str | None, names: tuple[str, ...],
         fallback: re.Pattern[str]) -> str | None:
    """The configured tag when the run has it; else the first known name; else the one tag
    that looks like it (two such tags: none, rather than a guess)."""
    if wanted:
        return wanted if wanted in tags else None
    for name in names:
        if name in tags:
            return name
    lowered = {n.lower(): n for n in names}
    for tag in tags:
        if tag.lower() in lowered:
            return tag
    found = [t for t in tags if fallback.search(t)]
    return found[0] if len(found) == 1 else None


_LOSSY = re.compile(r"loss", re.I)
_TRAIN_FALLBACK = re.compile(r"^(?!.*(eval|val|valid|test|dev)).*loss", re.I)
_EVAL_FALLBACK = re.compile(r"^(?!.*_step$).*((eval|val|valid).*loss|loss.*(eval|val|valid))",
                            re.I)
"""An evaluation's loss by its name; never Lightning's `val_loss_step`, a validation batch's
loss (logged with on_step), which is no evaluation's result."""


def tags_of(run: RunSeries, configured: tuple[str | None, str | None],
            ) -> tuple[dict[str, TagSeries], str | None, str | None, list[str]]:
    """The run's tags, its loss and eval tags, and the tags watched (for NaN at least)."""
    tags = candidate_tags(run)
    loss_cfg, eval_cfg = configured
    # an event file's tag first: HF's Trainer writes its loss to TensorBoard (with wall
    # times: the run's pace) and to trainer_state.json (without) alike
    timed = {n: t for n, t in tags.items() if n in run.event_series}
    loss = pick(timed, loss_cfg, LOSS_NAMES, _TRAIN_FALLBACK) \
        or pick(tags, loss_cfg, LOSS_NAMES, _TRAIN_FALLBACK)
    ev = pick(timed, eval_cfg, EVAL_NAMES, _EVAL_FALLBACK) \
        or pick(tags, eval_cfg, EVAL_NAMES, _EVAL_FALLBACK)
    watch = [t for t in (loss, ev) if t is not None]
    watch += sorted(t for t in tags if _LOSSY.search(t) and t not in watch)
    return tags, loss, ev, watch[:MAX_WATCHED]
