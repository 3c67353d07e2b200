"""The rules run on a host's history: a pure function that returns what it decided.

`evaluate(history)` diagnoses the runs the history saw vanish (history.departures), finds the
VRAM zombie holders and the discovered runs that are only what a dead run left behind, then
runs every registered rule on a view of the history with those decided. It changes nothing:
the Evaluation it returns is applied by the pipeline (watch/landing.py `judge`), which is what
makes a host judged the same way in the TUI, `--once`, `check` and the action verbs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..model.death import Diagnosis
from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.processes import ZombieHolder
from .base import Rule, registered_rules
from .diagnosis import diagnose_departure
from .run_curves import one_alarm
from .zombies import left_behind_runs, zombie_holders


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one evaluation decided: the findings, most severe first, and the state the rules
    read besides the history (why the runs that vanished died, the zombie holders, the runs
    that are only left behind)."""

    findings: list[Finding]
    deaths: dict[str, Diagnosis]
    rank_deaths: dict[str, Diagnosis]
    zombies: list[ZombieHolder]
    left_behind: frozenset[str]

    def apply(self, history: HostHistory) -> list[Finding]:
        """Keep it in the history (what the store saves and the TUI shows); the findings."""
        history.deaths = dict(self.deaths)
        history.rank_deaths = dict(self.rank_deaths)
        history.departures = {}
        history.zombies = list(self.zombies)
        history.left_behind = self.left_behind
        history.findings = list(self.findings)
        return history.findings


def evaluate(history: HostHistory, rules: Iterable[Rule] | None = None) -> Evaluation:
    """Every finding of every rule (default: the registered ones) on `history`, and what they
    were judged on. Pure: `history` is left as it was (Evaluation.apply keeps the result)."""
    deaths, rank_deaths = dict(history.deaths), dict(history.rank_deaths)
    for key, departure in history.departures.items():
        table = rank_deaths if key.startswith("rank:") else deaths
        table[departure.run] = diagnose_departure(departure)
    view = replace(history, deaths=deaths, rank_deaths=rank_deaths, departures={},
                   zombies=None, findings=[])
    zombies = zombie_holders(view)
    view.zombies = zombies
    if view.current is not None:  # a failed poll keeps what the last good one found
        view.left_behind = left_behind_runs(view, zombies)
    chosen = registered_rules() if rules is None else tuple(rules)
    found = one_alarm([f for r in chosen for f in r(view)
                       if f.run is None or f.run not in view.left_behind])
    found.sort(key=lambda f: (-f.severity, f.code, -1 if f.gpu is None else f.gpu, f.run or "",
                              f.subject or ""))
    return Evaluation(found, deaths, rank_deaths, zombies, view.left_behind)


def worst(findings: Iterable[Finding]) -> Severity | None:
    return max((f.severity for f in findings), default=None)
