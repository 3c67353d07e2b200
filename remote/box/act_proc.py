"""What both ops of the action script read of /proc (act.py: signal; act_launch.py: relaunch).

Stdlib only, Python 3.6+, as act.py. The first of the three files sent to the box as one script
(actions/types.py BOX_SCRIPTS): it imports nothing of them, they import from it on the client."""

import os
import pwd

PROCFS = "/proc"
"""Always the real /proc: a signal goes to a real pid, never to a fixture tree's."""


def read_text(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


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


def boot_id() -> str:
    try:
        return read_text(os.path.join(PROCFS, "sys/kernel/random/boot_id")).strip()
    except OSError:
        return ""


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
