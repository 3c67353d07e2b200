"""The watchdog: restart a dead run within its policy, one actor per run (DESIGN §4).

A run with `restart = "on-failure"` is relaunched exactly as the `r` key does it (actions:
plan_relaunch, execute, verify: identity checks, detached, from the latest checkpoint, audited)
when its death is confirmed and its cause is in `restart_on`, at most `max_restarts` times per
`restart_window_s`, each after `restart_delay_s` doubled per restart already in the window.
Never while a process of the run lives (plan_relaunch refuses, U2, U4), nor while gpuwatch's
last launch of it is still starting (the box refuses: its launch marker), never on a finished
run (its status is not `dead`), never while the disk its checkpoints live on is full (U6).

One actor: a watcher acts on a run only while it holds the run's lease in the store (taken in
one IMMEDIATE transaction, renewed each poll and by a heartbeat while it acts, expiring when its
holder stops renewing). Each restart is written to the store *before* it is sent, keyed by the
death it answers (the pids that died) and carrying the token of its launch, so no death is ever
answered twice, whichever watcher comes next, and a watcher that stopped mid-restart leaves a
row the next one settles from the box's evidence instead of repeating it. Every watcher — actor
or not — reads the same rows, so the TUI shows what the actor did. Nothing here prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.schema import HostConfig, RunConfig
from ..findings.diagnosis import DEAD_GPU_XIDS, Diagnosis
from ..findings.run_curves import latest_after_nan
from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.series import RunSeries
from ..store import RestartRecord, Store
from . import plan as actions
from .execute import LaunchState, launch_state, new_token, who
from .types import ActionError
from .verify import plan_verdict

COUNTED = ("sent", "verified", "failed")
"""Outcomes that use one of the window's restarts: a restart that never came up counts too."""


def new_holder(kind: str) -> str:
    """A lease holder's name: what it is, where, which process (shown to the others)."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def death_key(d: Diagnosis) -> str:
    """Which death a restart answers: the pids that died (the same for every watcher that saw
    them alive), else the poll that saw it."""
    return ",".join(map(str, sorted(d.pids))) if d.pids else f"at:{d.at}"


def cause_names(d: Diagnosis) -> list[str]:
    """The names `restart_on` may use for this death, most specific first."""
    ev = d.evidence
    if d.cause == "xid":
        return [f"xid:{ev.get('xid')}", "xid"]
    if d.cause == "exception" and ev.get("kind"):
        return [f"exception:{ev.get('kind')}", "exception"]
    return [d.cause]


def allowed(run: RunConfig, d: Diagnosis) -> bool:
    """Whether the policy restarts a run that died this way. `xid` alone leaves out the Xids
    that mean the GPU itself is gone (48, 79: U22); naming them (`xid:48`) lets them in."""
    names = cause_names(d)
    if d.cause == "xid" and names[0] not in run.restart_on:
        return "xid" in run.restart_on and d.evidence.get("xid") not in DEAD_GPU_XIDS
    if d.cause == "exception" and names[0] not in run.restart_on:
        # a generic `exception` does not let in kinds the defaults keep out (CUDA OOM)
        return "exception" in run.restart_on and names[0] != "exception:cuda_oom"
    return names[0] in run.restart_on


def describe_policy(run: RunConfig) -> str:
    if run.restart != "on-failure":
        return "restart: never"
    return (f"restart on failure: at most {run.max_restarts} per {_span(run.restart_window_s)}, "
            f"delay {_span(run.restart_delay_s)} doubling; on {', '.join(run.restart_on)}")


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


@dataclass(frozen=True, slots=True)
class RestartStatus:
    """What the watchdog has done to a run and may do next (the TUI's run header)."""

    policy: str
    used: int
    """Restarts used in the window."""
    limit: int
    next_at: float | None
    """The earliest a next restart may go (epoch s), None when there is none to go."""
    gave_up: bool
    last: RestartRecord | None
    actor: str | None
    """The lease's holder, while it holds."""


def _window(store: Store, host: str, run: RunConfig, now: float) -> list[RestartRecord]:
    return store.restarts(host, run.name, since=now - run.restart_window_s)


def next_allowed(run: RunConfig, records: Sequence[RestartRecord], died_at: float) -> float:
    used = [r for r in records if r.outcome in COUNTED]
    start = max([died_at, *(r.at for r in used)])
    return start + run.restart_delay_s * (2 ** len(used))


def status(store: Store, host: str, run: RunConfig, *, now: float | None = None,
           died_at: float | None = None) -> RestartStatus:
    now = time.time() if now is None else now
    records = _window(store, host, run, now)
    used = sum(r.outcome in COUNTED for r in records)
    holder = store.lease_holder(host, run.name, now)
    gave_up = bool(records) and records[-1].outcome == "gave_up"
    nxt = (next_allowed(run, records, died_at) if died_at is not None and not gave_up
           and run.restart == "on-failure" and used < run.max_restarts else None)
    return RestartStatus(describe_policy(run), used, run.max_restarts, nxt, gave_up,
                         records[-1] if records else None, holder)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One thing the watchdog did or decided, for the log and the notifications."""

    host: str
    run: str
    kind: str
    """restart | verified | failed | gave_up | held (not restarted, and why) | refused"""
    message: str
    severity: Severity = Severity.WARNING


def limit_findings(store: Store, host: HostConfig, history: HostHistory,
                   now: float | None = None) -> list[Finding]:
    """`run.restart_limit` for each dead run whose watchdog gave up on its current death (read
    from the store, so every watcher raises it, actor or not)."""
    now = time.time() if now is None else now
    out = []
    for run in host.runs:
        series = history.runs.get(run.name)
        death = history.deaths.get(run.name)
        if run.restart != "on-failure" or series is None or series.status != "dead" \
                or death is None:
            continue
        records = _window(store, host.name, run, now)
        if records and records[-1].outcome == "gave_up" and records[-1].death == death_key(death):
            used = sum(r.outcome in COUNTED for r in records)
            out.append(Finding(
                "run.restart_limit", Severity.CRITICAL,
                f"run {run.name} died again ({death.summary}) after {used} restarts in "
                f"{_span(run.restart_window_s)}: the watchdog stopped restarting it; find out "
                f"why it keeps dying, then relaunch it by hand",
                run=run.name, evidence={"restarts": used, "max_restarts": run.max_restarts,
                                        "window_s": run.restart_window_s,
                                        "cause": death.cause}))
    return out


class Watchdog:
    """Applies the restart policies of a watcher's hosts, poll after poll.

    `act(host, history)` is called once per judged and remembered poll of a host. For each run
    with a policy it takes the run's lease, holds it (renewed every lease_s / 3 by a heartbeat)
    for as long as it acts, and: settles the restarts that were sent (by it or by a watcher that
    stopped), restarts a death that no restart answers, or kills a hung run.

    A sent restart is settled by evidence, never by a timer alone: verified when a poll shows
    the run running; while not, after verify_s (this process's monotonic clock for its own
    restarts, the store's wall clock for another's), the box is asked how its launch stands
    (execute.launch_state): still starting while the launch shell or any process of its session
    lives, a relaunch of the run holds the box's lock, or a process of the run lives; failed
    only when none of these holds."""

    def __init__(self, store: Store, holder: str, *, lease_s: float, readonly: bool = False,
                 accept_new_host_keys: bool = False, verify_s: float = 60.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.holder, self.lease_s = store, holder, lease_s
        self.readonly, self.accept_new, self.verify_s = readonly, accept_new_host_keys, verify_s
        self.clock, self.monotonic = clock, monotonic
        self.beat_s = max(lease_s / 3.0, 0.05)
        """How often a lease is renewed while an action runs."""
        self._said: set[tuple[str, str, str, str]] = set()
        self._plans: dict[int, actions.ActionPlan] = {}
        self._sent: dict[int, float] = {}
        """Restarts this process sent: when, on its monotonic clock."""

    def release(self) -> None:
        self.store.release_leases(self.holder)

    def _once(self, host: str, run: str, death: str, why: str, message: str,
              severity: Severity = Severity.INFO, kind: str | None = None) -> list[WatchEvent]:
        key = (host, run, death, why)
        if key in self._said:
            return []
        self._said.add(key)
        return [WatchEvent(host, run, kind or ("held" if why != "refused" else "refused"),
                           message, severity)]

    async def act(self, host: HostConfig, history: HostHistory) -> list[WatchEvent]:
        """Decide and act for each run of `host` with a policy; after the poll was judged and
        remembered. Never raises for one run's trouble (it is an event)."""
        events: list[WatchEvent] = []
        for run in host.runs:
            if run.restart != "on-failure":
                continue
            if not self.store.take_lease(host.name, run.name, self.holder, self.lease_s,
                                         self.clock()):
                continue  # another watcher acts on this run; the store shows what it did
            async with self._holding(host.name, run.name):
                events += await self._act_on(host, run, history)
        return events

    @contextlib.asynccontextmanager
    async def _holding(self, host: str, run: str) -> AsyncIterator[None]:
        """The lease renewed every beat_s while the action inside runs: a relaunch may take
        connect_timeout + command_timeout, a check of the box as long; a lease taken once per
        round would lapse under it and let a second watcher act on the same death."""
        stop = asyncio.Event()

        async def beat() -> None:
            while True:
                try:
                    await asyncio.wait_for(stop.wait(), self.beat_s)
                    return
                except TimeoutError:
                    pass
                with contextlib.suppress(sqlite3.Error):
                    self.store.take_lease(host, run, self.holder, self.lease_s, self.clock())

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            stop.set()
            await task

    async def _act_on(self, host: HostConfig, run: RunConfig,
                      history: HostHistory) -> list[WatchEvent]:
        now = self.clock()
        series = history.runs.get(run.name)
        if history.current is None or series is None:
            return []
        records = _window(self.store, host.name, run, now)
        death = history.deaths.get(run.name) if series.status == "dead" else None
        key = death_key(death) if death is not None else None
        events = await self._settle(host, run, history, records, key, now)
        if series.status == "running" and "run.hung" in run.restart_on:
            return events + await self._kill_hung(host, run, history, records)
        if death is None or key is None:
            return events
        records = _window(self.store, host.name, run, now)
        if any(r.death == key and r.outcome in ("sent", "verified", "gave_up")
               for r in records):
            return events  # this death is answered (by us or another watcher)
        if any(r.outcome == "sent" for r in records):
            return events  # a restart of an earlier death is still starting: never a second
        if not allowed(run, death) and not any(r.death == f"hung:{key}" for r in records):
            return events + self._once(
                host.name, run.name, key, "cause",
                f"died ({death.summary}); not restarted: "
                f"{cause_names(death)[0]} is not in its restart_on", Severity.WARNING)
        full = _checkpoint_disk_full(run, history)
        if full:
            return events + self._once(host.name, run.name, key, "disk",
                                       f"not restarted: {full}", Severity.WARNING)
        used = [r for r in records if r.outcome in COUNTED]
        if len(used) >= run.max_restarts:
            msg = (f"died again ({death.summary}); {len(used)} restarts in "
                   f"{_span(run.restart_window_s)} used: giving up")
            self.store.record_restart(host.name, run.name, death=key, holder=self.holder,
                                      outcome="gave_up", message=msg, at=now)
            return [*events, WatchEvent(host.name, run.name, "gave_up", msg, Severity.CRITICAL)]
        died_at = self._died_at(host.name, run.name, now)
        due = next_allowed(run, records, died_at)
        if now < due:
            return events
        return events + await self._restart(host, run, history, key, records, now)

    async def _kill_hung(self, host: HostConfig, run: RunConfig, history: HostHistory,
                         records: Sequence[RestartRecord]) -> list[WatchEvent]:
        """A run the `run.hung` finding names (all processes alive, no step for far longer
        than its own step interval, seed 002) is killed whole, TERM then KILL, each process
        by its identity; the next polls see it dead and the policy restarts it. Not when the
        window's restarts are used: a hung run is worth more than a dead one."""
        hung = next((f for f in history.findings
                     if f.code == "run.hung" and f.run == run.name), None)
        snap = history.current
        if hung is None or snap is None:
            return []
        mine = {p.pid: p for p in snap.processes if p.run == run.name and not p.zombie}
        key = f"hung:{','.join(map(str, sorted(mine)))}"
        if not mine or any(r.death == key for r in records):
            return []
        if sum(r.outcome in COUNTED for r in records) >= run.max_restarts:
            return self._once(host.name, run.name, key, "hung",
                              f"hung ({hung.message}); not killed: its restarts in the window "
                              "are used", Severity.WARNING)
        if self.readonly:
            return self._once(host.name, run.name, key, "readonly",
                              "hung; would be killed and restarted, but gpuwatch is read-only")
        self.store.record_restart(host.name, run.name, death=key, holder=self.holder,
                                  outcome="hung_killed", message=hung.message[:500])
        said = []
        for root in (p for p in mine.values() if p.ppid not in mine):
            plan = actions.plan_kill(host, history, root.pid, "TERM")
            outcome = await actions.execute(plan, host, store=self.store, readonly=False,
                                            accept_new_host_keys=self.accept_new)
            said.append(f"pid {root.pid}: {outcome.message}")
        return [WatchEvent(host.name, run.name, "restart",
                           f"hung ({hung.message}); killed the whole run to restart it: "
                           + "; ".join(said), Severity.WARNING)]

    def _died_at(self, host: str, run: str, now: float) -> float:
        """When run.dead was first seen (the store's findings: any watcher's)."""
        for f in self.store.findings(host, active=True):
            if f.code == "run.dead" and f.run == run:
                return f.first_seen
        return now

    async def _restart(self, host: HostConfig, run: RunConfig, history: HostHistory, key: str,
                       records: Sequence[RestartRecord], now: float) -> list[WatchEvent]:
        # nobody confirms here: a run whose GPU broke is not moved to other GPUs (the refusal
        # says where `gpuwatch relaunch` would start it)
        plan = actions.plan_relaunch(host, run.name, history, elsewhere=False)
        if plan.refusal is not None:
            return self._once(host.name, run.name, key, "refused",
                              f"not restarted: {plan.refusal}", Severity.WARNING)
        after_nan = resumes_after_nan(history, run.name, plan)  # the way back (curves)
        if after_nan is not None:
            return self._once(host.name, run.name, key, "nan", f"not restarted: {after_nan}",
                              Severity.WARNING)
        if self.readonly:
            return self._once(host.name, run.name, key, "readonly",
                              "would be restarted, but gpuwatch is read-only")
        used = sum(r.outcome in COUNTED for r in records)
        attempt = f"restart {used + 1} of {run.max_restarts} in {_span(run.restart_window_s)}"
        token = new_token()
        # Written before it is sent, with the token its launch will carry on the box: whoever
        # comes next (this watcher killed mid-call) finds the row and asks the box about it.
        rid = self.store.record_restart(host.name, run.name, death=key, holder=self.holder,
                                        outcome="sent", message=attempt, at=now, token=token)
        self._sent[rid] = self.monotonic()
        guard = [r.launch for r in records if r.launch]
        outcome = await actions.execute(plan, host, store=self.store, readonly=False,
                                        accept_new_host_keys=self.accept_new, token=token,
                                        guard=guard)
        died = history.deaths[run.name].summary
        if outcome.ok is False and isinstance(outcome.launch, dict):
            # A launch of the run is under way on the box (a person's `r`, a watcher's that
            # left no row): it answers this death; this restart watches it, starts nothing.
            launch = {k: v for k, v in outcome.launch.items() if k != "alive"}
            if launch.get("pid") is not None:
                self.store.record_launch(rid, launch=launch)
            return [WatchEvent(host.name, run.name, "starting",
                               f"died ({died}); not started again: {outcome.message}; "
                               f"{attempt} watches that launch instead", Severity.WARNING)]
        if outcome.ok is False:
            msg = f"{attempt} failed: {outcome.message}"
            self.store.settle_restart(rid, "failed", msg)
            return [WatchEvent(host.name, run.name, "failed", msg, Severity.CRITICAL)]
        if isinstance(outcome.launch, dict):
            self.store.record_launch(rid, launch=outcome.launch)
        self._plans[rid] = plan
        latest = next((n for n in plan.notes if n.startswith("resumes from")), "from scratch")
        return [WatchEvent(host.name, run.name, "restart",
                           f"died ({died}); {attempt}, {latest}", Severity.WARNING)]

    async def _settle(self, host: HostConfig, run: RunConfig, history: HostHistory,
                      records: Sequence[RestartRecord], key: str | None,
                      now: float) -> list[WatchEvent]:
        """Settle the sent restarts by this poll and, where it cannot tell, by the box: running
        again (a process of the run) is verified; a launch that ended with no process of the
        run alive is a failure; anything else is still starting (said once), however long."""
        events: list[WatchEvent] = []
        series = history.runs[run.name]
        for r in records:
            if r.outcome != "sent":
                continue
            if series.status in ("running", "finished") or (key is not None and key != r.death):
                events += await self._verified(host, run, history, r)
                continue
            if self._age(r, now) < self.verify_s:
                continue  # give the poll a chance to see it first: no call to the box
            events += await self._ask_box(host, run, series, r)
        return events

    def _age(self, r: RestartRecord, now: float) -> float:
        """How long ago a restart was sent: this process's monotonic clock for its own (a step
        of the wall clock changes nothing), the store's wall clock for another watcher's."""
        sent = self._sent.get(r.id)
        return self.monotonic() - sent if sent is not None else now - r.at

    async def _verified(self, host: HostConfig, run: RunConfig, history: HostHistory,
                        r: RestartRecord) -> list[WatchEvent]:
        series = history.runs[run.name]
        plan = self._plans.get(r.id)
        verdict = None
        if plan is not None and series.status == "running":
            verdict = _verdict_now(plan, history)
            if verdict is not None and verdict.ok is False:
                return []  # running, but not what the plan asked for yet: the next poll
        pids = tuple(series.pids)
        if series.status == "running":
            msg = f"running again (pid {', '.join(map(str, pids)) or '?'}) after {r.message}"
        elif series.status == "finished":
            msg = f"ran again and finished ({series.finished_by()}) after {r.message}"
        else:
            msg = f"ran again and died again after {r.message}"
        if not self.store.settle_restart(r.id, "verified", msg, pids=pids):
            return []  # another watcher settled it
        if r.launch is None and r.token:
            # sent by a watcher that stopped before it heard what started: the box's marker
            with contextlib.suppress(ActionError):
                state = await launch_state(host, run.name, run.workdir or "", token=r.token,
                                           launch=None, accept_new_host_keys=self.accept_new)
                if state.mine and state.marker is not None:
                    self.store.record_launch(r.id, launch=state.marker)
        self._plans.pop(r.id, None)
        if plan is not None:
            self.store.record_action(
                who=who(), host=host.name, action="relaunch", phase="verify",
                targets=[{"run": run.name}], command=plan.command, outcome="verified",
                ok=True, message=verdict.message if verdict else msg)
        return [WatchEvent(host.name, run.name, "verified", msg, Severity.INFO)]

    async def _ask_box(self, host: HostConfig, run: RunConfig, series: RunSeries,
                       r: RestartRecord) -> list[WatchEvent]:
        """A sent restart whose run no poll has seen yet: how its launch stands on the box."""
        mark = f"restart:{r.id}"
        try:
            state = await launch_state(host, run.name, run.workdir or "", token=r.token,
                                       launch=r.launch, process=run.process,
                                       accept_new_host_keys=self.accept_new)
        except ActionError as exc:
            return self._once(host.name, run.name, mark, "unasked",
                              f"{r.message}: not running yet, and the box could not be asked "
                              f"how its launch stands ({exc}); asked again next round",
                              Severity.WARNING)
        launch = r.launch
        if launch is None and state.mine and state.marker is not None:
            launch = state.marker  # a watcher stopped before it recorded what it started
            self.store.record_launch(r.id, launch=launch)
        if state.live or state.locked or state.running:
            return self._once(host.name, run.name, mark, "starting",
                              f"{r.message}: still starting: {_starting(state, launch)}",
                              Severity.INFO, kind="starting")
        if launch is not None or state.mine:
            code = state.exit_code
            ended = (f"its launch (shell pid {launch.get('pid') if launch else '?'}) ended"
                     + (f" with status {code}" if code is not None else ""))
        else:
            ended = ("its launch left no trace on the box (the call that sent it never "
                     "started anything there)")
        tail = (series.tail or "").strip().splitlines()[-2:]
        said = f"; its log ends: {' | '.join(tail)}" if tail else ""
        ignored = f"; {state.ignored}" if state.ignored else ""
        msg = f"{r.message} failed: {ended} and no process of the run lives{said}{ignored}"
        if not self.store.settle_restart(r.id, "failed", msg[:2000]):
            return []
        self._plans.pop(r.id, None)
        return [WatchEvent(host.name, run.name, "failed", msg, Severity.CRITICAL)]


def _starting(state: LaunchState, launch: Mapping[str, Any] | None) -> str:
    if state.running:
        return f"a process of the run lives on the box ({state.running}); the next poll sees it"
    if state.live:
        shell = launch.get("pid") if launch else None
        return (f"its launch{f' (shell pid {shell})' if shell else ''} has not ended: pid "
                f"{', '.join(map(str, state.live))} of its session live and the run's own "
                "process has not appeared yet (a setup step before it)")
    return "a relaunch of the run is under way on the box right now"


def _verdict_now(plan: actions.ActionPlan, history: HostHistory) -> actions.ActionOutcome | None:
    try:
        return plan_verdict(plan, history)
    except Exception:  # the verdict is a nicety here: running again is what counts
        return None


def _checkpoint_disk_full(run: RunConfig, history: HostHistory) -> str | None:
    """Why the disk the run's checkpoints (else its workdir) live on is full, or None (U6: a
    restart would die writing its first checkpoint, and may leave a torn one)."""
    snap = history.current
    where = run.resolve(run.checkpoints) or run.workdir
    if snap is None or not where:
        return None
    best = None
    for disk in snap.disks:
        mount = disk.mount or disk.path
        under = where == mount or where.startswith(mount.rstrip("/") + "/")
        if under and (best is None or len(mount) > len(best.mount or best.path)):
            best = disk
    if best is None or not best.bytes_total or best.bytes_free is None:
        return None
    pct = 100.0 * best.bytes_free / best.bytes_total
    if pct < history.thresholds.disk_critical_pct or best.inodes_free == 0:
        return (f"the disk its checkpoints live on ({best.mount or best.path}) is full "
                f"({best.bytes_free} bytes free, {pct:.1f}%); free space first")
    return None


# ---------------------------------------------------------------- the way back (curves)

def resumes_after_nan(history: HostHistory, run_name: str,
                      plan: actions.ActionPlan) -> str | None:
    """Why the watchdog must not send `plan`: it resumes from a checkpoint written after the
    run's loss went NaN, whose weights are likely NaN too (findings/rewind.py); None when it
    does not. A template with {checkpoint_before_anomaly} never does."""
    series = history.runs.get(run_name)
    found = latest_after_nan(history, series) if series is not None else None
    if found is None or plan.command is None or found[1].path not in plan.command:
        return None
    nan, latest, before = found
    back = (f"the newest checkpoint before it is {before.path}" if before is not None
            else "no checkpoint was written before it")
    return (f"{nan.words} and its latest checkpoint {latest.path} was written after that: a "
            f"restart from it would resume the NaN — {back}; put {{checkpoint_before_anomaly}} "
            "in its relaunch command, or relaunch it by hand")
