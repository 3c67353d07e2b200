"""Findings about the runs (run.*): dead, a rank dead, exposed to SIGHUP, stalled or
buffering its log, writing no events, running code changed on disk."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.ack import STOPPED, ack_of
from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.processes import ancestry, dies_with_session, process_table
from ..model.snapshot import ProcessInfo, RunSample
from ..units import duration
from .base import (
    live_runs,
    rule,
    run_procs,
)


@rule({"run.dead": ("U3",)})
def run_dead(history: HostHistory) -> Iterable[Finding]:
    """U3: a run seen running whose processes are all gone (and no done marker, seed 004).
    Critical until it is relaunched, seen finished, or the death is acknowledged (`gpuwatch
    ack`, the TUI's `a`): a babysitter who looks at 3 am must see it red, not a warning one
    poll later. A death gpuwatch was asked for (a kill of the run's processes) and an
    acknowledged one are info. The diagnosis (history.deaths) says why."""
    if history.current is None:
        return
    for name, series in history.runs.items():
        if series.status != "dead":
            continue
        d = history.deaths.get(name)
        new = name in history.new_deaths
        # a process gpuwatch only discovered has no done marker, so a normal exit looks
        # like a kill: report it only with evidence of a death (a status its relaunch's
        # wrapper recorded is evidence enough)
        if getattr(series, "discovery", None) is not None and (
                d is None or (d.cause in ("killed", "unknown")
                              and d.evidence.get("exit_code") is None)):
            continue
        risk = series.work_at_risk_s()
        lost = f"; {duration(risk)} of work since its last checkpoint is lost" if risk else ""
        why = d.summary if d is not None else "it died before gpuwatch could see why"
        ack = ack_of(history.acks, name, d)
        evidence = {"cause": d.cause if d else "unknown",
                    "diagnosis": d.to_json() if d else None, "died_at": d.at if d else None,
                    "pids": list(d.pids) if d else [], "new": new,
                    "latest_checkpoint": series.latest_checkpoint.path
                    if series.latest_checkpoint else None, "work_lost_s": risk}
        ignored = series.errors.get("exit")
        if ignored:  # an exit record another user could have written says nothing (U3)
            evidence["exit_record_ignored"] = ignored
        if ack is not None:
            evidence.update(acknowledged_by=ack.who, acknowledged_at=ack.at, ack=ack.reason)
            said = ("stopped on request by " if ack.reason == STOPPED
                    else "death acknowledged by ") + ack.who
            yield Finding("run.dead", Severity.INFO,
                          f"run {name} is dead: {why} ({said}); relaunch it from its latest "
                          "checkpoint when you want it back", run=name, evidence=evidence)
            continue
        yield Finding(
            "run.dead", Severity.CRITICAL,
            f"run {name} is dead: {why}{lost} — fix the cause, then relaunch it from its "
            "latest checkpoint (or acknowledge it: `gpuwatch ack HOST RUN`, `a` in the TUI)",
            run=name, evidence=evidence)


@rule({"run.rank_dead": ("seed 002",)})
def run_rank_dead(history: HostHistory) -> Iterable[Finding]:
    """Seed 002: one rank of a multi-process (DDP) run died while the others live on. The
    survivors will hang in the next collective until the NCCL timeout (often 30 min or
    more), holding their GPUs: critical while it lasts."""
    if history.current is None:
        return
    for name, d in history.rank_deaths.items():
        series = history.runs.get(name)
        if series is not None and getattr(series, "discovery", None) is not None:
            continue  # a discovered run's grouping is a guess; a rank may just end
        survivors = d.evidence.get("survivors", [])
        yield Finding(
            "run.rank_dead", Severity.CRITICAL,
            f"run {name}: rank pid {', '.join(map(str, d.pids))} died ({d.summary}) while "
            f"{len(survivors)} other rank(s) live on and will hang until the NCCL timeout — "
            "kill the whole run and relaunch it from its latest checkpoint",
            run=name, evidence={"cause": d.cause, "diagnosis": d.to_json(), "died_at": d.at,
                                "dead_pids": list(d.pids), "survivors": survivors})


@rule({"run.sighup_risk": ("seed 000",)})
def run_sighup_risk(history: HostHistory) -> Iterable[Finding]:
    """Seed 000: a run process with a controlling terminal, SIGHUP neither ignored (nohup) nor
    caught, and no tmux/screen above it (setsid would have left it without a tty) dies when
    the SSH session that started it ends."""
    now = history.current
    if now is None:
        return
    table = process_table(now)
    for sample in now.runs:
        exposed = [p for p in run_procs(sample, now) if dies_with_session(p, table)]
        if not exposed:
            continue
        chain = [a.comm for a in ancestry(exposed[0], table)]
        yield Finding(
            "run.sighup_risk", Severity.WARNING,
            f"run {sample.name} (pid {exposed[0].pid}) is tied to a terminal without nohup, "
            "tmux or setsid: it dies when that SSH session drops — relaunch it detached "
            "(tmux, or setsid nohup ... &) at its next checkpoint",
            run=sample.name,
            evidence={"pids": [p.pid for p in exposed], "tty_nr": exposed[0].tty_nr,
                      "session": exposed[0].session, "ancestry": chain})


def _started(procs: Iterable[ProcessInfo]) -> float | None:
    times = [p.started_at for p in procs if p.started_at is not None]
    return min(times) if times else None


def _artifact_mtimes(sample: RunSample) -> dict[str, float]:
    out: dict[str, float] = {}
    files = [f.mtime for f in sample.event_files if f.error is None]
    if files:
        out["events"] = max(files)
    metrics = [m.mtime for m in sample.metrics if m.mtime is not None and m.error is None]
    if metrics:
        out["metrics"] = max(metrics)
    latest = sample.latest_checkpoint
    if latest is not None:
        out["checkpoint"] = latest.mtime
    return out


@rule({"run.stalled": ("U43", "seed 002"), "run.log_buffered": ("U43",)})
def run_progress(history: HostHistory) -> Iterable[Finding]:
    """U43: run.stalled — alive, but no log, event, metric or checkpoint write for stalled_s
    (seed 002: survivors of a dead rank look exactly like this). run.log_buffered — the log
    silent for log_buffered_s while events/metrics/checkpoints were written well after it:
    block-buffered stdout, not a dead run. Both are ages on the box's clock: no history needed."""
    th = history.thresholds
    for now, at, sample in live_runs(history):
        procs = run_procs(sample, now)
        started = _started(procs)
        up = at - started if started is not None else None
        arts = _artifact_mtimes(sample)
        log_mtime = sample.log.mtime if sample.log is not None else None
        times = list(arts.values()) + ([log_mtime] if log_mtime is not None else [])
        if not times:
            continue
        quiet = at - max(times)
        if quiet >= th.stalled_s and (up is None or up >= th.stalled_s):
            only_log = not arts
            yield Finding(
                "run.stalled", Severity.WARNING,
                f"run {sample.name} is alive but has written nothing for {duration(quiet)}"
                + (" (only its log is watched: it may just be block-buffered)"
                   if only_log else "")
                + " — it is likely hung (a dead rank leaves the others waiting in NCCL): "
                "check its log and py-spy dump, then kill and relaunch",
                run=sample.name,
                evidence={"quiet_s": quiet, "log_age_s": None if log_mtime is None
                          else at - log_mtime,
                          "artifact_age_s": {k: at - v for k, v in arts.items()},
                          "uptime_s": up})
            continue
        if log_mtime is None or not arts:
            continue
        log_age = at - log_mtime
        newest_kind, newest = max(arts.items(), key=lambda kv: kv[1])
        if log_age >= th.log_buffered_s and newest - log_mtime >= th.log_buffered_s:
            yield Finding(
                "run.log_buffered", Severity.INFO,
                f"run {sample.name}'s log has been silent for {duration(log_age)} while its "
                f"{newest_kind} was written {duration(at - newest)} ago: stdout is "
                "block-buffered, the run is fine — next time launch with python -u or "
                "PYTHONUNBUFFERED=1",
                run=sample.name,
                evidence={"log_age_s": log_age, "newest": newest_kind,
                          "newest_age_s": at - newest})


@rule({"run.events_empty": ("U39",)})
def run_events_empty(history: HostHistory) -> Iterable[Finding]:
    """U39: events are configured but, after events_grace_s of the run being alive, there is no
    event file there or none holds a scalar: the writer logs somewhere else."""
    th = history.thresholds
    for now, at, sample in live_runs(history):
        if sample.events_path is None:
            continue
        started = _started(run_procs(sample, now))
        if started is None or at - started < th.events_grace_s:
            continue
        if any(f.pending for f in sample.event_files):
            continue  # still reading a big file
        series = history.runs.get(sample.name)
        has_scalars = bool(series and series.event_series)
        if sample.event_files and has_scalars:
            continue
        error = sample.errors.get("events")
        what = ("no event file" if not sample.event_files else
                f"{len(sample.event_files)} event file(s) without a scalar")
        yield Finding(
            "run.events_empty", Severity.WARNING,
            f"run {sample.name} has run {duration(at - started)} but {sample.events_path} "
            f"holds {what}{f' ({error})' if error else ''}: its writer logs elsewhere — check "
            "SummaryWriter(log_dir=...) against the configured events path",
            run=sample.name,
            evidence={"events_path": sample.events_path, "files": len(sample.event_files),
                      "error": error, "uptime_s": at - started})



@rule({"run.code_changed": ("U2", "U42")})
def run_code_changed(history: HostHistory) -> Iterable[Finding]:
    """U2, U42: the script a run process executes was modified on disk after the process
    started: the running code is not the code on disk (bash re-reads scripts mid-run; Python
    tracebacks will show the new lines)."""
    now = history.current
    if now is None:
        return
    for sample in now.runs:
        changed = [p for p in run_procs(sample, now)
                   if p.script_mtime is not None and p.started_at is not None
                   and p.script_mtime > p.started_at + 2.0]  # btime is whole seconds
        if not changed:
            continue
        p = changed[0]
        late = (p.script_mtime or 0.0) - (p.started_at or 0.0)
        bash = p.comm in ("bash", "sh", "dash", "zsh")
        effect = ("bash reads scripts as it goes and may re-run or skip blocks" if bash else
                  "the run still executes the old code")
        yield Finding(
            "run.code_changed", Severity.WARNING,
            f"run {sample.name}: {p.script} changed on disk {duration(late)}"
            f" after pid {p.pid} started — {effect}; version the file instead of overwriting "
            "it, and restart the run if the change must apply",
            run=sample.name,
            evidence={"pid": p.pid, "script": p.script, "script_mtime": p.script_mtime,
                      "started_at": p.started_at, "pids": [c.pid for c in changed]})
