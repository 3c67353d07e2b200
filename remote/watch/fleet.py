"""THE pipeline: one object that owns a fleet's watching, for every part of gpuwatch.

FleetWatch holds the config, each host's history (restored from the store), one collector with
one opening limiter, the one Poller (backoff, jitter, wake, pause), the store policy, and the
watcher's hooks (restart policy under a lease, notifications). Every poll lands in one place,
`land` (bottom's `DataStore::eat_data`): judged, given the watchdog's findings, given its one
verdict, remembered as the role says, then handed to whoever listens. The TUI, `--once`,
`check`, `watch`, `watch --once` and the action verbs are thin adapters over it; none restores,
judges or saves a host itself (landing.py is private to this package).

    poll (collector, bounded SSH) ──> land: judge -> hooks' findings -> verdict -> remember
                                          └──> listeners (the TUI) ──> act (hooks: watchdog,
                                               notifications), where the role acts

Roles: what each caller may do to the store and the boxes (ROLES). Nothing here imports
Textual; asyncssh loads only when a host needs SSH; a `--once` of one local host runs without
an event loop.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..config.schema import Config, HostConfig
from ..config.thresholds import Thresholds
from ..model.ack import ACKNOWLEDGED, STOPPED, Ack, acks_from_rows
from ..model.finding import Finding
from ..model.history import HostHistory
from ..report import HostReport
from ..runreport import with_usage
from ..store import Store
from ..verdict import verdict_of
from ..wire.collect import Collector, PollOutcome, ssh_config_file
from .landing import judge, remember, restore, resume, save_runs_of, store_policy

if TYPE_CHECKING:
    import asyncio

    from ..actions.restart import Watchdog, WatchEvent
    from ..actions.types import ActionOutcome, ActionPlan
    from ..model.slurm_job import JobsReport
    from ..notify import Notifier
    from ..sources.prometheus import PrometheusSource
    from ..wire.poller import OpeningLimiter, Poller
    from .hooks import Hooks
    from .jobs import JobsWatch

RUNS_SAVE_S = 60.0
"""The TUI saves runs' series, findings and deaths at most this often per host (and at exit):
serialising them on every poll of 64 hosts was its poll handler's biggest cost."""
STOP_GRACE_S = 60.0
"""How long a stopped watcher lets its rounds in flight finish (a relaunch is not cut)."""
JOBS_SLACK_S = 10.0
"""A round of the scheduler is bounded by its login host's connect and command timeouts, plus
this (the source bounds itself; this bounds the rest, so the jobs' loop can never hang)."""

Listener = Callable[[HostReport], None]
EventListener = Callable[[str, "list[WatchEvent]"], None]
JobsListener = Callable[["JobsReport"], None]


@dataclass(frozen=True, slots=True)
class Role:
    """What one kind of caller does with a poll: how much it saves, whether it acts."""

    name: str
    saves: str
    """each (every poll, whole) | throttled (the poll each time, runs and findings at most
    every RUNS_SAVE_S) | never (`check`: looks, writes nothing)."""
    acts: bool | None
    """Restarts under the lease and notifications; None: where the config asks for either."""


ROLES = {r.name: r for r in (
    Role("tui", "throttled", None), Role("watch", "each", True), Role("cron", "each", True),
    Role("once", "each", False), Role("check", "never", False), Role("action", "each", False))}


@dataclass
class HostWatch:
    """One host as the pipeline keeps it."""

    config: HostConfig
    history: HostHistory
    report: HostReport | None = None
    """The latest landed poll (None before the first of this process)."""
    failures: int = 0
    """Consecutive failed polls (0: the last one was good)."""
    runs_saved_at: float = field(default=float("-inf"))


class FleetWatch:
    """A fleet's watching, for one caller (its role)."""

    def __init__(self, config: Config, store: Store, *, role: str,
                 hosts: Sequence[HostConfig] | None = None, accept_new_host_keys: bool = False,
                 log: Callable[[str], None] | None = None, notifier: Notifier | None = None,
                 collector: Collector | None = None, clock: Callable[[], float] = time.time,
                 verify_s: float | None = None) -> None:
        self.config, self.store, self.clock = config, store, clock
        self.role = ROLES[role]
        self.store_policy = store_policy(config, role)
        self.hosts_config: list[HostConfig] = list(config.hosts if hosts is None else hosts)
        self.accept_new_host_keys = accept_new_host_keys
        self._by_name = {h.name: h for h in self.hosts_config}
        if self.role.acts is None:
            from .hooks import wants_watcher

            self.acts = wants_watcher(config)
        else:
            self.acts = self.role.acts
        self._hooks: Hooks | None = None
        if self.acts or any(r.restart == "on-failure" for h in self.hosts_config
                            for r in h.runs):
            from .hooks import Hooks

            self._hooks = Hooks(config, store, log or (lambda _line: None), kind=role,
                                acts=self.acts, accept_new_host_keys=accept_new_host_keys,
                                notifier=notifier, verify_s=verify_s, clock=clock)
        self._limiter: OpeningLimiter | None = None
        needs_ssh = any(not h.is_local and h.source == "ssh" for h in self.hosts_config)
        self.collector = collector if collector is not None else Collector(
            accept_new_host_keys=accept_new_host_keys,
            opening=self.opening if needs_ssh else None)
        self.source: PrometheusSource | None = None
        """What polls the hosts whose `source` is "prometheus" (remote/sources/)."""
        if config.sources.prometheus is not None and any(
                h.source == "prometheus" for h in self.hosts_config):
            from ..sources.prometheus import PrometheusSource

            self.source = PrometheusSource(config.sources.prometheus,
                                           fresh_s=max(1.0, min(5.0, config.interval / 2)))
        self._hosts: dict[str, HostWatch] = {}
        self._listeners: list[Listener] = []
        self._event_listeners: list[EventListener] = []
        self._poller: Poller[HostConfig, HostReport] | None = None
        self.unsaved: dict[str, str] = {}
        """Host → why its last poll was not saved (a locked or failing store): the report
        stands either way."""
        self.jobs: JobsWatch | None = None
        """`[slurm]`'s jobs (watch/jobs.py): asked each round() before the hosts, and every
        interval on a loop of their own while polling (start())."""
        self._jobs_listeners: list[JobsListener] = []
        self._jobs_task: asyncio.Task[None] | None = None
        self._jobs_wake: asyncio.Event | None = None
        self._jobs_lock: asyncio.Lock | None = None
        self._jobs_forced = False
        if config.slurm is not None:
            from .jobs import JobsWatch

            self.jobs = JobsWatch(config.slurm, accept_new_host_keys=accept_new_host_keys,
                                  clock=clock)

    # -- hosts -------------------------------------------------------------------------------
    def host(self, name: str) -> HostWatch:
        """A host's state, restored from the store (and the collector's memory of it) the
        first time it is asked for."""
        watched = self._hosts.get(name)
        if watched is None:
            config = self._by_name[name]
            try:
                history = restore(self.store, config, self.config.thresholds)
                resume(self.collector, self.store, config)
            except sqlite3.Error:  # the store is a convenience: never fatal (DESIGN §5)
                history = HostHistory(name, thresholds=self.config.thresholds or Thresholds(),
                                      expects_gpus=bool(config.runs))
            watched = self._hosts[name] = HostWatch(config, history)
        return watched

    def history(self, name: str) -> HostHistory:
        return self.host(name).history

    def restored_findings(self, name: str) -> list[Finding]:
        """What the rules say of a host as the store left it, shown before its first poll
        here (the TUI at start): computed, not kept (its first landed poll judges it)."""
        from ..findings.evaluate import evaluate

        watched = self.host(name)
        if not watched.history.snapshots:
            return []
        return [*self._extra_findings(watched), *evaluate(watched.history).findings]

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts_config]

    def listen(self, on_report: Listener, on_events: EventListener | None = None,
               on_jobs: JobsListener | None = None) -> None:
        """Call `on_report` with every landed report, `on_events` with what the watchdog did,
        `on_jobs` with every landed round of the scheduler (`[slurm]`)."""
        self._listeners.append(on_report)
        if on_events is not None:
            self._event_listeners.append(on_events)
        if on_jobs is not None:
            self._jobs_listeners.append(on_jobs)

    # -- where every poll lands --------------------------------------------------------------
    def land(self, outcome: PollOutcome) -> HostReport:
        """One poll's outcome, judged on the host's history with the watchdog's findings,
        given its verdict, remembered as the role says, handed to the listeners. Never raises
        for the host's data (judge's guarantee); the store's trouble is `unsaved`'s."""
        watched = self.host(outcome.host.name)
        history = watched.history
        with contextlib.suppress(sqlite3.Error):  # `gpuwatch ack` from another process counts
            history.acks = acks_from_rows(self.store.acks(watched.config.name))
        report = judge(history, outcome)
        extra = self._extra_findings(watched)
        if extra:
            history.findings = [*extra, *history.findings]
            report = replace(report, findings=[*extra, *report.findings])
        out = report.outcome
        report = replace(report, judged=verdict_of(
            report.findings, "ok" if out.ok else "unreachable",
            failure=(out.error_kind, out.error_message)))
        watched.failures = 0 if out.ok else watched.failures + 1
        self._remember(watched, report)
        if self.role.name == "once":  # the runs' GPU-hours, energy, cost in --once --json
            with contextlib.suppress(sqlite3.Error):
                report = with_usage(report, self.store, watched.config)
        watched.report = report
        for listener in list(self._listeners):
            listener(report)
        return report

    def _extra_findings(self, watched: HostWatch) -> list[Finding]:
        told = (self.source.findings(watched.config.name)
                if self.source is not None and watched.config.source == "prometheus" else [])
        if told:  # a watcher's verdicts, where the host's own rules did not find the same
            own = {f.key for f in watched.history.findings}
            told = [f for f in told if f.key not in own]
        if self._hooks is None:
            return told
        try:
            return [*told, *self._hooks.findings(watched.config, watched.history)]
        except sqlite3.Error:
            return told

    def _remember(self, watched: HostWatch, report: HostReport) -> None:
        name = watched.config.name
        if self.role.saves == "never":
            return
        save_runs = True
        if self.role.saves == "throttled":
            now = time.monotonic()
            save_runs = now - watched.runs_saved_at >= RUNS_SAVE_S
            if save_runs:
                watched.runs_saved_at = now
        locked = next((why for why in self.unsaved.values() if "lock" in why), None)
        if locked is not None and self.role.name in ("once", "cron"):
            self.unsaved[name] = locked  # each write would wait out the busy timeout again
            return
        try:
            remember(self.store, report.outcome, watched.history, self.collector,
                     save_runs=save_runs, policy=self.store_policy)
        except sqlite3.OperationalError as exc:  # locked, busy, disk full, read-only
            self.unsaved[name] = (f"{exc} (another gpuwatch or an sqlite3 shell may hold its "
                                  f"write lock)" if "lock" in str(exc) else str(exc))
            return
        except Exception as exc:  # this host's data; the others are still saved
            from .. import errorlog

            where = errorlog.record(exc, f"saving {name}")
            self.unsaved[name] = f"{errorlog.summary(exc)}; traceback in {where}"
            return
        self.unsaved.pop(name, None)

    def store_warning(self) -> str | None:
        """What could not be saved, in one sentence (for stderr or a toast), or None."""
        if not self.unsaved:
            return None
        why = "; ".join(dict.fromkeys(self.unsaved.values()))
        return (f"{self.store.path or 'the store'}: this poll of {', '.join(self.unsaved)} was "
                f"not saved ({why}); the next run compares with the last saved one")

    def save_all(self) -> None:
        """What the throttled saves have not written yet (offsets, series) goes now."""
        if self.role.saves == "never":
            return
        for watched in self._hosts.values():
            if watched.report is None or not watched.history.runs:
                continue
            with contextlib.suppress(sqlite3.Error):
                save_runs_of(self.store, watched.config.name, watched.history)

    # -- polling -----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def opening(self, host: HostConfig) -> AsyncIterator[None]:
        """Hold the limiter's slots while a host's connection opens: per sshd and jump host,
        and from the failing hosts' own pool while the host's polls fail (so black holes
        never hold the slots that answering hosts wait for). The keys are worked out in a
        thread where the ssh config must be read (milliseconds per host); from its kept
        reading, on the loop (a thread's hop costs a poll ~0.1 ms of CPU)."""
        import asyncio

        from ..wire import ssh
        from ..wire.poller import OpeningLimiter

        if self._limiter is None:
            self._limiter = OpeningLimiter()
        keys = ssh.kept_endpoint_keys(host.ssh, ssh_config_file(host))
        if keys is None:
            keys = await asyncio.to_thread(opening_keys, host)
        failing = self._hosts[host.name].failures > 0 if host.name in self._hosts else False
        async with self._limiter.opening(keys, failing=failing):
            yield

    async def poll(self, name: str) -> HostReport:
        """One poll of a host, landed (not acted on)."""
        watched = self.host(name)
        if watched.config.source == "prometheus" and self.source is not None:
            return self.land(await self.source.poll(watched.config, watched.history.runs))
        outcome = await self.collector.poll(watched.config, watched.history.runs)
        return self.land(outcome)

    def poll_local(self, name: str) -> HostReport:
        """poll() of a `local` host without an event loop (a cron `--once` of this machine)."""
        watched = self.host(name)
        return self.land(self.collector.poll_local(watched.config, watched.history.runs))

    async def act(self, report: HostReport) -> list[WatchEvent]:
        """The watcher's hooks on a landed report, where this role acts."""
        if self._hooks is None or not self.acts:
            return []
        watched = self.host(report.name)
        events = await self._hooks.act(watched.config, watched.history, report)
        for listener in list(self._event_listeners):
            listener(report.name, events)
        return events

    async def cycle(self, name: str) -> HostReport:
        """One round of one host: polled, landed, then acted on where this role acts."""
        report = await self.poll(name)
        if self.acts:
            await self.act(report)
        return report

    async def _cycle(self, host: HostConfig) -> HostReport:
        return await self.cycle(host.name)

    async def round(self, names: Sequence[str] | None = None) -> list[HostReport]:
        """One poll of every host (or of `names`) at once, landed and acted on; reports in
        the hosts' order. Concurrency is bounded where it matters, in the openings."""
        import asyncio

        jobs = self.jobs is not None and names is None
        if jobs:  # [slurm]: the jobs first, so their nodes are polled too
            await self._jobs_asked()
        chosen = [self._by_name[n] for n in (self.names if names is None else names)]
        reports = list(await asyncio.gather(*(self._cycle(h) for h in chosen)))
        if jobs:
            self._jobs_landed()
        return reports

    def add_hosts(self, hosts: Sequence[HostConfig]) -> None:
        """Watch more hosts from now on (a Slurm job's nodes): polled by the next round, and
        while polling (start()) on loops of their own from now."""
        new = [h for h in hosts if h.name not in self._by_name]
        for host in new:
            self.hosts_config.append(host)
            self._by_name[host.name] = host
        if new and self._poller is not None:
            for host in new:
                self.host(host.name)  # restored before its first poll
            self._poller.add(new)

    # -- the scheduler's rounds ([slurm]) ------------------------------------------------------
    async def jobs_round(self) -> JobsReport | None:
        """One round of the scheduler, landed: the running jobs' new nodes join the polled
        hosts, each job is linked to its run on its nodes (their latest polls) and judged, and
        the listeners are told. Never raises: whatever went wrong is the report's error. None
        without `[slurm]`."""
        if self.jobs is None:
            return None
        import asyncio

        if self._jobs_lock is None:
            self._jobs_lock = asyncio.Lock()
        async with self._jobs_lock:  # one round at a time (the source remembers between them)
            try:
                await self._jobs_asked()
            except Exception as exc:  # a loop never dies of one round
                return self._jobs_failed(exc)
            return self._jobs_landed()

    async def _jobs_asked(self) -> None:
        import asyncio

        assert self.jobs is not None
        bounds = self.jobs.config.settings
        bound = bounds.connect_timeout + bounds.command_timeout + JOBS_SLACK_S
        try:
            await asyncio.wait_for(self.jobs.poll(), timeout=bound)
        except TimeoutError:
            from ..sources.slurm import SlurmError

            self.jobs.answer = SlurmError(
                "timeout", f"the scheduler on {self.jobs.config.host} did not answer within "
                           f"{bound:g} s")
        self.add_hosts(self.jobs.new_hosts(tuple(self.hosts_config)))

    def _jobs_landed(self) -> JobsReport:
        assert self.jobs is not None
        try:
            report = self.jobs.land({n: self.host(n).history for n in self.names},
                                    tuple(self.hosts_config))
        except Exception as exc:  # a job the linking or judging could not read
            return self._jobs_failed(exc)
        for listener in list(self._jobs_listeners):
            listener(report)
        return report

    def _jobs_failed(self, exc: Exception) -> JobsReport:
        from .. import errorlog
        from ..model.slurm_job import JobsReport

        assert self.jobs is not None
        where = errorlog.record(exc, f"a round of the scheduler on {self.jobs.config.host}")
        report = JobsReport(host=self.jobs.config.host, ok=False, polled_at=self.clock(),
                            error={"kind": "probe", "message":
                                   f"{errorlog.summary(exc)}; traceback in {where}"})
        self.jobs.report = report
        for listener in list(self._jobs_listeners):
            listener(report)
        return report

    async def _jobs_loop(self) -> None:
        """A round of the scheduler every interval (a paused watch asks only when told to),
        until stop()."""
        import asyncio

        assert self._jobs_wake is not None
        while True:
            if not self.paused or self._jobs_forced:
                self._jobs_forced = False
                await self.jobs_round()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._jobs_wake.wait(), timeout=self.config.interval)
            self._jobs_wake.clear()

    def jobs_now(self, *, through_pause: bool = False) -> None:
        """Ask the scheduler as soon as its round in flight ends (`through_pause`: once even
        while polling is paused)."""
        if self._jobs_wake is not None:
            self._jobs_forced = self._jobs_forced or through_pause
            self._jobs_wake.set()

    def round_sync(self) -> list[HostReport]:
        """round() for a `--once`: one local host (and nothing to act on) is polled without an
        event loop (~40 ms of a cron run's start-up); otherwise all at once on one."""
        if len(self.hosts_config) == 1 and self.hosts_config[0].is_local and not self.acts \
                and self.jobs is None and self.hosts_config[0].source == "ssh":
            return [self.poll_local(self.hosts_config[0].name)]
        import asyncio

        return asyncio.run(self.round())

    # -- continuous watching (the TUI, `gpuwatch watch`) --------------------------------------
    def start(self) -> None:
        """Poll every host on its own loop (jittered interval, backoff while it fails, never
        two polls of one host at once) until stop()."""
        from ..wire.poller import Poller

        if self._poller is not None:
            return
        for h in self.hosts_config:
            self.host(h.name)  # restored before the first poll, in the order of the config
        self._poller = Poller(self.hosts_config, self._cycle, lambda _h, _r: None,
                              lambda r: r.outcome.ok, interval=self.config.interval)
        self._poller.start()
        if self.jobs is not None:
            import asyncio

            self._jobs_wake = asyncio.Event()
            self._jobs_task = asyncio.create_task(self._jobs_loop(), name="jobs")

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop polling; `grace_s`: let a round in flight end first (a relaunch is not cut)."""
        poller, self._poller = self._poller, None
        task, self._jobs_task = self._jobs_task, None
        self._jobs_wake = None
        if task is not None:
            import asyncio

            # Cancelled again until it ends: a cancellation can get lost on its way in
            # (wire/poller.py's stop says how); each round bounds itself.
            for _ in range(10):
                task.cancel()
                done, _pending = await asyncio.wait({task}, timeout=1.0)
                if done:
                    if not task.cancelled():
                        task.exception()
                    break
        if poller is not None:
            await poller.stop(grace_s)

    async def run(self, stop: asyncio.Event) -> None:
        """`gpuwatch watch`: every host on its loop until `stop` is set."""
        self.start()
        try:
            await stop.wait()
        finally:
            await self.stop(STOP_GRACE_S)

    @property
    def polling(self) -> bool:
        return self._poller is not None

    @property
    def paused(self) -> bool:
        return self._poller is not None and self._poller.paused

    def in_flight(self) -> list[str]:
        """The hosts whose poll is under way now (none when not polling)."""
        return [h.name for h in self._poller.in_flight()] if self._poller is not None else []

    def pause(self) -> None:
        if self._poller is not None:
            self._poller.pause()

    def resume(self) -> None:
        if self._poller is not None:
            self._poller.resume()

    def poll_now(self, name: str | None = None, *, through_pause: bool = False) -> None:
        """Poll a host (or all) as soon as its poll in flight ends; `through_pause`: once even
        while polling is paused."""
        if self._poller is not None:
            self._poller.poll_now(self._by_name[name] if name is not None else None,
                                  through_pause=through_pause)
        if name is None:  # every host: the scheduler too
            self.jobs_now(through_pause=through_pause)

    # -- what a person does -------------------------------------------------------------------
    async def execute(self, plan: ActionPlan, *, readonly: bool) -> ActionOutcome:
        """Carry out a confirmed plan (its own bounded SSH call, audited); a kill of a run's
        processes makes its death one asked for (not critical), a reap's discovered runs gone.
        """
        from ..actions import execute as carry_out

        watched = self.host(plan.host)
        outcome = await carry_out.execute(plan, watched.config, store=self.store,
                                          readonly=readonly,
                                          accept_new_host_keys=self.accept_new_host_keys)
        if outcome.ok is not False:
            carry_out.mark_reaped(plan, watched.history)
            self._stopped_on_request(watched, plan, carry_out.who())
        return outcome

    def _stopped_on_request(self, watched: HostWatch, plan: ActionPlan, by: str) -> None:
        if plan.kind not in ("kill", "reap"):
            return
        snap = watched.history.current or (watched.history.snapshots[-1]
                                           if watched.history.snapshots else None)
        runs: dict[str, list[int]] = {}
        targets = {t.pid for t in plan.targets}
        for proc in snap.processes if snap is not None else ():
            if proc.pid in targets and proc.run:
                runs.setdefault(proc.run, []).append(proc.pid)
        for run, pids in runs.items():
            with contextlib.suppress(sqlite3.Error):
                self.store.acknowledge(plan.host, run, pids=pids, who=by, at=self.clock(),
                                       reason=STOPPED)

    async def verify(self, plan: ActionPlan,
                     fresh_poll: Callable[[], Any]) -> ActionOutcome | None:
        """THE verify loop (actions/verify.py) on this host's history: `fresh_poll` lands a
        poll that began after the action (None) or says why none landed."""
        from ..actions.verify import verify_until

        watched = self.host(plan.host)
        return await verify_until(plan, watched.config, watched.history, fresh_poll,
                                  store=self.store)

    def acknowledge(self, name: str, run: str, *, who: str | None = None) -> str:
        """A person knows of a dead run's death: it stops being critical (until the run dies
        again). Recorded in the store and the audit log; the next landed poll says it. Raises
        ValueError with what is wrong (no such run, not dead)."""
        from ..actions.execute import who as local_user

        watched = self.host(name)
        series = watched.history.runs.get(run)
        if series is None:
            known = ", ".join(sorted(watched.history.runs)) or "none seen yet"
            raise ValueError(f"{name} has no run named {run!r} (runs: {known})")
        if series.status != "dead":
            raise ValueError(f"run {run} on {name} is {series.status}, not dead: nothing to "
                             "acknowledge")
        by = who or local_user()
        death = watched.history.deaths.get(run)
        pids = death.pids if death is not None else ()
        now = self.clock()
        self.store.acknowledge(name, run, pids=pids, who=by, at=now, reason=ACKNOWLEDGED)
        self.store.record_action(who=by, host=name, action="ack", phase="execute",
                                 targets=[{"run": run, "pids": list(pids)}], command=None,
                                 outcome="sent", ok=True,
                                 message=f"death of run {run} acknowledged")
        watched.history.acks.setdefault(run, []).append(Ack(run, tuple(pids), by, now))
        return (f"run {run} on {name}: death acknowledged by {by}; no longer critical (a new "
                "death is)")

    def watch_lines(self, name: str) -> dict[str, str]:
        """Per run of the host, the watchdog's line for the TUI (hooks.lines)."""
        if self._hooks is None:
            return {}
        watched = self.host(name)
        try:
            return self._hooks.lines(watched.config, watched.history)
        except sqlite3.Error:
            return {}

    @property
    def notifier(self) -> Notifier | None:
        return self._hooks.notifier if self._hooks is not None else None

    @property
    def watchdog(self) -> Watchdog | None:
        """The restart policies' actor (actions/restart.py), where a run has a policy."""
        return self._hooks.watchdog if self._hooks is not None else None

    def close(self, flush_s: float = 10.0) -> None:
        """Hand the leases back, send what is batched (bounded), save what waits."""
        self.save_all()
        if self._hooks is not None:
            self._hooks.close(flush_s)


def opening_keys(host: HostConfig) -> list[str]:
    """Limiter keys of a host's connection: its sshd, and its jump host when there is one.
    Aliases of one sshd share a key (ssh.endpoint_keys reads the ssh config)."""
    from ..wire import ssh

    return ssh.endpoint_keys(host.ssh, ssh_config_file(host))

