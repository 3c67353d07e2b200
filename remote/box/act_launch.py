"""The relaunch and launched ops of the action script (act.py says what they are asked and
answer): refuse while a copy of the run is alive or gpuwatch's last launch of it is still
starting, else start the command detached (tmux, or setsid + nohup) through a private launch
script that records how the run ended; say how the last launch stands. What they keep on the box
lives in the run's private folder (<workdir>/.gpuwatch), trusted only as this login's own.

Stdlib only, Python 3.6+, as act.py. Sent to the box after act_proc.py and before act.py, as one
script (actions/types.py BOX_SCRIPTS): there is no package on the box, and the names imported
below are already defined by act_proc.py's source, sent ahead of this one."""

import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time

if __package__:  # imported on the client; on the box act_proc.py came ahead in the one script
    from .act_proc import PROCFS, all_stats, boot_id, own_family, proc_stat, user_name

SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish", "tcsh", "csh")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The login's own variables (as in discover.py; each box script is sent alone): a detached
# run does not inherit the SSH session that started it (U34).
SESSION_NAMES = ("TERM", "STY", "DISPLAY", "SHLVL", "PWD", "OLDPWD", "_", "WINDOW",
                 "TERMCAP", "COLUMNS", "LINES", "MAIL")
SESSION_PREFIXES = ("SSH_", "TMUX", "XDG_SESSION_")


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


def cmdline_bytes(pid: int) -> "list":
    try:
        with open(os.path.join(PROCFS, str(pid), "cmdline"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a for a in raw.rstrip(b"\0").split(b"\0") if a]


def cmdline(pid: int) -> "list":
    return [a.decode("utf-8", "replace") for a in cmdline_bytes(pid)]


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
                    "duplicate run; end that process first")  # U2
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
LAUNCH_FILE_BYTES = 4096
"""A launch marker is a few hundred bytes; anything larger is not one."""
LOCK_WAIT_S = 20.0
"""How long a relaunch waits for another one of the same run, on the box at once, to finish."""


def exit_record_path(workdir: str, run: str) -> str:
    """Where the launch wrapper records how a relaunched run ended: a file named for the run in
    a .gpuwatch folder of its workdir (the probe reads it there; series.exit_record_path is the
    client's copy of this rule, which a test holds equal)."""
    return f"{workdir.rstrip('/')}/{EXIT_RECORD_DIR}/exit-{safe_name(run)}.json"


def safe_name(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:80] or "run"


# ---------------------------------------------------------------- the run's private folder
#
# The run's .gpuwatch folder holds what gpuwatch keeps on the box about its launches: the exit
# record, the launch marker, the lock. Its workdir may be shared (a team folder another user can
# write), so nothing in it is trusted or followed unless the folder itself is a real folder (not
# a link) owned by this login and writable by it alone, and each file in it is a regular file
# owned by this login with one link. Every file is opened relative to the folder's descriptor
# with O_NOFOLLOW (a folder swapped for a link after the check is never entered), and written
# as a new file (O_CREAT | O_EXCL | O_NOFOLLOW) renamed over the old one.


class Untrusted(Exception):
    """A file or folder gpuwatch keeps on the box that another user could have written."""


def _nofollow_dir_flags() -> int:
    return os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW


def describe_owner(uid: int) -> str:
    return f"user {user_name(uid)} (uid {uid})"


def private_dir(workdir: bytes, create: bool) -> int:
    """A descriptor of <workdir>/.gpuwatch when it is this login's own folder (see above).
    create: make it (mode 0700) when missing, and take write access away from others when it is
    this login's but others may write it. Raises Untrusted (a link, not a folder, another
    user's, others may write it and create is False), FileNotFoundError (missing, create False)
    or another OSError (the workdir is not writable)."""
    path = os.path.join(workdir, fs_bytes(EXIT_RECORD_DIR))
    shown = fs_text(path)
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, _nofollow_dir_flags())
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.lexists(path):
            kind = "a symbolic link" if os.path.islink(path) else "not a folder"
            raise Untrusted(f"{shown} is {kind}") from None
        raise
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if not stat.S_ISDIR(st.st_mode):
            raise Untrusted(f"{shown} is not a folder")
        if st.st_uid != me:
            raise Untrusted(f"{shown} belongs to {describe_owner(st.st_uid)}, not to "
                            f"{describe_owner(me)} who runs gpuwatch's launches")
        if st.st_mode & 0o022:
            if not create:
                raise Untrusted(f"{shown} may be written by other users (mode "
                                f"{st.st_mode & 0o7777:04o})")
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(dir_fd: int, name: str, limit: int = LAUNCH_FILE_BYTES) -> "bytes | None":
    """A file of the private folder, or None when there is none. Raises Untrusted when it is a
    link, not a regular file, another user's, or has other links (a hard link to a file of
    this login's made by someone else), or is larger than limit."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted(f"{name} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{name} is not a regular file")
        if st.st_uid != os.geteuid():
            raise Untrusted(f"{name} belongs to {describe_owner(st.st_uid)}")
        if st.st_nlink != 1:
            raise Untrusted(f"{name} has {st.st_nlink} links")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Untrusted(f"{name} is over {limit} bytes")
    return data


def write_private(dir_fd: int, name: str, data: bytes) -> None:
    """Replace a file of the private folder whole: a new file (O_EXCL | O_NOFOLLOW, 0600)
    renamed over it (a rename replaces a link, never follows it)."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def remove_private(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)  # unlink never follows a link
    except FileNotFoundError:
        pass


def lock_private(dir_fd: int, name: str, wait_s: float, create: bool = True) -> "int | None":
    """An exclusive lock on the run's lock file (flock: released when this process ends, even
    by SIGKILL), or None when another process held it for wait_s. create False: a missing
    lock file is a free lock (a question about the launch writes nothing); raises
    FileNotFoundError then."""
    flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return None
                raise
        time.sleep(0.05)


# The launch wrapper's last step, run by the box's python when the command has ended: the exit
# record written as write_private writes (the folder checked again by its descriptor: it may
# have been swapped since the launch), never through a shell's `>`, which follows links.
EXIT_WRITER = "\n".join([
    "import json, os, sys",
    "d, name, run, code = sys.argv[1:5]",
    "try:",
    "    fd = os.open(d, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0) | os.O_NOFOLLOW)",
    "    st = os.fstat(fd)",
    "    if st.st_uid != os.geteuid() or st.st_mode & 0o022:",
    "        raise OSError('%s is not a folder of this user alone (uid %d, mode %o)'"
    " % (d, st.st_uid, st.st_mode & 0o7777))",
    "    tmp = '.%s.%d.tmp' % (name, os.getpid())",
    "    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,"
    " dir_fd=fd)",
    "    os.write(f, (json.dumps({'v': 1, 'run': run, 'code': int(code)}) + '\\n').encode())",
    "    os.close(f)",
    "    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)",
    "except Exception as exc:",
    "    sys.stderr.write('gpuwatch: the exit record of run %s was not written: %s\\n'"
    " % (run, exc))",
])


# ---------------------------------------------------------------- the launch and its marker


def launch_alive(launch: "dict | None", stats: dict, family: "set") -> "list":
    """The live processes of a launch (its shell, by pid and start time, and every process of
    the session it leads: a launch's setup steps and the run itself, unless they left it) on
    this boot; [] when it has ended. A session id is a pid the kernel does not hand out again
    while the session has a member, so a member of a session named by a pid whose process is
    another one (its start time differs) belongs to a later session: none of the launch's."""
    if not isinstance(launch, dict) or launch.get("boot_id") != boot_id():
        return []
    try:
        pid, ticks = int(launch["pid"]), int(launch["start_ticks"])
    except (KeyError, TypeError, ValueError):
        return []
    if pid <= 1:
        return []  # init (or no pid at all) is never a launch of gpuwatch's
    leader = stats.get(pid)
    if leader is not None and leader["start_ticks"] != ticks:
        return []  # the pid was handed out again: the launch's session had ended
    live = []
    for other, st in stats.items():
        if other in family or st["state"] in ("Z", "X") or st["start_ticks"] < ticks:
            continue
        if other == pid or st["session"] == pid:
            live.append(other)
    return sorted(live)


def read_marker(dir_fd: "int | None", run: str) -> "tuple":
    """(marker or None, why it was ignored or None)."""
    if dir_fd is None:
        return None, None
    try:
        raw = read_private(dir_fd, f"launch-{safe_name(run)}.json")
    except Untrusted as exc:
        return None, f"the launch marker is ignored: {exc}"
    if raw is None:
        return None, None
    try:
        marker = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None, "the launch marker is not JSON: ignored"
    return (marker, None) if isinstance(marker, dict) else (None, "the launch marker is "
                                                            "not an object: ignored")


def busy_launch(req: dict, marker: "dict | None") -> "dict | None":
    """The launch of this run still alive (the box's marker of its last launch by gpuwatch, or
    one the client names in `guard`: what it recorded of its own launches), with its live
    pids; None when none lives."""
    stats = all_stats()
    family = own_family()
    guard = [g for g in (req.get("guard") or []) if isinstance(g, dict)]
    for launch in ([marker] if marker else []) + guard:
        live = launch_alive(launch, stats, family)
        if live:
            return dict(launch, alive=live)
    return None


def starting_text(run: str, launch: dict) -> str:
    age = ""
    if isinstance(launch.get("at"), (int, float)):
        age = f", started {max(0, int(time.time() - launch['at']))} s ago"
    pids = ", ".join(str(p) for p in launch.get("alive") or [])
    return (f"run {run} is still starting: gpuwatch's launch of it (shell pid "
            f"{launch.get('pid')}{age}) has not ended, and pid {pids} of its session live "
            "(a setup step before the run's own process, or the run itself); a second launch "
            "now would start a second copy")


def launch_script(script_path: str, req: dict, workdir: bytes, log: bytes,
                  record_dir: "bytes | None" = None) -> bytes:
    """The private script the detached shell runs: it removes itself first (sh keeps it open,
    so nothing can edit it under the running shell, U2), then sets everything up. Bytes: a
    path in it that is not UTF-8 reaches the shell as its very bytes.

    It wraps the command (seed 004, U3): the command runs in a subshell (an `exit` in it ends
    only that), this shell waits for it and has the box's python write its exit status to the
    run's exit record in record_dir (EXIT_WRITER: never through `>`, which follows a link
    another user may have planted), so that how a run gpuwatch started ended is known, not
    guessed: 0 finished, 128+N killed by signal N, anything else exited N. No record_dir: no
    record (the workdir has no private folder). The wrapper catches INT, TERM and HUP (a
    handler, not an ignore: the command still gets the default ones) so that a signal to the
    whole group still leaves it to write the record."""
    q = shlex.quote
    text = fs_text(workdir)
    run = str(req.get("run") or "run")
    lines = [f"rm -f -- {q(script_path)}"]
    for name, value in sorted((req.get("env") or {}).items()):
        lines.append(f"export {name}={q(str(value))}")
    lines.append("export PYTHONUNBUFFERED=1")  # U43: a detached run's log must not stall
    lines.append(f"cd -- {q(text)} || exit 1")
    lines.append("trap : INT TERM HUP")
    # The command's own stdin and output, not this shell's: under tmux the shell must keep the
    # pane's terminal open, or tmux takes the pane for dead and hangs it up (SIGHUP).
    lines += ["(", str(req["command"]), ") </dev/null >>" + q(fs_text(log)) + " 2>&1"]
    lines.append("gpuwatch_status=$?")
    if record_dir is not None:
        python = sys.executable or "python3"
        record = f"exit-{safe_name(run)}.json"
        lines.append(f"{q(python)} -I -c {q(EXIT_WRITER)} {q(fs_text(record_dir))} "
                     f"{q(record)} {q(run)} \"$gpuwatch_status\" </dev/null >>"
                     f"{q(fs_text(log))} 2>&1")
    lines.append("exit $gpuwatch_status")
    return fs_bytes("\n".join(lines) + "\n")


def write_script(req: dict, workdir: bytes, log: bytes,
                 record_dir: "bytes | None" = None) -> str:
    """A new private file (mkstemp: O_EXCL | O_NOFOLLOW, mode 0600, only this user reads it)
    holding the launch script whole, or no file at all: a script cut short would run half a
    setup."""
    handle, path = tempfile.mkstemp(prefix="gpuwatch-launch-", suffix=".sh")
    try:
        data = memoryview(launch_script(path, req, workdir, log, record_dir))
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
    out["step"] = "checking the run's private folder"
    run = str(req.get("run") or "run")
    try:
        dir_fd = private_dir(workdir, create=True)  # type: int | None
    except Untrusted as exc:
        out["refused"] = (f"{exc}: gpuwatch keeps how its launches of run {run} end there and "
                          "trusts only a folder of your own that nobody else can write; remove "
                          "it (or ask its owner to), then relaunch")
        return out
    except OSError as exc:  # a workdir this login cannot write: no record, said
        dir_fd = None
        out["note"] = (f"no launch marker or exit record is kept: {fs_text(workdir)} is not "
                       f"writable ({exc.strerror or exc})")
    lock = None
    try:
        if dir_fd is not None:
            out["step"] = "waiting for another launch of the run on the box"
            lock = lock_private(dir_fd, f"lock-{safe_name(run)}", LOCK_WAIT_S)
            if lock is None:
                out["refused"] = (f"another launch of run {run} is under way on the box right "
                                  "now; nothing was started")
                out["starting"] = {"locked": True}
                return out
        return _relaunch_locked(req, out, workdir, run, dir_fd)
    finally:
        if lock is not None:
            os.close(lock)  # releases the flock
        if dir_fd is not None:
            os.close(dir_fd)


def _relaunch_locked(req: dict, out: dict, workdir: bytes, run: str,
                     dir_fd: "int | None") -> dict:
    """op_relaunch under the run's lock: no other launch of it on this box at the same time."""
    out["step"] = "checking that no copy of the run is alive"
    busy = still_running(req, workdir)
    if busy:
        out["refused"] = busy
        return out
    marker, ignored = read_marker(dir_fd, run)
    if ignored:
        out["marker_ignored"] = ignored
    live = busy_launch(req, marker)
    if live is not None:
        out["refused"] = starting_text(run, live)
        out["starting"] = live
        return out
    out["step"] = "opening the log"
    log = expand(fs_bytes(str(req.get("log") or "gpuwatch-relaunch.log")), workdir)
    out["log"] = fs_text(log)
    try:
        seen = os.lstat(log)
    except OSError:
        seen = None
    if seen is not None and seen.st_uid != os.geteuid():
        # a shared workdir: a log (or a link in its place) another user made is not written
        # through, or the run's output would land in whatever file it names
        what = "a symbolic link" if stat.S_ISLNK(seen.st_mode) else "a file"
        out["refused"] = (f"the log {fs_text(log)} is {what} of {describe_owner(seen.st_uid)}, "
                          f"not of {describe_owner(os.geteuid())}: gpuwatch does not write "
                          "through a file another user may have put there; remove it or name "
                          "another `log`")
        return out
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
    record_dir = os.path.join(workdir, fs_bytes(EXIT_RECORD_DIR)) if dir_fd is not None else None
    try:
        if dir_fd is not None:
            out["step"] = "removing the last launch's exit record"
            remove_private(dir_fd, f"exit-{safe_name(run)}.json")
        out["step"] = "writing the launch script"
        script = write_script(req, workdir, log, record_dir)
        out["step"] = "starting it"
        if tmux is not None:
            out.update(start_tmux(tmux, script, req, workdir, env))
        else:
            out.update(start_setsid(script, workdir, env, fd))
        out["launch"] = launch_marker(req, out)
        if dir_fd is not None and out["launch"] is not None:
            out["step"] = "writing the launch marker"
            write_private(dir_fd, f"launch-{safe_name(run)}.json",
                          json.dumps(out["launch"]).encode("utf-8"))
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


def launch_marker(req: dict, out: dict) -> "dict | None":
    """What identifies a launch that just started (the box's marker and the client's record):
    its shell's pid and start time on this boot, the session it leads, its token (the client's
    name for it) and when (this box's clock)."""
    pid = out.get("pid")
    st = proc_stat(pid) if pid else None
    if st is None:
        return None
    return {"v": 1, "run": req.get("run"), "token": str(req.get("token") or ""), "pid": pid,
            "start_ticks": st["start_ticks"], "boot_id": boot_id(), "session": pid,
            "at": round(time.time(), 3), "detach": out.get("detach"),
            "tmux": out.get("session")}


def op_launched(req: dict, out: dict) -> dict:
    """How the last launch of a run stands: the box's marker (and whether it is the launch the
    client's token names), the live processes of that launch or of one the client names,
    whether a launch holds the run's lock now, and the exit status its wrapper recorded."""
    run = str(req.get("run") or "run")
    out.update(op="launched", run=run, step="reading the run's private folder")
    workdir = os.path.expanduser(fs_bytes(str(req.get("workdir") or "")))
    dir_fd = None
    try:
        dir_fd = private_dir(workdir, create=False)
    except Untrusted as exc:
        out["ignored"] = f"{exc}: what it holds is ignored"
    except OSError:
        pass  # none: no launch by gpuwatch left anything here
    try:
        marker, ignored = read_marker(dir_fd, run)
        if ignored:
            out["ignored"] = ignored
        token = str(req.get("token") or "")
        out["marker"] = marker
        out["mine"] = bool(marker and token and marker.get("token") == token)
        stats, family = all_stats(), own_family()
        out["alive"] = launch_alive(marker, stats, family)
        theirs = req.get("launch") if isinstance(req.get("launch"), dict) else None
        out["alive_named"] = launch_alive(theirs, stats, family)
        if req.get("process") and os.path.isdir(workdir):
            out["running"] = still_running(req, workdir)
        out["locked"] = False
        if dir_fd is not None:
            try:
                lock = lock_private(dir_fd, f"lock-{safe_name(run)}", 0.0, create=False)
            except FileNotFoundError:
                lock = -1  # no launch ever took it
            out["locked"] = lock is None
            if lock is not None and lock >= 0:
                os.close(lock)
            if out["mine"]:
                try:
                    raw = read_private(dir_fd, f"exit-{safe_name(run)}.json", 512)
                    record = json.loads(raw.decode("utf-8")) if raw else None
                    code = record.get("code") if isinstance(record, dict) else None
                    if isinstance(code, int) and not isinstance(code, bool):
                        out["exit_code"] = code
                except (Untrusted, ValueError) as exc:
                    out["ignored"] = f"the exit record is ignored: {exc}"
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
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
