"""`gpuwatch watch` polls through the pipeline's one Poller (remote/watch/fleet.py): a host that
does not answer is polled less and less often, and its openings come from their own pool.

The box is a real TCP port that accepts and never speaks (a black hole: each poll costs a whole
connect_timeout). What is counted is what reached that port: connections arriving, not time
slept."""

from __future__ import annotations

import asyncio
import itertools

from gpuwatch.remote.config.schema import Config, HostConfig, SshSettings
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.poller import OpeningLimiter
from harness.faults import silent_port


async def test_watch_backs_off_a_black_hole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    arrivals: list[float] = []
    (tmp_path / "ssh_config").write_text("")
    with silent_port(arrivals) as port, Store.open(tmp_path / "s.sqlite3") as store:
        host = HostConfig(name="hole", ssh=f"127.0.0.1:{port}",
                          settings=SshSettings(connect_timeout=0.5, command_timeout=2.0,
                                               config_file=str(tmp_path / "ssh_config"),
                                               known_hosts=str(tmp_path / "known_hosts")))
        fleet = FleetWatch(Config(interval=0.5, hosts=(host,)), store, role="watch")
        stop = asyncio.Event()
        watching = asyncio.create_task(fleet.run(stop))
        try:
            for _ in range(1200):  # five connections reached the black hole (60 s at most)
                if len(arrivals) >= 5:
                    break
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await watching
        fleet.close(0)
        assert len(arrivals) >= 5, arrivals
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        # a fixed-interval loop gives gaps of connect_timeout + interval (1 s) each time; the
        # backoff doubles the interval per failure: about 1.5, 2.5, 4.5 s
        assert gaps[3] > 2.0 * gaps[0], gaps
        assert all(b > a for a, b in itertools.pairwise(gaps)), gaps
        assert fleet.host("hole").failures >= 4
        assert store.host_state("hole") is not None and not store.host_state("hole").ok


async def test_failing_hosts_open_from_their_own_pool() -> None:
    """Black holes hold their opening slots for a whole connect_timeout: from the second
    failure on they wait in their own pool, and the slots of hosts that answer stay free."""
    limiter = OpeningLimiter(overall=2, failing=1)
    held = asyncio.Event()
    release = asyncio.Event()

    async def black_hole(key: str) -> None:
        async with limiter.opening([key], failing=True):
            held.set()
            await release.wait()

    holes = [asyncio.create_task(black_hole(f"hole{i}:22")) for i in range(5)]
    await held.wait()
    opened = []
    for i in range(4):  # good hosts open one after another while the holes wait
        async with limiter.opening([f"good{i}:22"]):
            opened.append(i)
    assert opened == [0, 1, 2, 3]
    assert sum(1 for k, n in limiter.peak.items() if k.startswith("hole") and n) == 1
    release.set()
    await asyncio.gather(*holes)
