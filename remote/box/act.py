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

        Paths and the command are bytes on the box: a file name that is not UTF-8 reaches the
        client from the probe with its bytes as lone surrogates (Python's surrogateescape),
        and comes back here the same way; fs_bytes turns it into the very same bytes.

Answer: one JSON object on stdout: {"v": 1, "op", "boot_id", "euid", "step", ...}; "refused":
reason when the whole request was refused; "failed": what went wrong and at which step when the
script itself failed (never a bare traceback: the client audits what it is told).
"""

import errno
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PROCFS = "/proc"
"""Always the real /proc: a signal goes to a real pid, never to a fixture tree's."""
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish", "tcsh", "csh")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The login's own variables (as in discover.py; each box script is sent alone): a detached
# run does not inherit the SSH session that started it (U34).
SESSION_NAMES = ("TERM", "STY", "DISPLAY", "SHLVL", "PWD", "OLDPWD", "_", "WINDOW",
                 "TERMCAP", "COLUMNS", "LINES", "MAIL")
SESSION_PREFIXES = ("SSH_", "TMUX", "XDG_SESSION_")
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
# Looked up by name: both are new in Python 3.9, and a 3.6 box has neither.
PIDFD_OPEN = getattr(os, "pidfd_open", None)
PIDFD_SEND = getattr(signal, "pidfd_send_signal", None)


def fs_bytes(text: str) -> bytes:
    """A path or command line as the box's bytes. The probe reads names with the box's file
    system encoding and surrogateescape, so a name that is not UTF-8 travels as lone
    surrogates; os.fsencode gives back its very bytes. Text the box's encoding cannot hold (a
    UTF-8 name from the config on a 3.6 box in the C locale, whose encoding is ASCII) is UTF-8,
    with any surrogates still their bytes. Raises UnicodeEncodeError for a lone surrogate that
    no byte stands for (not from a file name)."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


def fs_text(raw: bytes) -> str:
    """The inverse of fs_bytes, for the JSON answer (never fails)."""
    return os.fsdecode(raw)


def read_text(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def boot_id() -> str:
    try:
        return read_text(os.path.join(PROCFS, "sys/kernel/random/boot_id")).strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> "dict | None":
    """The fields of /proc/PID/stat an identity needs; None when the pid does not exist."""
    try:
        data = read_text(os.path.join(PROCFS, str(pid), "stat"))
    except OSError:
        return None
    try:
        right = data.rindex(")")  # comm may hold spaces and ')': split on the LAST ')'
        rest = data[right + 2:].split()
        return {"pid": pid, "comm": data[data.index("(") + 1:right], "state": rest[0],
                "ppid": int(rest[1]), "session": int(rest[3]), "tty_nr": int(rest[4]),
                "start_ticks": int(rest[19])}
    except (ValueError, IndexError):
        return None


def proc_uid(pid: int) -> "int | None":
    try:
        for line in read_text(os.path.join(PROCFS, str(pid), "status")).splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def user_name(uid: "int | None") -> str:
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cmdline_bytes(pid: int) -> "list":
    try:
        with open(os.path.join(PROCFS, str(pid), "cmdline"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a for a in raw.rstrip(b"\0").split(b"\0") if a]


def cmdline(pid: int) -> "list":
    return [a.decode("utf-8", "replace") for a in cmdline_bytes(pid)]


def all_stats() -> "dict":
    out = {}
    for name in os.listdir(PROCFS):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out[st["pid"]] = st
    return out


def own_family() -> "set":
    """This script and its ancestors (the SSH session's shell): never a match or a target."""
    family, pid = set(), os.getpid()
    while pid > 1 and pid not in family:
        family.add(pid)
        st = proc_stat(pid)
        pid = st["ppid"] if st else 0
    return family


def gone(pid: int, start_ticks: int) -> bool:
    """Exited: no such pid, another process under that pid, or a zombie (it is dead and has
    let go of its memory; only its exit status waits for the parent)."""
    st = proc_stat(pid)
    return st is None or st["start_ticks"] != start_ticks or st["state"] in ("Z", "X")


# ---------------------------------------------------------------- signal

def simulated_procfs() -> "str | None":
    root = os.environ.get("GPUWATCH_PROCFS")
    if root and os.path.realpath(root) != "/proc":
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
    fake = simulated_procfs()
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


# ---------------------------------------------------------------- relaunch

def argv_match(argv: "list", words: "list") -> "list | None":
    """The probe's match (probe.argv_match, the same rule: keep them one): the arguments of
    argv where the words of a run's `process` stand in a row, each the word or ending in
    "/" + it; one argument only (a title rewritten in place) is read word by word."""
    if len(argv) == 1:
        argv = argv[0].split()
    n = len(words)
    for i in range(len(argv) - n + 1):  # no zip(strict=): Python 3.6 on the box
        if all(argv[i + j] == w or argv[i + j].endswith("/" + w) for j, w in enumerate(words)):
            return argv[i:i + n]
    return None


def within(path: bytes, root: bytes) -> bool:
    return path == root or path.startswith(root.rstrip(b"/") + b"/")


def in_run_folder(pid: int, args: "list", workdir: bytes, exact: bool) -> bool:
    """The probe's in_folder: the process's cwd is the run's folder (exact: a discovered run,
    whose folder is its launcher's cwd) or under it, or, not exact, the argument that matched
    names a file in it. Compared as the box's bytes, the folder with its symlinks resolved
    (as /proc shows a cwd) and as written."""
    roots = {os.path.realpath(workdir), os.path.normpath(os.path.abspath(workdir))}
    cwd = read_cwd(pid)
    if cwd is not None and (cwd in roots if exact else any(within(cwd, r) for r in roots)):
        return True
    if exact:
        return False
    for arg in args:
        raw = fs_bytes(arg)
        if b"/" in raw and (cwd is not None or raw.startswith(b"/")):
            path = os.path.normpath(os.path.join(cwd or b"/", raw))
            if any(within(path, r) for r in roots):
                return True
    return False


def expand(path: bytes, base: bytes) -> bytes:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(base, path)


def open_fds_to(pid: int, paths: "set") -> "list":
    """Which of paths (bytes) pid has open."""
    fd_dir = fs_bytes(os.path.join(PROCFS, str(pid), "fd"))
    hits = []  # type: list
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return hits
    for name in names[:4096]:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target in paths:
            hits.append(target)
    return hits


def still_running(req: dict, workdir: bytes) -> "str | None":
    """Why the run must not be started again now, or None (U2: a shell mid-script too).
    Paths compared as bytes: a script or folder whose name is not UTF-8 is still found."""
    words = str(req.get("process") or "").split()
    scripts = {}
    for word in req.get("scripts") or []:
        path = os.path.realpath(expand(fs_bytes(str(word)), workdir))
        if os.path.isfile(path) and not is_binary(path):  # an interpreter is not a script
            scripts[path] = str(word)
    family = own_family()
    for pid, st in sorted(all_stats().items()):
        if pid in family or st["state"] in ("Z", "X"):
            continue
        raw_argv = cmdline_bytes(pid)
        argv = [a.decode("utf-8", "replace") for a in raw_argv]
        text = " ".join(argv)
        args = argv_match([a.decode("utf-8", "surrogateescape") for a in raw_argv],
                          words) if words else None
        if args is not None and in_run_folder(pid, args, workdir, bool(req.get("in_workdir"))):
            return (f"run {req.get('run')} is still running: pid {pid} ({text[:200]}) "
                    f"matches its process pattern {req.get('process')!r} in "
                    f"{fs_text(workdir)}")
        if not scripts:
            continue
        held = open_fds_to(pid, set(scripts))
        is_shell = os.path.basename(argv[0]) if argv else ""
        if is_shell in SHELLS or st["comm"] in SHELLS:
            cwd = read_cwd(pid)  # unreadable (another user's): only an absolute path counts
            for arg in raw_argv[1:]:
                if cwd is None and not arg.startswith((b"/", b"~")):
                    continue
                resolved = os.path.realpath(expand(arg, cwd or b"/"))
                if resolved in scripts:
                    held.append(resolved)
        if held:
            return (f"{scripts[held[0]]} is being executed by pid {pid} ({text[:200]}): a "
                    "shell reads a script as it goes, so starting it again now risks a "
                    "duplicate run (U2); end that process first")
    return None


def is_binary(path: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return True


def read_cwd(pid: int) -> "bytes | None":
    try:
        return os.readlink(fs_bytes(os.path.join(PROCFS, str(pid), "cwd")))
    except OSError:
        return None


EXIT_RECORD_DIR = ".gpuwatch"


def exit_record_path(workdir: str, run: str) -> str:
    """Where the launch wrapper records how a relaunched run ended: a file named for the run in
    a .gpuwatch folder of its workdir (the probe reads it there; series.exit_record_path is the
    client's copy of this rule, which a test holds equal)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:80] or "run"
    return f"{workdir.rstrip('/')}/{EXIT_RECORD_DIR}/exit-{safe}.json"


def launch_script(script_path: str, req: dict, workdir: bytes, log: bytes) -> bytes:
    """The private script the detached shell runs: it removes itself first (sh keeps it open,
    so nothing can edit it under the running shell, U2), then sets everything up. Bytes: a
    path in it that is not UTF-8 reaches the shell as its very bytes.

    It wraps the command (seed 004, U3): the command runs in a subshell (an `exit` in it ends
    only that), this shell waits for it and writes its exit status to the run's exit record,
    so that how a run gpuwatch started ended is known, not guessed: 0 finished, 128+N killed
    by signal N, anything else exited N. The last launch's record is removed first. The
    wrapper catches INT, TERM and HUP (a handler, not an ignore: the command still gets the
    default ones) so that a signal to the whole group still leaves it to write the record."""
    q = shlex.quote
    text = fs_text(workdir)
    record = exit_record_path(text, str(req.get("run") or "run"))
    lines = [f"rm -f -- {q(script_path)}"]
    for name, value in sorted((req.get("env") or {}).items()):
        lines.append(f"export {name}={q(str(value))}")
    lines.append("export PYTHONUNBUFFERED=1")  # U43: a detached run's log must not stall
    lines.append(f"cd -- {q(text)} || exit 1")
    lines.append(f"mkdir -p -- {q(os.path.dirname(record))} 2>/dev/null; "
                 f"rm -f -- {q(record)}")
    lines.append("trap : INT TERM HUP")
    # The command's own stdin and output, not this shell's: under tmux the shell must keep the
    # pane's terminal open, or tmux takes the pane for dead and hangs it up (SIGHUP).
    lines += ["(", str(req["command"]), ") </dev/null >>" + q(fs_text(log)) + " 2>&1"]
    run_json = json.dumps(str(req.get("run") or "run"))
    lines += ["gpuwatch_status=$?",
              f"printf '{{\"v\": 1, \"run\": %s, \"code\": %d}}\\n' {q(run_json)} "
              f"\"$gpuwatch_status\" >{q(record + '.tmp')} 2>/dev/null && "
              f"mv -f -- {q(record + '.tmp')} {q(record)}",
              "exit $gpuwatch_status"]
    return fs_bytes("\n".join(lines) + "\n")


def write_script(req: dict, workdir: bytes, log: bytes) -> str:
    """A new private file (mkstemp: mode 0600, only this user reads it) holding the launch
    script whole, or no file at all: a script cut short would run half a setup."""
    handle, path = tempfile.mkstemp(prefix="gpuwatch-launch-", suffix=".sh")
    try:
        data = memoryview(launch_script(path, req, workdir, log))
        while data:
            data = data[os.write(handle, data):]
    except BaseException:
        os.close(handle)
        os.unlink(path)
        raise
    os.close(handle)
    return path


def unencodable(req: dict) -> "str | None":
    """The first value of a relaunch request that is no text and no file name's bytes."""
    values = [("command", req.get("command")), ("workdir", req.get("workdir")),
              ("log", req.get("log"))]
    values += [(f"env {k}", v) for k, v in (req.get("env") or {}).items()]
    for what, value in values:
        try:
            fs_bytes(str(value or ""))
        except UnicodeEncodeError:
            return what
    return None


def log_tail(path: bytes, size: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tmux_session_name(base: str, tmux: str, env: dict) -> str:
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", base)[:40] or "run"
    for n in range(1, 100):
        name = safe if n == 1 else f"{safe}-{n}"
        taken = subprocess.run([tmux, "has-session", "-t", "=" + name], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10)
        if taken.returncode != 0:
            return name
    return f"{safe}-{os.getpid()}"


def op_relaunch(req: dict, out: dict) -> dict:
    out.update(op="relaunch", run=req.get("run"), step="checking the request")
    env_vars = req.get("env") or {}
    bad = [k for k in env_vars if not ENV_NAME.match(str(k))]
    if bad:
        out["refused"] = f"not an environment variable name: {bad[0]!r}"
        return out
    odd = unencodable(req)
    if odd:
        out["refused"] = (f"the {odd} holds text that is neither UTF-8 nor a file name's bytes "
                          "(a lone surrogate): nothing was started")
        return out
    workdir = os.path.expanduser(fs_bytes(str(req.get("workdir") or "")))
    if not workdir or not os.path.isdir(workdir):
        out["refused"] = "the workdir %s does not exist on the box" % (
            fs_text(workdir) or "(unset)")
        return out
    out["step"] = "checking that no copy of the run is alive"
    busy = still_running(req, workdir)
    if busy:
        out["refused"] = busy
        return out
    out["step"] = "opening the log"
    log = expand(fs_bytes(str(req.get("log") or "gpuwatch-relaunch.log")), workdir)
    out["log"] = fs_text(log)
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        out["refused"] = f"cannot append to the log {fs_text(log)}: {exc.strerror or exc}"
        return out
    # Not the SSH session's own variables (and no TMUX: never nest into someone's session);
    # the run's recorded or configured variables are exported over these by the script.
    env = {k: v for k, v in os.environ.items()
           if k not in SESSION_NAMES and not k.startswith(SESSION_PREFIXES)}
    tmux = shutil.which("tmux") if req.get("detach") == "tmux" else None
    if req.get("detach") == "tmux" and tmux is None:
        out["note"] = "tmux is not installed on the box: started with setsid nohup instead"
    script = None
    try:
        out["step"] = "writing the launch script"
        script = write_script(req, workdir, log)
        out["step"] = "starting it"
        if tmux is not None:
            out.update(start_tmux(tmux, script, req, workdir, env))
        else:
            out.update(start_setsid(script, workdir, env, fd))
        out["step"] = "watching it start"
        settle(out, float(req.get("settle_s") or 1.0), log)
    except (OSError, subprocess.SubprocessError) as exc:
        out["refused"] = f"could not start it ({out['step']}): {exc}"
    finally:
        os.close(fd)
        if script is not None and os.path.exists(script) and out.get("status") != "started":
            os.unlink(script)  # the shell never got to it
    out.pop("_child", None)
    return out


def start_setsid(script: str, workdir: bytes, env: dict, log_fd: int) -> dict:
    """setsid (a new session: no controlling terminal, no SSH session to die with) + nohup
    (SIGHUP ignored, seed 000), stdin /dev/null, output appended to the log."""
    nohup = shutil.which("nohup")
    if nohup:
        argv = [nohup, "/bin/sh", script]
    else:  # what nohup does, by hand: an ignored signal stays ignored across exec
        argv = ["/bin/sh", "-c", "trap '' HUP; exec /bin/sh \"$0\"", script]
    # close_fds=False hands down only what this session itself inherited beyond 0-2 (nothing
    # under OpenSSH; the demo fleet's lifeline pipe under `gpuwatch --demo`): every fd this
    # script opens is non-inheritable (PEP 446), and 0-2 are replaced above.
    child = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                             stdout=log_fd, stderr=log_fd, close_fds=False,
                             start_new_session=True)
    return {"status": "started", "detach": "setsid", "pid": child.pid, "_child": child}


def start_tmux(tmux: str, script: str, req: dict, workdir: bytes, env: dict) -> dict:
    name = tmux_session_name(str(req.get("session") or "gpuwatch"), tmux, env)
    # One string, run by tmux's default-shell -c: the same on tmux 1.x to 3.x.
    shell = f"exec /bin/sh {shlex.quote(script)}"
    done = subprocess.run([tmux, "new-session", "-d", "-s", name, "-c", workdir, shell],
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=20)
    if done.returncode != 0:
        said = done.stdout.decode("utf-8", "replace").strip()[:300]
        raise OSError(f"tmux new-session failed: {said}")
    panes = subprocess.run([tmux, "list-panes", "-t", "=" + name, "-F", "#{pane_pid}"],
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=10)
    pid = None
    for line in panes.stdout.decode().split():
        if line.isdigit():
            pid = int(line)
            break
    return {"status": "started", "detach": "tmux", "session": name, "pid": pid}


def settle(out: dict, settle_s: float, log: bytes) -> None:
    """Give the new process a moment; report it, or that it exited at once (with the log's
    last lines, as data)."""
    child = out.pop("_child", None)
    if out.get("status") != "started":
        return
    pid = out.get("pid")
    deadline = time.monotonic() + max(0.0, settle_s)
    st = proc_stat(pid) if pid else None
    while time.monotonic() < deadline:
        if child is not None and child.poll() is not None:
            break
        st = proc_stat(pid) if pid else None
        if st is None or st["state"] in ("Z", "X"):
            break
        time.sleep(0.05)
    code = child.poll() if child is not None else None
    st = proc_stat(pid) if pid else None
    if code is not None or st is None or st["state"] in ("Z", "X"):
        out["status"] = "exited"
        out["code"] = code
        out["log_tail"] = log_tail(log)
        return
    out["start_ticks"] = st["start_ticks"]
    out["tty_nr"] = st["tty_nr"]
    out["session_id"] = st["session"]


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
        else:
            out["refused"] = f"unknown op {op!r}"
    except Exception as exc:  # reported to the client, which audits it
        out.pop("_child", None)
        out["failed"] = (f"the action script failed while {out.get('step', 'starting')}: "
                         f"{type(exc).__name__}: {exc}")
