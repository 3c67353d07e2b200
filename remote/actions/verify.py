"""Verifying an action from FRESH polls, in ONE loop for the TUI and the action verbs.

The budget: at most VERIFY_POLLS polls that began after the action ended, VERIFY_PAUSE_S apart
(a killed process may take a moment to go, a relaunched run a poll or two to show its process);
the first poll that shows the action done ends it. A kill's exit status proves nothing (U1).
"""

import asyncio
from collections.abc import Awaitable, Callable

from ..config.schema import HostConfig
from ..model.history import HostHistory
from ..model.processes import dies_with_session
from ..model.snapshot import HostSnapshot
from ..store import Store
from ..units import mib
from .execute import audit
from .types import ActionOutcome, ActionPlan

VERIFY_POLLS = 6
"""Fresh polls after an action before its verdict, for the TUI and the action verbs alike: a
killed process may take a moment to go, a relaunched run a poll or two to show its process."""
VERIFY_PAUSE_S = 1.0
"""The pause between two of those polls (after a poll that did not show the action done)."""

FreshPoll = Callable[[], Awaitable[str | None]]
"""One poll that began after the action ended, judged into the history by the pipeline
(watch.judge); None when it landed, else why it failed (the loop tries the next one)."""

# ---------------------------------------------------------------- verify

async def verify(plan: ActionPlan, host: HostConfig, history: HostHistory, *,
                 store: Store | None = None) -> ActionOutcome:
    """Judge the action from a FRESH poll (the history's current snapshot): for kill/reap, each
    target gone and no longer holding GPU memory; for relaunch, the run running again and not
    tied to a terminal. `store`: record the verdict in the audit log too."""
    outcome = plan_verdict(plan, history)
    label = "verified" if outcome.ok else ("not_verified" if outcome.ok is False else "pending")
    audit(store, plan, "verify", outcome, label)
    return outcome


def plan_verdict(plan: ActionPlan, history: HostHistory) -> ActionOutcome:
    if plan.refusal is not None:
        return ActionOutcome(False, f"nothing to verify: it was refused ({plan.refusal})")
    snap = history.current
    if snap is None:
        why = history.failure.message if history.failure else "no poll yet"
        return ActionOutcome(None, f"cannot verify yet: {history.name} was not polled ({why})")
    if plan.kind == "relaunch":
        return _verify_relaunch(plan, history, snap)
    if plan.targets and snap.boot_id != plan.targets[0].boot_id:
        return ActionOutcome(True, f"{plan.host} rebooted since: every targeted process is gone")
    table = {p.pid: p for p in snap.processes}
    holders = {a.pid for a in snap.gpu_processes}
    alive, holding, defunct = [], [], []
    for t in plan.targets:
        proc = table.get(t.pid)
        same = proc is not None and proc.start_ticks == t.start_ticks
        if same and proc is not None and not proc.zombie:
            alive.append(t.pid)
        elif same and proc is not None:
            defunct.append(t.pid)
        if (t.pid in holders and (proc is None or same)) or (
                same and proc is not None and proc.nvidia_devs):
            holding.append(t.pid)
    if alive or holding:
        parts = []
        if alive:
            parts.append(f"still alive: pid {', '.join(map(str, alive))}")
        if holding:
            parts.append(f"still holding GPU memory: pid {', '.join(map(str, holding))}")
        return ActionOutcome(False, f"on {plan.host}, " + "; ".join(parts))
    gpus = sorted({t.gpu_index for t in plan.targets if t.gpu_index is not None})
    mem = []
    for g in gpus:
        dev = next((d for d in snap.gpus if d.index == g), None)
        if dev is not None and dev.mem_used_mib is not None:
            mem.append(f"GPU {g} now uses {mib(dev.mem_used_mib)}")
    extra = f" ({'; '.join(mem)})" if mem else ""
    zombie = ("" if not defunct else
              f"; pid {defunct[0]} has exited and awaits its parent's reaping" if len(defunct) == 1
              else f"; pids {', '.join(map(str, defunct))} have exited and await their parents' "
                   "reaping")
    n = len(plan.targets)
    return ActionOutcome(True, f"{n} process{'es' * (n != 1)} gone from {plan.host} and no "
                               f"longer holding GPU memory{extra}{zombie}")


def _verify_relaunch(plan: ActionPlan, history: HostHistory,
                     snap: HostSnapshot) -> ActionOutcome:
    spec = plan.launch
    name = spec.run if spec else "?"
    series = history.runs.get(name)
    procs = [p for p in snap.processes if p.run == name and not p.zombie]
    pids = sorted({p.pid for p in procs} | set(series.pids if series else ()))
    if not pids:
        tail = (series.tail or "").strip().splitlines()[-3:] if series else []
        said = f"; its log ends: {' | '.join(tail)}" if tail else ""
        return ActionOutcome(False, f"run {name} is not running on {plan.host}{said}")
    table = {p.pid: p for p in snap.processes}
    bound = [p.pid for p in procs if dies_with_session(p, table)]
    if bound:
        return ActionOutcome(False, (
            f"run {name} runs (pid {', '.join(map(str, pids))}) but is tied to a terminal: it "
            f"would die with the SSH session (pid {', '.join(map(str, bound))}): relaunch it under "
            "setsid, nohup or systemd-run"))
    return ActionOutcome(True, f"run {name} is running again on {plan.host} (pid "
                               f"{', '.join(map(str, pids))}), detached from any SSH session")


async def verify_until(plan: ActionPlan, host: HostConfig, history: HostHistory,
                       fresh_poll: FreshPoll, *, store: Store | None = None,
                       polls: int = VERIFY_POLLS,
                       pause_s: float = VERIFY_PAUSE_S) -> ActionOutcome | None:
    """THE verify loop: up to `polls` fresh polls, `pause_s` apart, until one shows the action
    done; the last verdict (audited in `store`), or None when no poll landed."""
    verdict = None
    for attempt in range(polls):
        if attempt:
            await asyncio.sleep(pause_s)
        if await fresh_poll() is not None:
            continue
        verdict = plan_verdict(plan, history)
        if verdict.ok:
            break
    if verdict is not None:
        await verify(plan, host, history, store=store)
    return verdict
