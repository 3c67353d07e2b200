"""The scheduler: one poll in flight per host, backoff when down, poll-now, bounded openings."""

from __future__ import annotations

import asyncio
import itertools
import random

from gpuwatch.remote.wire.poller import (
    BACKOFF_CAP_S,
    OpeningLimiter,
    Poller,
    next_delay,
    poll_all_once,
)


def test_backoff_doubles_to_a_cap_with_jitter() -> None:
    rng = random.Random(1)
    assert 9.0 <= next_delay(10, 0, rng=rng) <= 11.0
    assert 18.0 <= next_delay(10, 1, rng=rng) <= 22.0
    assert 36.0 <= next_delay(10, 2, rng=rng) <= 44.0
    for failures in (6, 10, 1000):
        assert BACKOFF_CAP_S * 0.9 <= next_delay(10, failures, rng=rng) <= BACKOFF_CAP_S * 1.1
    delays = {round(next_delay(10, 0, rng=rng), 3) for _ in range(20)}
    assert len(delays) > 10  # spread, not lockstep


async def test_one_poll_in_flight_per_host_and_slow_hosts_do_not_block_others() -> None:
    in_flight: dict[str, int] = {"slow": 0, "fast": 0}
    peak: dict[str, int] = {"slow": 0, "fast": 0}
    done: dict[str, int] = {"slow": 0, "fast": 0}

    async def poll(host: str) -> bool:
        in_flight[host] += 1
        peak[host] = max(peak[host], in_flight[host])
        await asyncio.sleep(0.3 if host == "slow" else 0.01)
        in_flight[host] -= 1
        return True

    def on_result(host: str, _ok: bool) -> None:
        done[host] += 1

    poller = Poller(["slow", "fast"], poll, on_result, ok=bool, interval=0.02)
    poller.start()
    for _ in range(5):  # poll-now requests while a poll is running do not start a second one
        await asyncio.sleep(0.05)
        poller.poll_now("slow")
    await asyncio.sleep(0.4)
    await poller.stop()
    assert peak == {"slow": 1, "fast": 1}
    assert done["fast"] > 3 * done["slow"] > 0


async def test_failing_host_backs_off_and_poll_now_overrides() -> None:
    times: list[float] = []
    loop = asyncio.get_running_loop()

    async def poll(_host: str) -> bool:
        times.append(loop.time())
        return False

    poller = Poller(["down"], poll, lambda h, r: None, ok=bool, interval=0.05,
                    rng=random.Random(0))
    poller.start()
    await asyncio.sleep(1.3)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) >= 3
    assert gaps[1] > 1.5 * gaps[0] and gaps[2] > 1.5 * gaps[1]  # exponential
    before = len(times)
    poller.poll_now()
    await asyncio.sleep(0.05)
    assert len(times) == before + 1  # an immediate re-poll despite the backoff
    await poller.stop()


async def test_pause_stops_new_polls_until_resumed() -> None:
    count = 0

    async def poll(_host: str) -> bool:
        nonlocal count
        count += 1
        return True

    poller = Poller(["h"], poll, lambda h, r: None, ok=bool, interval=0.01)
    poller.start()
    await asyncio.sleep(0.1)
    poller.pause()
    await asyncio.sleep(0.05)
    frozen = count
    await asyncio.sleep(0.1)
    assert count == frozen
    poller.resume()
    await asyncio.sleep(0.1)
    assert count > frozen
    await poller.stop()


async def test_openings_are_bounded_per_sshd_and_per_jump_host() -> None:
    limiter = OpeningLimiter(per_key=3, overall=10)

    async def poll(host: str) -> str:
        keys = [f"sshd:{host.split('/')[0]}", "jump:bastion"] if "/" in host else [f"sshd:{host}"]
        async with limiter.opening(keys):
            await asyncio.sleep(0.02)
        return host

    behind = [f"node{i}/via" for i in range(12)]  # 12 boxes behind one bastion
    direct = [f"box{i}" for i in range(6)]
    results = await poll_all_once(behind + direct, poll)
    assert results == behind + direct
    assert limiter.peak["jump:bastion"] == 3
    assert max(v for k, v in limiter.peak.items() if k.startswith("sshd:")) == 1


async def test_stop_ends_a_loop_whose_cancellation_was_lost() -> None:
    """Python 3.11's asyncio.wait_for can swallow a cancellation (gh-86296; asyncssh's connect
    uses it): the poll then returns as if nothing happened. stop() still ends the host's loop,
    within its bound, and the lost poll's result reaches no one (the TUI is going away)."""
    started = asyncio.Event()
    results: list[str] = []

    async def poll(host: str) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "cancellation lost"  # what a swallowed cancel looks like from here
        return "slept"

    poller: Poller[str, str] = Poller(["a"], poll, lambda _h, r: results.append(r),
                                      lambda _r: True, interval=0.01)
    poller.start()
    await started.wait()
    await asyncio.wait_for(poller.stop(), 10)  # the test fails here rather than hang
    assert all(loop.task is not None and loop.task.done() for loop in poller._loops)
    assert results == []
