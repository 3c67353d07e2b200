"""ONE verify loop (actions/verify.py `verify_until`) with one budget: up to VERIFY_POLLS
fresh polls, VERIFY_PAUSE_S apart, ended by the first that shows the action done."""

from __future__ import annotations

import asyncio

from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.model.history import HostHistory
from harness.plan_data import HOST, history, proc, snapshot


def _loop(h: HostHistory, plan: actions.ActionPlan, results: list[str | None],
          snaps: list[object]) -> tuple[actions.ActionOutcome | None, int]:
    calls = 0

    async def fresh() -> str | None:
        nonlocal calls
        calls += 1
        if snaps:
            h.record(snaps.pop(0), 2000.0 + calls)  # type: ignore[arg-type]
        return results.pop(0) if results else None

    verdict = asyncio.run(actions.verify_until(plan, HOST, h, fresh, pause_s=0.0))
    return verdict, calls


def test_the_first_poll_that_shows_it_done_ends_the_loop() -> None:
    target = proc(100, gpu=0, mem=1024)
    h = history(snapshot(target))
    plan = actions.plan_kill(HOST, h, 100)
    # The first fresh poll still sees it, the second fails, the third shows it gone.
    verdict, calls = _loop(h, plan, [None, "timeout", None],
                           [snapshot(target), snapshot(target), snapshot()])
    assert verdict is not None and verdict.ok and calls == 3


def test_the_budget_is_verify_polls_and_no_landed_poll_is_no_verdict() -> None:
    assert actions.VERIFY_POLLS == 6 and actions.VERIFY_PAUSE_S == 1.0
    h = history(snapshot(proc(100)))
    plan = actions.plan_kill(HOST, h, 100)
    verdict, calls = _loop(h, plan, ["timeout"] * 10, [])
    assert verdict is None and calls == actions.VERIFY_POLLS
    verdict, calls = _loop(h, plan, [], [])  # polls land, the process stays: NOT verified
    assert verdict is not None and verdict.ok is False and calls == actions.VERIFY_POLLS
