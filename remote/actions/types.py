"""What an action is, as data: the plan (which processes, pid, start time, boot id; or which
command), its outcome, and how a plan's text shows env values and the box's bytes. Planned in
plan.py (kill, reap) and relaunch.py, sent by execute.py, judged by verify.py."""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..config.schema import HostConfig
from ..model.history import HostHistory
from ..model.snapshot import HostSnapshot, ProcessInfo
from ..units import mib

ActionKind = Literal["kill", "reap", "relaunch"]
SIGNALS = ("TERM", "KILL")
PLACEHOLDERS = re.compile(r"\{(latest_checkpoint|checkpoint_before_anomaly|workdir|run)\}")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"})
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
"""Env names whose values are shown as *** (U34, U35: a tracker key is a secret)."""
DEFAULT_LOG = "gpuwatch-relaunch.log"
SETTLE_S = 1.0
"""How long the box watches a relaunched run before saying it started (an exit at once, e.g. a
typo in the command, is reported then rather than at the next poll)."""
BOX_SCRIPTS = tuple(Path(__file__).parent.parent / "box" / name
                    for name in ("act_proc.py", "act_launch.py", "act.py"))
"""The action script's files, sent to the box as one script in this order: each defines what
the next ones use (on the client they import it; on the box there is no package)."""
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
                mem = f" {mib(t.gpu_mem_mib)}" if t.gpu_mem_mib is not None else ""
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
    """What happened, in a line or two: what a toast and a verb say."""
    detail: str = ""
    """How it was done (through a pidfd or kill(2), and why): for the audit log, which keeps
    message and detail together; a toast of it read as a wall of text over the Processes."""
    launch: Any = None
    """A relaunch: the launch the box started (its marker: the launch shell's pid, start_ticks,
    boot_id, session, token), or, refused as still starting, the launch in progress with its
    live pids ("alive"); None otherwise."""

    def __post_init__(self) -> None:
        # Box paths may hold bytes that are not UTF-8 (lone surrogates): shown escaped, so the
        # message can go to a terminal, a toast or the audit log as it is.
        object.__setattr__(self, "message", shown_bytes(self.message))
        object.__setattr__(self, "detail", shown_bytes(self.detail))

    @property
    def audited(self) -> str:
        """The audit log's text: the message, then the detail."""
        return f"{self.message} ({self.detail})" if self.detail else self.message


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


def refused_plan(kind: ActionKind, host: HostConfig, reason: str, *, signal: str = "TERM",
             notes: Sequence[str] = ()) -> ActionPlan:
    return ActionPlan(kind, host.name, (), None, signal if kind != "relaunch" else "",
                      reason, tuple(notes))


def process_target(proc: ProcessInfo, boot_id: str) -> ProcessTarget:
    return ProcessTarget(proc.pid, proc.start_ticks, boot_id, proc.user, proc.cmd,
                         proc.gpu_index, proc.gpu_mem_mib)


def family_of(snap: HostSnapshot, roots: Sequence[ProcessInfo]) -> list[ProcessInfo]:
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


def current_snapshot(history: HostHistory) -> tuple[HostSnapshot | None, str | None]:
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
