"""Planning a relaunch (DESIGN §4, U2): the run's command with its placeholders filled and
quoted, refused while any process of the run is alive or its launch script is being run; a
discovered run relaunched from how it was started."""

import os
import re
import shlex
import time
from collections.abc import Sequence

from ..config.schema import HostConfig
from ..findings.base import slow_start_likely
from ..findings.rewind import Anomaly, written_after
from ..findings.run_curves import checkpoint_before_anomaly
from ..model.history import HostHistory
from ..model.launches import LaunchRecord, RelaunchError
from ..model.resume import relaunch_command
from ..model.series import RunSeries
from ..model.snapshot import Checkpoint, HostSnapshot, ProcessInfo
from ..units import duration
from .gpu_choice import choose_gpus
from .types import (
    DEFAULT_LOG,
    PLACEHOLDERS,
    SHELLS,
    ActionPlan,
    LaunchSpec,
    current_snapshot,
    refused_plan,
)


def quote_path(path: str) -> str:
    """shlex.quote, keeping a leading ~/ expandable (`~/'my runs'`)."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def fill_command(template: str, *, run: str, workdir: str,
                 latest_checkpoint: str | None,
                 checkpoint_before_anomaly: str | None = None) -> str:
    """The relaunch template with {latest_checkpoint}, {checkpoint_before_anomaly},
    {workdir}, {run} replaced by quoted values. Other braces (a shell's ${VAR}, awk's
    {print}) are left alone. ValueError(name) for a checkpoint placeholder with none."""
    def path(p: str | None) -> str | None:
        return quote_path(p) if p is not None else None

    values = {"run": shlex.quote(run), "workdir": quote_path(workdir),
              "latest_checkpoint": path(latest_checkpoint),
              "checkpoint_before_anomaly": path(checkpoint_before_anomaly)}

    def fill(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        if value is None:
            raise ValueError(match.group(1))
        return value

    return PLACEHOLDERS.sub(fill, template)


def _script_words(template: str) -> tuple[str, ...]:
    """Words of the template that may name a launch script (checked on the box, U2)."""
    try:
        words = shlex.split(PLACEHOLDERS.sub("", template))
    except ValueError:
        words = template.split()
    return tuple(dict.fromkeys(w for w in words if w and not w.startswith("-")
                               and "=" not in w and w not in SHELLS))


def plan_relaunch(host: HostConfig, run_name: str, history: HostHistory,
                  launch: LaunchRecord | None = None, *, elsewhere: bool = True) -> ActionPlan:
    """Start a dead run again, from its latest checkpoint when the template asks for one (or,
    for a discovered run, when its framework's resume argument is known).

    Never on a GPU that is broken (a recovery action, a remap pending or failed, fallen off
    the bus, U22): the plan moves the run to free healthy GPUs (CUDA_VISIBLE_DEVICES, said in
    its notes) or, with `elsewhere` False (the watchdog: nobody confirms), is refused saying
    where a person could start it (gpu_choice.choose_gpus).

    A configured run is started from its config (`relaunch`, `workdir`, `process`). A run that
    is not configured was discovered: `launch` is how the store recorded it was
    started while it was alive (discovered.recorded_launch); without one there is nothing to
    start."""
    run = host.run(run_name)
    if run is None:
        if launch is not None and launch.run == run_name:
            return _plan_relaunch_discovered(host, launch, history, elsewhere)
        return refused_plan("relaunch", host, (
            f"no run named {run_name!r} is configured for {host.name}, and gpuwatch never saw "
            "how a run of that name was started (it records a discovered run's cwd, argv and "
            "environment while the run is alive); add it to the config with `relaunch`, "
            "`workdir` and `process`"))
    if not run.relaunch:
        return refused_plan("relaunch", host, f"run {run.name} has no `relaunch` command in the "
                                          "config")
    if not run.workdir:
        return refused_plan("relaunch", host, f"run {run.name} has no `workdir` in the config")
    if not run.process:
        return refused_plan("relaunch", host, (
            f"run {run.name} has no `process` pattern in the config, so gpuwatch cannot tell "
            "whether it is still alive before starting another copy"))
    scripts = _script_words(run.relaunch)
    snap, why = _relaunch_blocked(host, run.name, history, scripts, run.workdir)
    if snap is None:
        return refused_plan("relaunch", host, why or "no snapshot")
    series = history.runs.get(run.name)
    if series is not None and series.status == "finished":
        return refused_plan("relaunch", host, _finished_refusal(run.name, series, run.done))
    latest = series.latest_checkpoint if series else None
    before, anomaly = checkpoint_before_anomaly(history, series) if series else (None, None)
    try:
        command = fill_command(run.relaunch, run=run.name, workdir=run.workdir,
                               latest_checkpoint=latest.path if latest else None,
                               checkpoint_before_anomaly=before.path if before else None)
    except ValueError as exc:
        return refused_plan("relaunch", host, _no_checkpoint(run.name, run.checkpoints, str(exc),
                                                         anomaly))
    log = run.resolve(run.log) if run.log else run.resolve(DEFAULT_LOG)
    assert log is not None
    notes = []
    if run.log is None:
        notes.append(f"run {run.name} has no `log` in the config: output goes to {log}")
    notes += _way_back_notes(run.relaunch, latest, before, anomaly)
    gpus = choose_gpus(history, run.name, tuple(sorted(run.env.items())), command,
                       elsewhere=elsewhere, how=f"`gpuwatch relaunch {host.name} {run.name}`")
    if gpus.refusal is not None:
        return refused_plan("relaunch", host, gpus.refusal)
    notes[:0] = gpus.notes  # first: the person reads it before the rest
    spec = LaunchSpec(run=run.name, workdir=run.workdir, log=log, detach=run.detach,
                      env=gpus.env, process=run.process, scripts=scripts)
    return ActionPlan("relaunch", host.name, (), command, "", None, tuple(notes), spec)


def _no_checkpoint(name: str, glob: str | None, placeholder: str,
                   anomaly: Anomaly | None) -> str:
    """Why a template that names a checkpoint cannot be filled, and what to do."""
    where = (f"`checkpoints = \"{glob}\"` matched nothing" if glob
             else "`checkpoints` is not set for it")
    if placeholder == "checkpoint_before_anomaly" and anomaly is not None:
        return (f"the relaunch command needs {{checkpoint_before_anomaly}} but run {name} has "
                f"no checkpoint written before {anomaly.words}; start it "
                "from scratch, or relaunch it by hand from a checkpoint you trust")
    return (f"the relaunch command needs {{{placeholder}}} but run {name} has no checkpoint "
            f"({where}); fix the glob, or write a relaunch command that starts from scratch")


# ---- the way back: the plan says where it resumes from and what went wrong before it
def _way_back_notes(template: str, latest: Checkpoint | None, before: Checkpoint | None,
                    anomaly: Anomaly | None) -> list[str]:
    """The notes of a relaunch plan about the checkpoint it resumes from: the latest, or
    the newest before the run's latest curve anomaly ({checkpoint_before_anomaly}), and a
    warning where the latest was written after the anomaly began."""
    notes: list[str] = []
    uses_before = "{checkpoint_before_anomaly}" in template
    if uses_before and before is not None:
        notes.append(f"resumes from {before.path}" + (
            f", the newest checkpoint written before it: {anomaly.words}"
            if anomaly is not None else " (its latest: its curves show no anomaly)"))
    elif latest is not None and "{latest_checkpoint}" in template:
        notes.append(f"resumes from {latest.path}")
    elif latest is not None:  # the command starts as written: it names no checkpoint
        notes.append("the relaunch command has no {latest_checkpoint}: it starts as written, "
                     f"not from {latest.path}")
    if anomaly is not None and latest is not None and not uses_before \
            and written_after(latest, anomaly.step, anomaly.wall):
        back = (f"the newest before it is {before.path}" if before is not None
                else "no checkpoint was written before it")
        notes.append(f"{anomaly.words}, and its latest checkpoint {latest.path} was "
                     "written after that, so it may hold the bad state; "
                     f"{back}: put {{checkpoint_before_anomaly}} in the run's relaunch "
                     "command to resume from there")
    elif anomaly is not None and not uses_before:
        notes.append(f"its curves show {anomaly.words}")
    return notes


def _plan_relaunch_discovered(host: HostConfig, launch: LaunchRecord,
                              history: HostHistory, elsewhere: bool = True) -> ActionPlan:
    """A discovered run started again as it was started: the recorded cwd, argv (with the
    resume argument where the framework's convention is known) and environment, less the old
    login's variables and every secret-named one, which are named so the person knows what the
    box must supply (U34, U35)."""
    name = launch.run
    if not launch.process:
        return refused_plan("relaunch", host, (
            f"run {name} was recorded without a command-line pattern, so gpuwatch cannot tell "
            "whether it is still alive before starting another copy; add it to the config"))
    snap, why = _relaunch_blocked(host, name, history, launch.scripts, launch.cwd)
    if snap is None:
        return refused_plan("relaunch", host, why or "no snapshot")
    series = history.runs.get(name)
    if series is not None and series.status == "finished":
        return refused_plan("relaunch", host, _finished_refusal(name, series, None))
    latest = series.latest_checkpoint if series else None
    try:
        command, _dropped, said = relaunch_command(launch, latest)
    except RelaunchError as exc:
        return refused_plan("relaunch", host, str(exc))
    log = launch.log or f"{launch.cwd.rstrip('/') or '/'}/{DEFAULT_LOG}"
    notes = [f"run {name} is not in the config: this is how gpuwatch saw it started "
             f"{_ago(launch.recorded_at)}", *said]
    if launch.log is None:
        notes.append(f"its output went to no file at launch: now to {log}")
    gpus = choose_gpus(history, name, launch.env, command, elsewhere=elsewhere,
                       how=f"`gpuwatch relaunch {host.name} {name}`")
    if gpus.refusal is not None:
        return refused_plan("relaunch", host, gpus.refusal)
    notes[:0] = gpus.notes  # first: the person reads it before the rest
    # A discovered run has no done marker: one whose framework wrote nothing of its end (and
    # that gpuwatch did not start) reads as dead when it ended on its own.
    tail = (series.tail or "").strip().splitlines()[-1:] if series else []
    notes.append("gpuwatch found nothing that says this run finished (no done marker, no end "
                 "written by its framework), but it may have: check the log's end before "
                 "confirming" + (f"; it ends: {tail[0][:160]}" if tail else ""))
    spec = LaunchSpec(run=name, workdir=launch.cwd, log=log, detach=launch.detach,
                      env=gpus.env, process=launch.process, scripts=launch.scripts,
                      in_workdir=True)
    return ActionPlan("relaunch", host.name, (), command, "", None, tuple(notes), spec)


def _finished_refusal(name: str, series: RunSeries, marker: str | None) -> str:
    """Why a finished run is not started again (seed 004), and how to allow it."""
    how = (f"remove its done marker {marker} to run it again" if series.done and marker
           else "start it by hand if it is to train further")
    return f"run {name} finished ({series.finished_by()}); {how}"


def _ago(at: float) -> str:
    return f"{duration(time.time() - at)} ago"




def _relaunch_blocked(host: HostConfig, name: str, history: HostHistory,
                      scripts: Sequence[str], workdir: str
                      ) -> tuple[HostSnapshot | None, str | None]:
    """The fresh snapshot when nothing forbids starting run `name` again; else (None, why): no
    fresh snapshot, a process of the run alive (U4), or its launch script being executed by
    a shell (U2). Only the run's own processes are named: those the probe gave the run
    (probe.match_runs) and shells running the run's own script file."""
    snap, why = current_snapshot(history)
    if snap is None:
        return None, why
    err = snap.gpu_error
    if err is not None and err.meaning.relaunch is not None and not (
            err.kind == "timeout" and slow_start_likely(history)):
        return None, (f"the GPUs of {host.name} cannot be used now ({err.summary}: "
                      f"{err.message}); a new CUDA process would fail at once — "
                      f"{err.meaning.relaunch}")
    series = history.runs.get(name)
    alive = sorted({p.pid for p in snap.processes if p.run == name and not p.zombie}
                   | set(series.pids if series else ()))
    if alive:
        return None, (f"run {name} is running (pid {', '.join(map(str, alive))}); kill it "
                      "first — a kill and a relaunch are never one step")
    for p in snap.processes:
        argv0 = os.path.basename(p.cmd.split(" ", 1)[0]) if p.cmd else ""
        if p.zombie or (p.comm not in SHELLS and argv0 not in SHELLS):
            continue
        hit = _runs_script(p, scripts, workdir)
        if hit is not None:
            return None, (f"{hit} is being executed by pid {p.pid} ({p.cmd}): a shell reads "
                          "its script as it goes, so a second start now risks a duplicate "
                          "run; end it first")
    return snap, None


def _runs_script(shell: ProcessInfo, scripts: Sequence[str], workdir: str) -> str | None:
    """Which of the run's scripts (words of its command, relative to its workdir) the shell's
    arguments name as the same file: a word resolved against the shell's cwd, never a word
    that only looks alike (another folder's run.sh is another run's). Script-like words only
    (a file name with an extension, or a path): `python` in a shell's argv says nothing. The
    box checks open files and argv for real, symlinks resolved (actions_box.still_running)."""
    words = shell.cmd.split()[1:]
    for s in scripts:
        if "." not in os.path.basename(s) and "/" not in s:
            continue
        if s.startswith("~") or workdir.startswith("~"):  # the box's home: not known here
            target = None
        else:
            target = os.path.normpath(os.path.join(workdir, s))
        for w in words:
            if target is None:
                if w == s:
                    return s
            elif (w.startswith("/") or shell.cwd) and \
                    os.path.normpath(os.path.join(shell.cwd or "/", w)) == target:
                return s
    return None
