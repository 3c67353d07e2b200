"""A watcher's round for the watchdog's tests, driven through the Watchdog itself: poll the box,
judge the poll (the rules, as the pipeline applies them), remember its findings in the store,
then `Watchdog.act(host, history)` — the call the pipeline makes after a poll is judged and
remembered. Not through a Watcher object: the pipeline that owns the rounds may change shape;
the watchdog's contract is this call.

Run as a script it is one watcher in a process of its own, for a test that SIGKILLs it:

    python watchdog_rounds.py CONFIG STORE LEASE_S VERIFY_S

It prints its lease holder's name, then each event, as JSON lines on stdout, a round every
0.2 s until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpuwatch.remote.actions.restart import Watchdog, WatchEvent, new_holder
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.findings.evaluate import evaluate
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.store import Store
from gpuwatch.remote.wire.collect import Collector

ROUND_GAP_S = 0.2


class Actor:
    """One watcher of one host: its own lease holder, collector and history."""

    def __init__(self, store: Store, host: HostConfig, *, lease_s: float, verify_s: float,
                 kind: str = "test", clock: Callable[[], float] = time.time) -> None:
        self.store, self.host = store, host
        self.watchdog = Watchdog(store, new_holder(kind), lease_s=lease_s, verify_s=verify_s,
                                 clock=clock)
        self.collector = Collector()
        self.history = HostHistory(host.name)
        self.events: list[WatchEvent] = []

    @property
    def holder(self) -> str:
        return self.watchdog.holder

    def status(self, run: str) -> str | None:
        series = self.history.runs.get(run)
        return series.status if series is not None else None

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    async def round(self) -> list[WatchEvent]:
        outcome = await self.collector.poll(self.host, self.history.runs)
        if outcome.snapshot is None:
            return []  # a failed poll: nothing to act on
        self.history.record(outcome.snapshot, outcome.ended_at)
        findings = evaluate(self.history).apply(self.history)
        self.store.update_findings(self.host.name, findings, outcome.ended_at)
        events = await self.watchdog.act(self.host, self.history)
        self.events += events
        return events


async def rounds_until(actors: list[Actor], test: Callable[[], object], *,
                       limit_s: float = 90.0, what: str = "") -> None:
    """Rounds of each actor, one after another, until test() holds (bounded, never a timing
    assertion: the bound only ends a test that would otherwise hang)."""
    deadline = time.monotonic() + limit_s
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit_s:g} s: {what or test}; events: "
                                 f"{[(e.kind, e.message) for a in actors for e in a.events]}")
        for actor in actors:
            await actor.round()
        await asyncio.sleep(ROUND_GAP_S)


async def keep_rounding(actor: Actor, stop: asyncio.Event) -> None:
    """An actor's rounds until stop is set (a second watcher beside the test's own steps)."""
    while not stop.is_set():
        await actor.round()
        try:
            await asyncio.wait_for(stop.wait(), ROUND_GAP_S)
        except TimeoutError:
            pass


def main(argv: list[str]) -> None:
    from gpuwatch.remote.config.load import load_file

    config_path, store_path, lease_s, verify_s = argv
    config = load_file(Path(config_path))
    (host,) = config.hosts
    store = Store.open(store_path)
    actor = Actor(store, host, lease_s=float(lease_s), verify_s=float(verify_s), kind="killed")
    print(json.dumps({"holder": actor.holder}), flush=True)

    async def forever() -> None:
        while True:
            for e in await actor.round():
                print(json.dumps({"kind": e.kind, "message": e.message}), flush=True)
            await asyncio.sleep(ROUND_GAP_S)

    asyncio.run(forever())


if __name__ == "__main__":
    main(sys.argv[1:])
