"""Sending an action (DESIGN §4): one bounded SSH call (or a local subprocess) each, the box
script over stdin, TERM then KILL as separate calls (U4), every phase audited."""

import asyncio
import contextlib
import functools
import getpass
import json
import os
import shlex
import socket
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.schema import HostConfig
from ..model.history import HostHistory
from ..store import Store
from ..wire.bundle import build_command, strip_source
from .relaunch import quote_path
from .types import (
    BOX_SCRIPTS,
    MAX_STDERR,
    MAX_STDOUT,
    SETTLE_S,
    ActionError,
    ActionOutcome,
    ActionPlan,
    shown_bytes,
    shown_env,
)

# ---------------------------------------------------------------- sending

@functools.cache
def _compressed_script() -> bytes:
    source = "".join(strip_source(path.read_text(encoding="utf-8")) for path in BOX_SCRIPTS)
    source += "main()\n"
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


def audit(store: Store | None, plan: ActionPlan, phase: str, outcome: ActionOutcome,
            label: str) -> None:
    """One audit row. Its text is escaped first (shown_bytes): SQLite takes only valid UTF-8,
    and a path from the box need not be (a row must never be lost to a file name)."""
    if store is None:
        return
    command = _audit_command(plan)
    store.record_action(who=who(), host=plan.host, action=plan.kind, phase=phase,
                        targets=_audit_targets(plan),
                        command=shown_bytes(command) if command is not None else None,
                        outcome=label, ok=outcome.ok, message=shown_bytes(outcome.audited))


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
                  accept_new_host_keys: bool = False, grace_s: float = 10.0,
                  token: str | None = None,
                  guard: Sequence[Mapping[str, Any]] = ()) -> ActionOutcome:
    """Carry a confirmed plan out; every call (refused ones too) lands in the audit log.
    ok None: sent — the next poll verifies (`verify`); False: refused or failed.

    A relaunch: `token` names the launch in the box's launch marker (a new one when None);
    `guard` lists earlier launches ({pid, start_ticks, boot_id}) the box refuses to launch
    beside while any process of theirs lives. The outcome's `launch` is what the box started,
    or the launch still starting that refused it."""
    if readonly:
        outcome = ActionOutcome(False, f"refused: gpuwatch is read-only (--readonly or "
                                       f"`readonly = true`); nothing was sent to {plan.host}")
        audit(store, plan, "execute", outcome, "refused")
        return outcome
    if plan.refusal is not None:
        outcome = ActionOutcome(False, f"refused: {plan.refusal}")
        audit(store, plan, "execute", outcome, "refused")
        return outcome
    if host.name != plan.host:
        outcome = ActionOutcome(False, f"refused: the plan is for {plan.host}, not {host.name}")
        audit(store, plan, "execute", outcome, "refused")
        return outcome
    try:
        if plan.kind == "relaunch":
            outcome, label = await _relaunch(plan, host, accept_new_host_keys,
                                             token or new_token(), guard)
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
        audit(store, plan, "execute", ActionOutcome(False, (
            f"gpuwatch failed while sending the {plan.kind} to {plan.host}: "
            f"{type(exc).__name__}: {exc}; it may or may not have been done")), "failed")
        raise
    audit(store, plan, "execute", outcome, label)
    return outcome


STATUS_TEXT = {
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
        return failed_on_box(plan, doc), "failed"
    results = doc.get("results", []) if doc else []
    signalled = [r for r in results if r.get("status") == "signalled"]
    for r in results:
        lines.append(result_line(r, plan.signal))
    via = via_line(doc)
    if doc is not None and not signalled:
        done = all(r.get("status") in ("gone", "defunct") for r in results)
        ok: bool | None = None if done else False
        return ActionOutcome(ok, "; ".join(lines) or "nothing to signal", "; ".join(via)), (
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
            via = via or via_line(escalated)
    outcome_text = "; ".join(lines) + "; the next poll verifies"
    if lost:
        outcome_text += " (the connection dropped, which a kill can cause: that is not a failure)"
    return ActionOutcome(None, outcome_text, "; ".join(via)), "sent"


async def _escalate(plan: ActionPlan, host: HostConfig, accept_new: bool,
                    alive: Sequence[Mapping[str, int]]) -> dict[str, Any] | None:
    """KILL, in its own call (U4), for what outlived TERM and the grace; identity re-checked."""
    try:
        return await _call(host, _signal_request(plan, alive, "KILL", 2.0),
                           accept_new_host_keys=accept_new)
    except (_Lost, _Unsent, ActionError):
        return None


def via_line(doc: Mapping[str, Any] | None) -> list[str]:
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


def failed_on_box(plan: ActionPlan, doc: Mapping[str, Any]) -> ActionOutcome:
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


def result_line(row: Mapping[str, Any], signal: str) -> str:
    status = str(row.get("status"))
    who_ = f" ({row['user']})" if row.get("user") else ""
    child = f", child of {row['child_of']}" if row.get("child_of") else ""
    pid = row.get("pid")
    if status == "signalled":
        return f"pid {pid}{who_}{child}: {signal} sent"
    return f"pid {pid}{who_}{child}: {STATUS_TEXT.get(status, status)}"


def new_token() -> str:
    """A launch's name in the box's launch marker: which call started it."""
    return uuid.uuid4().hex[:16]


async def _relaunch(plan: ActionPlan, host: HostConfig, accept_new: bool, token: str,
                    guard: Sequence[Mapping[str, Any]]) -> tuple[ActionOutcome, str]:
    spec = plan.launch
    assert spec is not None and plan.command is not None
    request = {"v": 1, "op": "relaunch", "run": spec.run, "process": spec.process,
               "in_workdir": spec.in_workdir,
               "scripts": list(spec.scripts), "workdir": spec.workdir, "log": spec.log,
               "command": plan.command, "env": dict(spec.env), "detach": spec.detach,
               "session": f"gpuwatch-{spec.run}", "settle_s": SETTLE_S, "token": token,
               "guard": [_identity(g) for g in guard]}
    try:
        doc = await _call(host, request, accept_new_host_keys=accept_new)
    except _Lost as exc:
        return ActionOutcome(None, f"the connection dropped while starting run {spec.run} "
                                   f"({exc}); the next poll shows whether it runs"), "sent"
    if doc.get("refused"):
        starting = doc.get("starting") if isinstance(doc.get("starting"), dict) else None
        return ActionOutcome(False, f"refused on {plan.host}: {doc['refused']}",
                             launch=starting), "refused"
    if doc.get("failed"):
        return failed_on_box(plan, doc), "failed"
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
    launch = doc.get("launch") if isinstance(doc.get("launch"), dict) else None
    return ActionOutcome(None, (
        f"started run {spec.run} (launcher pid {doc.get('pid')}: the run's own processes are "
        f"its children) in {where}{note}, output appended to "
        f"{doc.get('log', spec.log)}; the next poll verifies it runs"), launch=launch), "sent"


def _identity(launch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: launch.get(k) for k in ("pid", "start_ticks", "boot_id")}


@dataclass(frozen=True, slots=True)
class LaunchState:
    """How a run's last launch stands on the box (the action script's `launched` op)."""

    marker: Mapping[str, Any] | None
    """The box's launch marker of the run's last launch by gpuwatch (None: none, or ignored)."""
    mine: bool
    """The marker is the launch the asked token names."""
    alive: tuple[int, ...]
    """Live processes of the marker's launch (its shell and its session)."""
    alive_named: tuple[int, ...]
    """Live processes of the launch the caller named."""
    locked: bool
    """A relaunch of the run holds its lock on the box right now."""
    exit_code: int | None
    """The status its wrapper recorded (when the marker is the asked launch and it ended)."""
    ignored: str | None
    """A file of the run's private folder that failed the ownership checks, and why."""
    running: str | None = None
    """Why a process of the run is alive (its `process` pattern matched in its workdir)."""

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.alive) | set(self.alive_named)))


async def launch_state(host: HostConfig, run: str, workdir: str, *, token: str | None,
                       launch: Mapping[str, Any] | None, process: str | None = None,
                       accept_new_host_keys: bool = False) -> LaunchState:
    """Ask the box how the launch `token` (or the one named by `launch`) of a run stands, and
    whether a process of the run (`process` in `workdir`) lives. One bounded call. Raises
    ActionError when it could not be asked or answered."""
    request = {"v": 1, "op": "launched", "run": run, "workdir": workdir, "token": token or "",
               "launch": _identity(launch) if launch else None, "process": process or ""}
    try:
        doc = await _call(host, request, accept_new_host_keys=accept_new_host_keys)
    except (_Unsent, _Lost) as exc:
        raise ActionError(f"{host.name} could not be asked how the launch of run {run} stands "
                          f"({exc})") from None
    if doc.get("refused") or doc.get("failed"):
        raise ActionError(str(doc.get("refused") or doc.get("failed")))
    marker = doc.get("marker") if isinstance(doc.get("marker"), dict) else None
    code = doc.get("exit_code")

    def pids(key: str) -> tuple[int, ...]:
        value = doc.get(key)
        return tuple(p for p in value if isinstance(p, int)) if isinstance(value, list) else ()

    return LaunchState(marker, bool(doc.get("mine")), pids("alive"), pids("alive_named"),
                       bool(doc.get("locked")),
                       code if isinstance(code, int) and not isinstance(code, bool) else None,
                       str(doc["ignored"]) if doc.get("ignored") else None,
                       str(doc["running"]) if doc.get("running") else None)
