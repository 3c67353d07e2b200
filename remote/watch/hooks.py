"""The watcher's hooks on a judged poll: the watchdog's findings, its restarts under the run's
lease, and the notifications of what changed (DESIGN §4).

FleetWatch (fleet.py) calls `findings` on every judged poll, whoever watches (a TUI that does
not act, `--once`, `check`, `gpuwatch watch`), so that every process on one store says
run.restart_limit where the watchdog gave up, and none erases another's; it calls `act` only
where it acts (`gpuwatch watch`, `watch --once`, the TUI with a policy or a notification
target). The lease in the store makes one actor of all of them. Nothing here prints: lines go to
the `log` callable given.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from ..actions.restart import Watchdog, WatchEvent, limit_findings, new_holder, status
from ..config.schema import Config, HostConfig
from ..model.finding import Finding
from ..model.history import HostHistory
from ..notify import Notifier, event_line, last_sent, remember_sent, target_urls, transitions
from ..report import HostReport
from ..store import Store
from ..textsafe import visible

Log = Callable[[str], None]
NOTIFY_LEASE = ""
"""The lease name of a host's notifications (one actor sends them)."""
NOTIFIED_EVENTS = ("restart", "verified", "failed", "gave_up")
"""The watchdog's events that are sent as notifications (the rest are logged)."""


def lease_seconds(config: Config) -> float:
    """A lease outlives a few missed rounds of its holder, not much more: a watcher that died
    hands its runs over within about a minute."""
    return max(3 * config.interval + 30.0, 60.0)


def wants_watcher(config: Config) -> bool:
    """Whether a watcher has anything to do: a run with a policy, or a notification target."""
    return bool(target_urls(config.notify)) or any(
        r.restart == "on-failure" for h in config.hosts for r in h.runs)


class Hooks:
    """What a watcher adds to each judged poll of its hosts."""

    def __init__(self, config: Config, store: Store, log: Log, *, kind: str, acts: bool,
                 accept_new_host_keys: bool = False, notifier: Notifier | None = None,
                 verify_s: float | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config, self.store, self.log, self.acts = config, store, log, acts
        self.clock = clock
        self.holder = new_holder(kind)
        self.lease_s = lease_seconds(config)
        self.watchdog = Watchdog(
            store, self.holder, lease_s=self.lease_s, readonly=config.readonly,
            accept_new_host_keys=accept_new_host_keys,
            verify_s=verify_s if verify_s is not None else max(3 * config.interval + 20, 30.0))
        urls = target_urls(config.notify) if acts else []
        self.notifier = notifier if notifier is not None else (
            Notifier(config.notify, urls, log) if urls else None)
        self.log_failed_polls = True

    def findings(self, host: HostConfig, history: HostHistory) -> list[Finding]:
        """run.restart_limit where the watchdog gave up (from the store: any watcher's)."""
        if not any(r.restart == "on-failure" for r in host.runs):
            return []
        return limit_findings(self.store, host, history, self.clock())

    async def act(self, host: HostConfig, history: HostHistory,
                  report: HostReport) -> list[WatchEvent]:
        """After the poll is remembered: notify its transitions, let the watchdog act, notify
        what it did. Returns the watchdog's events (the TUI toasts them)."""
        if not self.acts:
            return []
        now = self.clock()
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
            from .. import errorlog

            where = errorlog.record(exc, f"watchdog on {host.name}")
            events = [WatchEvent(host.name, "?", "failed",
                                 f"the watchdog failed ({errorlog.summary(exc)}); traceback "
                                 f"in {where}")]
        for e in events:
            line = event_line(e.kind, f"{e.run}: {e.message}")
            self.log(f"{host.name}: {line}")
            if e.kind in NOTIFIED_EVENTS:
                lines.append((e.severity, line))
        if self.notifier is not None:
            verdict = report.verdict
            self.notifier.post(host.name, lines,
                               verdict=f"{verdict.label}: {verdict.headline}")
            self.save_sent()
        return events

    def save_sent(self) -> None:
        if self.notifier is not None:
            remember_sent(self.store, self.notifier.results())

    def lines(self, host: HostConfig, history: HostHistory,
              now: float | None = None) -> dict[str, str]:
        """Per run, one line for the TUI: the policy, restarts used in the window, the next
        allowed restart, who acts, and the last message sent about the host. Runs without a
        policy and a host without messages get none."""
        now = self.clock() if now is None else now
        sent = last_sent(self.store, host.name)
        out = {}
        for run in host.runs:
            if run.restart != "on-failure" and sent is None:
                continue
            parts = []
            if run.restart == "on-failure":
                died_at = None
                series = history.runs.get(run.name)
                if series is not None and series.status == "dead":
                    died_at = next((f.first_seen for f in self.store.findings(
                        host.name, active=True) if f.code == "run.dead"
                        and f.run == run.name), now)
                st = status(self.store, host.name, run, now=now, died_at=died_at)
                parts.append(f"{st.policy} · used {st.used} of {st.limit}")
                if st.gave_up:
                    parts.append("gave up: restart it by hand")
                elif st.next_at is not None:
                    parts.append("next restart " + ("now" if st.next_at <= now else
                                                    clock_time(st.next_at)))
                if st.actor:
                    parts.append(f"acting: {st.actor.split('@')[0]}")
            if sent is not None:
                parts.append(f"last message {clock_time(sent[1])}: {sent[0]}")
            out[run.name] = visible(" · ".join(parts))
        return out

    def close(self, flush_s: float = 10.0) -> None:
        """Hand the leases back and send what is batched (bounded)."""
        with contextlib.suppress(Exception):  # a closed or locked store: the leases expire
            self.watchdog.release()
        if self.notifier is not None:
            self.notifier.close(flush_s)
            self.save_sent()


def policies_line(config: Config) -> str:
    """Which runs the watchdog restarts, for `gpuwatch watch`'s first line."""
    runs = [f"{h.name}/{r.name}" for h in config.hosts for r in h.runs
            if r.restart == "on-failure"]
    return (f"restart on failure: {', '.join(runs)}" if runs else
            "no run has restart = \"on-failure\"")



def clock_time(at: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(at).astimezone().strftime("%H:%M:%S")
