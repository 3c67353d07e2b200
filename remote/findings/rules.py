"""Findings: what is wrong on a host and what to do, as pure functions of its history.

Every rule takes the host's history (this poll and the ones before, plus what the store carried
over from earlier runs) and returns findings: a code, a severity, one sentence a person can act
on, and the numbers behind it. No SSH, no Textual: every rule is testable on plain data. Each rule
names the gotcha of seeds/003 it encodes.

The rules live one module per code prefix (host.py, gpu.py, run.py, ckpt.py, disk.py) and
register themselves with `@rule` (base.py). This module imports them all, in this order, and
keeps the names earlier code imported from here: RULES, CODES, `evaluate` (which, unlike
evaluate.evaluate, applies its result to the history: for callers that own one), and the
types. A new rule module is added to the import list below.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..config.thresholds import HISTORY_LEN, Thresholds
from ..model.finding import Finding, Severity
from ..model.history import HostHistory, PollFailure, same_gpu
from . import ckpt, disk, gpu, gpu_health, host, run, run_curves, run_gpus
from .base import Rule, recent, registered_codes, registered_rules, slow_start_likely, sustained
from .ckpt import ckpt_overdue, ckpt_tmp_leftover
from .disk import disk_full_soon, disk_low
from .evaluate import Evaluation, worst
from .evaluate import evaluate as evaluation_of
from .gpu import (
    XID_MEANING,
    gpu_driver_mismatch,
    gpu_idle_while_running,
    gpu_lost,
    gpu_persistence_off,
    gpu_query_failed,
    gpu_throttled,
    gpu_util_without_clock,
    gpu_vram_zombie,
    gpu_xid,
)
from .host import (
    host_cgroup_oom,
    host_cpu_oversubscribed,
    host_kill_user_processes,
    host_rebooted,
    host_unreachable,
)
from .run import (
    run_code_changed,
    run_dead,
    run_events_empty,
    run_progress,
    run_rank_dead,
    run_sighup_risk,
)

RULE_MODULES = (host, gpu, gpu_health, run, run_gpus, ckpt, disk, run_curves)
"""The modules whose `@rule`s make RULES, in order (importing them registers them)."""

RULES: tuple[Rule, ...] = registered_rules()

CODES: dict[str, tuple[str, ...]] = registered_codes()
"""Every finding code and the gotchas it encodes (DESIGN §3)."""


def evaluate(history: HostHistory, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every finding of every rule, most severe first, kept in `history` (Evaluation.apply).
    The pipeline uses the pure evaluate.evaluate and applies it in remote/watch/landing.py."""
    return evaluation_of(history, rules).apply(history)


__all__ = [
    "CODES", "HISTORY_LEN", "RULES", "RULE_MODULES", "XID_MEANING", "Evaluation", "Finding",
    "HostHistory", "PollFailure", "Rule", "Severity", "Thresholds", "ckpt_overdue",
    "ckpt_tmp_leftover", "disk_full_soon", "disk_low", "evaluate", "gpu_driver_mismatch",
    "gpu_idle_while_running", "gpu_lost", "gpu_persistence_off", "gpu_query_failed",
    "gpu_throttled", "gpu_util_without_clock", "gpu_vram_zombie", "gpu_xid", "host_cgroup_oom",
    "host_cpu_oversubscribed", "host_kill_user_processes", "host_rebooted", "host_unreachable",
    "recent", "run_code_changed", "run_dead", "run_events_empty", "run_progress",
    "run_rank_dead", "run_sighup_risk", "same_gpu", "slow_start_likely", "sustained", "worst",
]
