"""Actions: kill, reap, relaunch (DESIGN §4). Planned from a snapshot, confirmed by a person,
sent as one bounded SSH call each, audited, and verified by the next poll.

Planning kill and reap is here; a relaunch's in relaunch.py, the plans' data in types.py,
sending in execute.py, verifying (one loop, one budget) in verify.py. This module re-exports
their names, so `from gpuwatch.remote.actions import plan as actions` gives the whole API.

A plan is pure data built from the host's history: exactly which processes (pid, start time,
boot id, user, command) or which command it will touch, or why it cannot be done. `describe()`
is the plain text of the confirmation. `execute()` sends it; `verify()` judges a FRESH poll.

Rules this module keeps:

- Identity before every signal. The box-side script (box/act.py, stdlib, Python 3.6+, sent
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

from ..config.schema import HostConfig
from ..findings.zombies import zombie_holders
from ..model.history import HostHistory
from ..model.processes import DETACH_SERVERS
from ..model.snapshot import ProcessInfo
from .execute import (
    STATUS_TEXT,
    build_stdin,
    execute,
    failed_on_box,
    mark_reaped,
    result_line,
    via_line,
)
from .relaunch import fill_command, plan_relaunch, quote_path
from .types import (
    BOX_SCRIPTS,
    SIGNALS,
    ActionError,
    ActionKind,
    ActionOutcome,
    ActionPlan,
    LaunchSpec,
    ProcessTarget,
    current_snapshot,
    family_of,
    process_target,
    refused_plan,
)
from .verify import VERIFY_PAUSE_S, VERIFY_POLLS, FreshPoll, verify, verify_until

D_STATE_POLLS = 3
"""Polls in a row a process must be seen in uninterruptible sleep before a plan says so."""


def stuck_notes(history: HostHistory, procs: list[ProcessInfo]) -> list[str]:
    """What a plan says of a target stuck in the kernel: state D (uninterruptible sleep) in
    each of the last D_STATE_POLLS polls, as the same process (pid and start time). A signal
    is only delivered when its kernel call returns: SIGKILL does not free it, and one stuck on
    a wedged GPU holds the GPU until it is reset or the box rebooted (U22). The plan still
    asks: the person decides."""
    snaps = list(history.snapshots)[-D_STATE_POLLS:]
    if len(snaps) < D_STATE_POLLS:
        return []
    notes = []
    for proc in procs:
        stuck = all(any(p.pid == proc.pid and p.start_ticks == proc.start_ticks
                        and p.state == "D" for p in snap.processes) for snap in snaps)
        if stuck:
            notes.append(
                f"pid {proc.pid} has been in uninterruptible sleep (state D) for "
                f"{len(snaps)} polls: SIGKILL will not free it while it waits in the kernel; "
                f"the GPU may need a reset or the box a reboot")
    return notes


def plan_kill(host: HostConfig, history: HostHistory, pid: int,
              signal: str = "TERM") -> ActionPlan:
    """Signal one process the person picked (and its children in its session)."""
    if signal not in SIGNALS:
        return refused_plan("kill", host, f"unknown signal {signal!r}: use TERM or KILL")
    snap, why = current_snapshot(history)
    if snap is None:
        return refused_plan("kill", host, why or "no snapshot", signal=signal)
    if pid <= 1:
        return refused_plan("kill", host, f"pid {pid} is not a process gpuwatch signals",
                        signal=signal)
    proc = next((p for p in snap.processes if p.pid == pid), None)
    if proc is None:
        return refused_plan("kill", host, (
            f"pid {pid} is not in the latest poll of {host.name} (it exited, or it is not a "
            "process gpuwatch lists: GPU holders, runs' processes and their families)"),
            signal=signal)
    assert snap.boot_id is not None
    if proc.zombie:
        return refused_plan("kill", host, (
            f"pid {pid} is defunct: it is already dead and no signal reaches it; its parent "
            f"(pid {proc.ppid}) has to reap it"), signal=signal)
    notes = []
    if proc.run is not None:
        notes.append(f"pid {pid} belongs to run {proc.run}: this ends that run")
    if proc.comm.startswith(DETACH_SERVERS):
        notes.append(f"pid {pid} is a {proc.comm} server: every session in it ends too")
    family = family_of(snap, [proc])
    if family:
        notes.append(f"its {len(family)} child process{'es' * (len(family) != 1)} in the same "
                     "session (workers, ranks) are signalled with it")
    notes.extend(stuck_notes(history, [proc, *family]))
    euid = snap.process_counts.euid if snap.process_counts is not None else None
    if euid != 0:  # said to root, it read as a warning that did not apply
        notes.append("only your own processes can be signalled unless you log in as root")
    targets = tuple(process_target(p, snap.boot_id) for p in [proc, *family])
    return ActionPlan("kill", host.name, targets, None, signal, None, tuple(notes))


def plan_reap(host: HostConfig, history: HostHistory) -> ActionPlan:
    """End exactly the VRAM zombies zombies.py finds that a signal can free (U11); explain the
    ones it cannot."""
    snap, why = current_snapshot(history)
    if snap is None:
        return refused_plan("reap", host, why or "no snapshot")
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
        return refused_plan("reap", host, reason, notes=notes)
    family = family_of(snap, roots)
    if family:
        notes.insert(0, f"{len(family)} child process{'es' * (len(family) != 1)} of those "
                        "holders, in their sessions, go with them")
    notes.extend(stuck_notes(history, [*roots, *family]))
    targets = tuple(process_target(p, snap.boot_id) for p in [*roots, *family])
    return ActionPlan("reap", host.name, targets, None, "TERM", None, tuple(notes))


__all__ = [
    "BOX_SCRIPTS",
    "STATUS_TEXT",
    "VERIFY_PAUSE_S",
    "VERIFY_POLLS",
    "ActionError",
    "ActionKind",
    "ActionOutcome",
    "ActionPlan",
    "FreshPoll",
    "LaunchSpec",
    "ProcessTarget",
    "build_stdin",
    "execute",
    "failed_on_box",
    "fill_command",
    "mark_reaped",
    "plan_kill",
    "plan_reap",
    "plan_relaunch",
    "quote_path",
    "result_line",
    "verify",
    "verify_until",
    "via_line",
]
