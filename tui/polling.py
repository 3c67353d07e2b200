"""The app's side of polling: one Poller for the fleet, run in the app's event loop.

The Poller (remote/wire/poller.py) is asyncio-native: one loop per host, each awaiting its poll
before arming the next, so polls never overlap (U16, U17) and a slow host only delays itself.
Results are handed to `on_result` (the app posts a SnapshotReady message); nothing here touches
a widget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuwatch.remote.config.schema import Config, HostConfig
from gpuwatch.remote.findings.rules import HostHistory
from gpuwatch.remote.wire.collect import Collector, PollOutcome
from gpuwatch.remote.wire.poller import OpeningLimiter, Poller


class PollFeed:
    """Owns the Collector and the Poller of one app run."""

    def __init__(self, config: Config, histories: Mapping[str, HostHistory],
                 on_result: Callable[[HostConfig, PollOutcome], None], *,
                 accept_new_host_keys: bool = False,
                 collector: Collector | None = None) -> None:
        self.config = config
        self._histories = histories
        if collector is None:
            limiter = OpeningLimiter()
            needs_ssh = any(not h.is_local for h in config.hosts)
            opening = None
            if needs_ssh:
                from gpuwatch.remote.watch import opening_keys

                def opening(h: HostConfig):  # type: ignore[no-untyped-def]
                    return limiter.opening(opening_keys(h))
            collector = Collector(accept_new_host_keys=accept_new_host_keys, opening=opening)
        self.collector = collector
        self.judge_failed: set[str] = set()
        """Hosts whose last good poll could not be judged (the app says which): they back off
        as a failed poll does, from their next poll on."""
        self.poller: Poller[HostConfig, PollOutcome] = Poller(
            list(config.hosts), self._poll, on_result,
            lambda o: o.ok and o.host.name not in self.judge_failed, interval=config.interval)
        self.started = False

    async def _poll(self, host: HostConfig) -> PollOutcome:
        # The history's runs carry the event-file offsets: only what is new comes back.
        return await self.collector.poll(host, self._histories[host.name].runs)

    def start(self) -> None:
        if not self.started:
            self.poller.start()
            self.started = True

    async def stop(self) -> None:
        if self.started:
            await self.poller.stop()
            self.started = False

    @property
    def paused(self) -> bool:
        return self.poller.paused

    def pause(self) -> None:
        self.poller.pause()

    def resume(self) -> None:
        self.poller.resume()

    def poll_now(self, host: HostConfig | None = None) -> None:
        self.poller.poll_now(host)
