"""Actions: kill, reap, relaunch (DESIGN §4). Planned from a snapshot, confirmed by a person,
sent as one bounded SSH call each, audited, and verified by the next poll.

A plan is pure data built from the host's history: exactly which processes (pid, start time,
boot id, user, command) or which command it will touch, or why it cannot be done. `describe()`
is the plain text of the confirmation. `execute()` sends it; `verify()` judges a FRESH poll.

Rules this module keeps:

- Identity before every signal. The box-side script (actions_box.py, stdlib, Python 3.6+, sent
  over stdin like the probe) re-reads /proc/sys/kernel/random/boot_id and /proc/PID/stat's start
  time in the same call that signals; a reused pid or a rebooted box is refused there and then.
  Where the box has pidfds (Linux 5.3+, Python 3.9+) it opens the pid first, checks, and signals
  through the pidfd: no window at all between check and signal. The outcome and its audit row
  say which way was used.
- TERM, a grace period, then KILL, each signal its own SSH call (U4). A dropped connection after
  a kill is normal (U1): the outcome is never read from the kill's exit status, it is `None`
  ("sent") until a fresh poll shows the processes gone and the VRAM back.
- A relaunch never shares a call with a kill (U4), refuses while any process of the run is alive
  or its launch script is being executed (U2), and starts the run detached: tmux or setsid +
  nohup, stdin /dev/null, output appended to the log, PYTHONUNBUFFERED=1, the run's env
  exported (U2, U18, U43).
- Config values and box text reach a shell only through shlex.quote; nothing read from the box
  is executed; the SSH command line carries neither (U34).
- Paths are the box's bytes end to end: a file name that is not UTF-8 arrives from the probe
  with its bytes as lone surrogates (surrogateescape), is quoted and sent back that way, and
  the box script turns it into the same bytes. Text for people (the confirmation, outcomes,
  the audit log) shows those bytes escaped (`step-\\xff`): never a UnicodeEncodeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import json
import os
import re
import shlex
import socket
import time
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..config.schema import HostConfig, RunConfig
from ..findings.rules import HostHistory, slow_start_likely
from ..model.discovered import LaunchRecord, RelaunchError, relaunch_command
from ..model.snapshot import HostSnapshot, ProcessInfo
from ..wire.bundle import build_command, strip_source

VERIFY_POLLS = 6
"""Fresh polls after an action before its verdict, for the TUI and the action verbs alike: a
killed process may take a moment to go, a relaunched run a poll or two to show its process."""
VERIFY_PAUSE_S = 1.0

if TYPE_CHECKING:
    from ..model.series import RunSeries
    from ..store import Store

__all__ = [
    "ActionError",
    "ActionOutcome",
    "ActionPlan",
    "LaunchSpec",
    "ProcessTarget",
    "execute",
    "fill_command",
    "plan_kill",
    "plan_reap",
    "plan_relaunch",
    "verify",
]

ActionKind = Literal["kill", "reap", "relaunch"]
SIGNALS = ("TERM", "KILL")
PLACEHOLDERS = re.compile(r"\{(latest_checkpoint|workdir|run)\}")
DETACH_SERVERS = ("tmux", "screen", "SCREEN")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"})
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
"""Env names whose values are shown as *** (U34, U35: a tracker key is a secret)."""
DEFAULT_LOG = "gpuwatch-relaunch.log"
SETTLE_S = 1.0
"""How long the box watches a relaunched run before saying it started (an exit at once, e.g. a
typo in the command, is reported then rather than at the next poll)."""
BOX_SCRIPT = Path(__file__).parent.parent / "box" / "act.py"
MAX_STDOUT = 1024 * 1024
MAX_STDERR = 64 * 1024


# ---------------------------------------------------------------- plans

@dataclass(frozen=True, slots=True)
class ProcessTarget:
    """A process exactly as the person saw it: (pid, start_ticks, boot_id) is its identity."""

    pid: int
    start_ticks: int
    boot_id: str
    user: str | None
    cmd: str
    gpu_index: int | None
    gpu_mem_mib: float | None

    def identity(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "boot_id": self.boot_id,
                "user": self.user, "cmd": self.cmd}


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything a relaunch sends besides the command: what the confirmation shows is what
    runs, even if the config changes between the prompt and the key press."""

    run: str
    workdir: str
    log: str
    detach: str
    env: tuple[tuple[str, str], ...]
    process: str
    scripts: tuple[str, ...]
    """Words of the command that may be a launch script (U2: checked on the box)."""
    in_workdir: bool = False
    """A process counts as the run only when its cwd is the workdir itself (a discovered run:
    its pattern is just its script's name, and another folder's train.py is another run);
    else (a configured run) when its cwd is the workdir or under it, or the argument that
    matched names a file there, as the probe decides (probe.match_runs)."""


@dataclass(frozen=True, slots=True)
class ActionPlan:
    """What an action will do, or why it cannot be done (refusal)."""

    kind: ActionKind
    host: str
    targets: tuple[ProcessTarget, ...]
    command: str | None
    """relaunch: the exact command that will run (placeholders filled, values quoted)."""
    signal: str
    """TERM or KILL (kill/reap): the first signal; TERM escalates to KILL after the grace."""
    refusal: str | None
    """Why it cannot be done; None: it can."""
    notes: tuple[str, ...]
    """What the person should know (e.g. holders that no signal can free)."""
    launch: LaunchSpec | None = None
    """relaunch: where and how the command starts."""

    def describe(self) -> str:
        """Plain text for a confirmation: exactly what will be hit (pid, user, command, host).
        Box text stays plain text here (the TUI escapes Rich markup)."""
        lines: list[str] = []
        if self.kind == "relaunch":
            lines += self._describe_relaunch()
        else:
            lines += self._describe_signal()
        lines += [f"note: {note}" for note in self.notes]
        if self.refusal:
            lines.append(f"cannot {self.kind}: {self.refusal}")
        return shown_bytes("\n".join(lines))

    def _describe_signal(self) -> list[str]:
        if not self.targets:
            return [f"{self.kind} on {self.host}: no process to signal"]
        then = ", then KILL to any that are still alive after a grace period" \
            if self.signal == "TERM" else ""
        n = len(self.targets)
        lines = [f"{self.kind} on {self.host}: send {self.signal} to {n} "
                 f"process{'es' * (n != 1)}{then}:"]
        for t in self.targets:
            gpu = ""
            if t.gpu_index is not None or t.gpu_mem_mib is not None:
                where = f"GPU {t.gpu_index}" if t.gpu_index is not None else "GPU"
                mem = f" {t.gpu_mem_mib:g} MiB" if t.gpu_mem_mib is not None else ""
                gpu = f"  {where}{mem}"
            lines.append(f"  pid {t.pid}  user {t.user or '?'}{gpu}  {t.cmd}")
        lines.append("Each pid's start time and the box's boot id are checked again on the box "
                     "first: a pid reused since this snapshot is not touched.")
        return lines

    def _describe_relaunch(self) -> list[str]:
        spec = self.launch
        if spec is None or self.command is None:
            return [f"relaunch on {self.host}: nothing to start"]
        how = ("in a new tmux session (setsid nohup if the box has no tmux)"
               if spec.detach == "tmux" else "under setsid nohup")
        env = " ".join(f"{k}={shown_env(k, v)}" for k, v in spec.env
                       if k != "PYTHONUNBUFFERED")  # always set to 1 (U43): said once below
        return [
            f"relaunch run {spec.run} on {self.host}, detached {how}:",
            f"  cd {spec.workdir}",
            f"  {self.command}",
            f"  env: {env + ' ' if env else ''}PYTHONUNBUFFERED=1",
            f"  stdin /dev/null; stdout and stderr appended to {spec.log}",
        ]


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """ok: True done (verified), False refused or failed, None sent: the next poll verifies."""

    ok: bool | None
    message: str

    def __post_init__(self) -> None:
        # Box paths may hold bytes that are not UTF-8 (lone surrogates): shown escaped, so the
        # message can go to a terminal, a toast or the audit log as it is.
        object.__setattr__(self, "message", shown_bytes(self.message))


class ActionError(Exception):
    """The box's answer to an action cannot be read."""


def shown_env(name: str, value: str) -> str:
    return "***" if SECRET_NAME.search(name) else value


def shown_bytes(text: str) -> str:
    """Text that can be written anywhere (a terminal, SQLite, JSON): the bytes of a box's file
    name that is not UTF-8 (lone surrogates, from surrogateescape) shown as `\\xff`, any other
    lone surrogate as `\\udXXX`. Valid text is unchanged."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte stands for (not from a file name)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _refused(kind: ActionKind, host: HostConfig, reason: str, *, signal: str = "TERM",
             notes: Sequence[str] = ()) -> ActionPlan:
    return ActionPlan(kind, host.name, (), None, signal if kind != "relaunch" else "",
                      reason, tuple(notes))


def _target(proc: ProcessInfo, boot_id: str) -> ProcessTarget:
    return ProcessTarget(proc.pid, proc.start_ticks, boot_id, proc.user, proc.cmd,
                         proc.gpu_index, proc.gpu_mem_mib)


def _family(snap: HostSnapshot, roots: Sequence[ProcessInfo]) -> list[ProcessInfo]:
    """Descendants of the roots, as the snapshot lists them, that share their root's session:
    a dead run's dataloader workers and ranks go with it; a tmux server's other shells don't."""
    children: dict[int, list[ProcessInfo]] = {}
    for p in snap.processes:
        children.setdefault(p.ppid, []).append(p)
    seen = {r.pid for r in roots}
    found: list[ProcessInfo] = []
    for root in roots:
        stack = [root.pid]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid in seen or child.zombie or child.session != root.session:
                    continue
                seen.add(child.pid)
                found.append(child)
                stack.append(child.pid)
    return found


def _current(history: HostHistory) -> tuple[HostSnapshot | None, str | None]:
    """The fresh snapshot, or why there is none."""
    snap = history.current
    if snap is None:
        if history.failure is not None:
            return None, (f"the last poll of {history.name} failed ({history.failure.message}); "
                          "act on a fresh snapshot")
        return None, f"{history.name} has not been polled yet"
    if not snap.boot_id:
        return None, (f"{history.name} did not report its boot id, so a process's identity "
                      "cannot be checked")
    if "processes" in snap.section_errors:
        return None, (f"the process list of {history.name} could not be read: "
                      f"{snap.section_errors['processes']}")
    return snap, None


def plan_kill(host: HostConfig, history: HostHistory, pid: int,
              signal: str = "TERM") -> ActionPlan:
    """Signal one process the person picked (and its children in its session)."""
    if signal not in SIGNALS:
        return _refused("kill", host, f"unknown signal {signal!r}: use TERM or KILL")
    snap, why = _current(history)
    if snap is None:
        return _refused("kill", host, why or "no snapshot", signal=signal)
    if pid <= 1:
        return _refused("kill", host, f"pid {pid} is not a process gpuwatch signals",
                        signal=signal)
    proc = next((p for p in snap.processes if p.pid == pid), None)
    if proc is None:
        return _refused("kill", host, (
            f"pid {pid} is not in the latest poll of {host.name} (it exited, or it is not a "
            "process gpuwatch lists: GPU holders, runs' processes and their families)"),
            signal=signal)
    assert snap.boot_id is not None
    if proc.zombie:
        return _refused("kill", host, (
            f"pid {pid} is defunct: it is already dead and no signal reaches it; its parent "
            f"(pid {proc.ppid}) has to reap it"), signal=signal)
    notes = []
    if proc.run is not None:
        notes.append(f"pid {pid} belongs to run {proc.run}: this ends that run")
    if proc.comm.startswith(DETACH_SERVERS):
        notes.append(f"pid {pid} is a {proc.comm} server: every session in it ends too")
    family = _family(snap, [proc])
    if family:
        notes.append(f"its {len(family)} child process{'es' * (len(family) != 1)} in the same "
                     "session (workers, ranks) are signalled with it")
    euid = snap.process_counts.euid if snap.process_counts is not None else None
    if euid != 0:  # said to root, it read as a warning that did not apply
        notes.append("only your own processes can be signalled unless you log in as root")
    targets = tuple(_target(p, snap.boot_id) for p in [proc, *family])
    return ActionPlan("kill", host.name, targets, None, signal, None, tuple(notes))


def plan_reap(host: HostConfig, history: HostHistory) -> ActionPlan:
    """End exactly the VRAM zombies zombies.py finds that a signal can free (U11); explain the
    ones it cannot."""
    from ..findings.zombies import zombie_holders

    snap, why = _current(history)
    if snap is None:
        return _refused("reap", host, why or "no snapshot")
    assert snap.boot_id is not None
    holders = zombie_holders(history)
    table = {p.pid: p for p in snap.processes}
    roots: list[ProcessInfo] = []
    notes: list[str] = []
    for h in holders:
        proc = table.get(h.pid) if h.pid is not None else None
        if h.signallable and proc is not None and proc.start_ticks == h.start_ticks:
            roots.append(proc)
        else:
            notes.append(h.explanation)
    if not roots:
        reason = ("no VRAM zombie that a signal can free" if holders
                  else f"no VRAM zombie on {host.name}")
        return _refused("reap", host, reason, notes=notes)
    family = _family(snap, roots)
    if family:
        notes.insert(0, f"{len(family)} child process{'es' * (len(family) != 1)} of those "
                        "holders, in their sessions, go with them")
    targets = tuple(_target(p, snap.boot_id) for p in [*roots, *family])
    return ActionPlan("reap", host.name, targets, None, "TERM", None, tuple(notes))


def quote_path(path: str) -> str:
    """shlex.quote, keeping a leading ~/ expandable (`~/'my runs'`)."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def fill_command(template: str, *, run: str, workdir: str,
                 latest_checkpoint: str | None) -> str:
    """The relaunch template with {latest_checkpoint}, {workdir}, {run} replaced by quoted
    values. Other braces (a shell's ${VAR}, awk's {print}) are left alone."""
    values = {"run": shlex.quote(run), "workdir": quote_path(workdir),
              "latest_checkpoint": (quote_path(latest_checkpoint)
                                    if latest_checkpoint is not None else None)}

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


def _run_config(host: HostConfig, name: str) -> RunConfig | None:
    return next((r for r in host.runs if r.name == name), None)


def plan_relaunch(host: HostConfig, run_name: str, history: HostHistory,
                  launch: LaunchRecord | None = None) -> ActionPlan:
    """Start a dead run again, from its latest checkpoint when the template asks for one (or,
    for a discovered run, when its framework's resume argument is known).

    A configured run is started from its config (`relaunch`, `workdir`, `process`). A run that
    is not configured was discovered (issue 8): `launch` is how the store recorded it was
    started while it was alive (discovered.recorded_launch); without one there is nothing to
    start."""
    run = _run_config(host, run_name)
    if run is None:
        if launch is not None and launch.run == run_name:
            return _plan_relaunch_discovered(host, launch, history)
        return _refused("relaunch", host, (
            f"no run named {run_name!r} is configured for {host.name}, and gpuwatch never saw "
            "how a run of that name was started (it records a discovered run's cwd, argv and "
            "environment while the run is alive); add it to the config with `relaunch`, "
            "`workdir` and `process`"))
    if not run.relaunch:
        return _refused("relaunch", host, f"run {run.name} has no `relaunch` command in the "
                                          "config")
    if not run.workdir:
        return _refused("relaunch", host, f"run {run.name} has no `workdir` in the config")
    if not run.process:
        return _refused("relaunch", host, (
            f"run {run.name} has no `process` pattern in the config, so gpuwatch cannot tell "
            "whether it is still alive before starting another copy"))
    scripts = _script_words(run.relaunch)
    snap, why = _relaunch_blocked(host, run.name, history, scripts, run.workdir)
    if snap is None:
        return _refused("relaunch", host, why or "no snapshot")
    series = history.runs.get(run.name)
    if series is not None and series.status == "finished":
        return _refused("relaunch", host, _finished_refusal(run.name, series, run.done))
    latest = series.latest_checkpoint if series else None
    try:
        command = fill_command(run.relaunch, run=run.name, workdir=run.workdir,
                               latest_checkpoint=latest.path if latest else None)
    except ValueError:
        where = (f"`checkpoints = \"{run.checkpoints}\"` matched nothing"
                 if run.checkpoints else "`checkpoints` is not set for it")
        return _refused("relaunch", host, (
            f"the relaunch command needs {{latest_checkpoint}} but run {run.name} has no "
            f"checkpoint ({where}); fix the glob, or write a relaunch command that starts "
            "from scratch"))
    log = run.resolve(run.log) if run.log else run.resolve(DEFAULT_LOG)
    assert log is not None
    notes = []
    if run.log is None:
        notes.append(f"run {run.name} has no `log` in the config: output goes to {log}")
    if latest is not None:
        notes.append(f"resumes from {latest.path}")
    spec = LaunchSpec(run=run.name, workdir=run.workdir, log=log, detach=run.detach,
                      env=tuple(sorted(run.env.items())), process=run.process, scripts=scripts)
    return ActionPlan("relaunch", host.name, (), command, "", None, tuple(notes), spec)


def _plan_relaunch_discovered(host: HostConfig, launch: LaunchRecord,
                              history: HostHistory) -> ActionPlan:
    """A discovered run started again as it was started: the recorded cwd, argv (with the
    resume argument where the framework's convention is known) and environment, less the old
    login's variables and every secret-named one, which are named so the person knows what the
    box must supply (U34, U35)."""
    name = launch.run
    if not launch.process:
        return _refused("relaunch", host, (
            f"run {name} was recorded without a command-line pattern, so gpuwatch cannot tell "
            "whether it is still alive before starting another copy; add it to the config"))
    snap, why = _relaunch_blocked(host, name, history, launch.scripts, launch.cwd)
    if snap is None:
        return _refused("relaunch", host, why or "no snapshot")
    series = history.runs.get(name)
    if series is not None and series.status == "finished":
        return _refused("relaunch", host, _finished_refusal(name, series, None))
    latest = series.latest_checkpoint if series else None
    try:
        command, _dropped, said = relaunch_command(launch, latest)
    except RelaunchError as exc:
        return _refused("relaunch", host, str(exc))
    log = launch.log or f"{launch.cwd.rstrip('/') or '/'}/{DEFAULT_LOG}"
    notes = [f"run {name} is not in the config: this is how gpuwatch saw it started "
             f"{_ago(launch.recorded_at)}", *said]
    if launch.log is None:
        notes.append(f"its output went to no file at launch: now to {log}")
    # A discovered run has no done marker: one whose framework wrote nothing of its end (and
    # that gpuwatch did not start) reads as dead when it ended on its own.
    tail = (series.tail or "").strip().splitlines()[-1:] if series else []
    notes.append("gpuwatch found nothing that says this run finished (no done marker, no end "
                 "written by its framework), but it may have: check the log's end before "
                 "confirming" + (f"; it ends: {tail[0][:160]}" if tail else ""))
    spec = LaunchSpec(run=name, workdir=launch.cwd, log=log, detach=launch.detach,
                      env=launch.env, process=launch.process, scripts=launch.scripts,
                      in_workdir=True)
    return ActionPlan("relaunch", host.name, (), command, "", None, tuple(notes), spec)


def _finished_refusal(name: str, series: RunSeries, marker: str | None) -> str:
    """Why a finished run is not started again (seed 004), and how to allow it."""
    how = (f"remove its done marker {marker} to run it again" if series.done and marker
           else "start it by hand if it is to train further")
    return f"run {name} finished ({series.finished_by()}); {how}"


def _ago(at: float) -> str:
    minutes = max(0, int((time.time() - at) // 60))
    if minutes < 1:
        return "under a minute ago"
    if minutes < 120:
        return f"{minutes} min ago"
    return f"{minutes // 60} h ago" if minutes < 48 * 60 else f"{minutes // 1440} days ago"




def _relaunch_blocked(host: HostConfig, name: str, history: HostHistory,
                      scripts: Sequence[str], workdir: str
                      ) -> tuple[HostSnapshot | None, str | None]:
    """The fresh snapshot when nothing forbids starting run `name` again; else (None, why): no
    fresh snapshot, a process of the run alive (U4), or its launch script being executed by
    a shell (U2). Only the run's own processes are named: those the probe gave the run
    (probe.match_runs) and shells running the run's own script file."""
    snap, why = _current(history)
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


# ---------------------------------------------------------------- sending

@functools.cache
def _compressed_script() -> bytes:
    source = strip_source(BOX_SCRIPT.read_text(encoding="utf-8")) + "main()\n"
    return zlib.compress(source.encode("utf-8"), 9)


def build_stdin(request: Mapping[str, Any]) -> bytes:
    """The framed box script, then the request (the probe's framing, probe_bundle.py)."""
    script = _compressed_script()
    body = json.dumps(request, separators=(",", ":")).encode()
    return b"%d\n" % len(script) + script + body


class _Unsent(Exception):
    """The call failed before the command could run: nothing happened on the box."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class _Lost(Exception):
    """The connection went away while the command ran: it may or may not have acted (U1)."""


async def _call(host: HostConfig, request: Mapping[str, Any], *,
                accept_new_host_keys: bool) -> dict[str, Any]:
    """One bounded call of the box script. Raises _Unsent (nothing ran), _Lost (it may have),
    ActionError (it ran and answered nonsense)."""
    command = build_command(host.python)
    stdin = build_stdin(request)
    if host.is_local:
        status, out, err = await _local(command, stdin, host.settings.command_timeout)
    else:
        status, out, err = await _remote(host, command, stdin, accept_new_host_keys)
    text = err.decode("utf-8", "replace").strip().splitlines()
    last = text[-1][:200] if text else ""
    if status == 127 and not out:
        raise _Unsent("probe", f"`{host.python}` was not found on {host.name}; set `python` for "
                               "this host")
    try:
        doc = json.loads(out.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("v") != 1:
            raise ValueError("not an action answer")
    except (ValueError, UnicodeDecodeError):
        raise ActionError(f"the action script on {host.name} gave no answer (exit {status}"
                          f"{': ' + last if last else ''})") from None
    return doc


async def _remote(host: HostConfig, command: str, stdin: bytes,
                  accept_new_host_keys: bool) -> tuple[int | None, bytes, bytes]:
    from ..wire import ssh
    from ..wire.collect import ssh_files

    logged_in = False

    @contextlib.asynccontextmanager
    async def opening() -> AsyncIterator[None]:
        nonlocal logged_in
        yield
        logged_in = True  # run_once leaves this context when the login is done

    try:
        result = await ssh.run_once(host.ssh, command, stdin, bounds=host.settings,
                                    **ssh_files(host), accept_new_host_keys=accept_new_host_keys,
                                    max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR,
                                    opening=opening())
    except ssh.SshError as exc:
        if logged_in:
            raise _Lost(exc.message) from None
        raise _Unsent(exc.kind, exc.message) from None
    return result.exit_status, result.stdout, result.stderr


async def _local(command: str, stdin: bytes, deadline: float) -> tuple[int | None, bytes, bytes]:
    """The action on this machine, under the bounds of an SSH exec (remote/wire/local.py): its
    output capped like the remote one's, its process group killed past the deadline."""
    from ..wire import local

    try:
        result = await local.run_async(command, stdin, deadline, max_stdout=MAX_STDOUT,
                                       max_stderr=MAX_STDERR)
    except local.LocalTimeout:
        raise _Lost(f"the action did not finish within command_timeout ({deadline:g} s)") \
            from None
    except OSError as exc:  # nothing ran
        raise _Unsent("probe", f"the action could not be started on this machine ({exc})") \
            from None
    return result.exit_status, result.stdout, result.stderr


# ---------------------------------------------------------------- execute

def who() -> str:
    """The local user@host that asked, for the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _audit_targets(plan: ActionPlan) -> list[dict[str, Any]]:
    if plan.kind == "relaunch":
        rows = [{"run": plan.launch.run if plan.launch else None}]
    else:
        rows = [t.identity() for t in plan.targets]
    return [{k: shown_bytes(v) if isinstance(v, str) else v for k, v in row.items()}
            for row in rows]


def _audit_command(plan: ActionPlan) -> str | None:
    if plan.kind == "relaunch":
        if plan.launch is None:
            return plan.command
        env = " ".join(f"{k}={shlex.quote(shown_env(k, v))}" for k, v in plan.launch.env)
        return (f"[{plan.launch.detach}] cd {quote_path(plan.launch.workdir)} && "
                f"{env + ' ' if env else ''}PYTHONUNBUFFERED=1 {plan.command} "
                f">> {quote_path(plan.launch.log)} 2>&1 < /dev/null")
    return "TERM, grace, KILL" if plan.signal == "TERM" else plan.signal


def _record(store: Store | None, plan: ActionPlan, phase: str, outcome: ActionOutcome,
            label: str) -> None:
    """One audit row. Its text is escaped first (shown_bytes): SQLite takes only valid UTF-8,
    and a path from the box need not be (issue 15: a row must never be lost to a file name)."""
    if store is None:
        return
    command = _audit_command(plan)
    store.record_action(who=who(), host=plan.host, action=plan.kind, phase=phase,
                        targets=_audit_targets(plan),
                        command=shown_bytes(command) if command is not None else None,
                        outcome=label, ok=outcome.ok, message=shown_bytes(outcome.message))


def mark_reaped(plan: ActionPlan, history: HostHistory) -> None:
    """After a reap was sent: each discovered run whose every last-seen process was one of its
    targets is gone, not dead (RunSeries.reaped; zombies.left_behind_runs). Kept in the store
    with the run's state, so a cron `--once` after `gpuwatch reap` knows it too."""
    if plan.kind != "reap":
        return
    targets = {t.pid for t in plan.targets}
    for series in history.runs.values():
        if series.discovery is not None and series.pids and set(series.pids) <= targets:
            series.reaped = True


async def execute(plan: ActionPlan, host: HostConfig, *, store: Store | None, readonly: bool,
                  accept_new_host_keys: bool = False, grace_s: float = 10.0) -> ActionOutcome:
    """Carry a confirmed plan out; every call (refused ones too) lands in the audit log.
    ok None: sent — the next poll verifies (`verify`); False: refused or failed."""
    if readonly:
        outcome = ActionOutcome(False, f"refused: gpuwatch is read-only (--readonly or "
                                       f"`readonly = true`); nothing was sent to {plan.host}")
        _record(store, plan, "execute", outcome, "refused")
        return outcome
    if plan.refusal is not None:
        outcome = ActionOutcome(False, f"refused: {plan.refusal}")
        _record(store, plan, "execute", outcome, "refused")
        return outcome
    if host.name != plan.host:
        outcome = ActionOutcome(False, f"refused: the plan is for {plan.host}, not {host.name}")
        _record(store, plan, "execute", outcome, "refused")
        return outcome
    try:
        if plan.kind == "relaunch":
            outcome, label = await _relaunch(plan, host, accept_new_host_keys)
        else:
            outcome, label = await _signal(plan, host, accept_new_host_keys, grace_s)
    except _Unsent as exc:
        outcome, label = ActionOutcome(False, f"{plan.host} could not be reached ({exc.kind}): "
                                              f"{exc.message} Nothing was done."), "failed"
    except ActionError as exc:
        outcome, label = ActionOutcome(False, str(exc)), "failed"
    except Exception as exc:
        # A bug of gpuwatch's own, after the request may have been sent: the audit log says
        # so before it propagates (the caller reports internal errors).
        _record(store, plan, "execute", ActionOutcome(False, (
            f"gpuwatch failed while sending the {plan.kind} to {plan.host}: "
            f"{type(exc).__name__}: {exc}; it may or may not have been done")), "failed")
        raise
    _record(store, plan, "execute", outcome, label)
    return outcome


_STATUS_TEXT = {
    "gone": "already gone",
    "mismatch": "NOT signalled: its start time changed since the snapshot, so the pid now "
                "belongs to another process",
    "defunct": "already exited (defunct, waiting for its parent to reap it)",
    "not_yours": "NOT signalled: not your process (log in as its user, or as root)",
    "eperm": "NOT signalled: permission denied (EPERM)",
    "refused": "NOT signalled: gpuwatch does not signal this process",
    "error": "NOT signalled: the kill failed",
}


def _signal_request(plan: ActionPlan, targets: Sequence[Mapping[str, int]], signal: str,
                    wait_s: float) -> dict[str, Any]:
    boot_id = plan.targets[0].boot_id if plan.targets else ""
    return {"v": 1, "op": "signal", "boot_id": boot_id, "signal": signal, "wait_s": wait_s,
            "tree": True, "targets": list(targets)}


async def _signal(plan: ActionPlan, host: HostConfig, accept_new: bool,
                  grace_s: float) -> tuple[ActionOutcome, str]:
    """TERM (waiting on the box for them to go), then — in a call of its own — KILL for what is
    left; with signal KILL, KILL only."""
    if any(t.boot_id != plan.targets[0].boot_id for t in plan.targets):
        return ActionOutcome(False, "refused: the targets come from different boots"), "refused"
    # The box waits for the processes inside the call, but never past the command deadline.
    window = max(0.0, host.settings.command_timeout - 5.0)
    first_wait = min(grace_s, window) if plan.signal == "TERM" else min(2.0, window)
    targets = [{"pid": t.pid, "start_ticks": t.start_ticks} for t in plan.targets]
    lines: list[str] = []
    t0 = time.monotonic()
    lost = False
    try:
        doc = await _call(host, _signal_request(plan, targets, plan.signal, first_wait),
                          accept_new_host_keys=accept_new)
    except _Lost as exc:  # U1: a kill may drop the connection; the poll decides
        doc, lost = None, True
        lines.append(f"the connection dropped after {plan.signal} was sent ({exc}); that is "
                     "normal after a kill")
    if doc is not None and doc.get("refused"):
        return ActionOutcome(False, f"refused on {plan.host}: {doc['refused']}"), "refused"
    if doc is not None and doc.get("failed"):
        return _failed_on_box(plan, doc), "failed"
    results = doc.get("results", []) if doc else []
    signalled = [r for r in results if r.get("status") == "signalled"]
    for r in results:
        lines.append(_result_line(r, plan.signal))
    via = _via_line(doc)
    if doc is not None and not signalled:
        done = all(r.get("status") in ("gone", "defunct") for r in results)
        ok: bool | None = None if done else False
        return ActionOutcome(ok, "; ".join(lines + via) or "nothing to signal"), (
            "sent" if done else "refused")
    if plan.signal == "TERM":
        if doc is not None:
            alive = [{"pid": int(p), "start_ticks": int(s)} for p, s in doc.get("alive", [])]
            gone_now = len(signalled) - len(alive)
            if gone_now:
                lines.append(f"{gone_now} exited after TERM")
        else:
            alive = targets  # not known: the KILL call re-checks each identity anyway
        if alive:
            rest = grace_s - (time.monotonic() - t0)
            if rest > 0:
                await asyncio.sleep(rest)
            escalated = await _escalate(plan, host, accept_new, alive)
            lines.append(_kill_line(escalated))
            via = via or _via_line(escalated)
    outcome_text = "; ".join(lines + via) + "; the next poll verifies that they are gone"
    if lost:
        outcome_text += " (a dropped connection is not a failure: U1)"
    return ActionOutcome(None, outcome_text), "sent"


async def _escalate(plan: ActionPlan, host: HostConfig, accept_new: bool,
                    alive: Sequence[Mapping[str, int]]) -> dict[str, Any] | None:
    """KILL, in its own call (U4), for what outlived TERM and the grace; identity re-checked."""
    try:
        return await _call(host, _signal_request(plan, alive, "KILL", 2.0),
                           accept_new_host_keys=accept_new)
    except (_Lost, _Unsent, ActionError):
        return None


def _via_line(doc: Mapping[str, Any] | None) -> list[str]:
    """How the box signalled (DESIGN §4), for the outcome and the audit row: through a pidfd
    (the identity re-checked on the very process signalled: no pid-reuse window) or by pid
    with os.kill right after the check (a box without pidfds)."""
    if not doc or doc.get("via") not in ("pidfd", "kill"):
        return []
    rows = [r for r in doc.get("results", []) if r.get("status") != "gone"]
    if not rows:
        return []
    if all(r.get("via") == "pidfd" for r in rows):
        return ["each pid was opened as a pidfd, its identity re-checked and any signal sent "
                "through it (no pid-reuse window)"]
    why = f": {doc['via_why']}" if doc.get("via_why") else ""
    return [f"each identity was checked, then any signal sent by pid with kill(2) (no pidfd"
            f"{why})"]


def _failed_on_box(plan: ActionPlan, doc: Mapping[str, Any]) -> ActionOutcome:
    return ActionOutcome(False, f"failed on {plan.host}: {doc['failed']}")


def _kill_line(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "KILL after the grace period: no answer from the box (the poll decides)"
    if doc.get("refused"):
        return f"KILL not sent: {doc['refused']}"
    killed = [r for r in doc.get("results", []) if r.get("status") == "signalled"]
    if not killed:
        return "all exited during the grace period; no KILL needed"
    pids = ", ".join(str(r.get("pid")) for r in killed)
    return f"KILL sent to {pids} (still alive after the grace period)"


def _result_line(row: Mapping[str, Any], signal: str) -> str:
    status = str(row.get("status"))
    who_ = f" ({row['user']})" if row.get("user") else ""
    child = f", child of {row['child_of']}" if row.get("child_of") else ""
    pid = row.get("pid")
    if status == "signalled":
        return f"pid {pid}{who_}{child}: {signal} sent"
    return f"pid {pid}{who_}{child}: {_STATUS_TEXT.get(status, status)}"


async def _relaunch(plan: ActionPlan, host: HostConfig,
                    accept_new: bool) -> tuple[ActionOutcome, str]:
    spec = plan.launch
    assert spec is not None and plan.command is not None
    request = {"v": 1, "op": "relaunch", "run": spec.run, "process": spec.process,
               "in_workdir": spec.in_workdir,
               "scripts": list(spec.scripts), "workdir": spec.workdir, "log": spec.log,
               "command": plan.command, "env": dict(spec.env), "detach": spec.detach,
               "session": f"gpuwatch-{spec.run}", "settle_s": SETTLE_S}
    try:
        doc = await _call(host, request, accept_new_host_keys=accept_new)
    except _Lost as exc:
        return ActionOutcome(None, f"the connection dropped while starting run {spec.run} "
                                   f"({exc}); the next poll shows whether it runs"), "sent"
    if doc.get("refused"):
        return ActionOutcome(False, f"refused on {plan.host}: {doc['refused']}"), "refused"
    if doc.get("failed"):
        return _failed_on_box(plan, doc), "failed"
    note = f" ({doc['note']})" if doc.get("note") else ""
    if doc.get("status") == "exited":
        tail = str(doc.get("log_tail") or "").strip().splitlines()[-5:]
        shown = " | ".join(tail) if tail else "(the log is empty)"
        code = doc.get("code")
        return ActionOutcome(False, (
            f"run {spec.run} started but exited at once{f' with status {code}' if code else ''}"
            f"{note}; last lines of {doc.get('log', spec.log)}: {shown}")), "failed"
    if doc.get("status") != "started":
        raise ActionError(f"the action script on {plan.host} gave an unexpected answer")
    where = (f"tmux session {doc.get('session')} (`tmux attach -t {doc.get('session')}`)"
             if doc.get("detach") == "tmux" else "its own session (setsid nohup)")
    return ActionOutcome(None, (
        f"started run {spec.run} as pid {doc.get('pid')} in {where}{note}, output appended to "
        f"{doc.get('log', spec.log)}; the next poll verifies it runs")), "sent"


# ---------------------------------------------------------------- verify

def _tty_bound(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> bool:
    """Dies with the SSH session (seed 000): a terminal, SIGHUP not ignored, and no
    tmux/screen above it."""
    if not proc.has_tty or proc.sighup_ignored:
        return False
    parent, seen = table.get(proc.ppid), {proc.pid}
    while parent is not None and parent.pid not in seen:
        if parent.comm.startswith(DETACH_SERVERS):
            return False
        seen.add(parent.pid)
        parent = table.get(parent.ppid)
    return True


async def verify(plan: ActionPlan, host: HostConfig, history: HostHistory, *,
                 store: Store | None = None) -> ActionOutcome:
    """Judge the action from a FRESH poll (the history's current snapshot): for kill/reap, each
    target gone and no longer holding GPU memory; for relaunch, the run running again and not
    tied to a terminal. `store`: record the verdict in the audit log too."""
    outcome = _verdict(plan, history)
    label = "verified" if outcome.ok else ("not_verified" if outcome.ok is False else "pending")
    _record(store, plan, "verify", outcome, label)
    return outcome


def _verdict(plan: ActionPlan, history: HostHistory) -> ActionOutcome:
    if plan.refusal is not None:
        return ActionOutcome(False, f"nothing to verify: it was refused ({plan.refusal})")
    snap = history.current
    if snap is None:
        why = history.failure.message if history.failure else "no poll yet"
        return ActionOutcome(None, f"cannot verify yet: {history.name} was not polled ({why})")
    if plan.kind == "relaunch":
        return _verify_relaunch(plan, history, snap)
    if plan.targets and snap.boot_id != plan.targets[0].boot_id:
        return ActionOutcome(True, f"{plan.host} rebooted since: every targeted process is gone")
    table = {p.pid: p for p in snap.processes}
    holders = {a.pid for a in snap.gpu_processes}
    alive, holding, defunct = [], [], []
    for t in plan.targets:
        proc = table.get(t.pid)
        same = proc is not None and proc.start_ticks == t.start_ticks
        if same and proc is not None and not proc.zombie:
            alive.append(t.pid)
        elif same and proc is not None:
            defunct.append(t.pid)
        if (t.pid in holders and (proc is None or same)) or (
                same and proc is not None and proc.nvidia_devs):
            holding.append(t.pid)
    if alive or holding:
        parts = []
        if alive:
            parts.append(f"still alive: pid {', '.join(map(str, alive))}")
        if holding:
            parts.append(f"still holding GPU memory: pid {', '.join(map(str, holding))}")
        return ActionOutcome(False, f"on {plan.host}, " + "; ".join(parts))
    gpus = sorted({t.gpu_index for t in plan.targets if t.gpu_index is not None})
    mem = []
    for g in gpus:
        dev = next((d for d in snap.gpus if d.index == g), None)
        if dev is not None and dev.mem_used_mib is not None:
            mem.append(f"GPU {g} now uses {dev.mem_used_mib} MiB")
    extra = f" ({'; '.join(mem)})" if mem else ""
    zombie = ("" if not defunct else
              f"; pid {defunct[0]} has exited and awaits its parent's reaping" if len(defunct) == 1
              else f"; pids {', '.join(map(str, defunct))} have exited and await their parents' "
                   "reaping")
    n = len(plan.targets)
    return ActionOutcome(True, f"{n} process{'es' * (n != 1)} gone from {plan.host} and no "
                               f"longer holding GPU memory{extra}{zombie}")


def _verify_relaunch(plan: ActionPlan, history: HostHistory,
                     snap: HostSnapshot) -> ActionOutcome:
    spec = plan.launch
    name = spec.run if spec else "?"
    series = history.runs.get(name)
    procs = [p for p in snap.processes if p.run == name and not p.zombie]
    pids = sorted({p.pid for p in procs} | set(series.pids if series else ()))
    if not pids:
        tail = (series.tail or "").strip().splitlines()[-3:] if series else []
        said = f"; its log ends: {' | '.join(tail)}" if tail else ""
        return ActionOutcome(False, f"run {name} is not running on {plan.host}{said}")
    table = {p.pid: p for p in snap.processes}
    bound = [p.pid for p in procs if _tty_bound(p, table)]
    if bound:
        return ActionOutcome(False, (
            f"run {name} runs (pid {', '.join(map(str, pids))}) but is tied to a terminal: it "
            f"would die with the SSH session (pid {', '.join(map(str, bound))}, seed 000)"))
    return ActionOutcome(True, f"run {name} is running again on {plan.host} (pid "
                               f"{', '.join(map(str, pids))}), detached from any SSH session")
