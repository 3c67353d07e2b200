"""The headless watcher: the pipeline of remote/watch.py with the watchdog and notifications.

Each round of a host: poll -> judge (with run.restart_limit from the store) -> remember ->
the watchdog acts (actions/restart.py, under the run's lease) -> the finding transitions and the
watchdog's events are logged and handed to the notifier (never waited on). `gpuwatch watch`
runs rounds until stopped; `gpuwatch watch --once` runs one round of every host. The TUI calls
`add_findings` and `act` on its own polls (tui/watching.py). Nothing here imports Textual or
prints: lines go to the `log` callable given.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from .actions.restart import (
    Watchdog,
    WatchEvent,
    limit_findings,
    new_holder,
    status,
)
from .config.schema import Config, HostConfig
from .findings.rules import Finding, HostHistory
from .notify import Notifier, event_line, last_sent, remember_sent, target_urls, transitions
from .report import HostReport
from .store import Store
from .textsafe import visible
from .watch import history_from_store, judge, opening, remember, resume
from .wire.collect import Collector

Log = Callable[[str], None]
STOP_GRACE_S = 60.0
"""How long a stopped watcher lets its rounds in flight finish."""
NOTIFY_LEASE = ""
"""The lease name of a host's notifications (one actor sends them)."""


def lease_seconds(config: Config) -> float:
    """A lease outlives a few missed rounds of its holder, not much more: a watcher that died
    hands its runs over within about a minute."""
    return max(3 * config.interval + 30.0, 60.0)


def with_limit_findings(report: HostReport, history: HostHistory, extra: list[Finding]
                        ) -> HostReport:
    """The report with the watchdog's own findings (run.restart_limit) added first."""
    if not extra:
        return report
    history.findings = [*extra, *history.findings]
    return replace(report, findings=[*extra, *report.findings])


class Watcher:
    """Rounds of polls with the watchdog and notifications, for `watch` and the TUI."""

    def __init__(self, config: Config, store: Store, log: Log, *, kind: str = "watch",
                 accept_new_host_keys: bool = False, notifier: Notifier | None = None,
                 verify_s: float | None = None) -> None:
        self.config, self.store, self.log = config, store, log
        self.holder = new_holder(kind)
        self.lease_s = lease_seconds(config)
        self.watchdog = Watchdog(
            store, self.holder, lease_s=self.lease_s, readonly=config.readonly,
            accept_new_host_keys=accept_new_host_keys,
            verify_s=verify_s if verify_s is not None else max(3 * config.interval + 20, 30.0))
        urls = target_urls(config.notify)
        self.notifier = notifier if notifier is not None else (
            Notifier(config.notify, urls, log) if urls else None)
        self.collector = Collector(accept_new_host_keys=accept_new_host_keys)
        self.histories: dict[str, HostHistory] = {}
        self.log_failed_polls = True

    def history(self, host: HostConfig) -> HostHistory:
        if host.name not in self.histories:
            self.histories[host.name] = history_from_store(self.store, host,
                                                           self.config.thresholds)
            resume(self.collector, self.store, host)
        return self.histories[host.name]

    async def round(self, host: HostConfig) -> HostReport:
        """One poll of a host, judged, remembered, acted on, notified."""
        history = self.history(host)
        outcome = await self.collector.poll(host, history.runs)
        report = judge(history, outcome)
        return await self.after_judge(host, history, report)

    async def after_judge(self, host: HostConfig, history: HostHistory,
                          report: HostReport) -> HostReport:
        """What the watcher adds to a judged poll: its findings, then remember, then act."""
        report = self.add_findings(host, history, report)
        try:
            remember(self.store, report.outcome, history, self.collector)
        except sqlite3.OperationalError as exc:  # locked or full: this poll is not kept
            self.log(f"{host.name}: this poll was not saved ({exc}); acting on it anyway")
        await self.act(host, history, report)
        return report

    def add_findings(self, host: HostConfig, history: HostHistory,
                     report: HostReport) -> HostReport:
        """run.restart_limit where the watchdog gave up (from the store: any watcher's)."""
        return with_limit_findings(report, history, limit_findings(self.store, host, history))

    async def act(self, host: HostConfig, history: HostHistory,
                  report: HostReport) -> list[WatchEvent]:
        """After the poll is remembered: notify its transitions, let the watchdog act, notify
        what it did. Returns the watchdog's events (the TUI toasts them)."""
        now = time.time()
        if not report.outcome.ok and self.log_failed_polls:
            self.log(f"{host.name}: poll failed: {report.outcome.error_kind}: "
                     f"{visible(report.outcome.error_message or '')[:300]}")
        lines = []
        if self.notifier is not None and self.store.take_lease(
                host.name, NOTIFY_LEASE, self.holder, self.lease_s, now):
            lines = transitions(self.store, self.config.notify, host.name, report.findings,
                                polled=report.outcome.ok, now=now)
        for _, line in lines:
            self.log(f"{host.name}: {line}")
        try:
            events = await self.watchdog.act(host, history)
        except Exception as exc:  # one run's trouble must not end the watch
            from . import errorlog

            where = errorlog.record(exc, f"watchdog on {host.name}")
            events = [WatchEvent(host.name, "?", "failed",
                                 f"the watchdog failed ({errorlog.summary(exc)}); traceback "
                                 f"in {where}")]
        for e in events:
            line = event_line(e.kind, f"{e.run}: {e.message}")
            self.log(f"{host.name}: {line}")
            if e.kind in ("restart", "verified", "failed", "gave_up"):
                lines.append((e.severity, line))
        if self.notifier is not None:
            self.notifier.post(host.name, lines)
            self.save_sent()
        return events

    def save_sent(self) -> None:
        if self.notifier is not None:
            remember_sent(self.store, self.notifier.results())

    async def once(self, hosts: Sequence[HostConfig]) -> list[HostReport]:
        from .wire.poller import OpeningLimiter

        limiter = OpeningLimiter()
        self.collector = Collector(accept_new_host_keys=self.watchdog.accept_new,
                                   opening=lambda h: opening(limiter, h))
        return list(await asyncio.gather(*(self.round(h) for h in hosts)))

    async def run(self, hosts: Sequence[HostConfig], stop: asyncio.Event) -> None:
        """Rounds of every host, each host on its own interval, until `stop` is set."""
        from .wire.poller import OpeningLimiter

        limiter = OpeningLimiter()
        self.collector = Collector(accept_new_host_keys=self.watchdog.accept_new,
                                   opening=lambda h: opening(limiter, h))
        tasks = [asyncio.create_task(self._host_loop(h, stop)) for h in hosts]
        try:
            await stop.wait()
            # A round in flight ends first (a relaunch is not cut mid-way), within bounds: each
            # SSH call has its own deadline.
            await asyncio.wait(tasks, timeout=STOP_GRACE_S)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    async def _host_loop(self, host: HostConfig, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.round(host)
            except Exception as exc:  # a bug of ours: logged, the watch goes on
                from . import errorlog

                where = errorlog.record(exc, f"watching {host.name}")
                self.log(f"{host.name}: internal error ({errorlog.summary(exc)}); traceback "
                         f"in {where}")
            wait = max(0.0, self.config.interval - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    def close(self, flush_s: float = 10.0) -> None:
        """Hand the leases back and send what is batched (bounded)."""
        with contextlib.suppress(Exception):
            self.watchdog.release()
        if self.notifier is not None:
            self.notifier.close(flush_s)
            self.save_sent()


def wants_watcher(config: Config) -> bool:
    """Whether a watcher has anything to do: a run with a policy, or a notification target."""
    return bool(target_urls(config.notify)) or any(
        r.restart == "on-failure" for h in config.hosts for r in h.runs)


def watch_lines(store: Store, host: HostConfig, history: HostHistory,
                now: float | None = None) -> dict[str, str]:
    """Per run, one line for the TUI: the policy, restarts used in the window, the next allowed
    restart, who acts, and the last message sent about the host. Runs without a policy and a
    host without messages get none."""
    now = time.time() if now is None else now
    sent = last_sent(store, host.name)
    out = {}
    for run in host.runs:
        if run.restart != "on-failure" and sent is None:
            continue
        parts = []
        if run.restart == "on-failure":
            died_at = None
            series = history.runs.get(run.name)
            if series is not None and series.status == "dead":
                died_at = next((f.first_seen for f in store.findings(host.name, active=True)
                                if f.code == "run.dead" and f.run == run.name), now)
            st = status(store, host.name, run, now=now, died_at=died_at)
            parts.append(f"{st.policy} · used {st.used} of {st.limit}")
            if st.gave_up:
                parts.append("gave up: restart it by hand")
            elif st.next_at is not None:
                parts.append("next restart " + ("now" if st.next_at <= now else
                                                _clock(st.next_at)))
            if st.actor:
                parts.append(f"acting: {st.actor.split('@')[0]}")
        if sent is not None:
            parts.append(f"last message {_clock(sent[1])}: {sent[0]}")
        out[run.name] = visible(" · ".join(parts))
    return out


def _clock(at: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(at).astimezone().strftime("%H:%M:%S")
