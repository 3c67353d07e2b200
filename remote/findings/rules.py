"""The rules as one set: RULES (every registered rule, in order), CODES (every finding code and
the gotchas it encodes), and `evaluate`, which, unlike evaluate.evaluate, applies its result to
the history (for callers that own one: tests, tools). The rules live one module per code prefix
(host.py, gpu.py, gpu_health.py, run.py, run_gpus.py, ckpt.py, disk.py, run_curves.py) and
register themselves with `@rule` (base.py); base.RULE_MODULES names those modules. Each name of
findings/ has one home: import a rule, a type or a helper from the module that defines it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..model.finding import Finding
from ..model.history import HostHistory
from .base import Rule, registered_codes, registered_rules
from .evaluate import evaluate as evaluation_of

RULES: tuple[Rule, ...] = registered_rules()

CODES: dict[str, tuple[str, ...]] = registered_codes()
"""Every finding code and the gotchas it encodes (DESIGN §3)."""


def evaluate(history: HostHistory, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every finding of every rule, most severe first, kept in `history` (Evaluation.apply).
    The pipeline uses the pure evaluate.evaluate and applies it in remote/watch/landing.py."""
    return evaluation_of(history, rules).apply(history)
