"""The processes section: the process table, GPU holders, and the processes of each run.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import pwd
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
host = base.load_module("host")


# ---------------------------------------------------------------- processes

def parse_stat(data):
    """/proc/PID/stat → dict. comm may hold spaces and ')' — split on the LAST ')'."""
    left, right = data.index("("), data.rindex(")")
    rest = data[right + 2:].split()
    return {
        "pid": int(data[:left]), "comm": data[left + 1:right], "state": rest[0],
        "ppid": int(rest[1]), "pgrp": int(rest[2]), "session": int(rest[3]),
        "tty_nr": int(rest[4]), "flags": int(rest[6]), "threads": int(rest[17]),
        "start_ticks": int(rest[19]), "cpu_ticks": int(rest[11]) + int(rest[12]),  # utime+stime
    }


SCRIPT_SUFFIXES = (".py", ".sh", ".bash")


def run_script(pid, cwd):
    """U2, U42: the script a run process executes and its mtime (to compare with the start
    time): the first argument that names a .py/.sh file. (None, None) when there is none."""
    for arg in read_argv(pid)[1:]:
        if arg.startswith("-") or not arg.endswith(SCRIPT_SUFFIXES):
            continue
        path = arg if os.path.isabs(arg) or not cwd else os.path.join(cwd, arg)
        try:
            return path, os.stat(path).st_mtime
        except OSError:
            return path, None
    return None, None


def nvidia_devices(pid, cap):
    """Minor numbers of the /dev/nvidiaN a process holds open (U11: the holders nvidia-smi
    may not show). None when its fds are unreadable; 'skipped' above the fd cap."""
    fd_dir = base.proc_path(pid, "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    if len(names) > cap:
        return "skipped"
    minors, fd_dir = set(), fd_dir + "/"
    for name in names:
        try:
            target = os.readlink(fd_dir + name)
        except OSError:
            continue
        if target.startswith("/dev/nvidia") and target[11:].isdigit():
            minors.add(int(target[11:]))
    return sorted(minors)


def scan_table():
    """Every live user-space process's stat; kernel threads are only counted.
    A process that vanishes mid-scan is skipped silently."""
    procs, kernel_threads = {}, 0
    for name in os.listdir(base.PROCFS):
        if not name.isdigit():
            continue
        try:
            stat = parse_stat(base.read_text(base.proc_path(name, "stat")))
        except (OSError, ValueError, IndexError):
            continue
        if stat["flags"] & base.PF_KTHREAD:
            kernel_threads += 1
        else:
            procs[stat["pid"]] = stat
    return procs, kernel_threads


def read_argv(pid):
    """/proc/PID/cmdline as its words; [] for a zombie or a process gone."""
    try:
        with open(base.proc_path(pid, "cmdline"), "rb") as f:
            raw = f.read().rstrip(b"\0")
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0")] if raw else []


def argv_match(argv, words):
    """The arguments of argv where the words of a run's `process` stand in a row, each the
    word or ending in "/" + it ("train.py" matches "train.py", "./train.py", "/w/train.py";
    never "pretrain.py" nor "--out=train.py"), or None. One argument only: a title rewritten
    in place (setproctitle), read word by word. actions_box.argv_match: the same rule."""
    if len(argv) == 1:
        argv = argv[0].split()
    n = len(words)
    for i in range(len(argv) - n + 1):
        if all(a == w or a.endswith("/" + w) for a, w in zip(argv[i:i + n], words)):
            return argv[i:i + n]
    return None


def in_folder(pid, args, roots):
    """A structural run's second test: the process's cwd is in the run's folder (one of
    roots, each ending in /), or a matching argument names a file there (`python
    /w/train.py` started elsewhere). Another user's cwd is unreadable without root: then
    only an absolute argument can place it."""
    cwd = read_link(base.proc_path(pid, "cwd"))
    for path in [cwd] + [os.path.join(cwd or "/", a) for a in args
                         if "/" in a and (cwd or a[0] == "/")]:
        if path and any((os.path.normpath(path) + "/").startswith(r) for r in roots):
            return True
    return False


def match_runs(procs, runs):
    """pid → the run it belongs to. A run with a `workdir` is structural: its processes are
    those whose arguments match its `process` (argv_match) in its folder (in_folder; the
    folder as written, ~ expanded, and with its symlinks resolved, as /proc shows a cwd),
    and all their live descendants (ranks under a launcher, dataloader workers), whatever
    their command lines: another folder's or another user's `train.py` is not it. A run
    without one is loose, as before: the same match on the words of the whole command line
    (an argument with spaces too), in any folder, of any user, without descendants
    (`gpuwatch check` says so). A process matched directly goes to the first run of the
    request that matches it, before any run claims it as a descendant; a descendant of two
    runs' processes (one run's launcher starting another's) goes to the first seen."""
    patterns = {}
    for r in runs:
        if isinstance(r, dict) and isinstance(r.get("name"), str) \
                and isinstance(r.get("process"), str) and r["process"].strip():
            root = r.get("workdir")
            if isinstance(root, str) and root.strip():
                root = os.path.abspath(os.path.expanduser(root))
                root = [os.path.join(p, "") for p in (root, os.path.realpath(root))]
            patterns[r["name"]] = (r["process"].split(), root if isinstance(root, list) else 0)
    matched = {}
    for pid in procs if patterns else ():
        argv = read_argv(str(pid))
        for name, (words, roots) in patterns.items() if argv else ():
            args = argv_match(argv if roots else " ".join(argv).split(), words)
            if args and (not roots or in_folder(str(pid), args, roots)):
                matched[pid] = name
                break
    children = children_of(procs)
    for pid, name in list(matched.items()):
        for member in subtree(pid, children) if patterns[name][1] else ():
            if procs[member]["state"] not in ("Z", "X"):
                matched.setdefault(member, name)
    return matched


def related(procs, seeds):
    """Ancestors (SIGHUP risk is read from the parent chain) and descendants (dataloader
    workers) of the seed processes, ancestors first."""
    children = children_of(procs)
    ancestors, descendants = [], []
    for pid in seeds:
        parent = procs[pid]["ppid"]
        while parent in procs and parent not in ancestors and parent not in seeds:
            ancestors.append(parent)
            parent = procs[parent]["ppid"]
    stack = list(seeds)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seeds and child not in descendants:
                descendants.append(child)
                stack.append(child)
    return ancestors, descendants


def status_fields(pid):
    fields = {}
    for line in base.read_text(base.proc_path(pid, "status")).splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "SigIgn", "SigCgt"):
            fields[key] = value.split()[0]
    return fields


def read_link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def children_of(procs):
    children = {}
    for pid, stat in procs.items():
        children.setdefault(stat["ppid"], []).append(pid)
    return children


def subtree(root, children):
    """A process and all its descendants."""
    members, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    return members


def process_row(stat, users, limits, devices, run):
    pid = str(stat["pid"])
    status = status_fields(pid)
    uid = int(status.get("Uid", "-1"))
    if uid not in users:
        try:
            users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            users[uid] = str(uid)
    try:
        cgroup = host.parse_cgroup_file(base.read_text(base.proc_path(pid, "cgroup")))
    except OSError:
        cgroup = None
    cmd = " ".join(read_argv(pid)) or "[%s]" % stat["comm"]  # zombies have no command line
    sighup = 1  # bit of signal 1 in the SigIgn/SigCgt masks (seed 000: nohup sets SigIgn)
    cwd = read_link(base.proc_path(pid, "cwd"))
    return [
        stat["pid"], stat["ppid"], users[uid], stat["state"], stat["comm"],
        cmd[:limits["cmd_chars"]], stat["start_ticks"], stat["tty_nr"], stat["session"],
        stat["pgrp"], bool(int(status.get("SigIgn", "0"), 16) & sighup),
        bool(int(status.get("SigCgt", "0"), 16) & sighup), stat["threads"],
        cgroup[1] if cgroup else None, cwd,
        read_link(base.proc_path(pid, "exe")), devices if isinstance(devices, list) else None, run,
        stat["cpu_ticks"],
    ]


ELASTIC_MARK = b"TORCHELASTIC_RUN_ID="


def environ_has(pid, mark):
    """Whether /proc/PID/environ (read up to 1 MiB) holds the variable `mark` (b"NAME=")."""
    try:
        with open(base.proc_path(pid, "environ"), "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return False
    return data.startswith(mark) or (b"\0" + mark) in data


def collect_processes(request, limits, gpu_pids, found):
    procs, kernel_threads = scan_table()
    try:  # when the CPU times were read: what the client's CPU% divides by
        uptime_s = host.uptime()
    except (OSError, ValueError, IndexError):
        uptime_s = None
    runs = request.get("runs")
    matched = found["matched"] = match_runs(procs, runs if isinstance(runs, list) else [])
    devices, fd_unreadable, fd_skipped = {}, 0, []
    for pid in procs:
        held = nvidia_devices(str(pid), limits["fds_per_proc"])
        if held is None:
            fd_unreadable += 1
        elif held == "skipped":
            fd_skipped.append(pid)
        devices[pid] = held
    holders = [pid for pid in procs if isinstance(devices[pid], list) and devices[pid]]
    holders += [pid for pid in gpu_pids if pid in procs and pid not in holders]
    if base.want(request, "discover"):  # GPU holders grouped into runs (discover.py)
        found["discovery"] = base.load_module("known_runs").discovery_state(procs, holders,
                                                                            matched, request)
    seeds = holders + [pid for pid in matched if pid not in holders]
    ancestors, descendants = related(procs, seeds)
    zombies = [pid for pid, stat in procs.items() if stat["state"] == "Z"]
    servers = [pid for pid, stat in procs.items() if stat["comm"].startswith(base.DETACH_SERVERS)]
    chosen = []
    for pid in seeds + ancestors + zombies + servers + descendants:  # most telling first
        if pid not in chosen:
            chosen.append(pid)
    users, rows, scripts = {}, [], {}
    for pid in chosen[:limits["procs"]]:
        try:
            row = process_row(procs[pid], users, limits, devices[pid], matched.get(pid))
        except (OSError, ValueError):
            continue  # vanished between the scan and the details
        rows.append(row)
        if pid in matched:  # U2, U42: a run's script and its mtime, against its start time
            script, mtime = run_script(str(pid), row[base.PROC_FIELDS.index("cwd")])
            if script is not None and mtime is not None:  # {script: [mtime, pid, ...]}
                scripts.setdefault(script, [mtime]).append(pid)
    # U11: torchrun starts each rank in a session of its own (torch 2.11, tests/captures): a
    # rank its dead torchrun left behind looks like a `setsid nohup` run but for its
    # environment. Read only for the session leaders that hold a GPU.
    elastic = [pid for pid in holders if procs[pid]["session"] == pid
               and environ_has(str(pid), ELASTIC_MARK)]
    return {
        "procs": base.table(base.PROC_FIELDS, rows),
        "scripts": scripts,
        "elastic": elastic,
        "total": len(procs) + kernel_threads,
        "kernel_threads": kernel_threads,
        "zombies": len(zombies),
        "not_listed": len(procs) - len(rows),
        "fd_unreadable": fd_unreadable,
        "fd_skipped": fd_skipped,
        "uptime_s": uptime_s,
        "euid": os.geteuid(),  # whom the probe runs as: root can signal anyone's processes
    }


