"""gpuwatch action script: runs ON the box, one action per SSH call (DESIGN §4).

Stdlib only, Python 3.6+ (the probe's rules): the client sends this source and a JSON request
over stdin, exactly as it sends the probe (see actions.py), so the command line carries no
secrets and no text from the box or the config, only the interpreter's name. Nothing read from
the box is executed; the only programs run are `nohup`, `tmux` and `/bin/sh` on a script this
file writes from the request, with every value quoted by shlex.quote.

Requests (unknown keys are ignored):

    {"v": 1, "op": "signal", "boot_id": str, "signal": "TERM" | "KILL", "wait_s": float,
     "tree": bool, "targets": [{"pid": int, "start_ticks": int}, ...]}

        Before each signal the target's identity is re-checked here, in this same call:
        /proc/sys/kernel/random/boot_id against the snapshot's, /proc/PID/stat field 22 (start
        time in clock ticks since boot) against the target's. A mismatch signals nothing. Not
        root: only this login's own processes (a clear "not_yours", never a bare EPERM).
        Where the box has pidfds (Linux 5.3+, Python 3.9+) the pid is opened first, the
        identity re-checked, and the signal sent through that pidfd: it names the process
        that was checked, so a pid reused after the check cannot be hit. Elsewhere os.kill
        follows the check (a window of microseconds). The answer's "via" says which
        ("pidfd" | "kill", with "via_why" for kill).
        tree: also the live descendants of a signalled target that share its session (a dead
        run's dataloader workers and ranks), each checked and signalled the same way. Then
        waits up to wait_s for them to be gone.

    {"v": 1, "op": "relaunch", "run": str, "process": str, "scripts": [str, ...],
     "workdir": str, "log": str, "command": str, "env": {NAME: value}, "detach": "tmux" |
     "setsid", "session": str, "settle_s": float, "in_workdir": bool}

        Refuses while a process of the run is alive: one whose arguments match `process`
        (the probe's argv_match) and whose cwd is the workdir or under it, or whose matching
        argument names a file there (the probe's in_folder; with in_workdir, a discovered
        run's, the cwd must be the workdir itself), or while a shell
        has one of `scripts` open or in its argv (U2). Then starts `command` detached: in a
        new tmux session when asked and tmux is here, else under setsid + nohup; either way
        through a private 0600 script that deletes itself, exports the env and
        PYTHONUNBUFFERED=1 (U2, U43), cds to the workdir and runs the command with stdin from
        /dev/null, stdout and stderr appended to the log (U18). The env never appears in any
        process's argv (U34). The script is written whole or not at all.

        One launch at a time, and never a second while the first lives: the run's private
        folder <workdir>/.gpuwatch (a real folder of this login's, mode 0700; another user's,
        or a link, refuses the relaunch) holds a lock taken for the whole op, and the launch
        marker launch-RUN.json: the launch shell's pid, start time, boot id and session, and
        the request's `token`. While that shell or any process of the session it leads lives
        (a setup step such as `sleep 45; exec python train.py`, or the run), or one of the
        launches the request lists in `guard` ([{pid, start_ticks, boot_id}]) lives, the
        relaunch is refused with "starting": that launch and its live pids. The answer's
        "launch" is the new marker. The wrapper writes the exit record exit-RUN.json there at
        the end through the box's python (O_EXCL | O_NOFOLLOW in the checked folder).

    {"v": 1, "op": "launched", "run": str, "workdir": str, "token": str,
     "launch": {"pid", "start_ticks", "boot_id"} | null, "process": str, "in_workdir": bool}

        How the run's last launch stands: "marker" (the box's, or null), "mine" (its token is
        the request's), "alive" (the live pids of the marker's launch), "alive_named" (of the
        launch the request names), "locked" (a relaunch holds the run's lock now),
        "exit_code" (its wrapper's record, when the marker is the request's launch),
        "running" (why a process of the run is alive, as a relaunch would refuse: `process`
        matched in the workdir) and "ignored" (a file that failed the ownership checks, and
        why).

        Paths and the command are bytes on the box: a file name that is not UTF-8 reaches the
        client from the probe with its bytes as lone surrogates (Python's surrogateescape),
        and comes back here the same way; fs_bytes turns it into the very same bytes.

Answer: one JSON object on stdout: {"v": 1, "op", "boot_id", "euid", "step", ...}; "refused":
reason when the whole request was refused; "failed": what went wrong and at which step when the
script itself failed (never a bare traceback: the client audits what it is told).

The script is three files, sent as one in this order (actions/types.py BOX_SCRIPTS):
act_proc.py (what both ops read of /proc), act_launch.py (relaunch) and this one (the request,
signal, main). On the client each imports what it uses from the ones before it; on the box
there is no package, and their sources, sent ahead, have defined those names already.
"""

import errno
import json
import os
import signal
import sys
import time

if __package__:  # imported on the client; on the box these files came ahead in the one script
    from .act_launch import (  # noqa: F401 (re-exported: the client's tests import them here)
        ENV_NAME,
        EXIT_RECORD_DIR,
        SESSION_NAMES,
        SESSION_PREFIXES,
        SHELLS,
        argv_match,
        cmdline,
        cmdline_bytes,
        exit_record_path,
        expand,
        fs_bytes,
        fs_text,
        in_run_folder,
        is_binary,
        launch_script,
        log_tail,
        op_launched,
        op_relaunch,
        open_fds_to,
        read_cwd,
        settle,
        start_setsid,
        start_tmux,
        still_running,
        tmux_session_name,
        unencodable,
        within,
        write_script,
    )
    from .act_proc import (
        all_stats,
        boot_id,
        own_family,
        proc_stat,
        proc_uid,
        user_name,
    )

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
# Looked up by name: both are new in Python 3.9, and a 3.6 box has neither.
PIDFD_OPEN = getattr(os, "pidfd_open", None)
PIDFD_SEND = getattr(signal, "pidfd_send_signal", None)


def gone(pid: int, start_ticks: int) -> bool:
    """Exited: no such pid, another process under that pid, or a zombie (it is dead and has
    let go of its memory; only its exit status waits for the parent)."""
    st = proc_stat(pid)
    return st is None or st["start_ticks"] != start_ticks or st["state"] in ("Z", "X")


# ---------------------------------------------------------------- signal

def simulated_procfs(targets: "list") -> "str | None":
    """The fixture /proc the probe was pointed at, where a target's pid there is not a real
    process: a test's tree names pids that are not real. A view whose processes' stat is a
    link to this machine's /proc/PID/stat (gpuwatch --demo's boxes) names real ones: None."""
    root = os.environ.get("GPUWATCH_PROCFS")
    if not root or os.path.realpath(root) == "/proc":
        return None
    for target in targets:
        pid = str(int(target["pid"]))
        stat = os.path.join(root, pid, "stat")
        if os.path.realpath(stat) != os.path.join("/proc", pid, "stat"):
            return root
    return None


def check_target(target: dict, euid: int) -> "tuple":
    """(status, stat) for one target before signalling it; status None means go ahead."""
    pid, start = int(target["pid"]), int(target["start_ticks"])
    st = proc_stat(pid)
    if st is None:
        return "gone", None
    if st["start_ticks"] != start:
        return "mismatch", st
    if st["state"] in ("Z", "X"):
        return "defunct", st
    if pid <= 1:
        return "refused", st
    uid = proc_uid(pid)
    if euid != 0 and uid != euid:
        return "not_yours", st
    return None, st


def pidfd_missing() -> "str | None":
    """Why this box signals by pid (os.kill right after the identity check), or None when it
    has pidfds and every signal goes through one."""
    if PIDFD_OPEN is None or PIDFD_SEND is None:
        return "Python {}.{} has no os.pidfd_open (3.9+)".format(*sys.version_info[:2])
    try:
        fd = PIDFD_OPEN(os.getpid())
    except OSError as exc:  # ENOSYS: a kernel before 5.3
        return f"this kernel has no pidfd_open (Linux 5.3+): {exc.strerror or exc}"
    os.close(fd)
    return None


def send(pid: int, sig: int, pidfd: "int | None" = None) -> str:
    """Signal by pidfd (exactly the process it was opened on) or, without one, by pid."""
    try:
        if pidfd is not None and PIDFD_SEND is not None:
            PIDFD_SEND(pidfd, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "eperm"
    except OSError as exc:
        return "eperm" if exc.errno == errno.EPERM else "error"
    return "signalled"


def open_pidfd(pid: int) -> "tuple":
    """(fd, None) for a pidfd on pid; (None, "gone") when no such process exists; (None, None)
    when the pid cannot be opened this way (then os.kill after the check, as without pidfds)."""
    if PIDFD_OPEN is None:
        return None, None
    try:
        return PIDFD_OPEN(pid), None
    except ProcessLookupError:
        return None, "gone"
    except (OSError, OverflowError):  # a thread's id, or no pid at all: the check decides
        return None, None


def signal_checked(target: dict, euid: int, sig: int, use_pidfd: bool,
                   family: "set") -> "tuple":
    """(status, stat, via) for one target: open it (pidfd), re-check its identity, signal.
    With a pidfd there is no window (DESIGN §4): if /proc/PID/stat shows the target's start
    time after the fd was opened, the target held the pid then, and as it is older than the
    fd, it is the process the fd holds; the signal goes to that process alone, even if it
    exits and its pid is reused before the signal."""
    pid = int(target["pid"])
    fd, early = open_pidfd(pid) if use_pidfd else (None, None)
    if early is not None:
        return early, None, "pidfd"
    via = "pidfd" if fd is not None else "kill"
    try:
        status, st = check_target(target, euid)
        if status is None and pid in family:
            status = "refused"
        if status is None:
            status = send(pid, sig, fd)
        return status, st, via
    finally:
        if fd is not None:
            os.close(fd)


def session_children(roots: "list", stats: "dict", skip: "set") -> "list":
    """Live descendants of the roots that share their root's session, parents first."""
    children = {}  # type: dict
    for st in stats.values():
        children.setdefault(st["ppid"], []).append(st)
    found, seen = [], set(skip)
    for root in roots:
        stack = [root]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child["pid"] in seen or child["state"] in ("Z", "X"):
                    continue
                if child["session"] != stats[root]["session"]:
                    continue
                seen.add(child["pid"])
                found.append((child, root))
                stack.append(child["pid"])
    return found


def op_signal(req: dict, out: dict) -> dict:
    out.update(op="signal", results=[], alive=[])
    fake = simulated_procfs(req.get("targets") or [])
    if fake:
        out["refused"] = (f"this box's /proc is a simulated tree (GPUWATCH_PROCFS={fake}): its "
                          "pids are not real processes, nothing was signalled")
        return out
    name = str(req.get("signal"))
    if name not in SIGNALS:
        out["refused"] = f"unknown signal {name!r} (TERM or KILL)"
        return out
    now_boot = boot_id()
    if not now_boot or now_boot != req.get("boot_id"):
        out["refused"] = (f"the box's boot id is {now_boot or 'unreadable'}, not "
                          f"{req.get('boot_id')} as in the snapshot: it rebooted since, so "
                          "every pid seen then is gone; nothing was signalled")
        return out
    sig, euid = SIGNALS[name], os.geteuid()
    out["step"] = "checking for pidfds"
    why_not = pidfd_missing()
    out["via"] = "kill" if why_not else "pidfd"
    if why_not:
        out["via_why"] = why_not
    family = own_family()
    signalled = []
    out["step"] = "signalling"
    for target in req.get("targets") or []:
        status, st, via = signal_checked(target, euid, sig, not why_not, family)
        pid = int(target["pid"])
        row = {"pid": pid, "start_ticks": int(target["start_ticks"]), "via": via}  # type: dict
        if st is not None:
            row.update(now_start_ticks=st["start_ticks"], state=st["state"],
                       user=user_name(proc_uid(pid)))
        if status == "signalled":
            signalled.append((pid, st["start_ticks"]))
        row["status"] = status
        out["results"].append(row)
    if req.get("tree") and signalled:
        stats = all_stats()
        roots = [pid for pid, _ in signalled if pid in stats]
        for child, root in session_children(roots, stats, family | {p for p, _ in signalled}):
            status, st, via = signal_checked(child, euid, sig, not why_not, family)
            row = {"pid": child["pid"], "start_ticks": child["start_ticks"], "child_of": root,
                   "state": child["state"], "user": user_name(proc_uid(child["pid"])),
                   "status": status, "via": via}
            if status == "signalled":
                signalled.append((child["pid"], child["start_ticks"]))
            out["results"].append(row)
    out["step"] = "waiting for them to exit"
    deadline = time.monotonic() + max(0.0, float(req.get("wait_s") or 0.0))
    waiting = list(signalled)
    while waiting:
        waiting = [(p, s) for p, s in waiting if not gone(p, s)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    out["alive"] = [[p, s] for p, s in waiting]
    return out


# ---------------------------------------------------------------- main

def main() -> None:
    out = {"step": "reading the request"}  # type: dict
    try:
        req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
        if not isinstance(req, dict):
            raise ValueError("the request is not an object")
    except ValueError as exc:
        out["refused"] = f"unreadable request: {exc}"
    else:
        run_op(req, out)
    out.update(v=1, boot_id=boot_id(), euid=os.geteuid())
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


def run_op(req: dict, out: dict) -> None:
    """The asked op, into out. Whatever fails in it is said in the answer ("failed", naming
    the step), never a bare traceback: the client writes what it is told to the audit log."""
    op = req.get("op")
    try:
        if op == "signal":
            op_signal(req, out)
        elif op == "relaunch":
            op_relaunch(req, out)
        elif op == "launched":
            op_launched(req, out)
        else:
            out["refused"] = f"unknown op {op!r}"
    except Exception as exc:  # reported to the client, which audits it
        out.pop("_child", None)
        out["failed"] = (f"the action script failed while {out.get('step', 'starting')}: "
                         f"{type(exc).__name__}: {exc}")
