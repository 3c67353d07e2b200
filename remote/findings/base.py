"""What every rule module shares: the rule registry (`@rule`), the history helpers for
"sustained" judgements (sizes and durations are said by remote/units.py).

A rule is a function of the host's history that yields findings. It registers itself by its
decorator, which names the codes it emits and the gotchas (seeds/003) each encodes:

    @rule({"disk.low": ("U6",)})
    def disk_low(history: HostHistory) -> Iterable[Finding]: ...

The module only has to be imported by remote/findings/rules.py (the list of rule modules).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.processes import process_table
from ..model.snapshot import HostSnapshot, ProcessInfo, RunSample

__all__ = ["REGISTRY", "Finding", "Rule", "RuleSpec", "Severity", "gpu_at", "live_runs",
           "recent", "registered_codes", "registered_rules", "rule", "run_procs",
           "slow_start_likely", "sustained"]

Rule = Callable[[HostHistory], Iterable[Finding]]


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One registered rule: the function and the codes (with their gotchas) it may emit."""

    func: Rule
    codes: Mapping[str, tuple[str, ...]]


REGISTRY: list[RuleSpec] = []
"""Every rule, in the order their modules were imported (rules.py imports them all)."""


def rule(codes: Mapping[str, tuple[str, ...]]) -> Callable[[Rule], Rule]:
    """Register a rule that emits `codes` ({code: the gotchas it encodes}); the function is
    returned unchanged, so a test can still call it on a history of its own."""
    def register(func: Rule) -> Rule:
        if any(spec.func is func for spec in REGISTRY):
            return func
        taken = {c for spec in REGISTRY for c in spec.codes} & set(codes)
        if taken:
            raise ValueError(f"finding codes registered twice: {sorted(taken)}")
        REGISTRY.append(RuleSpec(func, dict(codes)))
        return func
    return register


RULE_MODULES = ("host", "gpu", "gpu_health", "run", "run_gpus", "ckpt", "disk", "run_curves")
"""The modules of findings/ that hold `@rule`s, in the order their rules run. A new rule in one
of them is registered by its decorator; a new module of rules is one more name here."""


def _load_rules() -> None:
    """Import every rule module (their `@rule`s register as they load): whoever asks for the
    rules gets all of them, whatever was imported before (`--once` imports little)."""
    import importlib

    for name in RULE_MODULES:
        importlib.import_module(f"{__package__}.{name}")


def registered_rules() -> tuple[Rule, ...]:
    _load_rules()
    return tuple(spec.func for spec in REGISTRY)


def registered_codes() -> dict[str, tuple[str, ...]]:
    _load_rules()
    return {code: gotchas for spec in REGISTRY for code, gotchas in spec.codes.items()}


def live_runs(history: HostHistory) -> Iterator[tuple[HostSnapshot, float, RunSample]]:
    """This poll's runs that have processes, with the snapshot (ages use the box's clock, so a
    snapshot without one yields nothing)."""
    now = history.current
    if now is None or now.taken_at is None:
        return
    at = now.taken_at
    for sample in now.runs:
        if sample.pids:
            yield now, at, sample


def run_procs(sample: RunSample, snap: HostSnapshot) -> list[ProcessInfo]:
    table = process_table(snap)
    pids = set(sample.pids) | {p.pid for p in snap.processes if p.run == sample.name}
    return [table[p] for p in sorted(pids) if p in table]


def gpu_at(snap: HostSnapshot, index: int) -> Any:
    return next((g for g in snap.gpus if g.index == index), None)


def recent(history: HostHistory, n: int | None = None,
           window_s: float | None = None) -> list[HostSnapshot]:
    """The newest snapshots for a 'sustained' judgement (U21: never one snapshot): at most n
    (default sustain_polls), of the current boot, none older than window_s before the newest.
    Fewer than n come back when the history cannot show that many — then nothing is sustained.
    Empty when the latest poll failed."""
    th = history.thresholds
    n = th.sustain_polls if n is None else n
    window_s = th.sustain_window_s if window_s is None else window_s
    now = history.current
    if now is None:
        return []
    out: list[HostSnapshot] = []
    for snap in reversed(history.snapshots):
        if len(out) >= n:
            break
        if snap.boot_id != now.boot_id:
            break
        if (now.taken_at is not None and snap.taken_at is not None
                and now.taken_at - snap.taken_at > window_s):
            break
        out.append(snap)
    return out[::-1]


def sustained(history: HostHistory, test: Callable[[HostSnapshot], bool],
              n: int | None = None) -> list[HostSnapshot] | None:
    """The last n snapshots when `test` holds in every one of them, else None."""
    n = history.thresholds.sustain_polls if n is None else n
    snaps = recent(history, n)
    if len(snaps) < max(1, n) or not all(test(s) for s in snaps):
        return None
    return snaps


def slow_start_likely(history: HostHistory) -> bool:
    """Whether the host's GPUs were last seen without persistence mode: a GPU query that
    times out is then likely their re-initialisation (seconds), not a hung driver."""
    return any(g.get("persistence") is False for g in history.known_gpus.values())
