"""The scheduler: at most one poll in flight per host, a jittered interval, backoff when down.

Polls never pile up (U16, U17): each host has one loop that awaits its poll before arming the next
one, so a slow box only makes its own polls later. Connections being *opened* are bounded per sshd
and per jump host as well as overall: OpenSSH's default `MaxStartups 10:30:100` starts dropping
unauthenticated connections past 10, which is what a fleet behind one bastion runs into.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import random

BACKOFF_CAP_S = 300.0
JITTER = 0.05
"""Each delay is spread by ±5%: a fleet started at once drifts out of lockstep within a few
rounds, and each host still keeps its interval to within 5% (the interval runs from one poll's
start to the next's, so a slow poll does not stretch it either)."""
REST = 0.25
"""The least a host waits between the end of one poll and the start of the next, as a share of
its interval."""
PER_SSHD_OPENING = 8
"""Below sshd's default MaxStartups start (10), so no connection of ours is ever dropped."""
OVERALL_OPENING = 64
FAILING_OPENING = 16
"""Openings at once for hosts whose last poll failed: their own pool, so that a fleet of
black holes (each holding a slot for a whole connect_timeout) never makes good hosts wait."""
STOP_ATTEMPTS, STOP_WAIT_S = 10, 1.0
"""How often stop() cancels a host's loop, and how long it waits each time, before giving up
on it (each poll bounds itself: a loop that outlives this much is stuck elsewhere)."""

H = TypeVar("H")
R = TypeVar("R")


class OpeningLimiter:
    """Bounds how many SSH connections are in their opening phase (TCP + handshake + auth) at
    once, per key (an sshd's host:port, a jump host) and overall. Hosts whose last poll failed
    open from a pool of their own (FAILING_OPENING): they cannot hold the slots that hosts that
    answer wait for."""

    def __init__(self, per_key: int = PER_SSHD_OPENING, overall: int = OVERALL_OPENING,
                 failing: int = FAILING_OPENING) -> None:
        self.per_key = per_key
        self._overall = asyncio.Semaphore(overall)
        self._failing = asyncio.Semaphore(failing)
        self._keys: dict[str, asyncio.Semaphore] = {}
        self.peak: dict[str, int] = {}
        """Highest number of openings seen at once per key (for tests and benchmarks)."""
        self._now: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def opening(self, keys: Iterable[str], *, failing: bool = False
                      ) -> AsyncIterator[None]:
        ordered = sorted(set(keys))  # a fixed order, so two openings never deadlock
        async with contextlib.AsyncExitStack() as stack:
            for key in ordered:
                sem = self._keys.setdefault(key, asyncio.Semaphore(self.per_key))
                await stack.enter_async_context(sem)
            await stack.enter_async_context(self._failing if failing else self._overall)
            for key in ordered:
                self._now[key] = self._now.get(key, 0) + 1
                self.peak[key] = max(self.peak.get(key, 0), self._now[key])
            try:
                yield
            finally:
                for key in ordered:
                    self._now[key] -= 1


def next_delay(interval: float, failures: int, *, rng: random.Random | None = None,
               jitter: float = JITTER, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds until a host's next poll: the interval, doubled per consecutive failure up to the
    cap, spread by ±jitter so a fleet does not poll in lockstep."""
    base = interval if failures == 0 else min(cap, interval * 2 ** min(failures, 30))
    if rng is None:
        import random  # the TUI's loops only: not on `--once`'s start-up path

        rng = random.Random()
    spread = rng.uniform(1 - jitter, 1 + jitter)
    return min(cap * (1 + jitter), base * spread)


@dataclass
class _HostLoop(Generic[H]):
    host: H
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failures: int = 0
    in_flight: bool = False
    through_pause: bool = False
    """Its next poll goes even while polling is paused (a person asked for it)."""
    task: asyncio.Task[None] | None = None


class Poller(Generic[H, R]):
    """Polls every host forever on its own loop; results go to `on_result` as they land.

    `poll` must bound itself (the SSH layer's deadlines); `ok(result)` says whether it succeeded,
    which drives the backoff.
    """

    def __init__(self, hosts: Sequence[H], poll: Callable[[H], Awaitable[R]],
                 on_result: Callable[[H, R], None], ok: Callable[[R], bool], *,
                 interval: float | Callable[[H], float], rng: random.Random | None = None) -> None:
        self._poll, self._on_result, self._ok = poll, on_result, ok
        self._interval = interval if callable(interval) else (lambda _h: float(interval))
        if rng is None:
            import random

            rng = random.Random()
        self._rng = rng
        self._loops = [_HostLoop(h) for h in hosts]
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._stopping = False
        self._started = False

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def start(self) -> None:
        self._started = True
        for i, loop in enumerate(self._loops):
            # Spread the first polls over a fraction of a second rather than all at t=0.
            first = min(0.5, 0.01 * i)
            loop.task = asyncio.create_task(self._run(loop, first), name=f"poll:{i}")

    def add(self, hosts: Sequence[H]) -> None:
        """Poll these hosts too from now on (a Slurm job's nodes), each on a loop of its own;
        a host already polled is not polled twice. Before start() they start with the rest."""
        known = [loop.host for loop in self._loops]
        for host in hosts:
            if host in known:
                continue
            known.append(host)
            loop = _HostLoop(host)
            self._loops.append(loop)
            if self._started and not self._stopping:
                loop.task = asyncio.create_task(self._run(loop, 0.0),
                                                name=f"poll:{len(self._loops) - 1}")

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop every host's loop and wait until each has ended; `grace_s`: first let polls in
        flight finish for up to that long (a watcher's round may be relaunching a run).

        A cancellation can get lost on its way in (Python 3.11's asyncio.wait_for returns the
        inner result when the two land together, gh-86296, and asyncssh's connect uses it): the
        loop would then poll on and this wait never end (the TUI left the screen and the process
        stayed, CI saw it twice). So the loops stop at their next turn anyway, and one still
        running a second later is cancelled again."""
        self._stopping = True
        for loop in self._loops:
            loop.wake.set()  # a loop waiting out its interval or a pause ends at once
        pending = {loop.task for loop in self._loops if loop.task}
        if grace_s > 0 and pending:
            busy = {loop.task for loop in self._loops if loop.task and loop.in_flight}
            if busy:
                await asyncio.wait(busy, timeout=grace_s)
            pending = {t for t in pending if not t.done()}
        for _ in range(STOP_ATTEMPTS):
            if not pending:
                return
            for task in pending:
                task.cancel()
            done, pending = await asyncio.wait(pending, timeout=STOP_WAIT_S)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: no "never retrieved" warning at exit

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        """Polling goes on: every host is polled at once (what shows went stale)."""
        self._resumed.set()
        for loop in self._loops:
            loop.wake.set()

    def poll_now(self, host: H | None = None, *, through_pause: bool = False) -> None:
        """Poll a host (or every host) as soon as its current poll, if any, has finished;
        `through_pause`: once even while polling is paused (the pause holds after it)."""
        for loop in self._loops:
            if host is None or loop.host == host:
                loop.through_pause = loop.through_pause or through_pause
                loop.wake.set()

    def failures(self, host: H) -> int:
        """The host's consecutive failed polls (0: its last poll was good)."""
        return next((loop.failures for loop in self._loops if loop.host == host), 0)

    def in_flight(self) -> list[H]:
        return [loop.host for loop in self._loops if loop.in_flight]

    async def _run(self, loop: _HostLoop[H], delay: float) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), timeout=delay)
            loop.wake.clear()
            while self.paused and not loop.through_pause and not self._stopping:
                await loop.wake.wait()  # resume() wakes every loop; poll_now() this one
                loop.wake.clear()
            loop.through_pause = False
            loop.in_flight = True
            clock = asyncio.get_running_loop().time
            started = clock()
            try:
                result = await self._poll(loop.host)
            except Exception as exc:  # `poll` should say its failures; a loop never dies of one
                from .. import errorlog

                errorlog.record(exc, f"polling {loop.host}")
                loop.failures += 1
                delay = next_delay(self._interval(loop.host), loop.failures, rng=self._rng)
                continue
            finally:
                loop.in_flight = False
            if self._stopping:  # its cancellation was lost (see stop)
                return
            loop.failures = 0 if self._ok(result) else loop.failures + 1
            self._on_result(loop.host, result)
            # From this poll's start: a poll that took 2 s of a 10 s interval does not make
            # the host's interval 12 s. A box slower than its interval still gets a rest of a
            # quarter of it between two polls (it is not polled back to back).
            interval = self._interval(loop.host)
            delay = max(interval * REST, next_delay(interval, loop.failures, rng=self._rng)
                        - (clock() - started))


async def poll_all_once(hosts: Sequence[H], poll: Callable[[H], Awaitable[R]]) -> list[R]:
    """One poll of every host at once (for --once and check); results in the hosts' order.
    Concurrency is bounded where it matters, in the opening of connections."""
    return list(await asyncio.gather(*(poll(h) for h in hosts)))
