"""The watchdog: restart a dead run within its policy, one actor per run (DESIGN §4).

A run with `restart = "on-failure"` is relaunched exactly as the `r` key does it (actions:
plan_relaunch, execute, verify: identity checks, detached, from the latest checkpoint, audited)
when its death is confirmed and its cause is in `restart_on`, at most `max_restarts` times per
`restart_window_s`, each after `restart_delay_s` doubled per restart already in the window.
Never while a process of the run lives (plan_relaunch refuses, U2, U4), never on a finished run
(its status is not `dead`), never while the disk its checkpoints live on is full (U6).

One actor: a watcher acts on a run only while it holds the run's lease in the store (taken in
one IMMEDIATE transaction, renewed each poll, expiring when its holder stops renewing). Each
restart is written to the store *before* it is sent, keyed by the death it answers (the pids
that died), so no death is ever answered twice, whichever watcher comes next. Every watcher —
actor or not — reads the same rows, so the TUI shows what the actor did. Nothing here prints.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config.schema import HostConfig, RunConfig
from ..findings.diagnosis import DEAD_GPU_XIDS, Diagnosis
from ..findings.rules import Finding, HostHistory, Severity
from ..store import RestartRecord, Store
from . import plan as actions
from .execute import who
from .verify import _verdict

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
    lease = store.lease(host, run.name)
    gave_up = bool(records) and records[-1].outcome == "gave_up"
    nxt = (next_allowed(run, records, died_at) if died_at is not None and not gave_up
           and run.restart == "on-failure" and used < run.max_restarts else None)
    return RestartStatus(describe_policy(run), used, run.max_restarts, nxt, gave_up,
                         records[-1] if records else None,
                         lease[0] if lease and lease[1] > now else None)


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
    """Applies the restart policies of a watcher's hosts, poll after poll."""

    def __init__(self, store: Store, holder: str, *, lease_s: float, readonly: bool = False,
                 accept_new_host_keys: bool = False, verify_s: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.holder, self.lease_s = store, holder, lease_s
        self.readonly, self.accept_new, self.verify_s = readonly, accept_new_host_keys, verify_s
        self.clock = clock
        self._said: set[tuple[str, str, str, str]] = set()
        self._plans: dict[int, actions.ActionPlan] = {}

    def release(self) -> None:
        self.store.release_leases(self.holder)

    def _once(self, host: str, run: str, death: str, why: str, message: str,
              severity: Severity = Severity.INFO) -> list[WatchEvent]:
        key = (host, run, death, why)
        if key in self._said:
            return []
        self._said.add(key)
        return [WatchEvent(host, run, "held" if why != "refused" else "refused", message,
                           severity)]

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
            events += await self._act_on(host, run, history)
        return events

    async def _act_on(self, host: HostConfig, run: RunConfig,
                      history: HostHistory) -> list[WatchEvent]:
        now = self.clock()
        series = history.runs.get(run.name)
        if history.current is None or series is None:
            return []
        records = _window(self.store, host.name, run, now)
        death = history.deaths.get(run.name) if series.status == "dead" else None
        key = death_key(death) if death is not None else None
        events = self._settle(host, run, history, records, key, now)
        if series.status == "running" and "run.hung" in run.restart_on:
            return events + await self._kill_hung(host, run, history, records)
        if death is None or key is None:
            return events
        records = _window(self.store, host.name, run, now)
        if any(r.death == key and r.outcome in ("sent", "verified", "gave_up")
               for r in records):
            return events  # this death is answered (by us or another watcher)
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
        return events + await self._restart(host, run, history, key, len(used), now)

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
                       used: int, now: float) -> list[WatchEvent]:
        # nobody confirms here: a run whose GPU broke is not moved to other GPUs (the refusal
        # says where `gpuwatch relaunch` would start it)
        plan = actions.plan_relaunch(host, run.name, history, elsewhere=False)
        if plan.refusal is not None:
            return self._once(host.name, run.name, key, "refused",
                              f"not restarted: {plan.refusal}", Severity.WARNING)
        if self.readonly:
            return self._once(host.name, run.name, key, "readonly",
                              "would be restarted, but gpuwatch is read-only")
        attempt = f"restart {used + 1} of {run.max_restarts} in {_span(run.restart_window_s)}"
        rid = self.store.record_restart(host.name, run.name, death=key, holder=self.holder,
                                        outcome="sent", message=attempt, at=now)
        outcome = await actions.execute(plan, host, store=self.store, readonly=False,
                                        accept_new_host_keys=self.accept_new)
        latest = next((n for n in plan.notes if n.startswith("resumes from")), "from scratch")
        if outcome.ok is False:
            msg = f"{attempt} failed: {outcome.message}"
            self.store.settle_restart(rid, "failed", msg)
            return [WatchEvent(host.name, run.name, "failed", msg, Severity.CRITICAL)]
        self._plans[rid] = plan
        return [WatchEvent(host.name, run.name, "restart",
                           f"died ({history.deaths[run.name].summary}); {attempt}, "
                           f"{latest}", Severity.WARNING)]

    def _settle(self, host: HostConfig, run: RunConfig, history: HostHistory,
                records: Sequence[RestartRecord], key: str | None,
                now: float) -> list[WatchEvent]:
        """Verify sent restarts by this poll: running again (a new process) is verified; still
        the same death after verify_s is a failure."""
        events = []
        series = history.runs[run.name]
        for r in records:
            if r.outcome != "sent":
                continue
            plan = self._plans.pop(r.id, None)
            if series.status == "running" or (key is not None and key != r.death):
                if plan is not None:
                    verdict = _verdict_now(plan, history)
                    if verdict is not None and verdict.ok is False:
                        self._plans[r.id] = plan
                        continue
                    self.store.record_action(
                        who=who(), host=host.name, action="relaunch", phase="verify",
                        targets=[{"run": run.name}], command=plan.command, outcome="verified",
                        ok=True, message=verdict.message if verdict else "running again")
                pids = ", ".join(map(str, series.pids)) or "?"
                msg = f"running again (pid {pids}) after {r.message}"
                self.store.settle_restart(r.id, "verified", msg)
                events.append(WatchEvent(host.name, run.name, "verified", msg, Severity.INFO))
            elif now - r.at > self.verify_s:
                tail = (series.tail or "").strip().splitlines()[-2:]
                said = f"; its log ends: {' | '.join(tail)}" if tail else ""
                msg = (f"{r.message} did not come up within "
                       f"{_span(self.verify_s)}{said}")
                self.store.settle_restart(r.id, "failed", msg[:2000])
                events.append(WatchEvent(host.name, run.name, "failed", msg, Severity.CRITICAL))
            elif plan is not None:
                self._plans[r.id] = plan
        return events


def _verdict_now(plan: actions.ActionPlan, history: HostHistory) -> actions.ActionOutcome | None:
    try:
        return _verdict(plan, history)
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
