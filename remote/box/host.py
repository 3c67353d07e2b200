"""The host, cgroup (U9, U40, U41), logind (seed 000) and kernel log (U3, U9, U22)
sections.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
ETC, read_text = base.ETC, base.read_text


# ---------------------------------------------------------------- host

def collect_host():
    stat = base.read_text(base.proc_path("stat"))
    btime = [(line[6:].split() or [""])[0] for line in stat.splitlines()
             if line.startswith("btime ")]
    return {
        "hostname": host_name(),
        "boot_id": base.read_text(base.proc_path("sys", "kernel", "random", "boot_id")).strip(),
        "uptime_s": uptime(),
        "loadavg": [float(x) for x in base.read_text(base.proc_path("loadavg")).split()[:3]],
        "time": round(time.time(), 3),
        "btime": int(btime[0]) if btime and btime[0].isdigit() else None,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        # host CPUs online (one "cpuN" line each in /proc/stat), not the cgroup quota (U40)
        "ncpu": sum(1 for line in stat.splitlines()
                    if line.startswith("cpu") and line[3:4].isdigit()) or os.cpu_count(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "spawn": hasattr(os, "posix_spawnp"),  # the client sends run_bounded_popen where not
    }


def uptime():
    return float(base.read_text(base.proc_path("uptime")).split()[0])


def host_name():
    try:
        return base.read_text(base.proc_path("sys", "kernel", "hostname")).strip()
    except OSError:
        import socket  # only here: its import costs 3 ms of every poll's start-up

        return socket.gethostname()


# ---------------------------------------------------------------- cgroup (U9, U40, U41)

def parse_cgroup_file(text):
    """/proc/PID/cgroup → (version, path) of the memory controller's group, or None.

    A hybrid v1 box also lists "0::/"; the v1 memory line is the one that limits it.
    """
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            return 1, parts[2]
        if parts[0] == "0" and parts[1] == "":
            unified = (2, parts[2])
    return unified


def cgroup_dir(base, path):
    """The group's folder; a container sees its own group at the root (its path is the
    host's view), so fall back to the root when the path is absent."""
    full = os.path.join(base, path.lstrip("/"))
    return full if os.path.isdir(full) else base


def read_int_file(path, unlimited=()):
    """An integer file; None when absent or when it holds an 'unlimited' spelling."""
    try:
        text = base.read_text(path).strip()
    except OSError:
        return None
    if text in unlimited:
        return None
    return int(text)


def read_counters(path):
    """'key value' lines (memory.events, cpu.stat) → {key: int}; {} when absent."""
    try:
        text = base.read_text(path)
    except OSError:
        return {}
    counters = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            counters[parts[0]] = int(parts[1])
    return counters


def collect_cgroup(processes=None, wanted=None):
    """The probe's own cgroup (the host's view of a container's share), and in "groups" the
    cgroups of the runs' processes and those the request names (run_groups)."""
    found = parse_cgroup_file(base.read_text(base.proc_path("self", "cgroup")))
    if found is None:
        raise base.ProbeFailure("no memory cgroup in %s" % base.proc_path("self", "cgroup"))
    version, path = found
    root = os.path.join(base.SYSFS, "fs", "cgroup")
    v1 = base.optional("cgroup_v1")  # sent unless the box said its cgroups are v2
    if version == 1 and v1 is None:
        raise base.ProbeFailure("cgroup v1 here: the next poll brings its reader")
    info = cgroup_v2(root, path) if version == 2 else v1.cgroup_v1(root, path)
    info["version"] = version
    info["path"] = path
    runs = base.optional("runs")  # sent where a run may be read
    if runs is not None:
        info["groups"] = runs.run_groups(root, version, path, processes, wanted)
    return info


def cgroup_v2(root, path):
    group = cgroup_dir(root, path)
    cpu_max = None
    try:
        cpu_max = base.read_text(os.path.join(group, "cpu.max")).split()
    except OSError:
        pass
    return {
        "memory_current_bytes": read_int_file(os.path.join(group, "memory.current")),
        "memory_max_bytes": read_int_file(os.path.join(group, "memory.max"), ("max",)),
        # U41: the oom_kill counter here is authoritative, not host dmesg or free
        "memory_events": read_counters(os.path.join(group, "memory.events")),
        "cpu_quota_us": int(cpu_max[0]) if cpu_max and cpu_max[0] != "max" else None,
        "cpu_period_us": int(cpu_max[1]) if cpu_max and len(cpu_max) > 1 else None,
        "cpu_stat": read_counters(os.path.join(group, "cpu.stat")),
    }


V1_UNLIMITED_BYTES = 1 << 60  # v1 spells "no limit" as PAGE_COUNTER_MAX pages in bytes




# ---------------------------------------------------------------- logind (seed 000)

SYSTEMD_BOOLEANS = {"1": True, "yes": True, "y": True, "true": True, "t": True, "on": True,
                    "0": False, "no": False, "n": False, "false": False, "f": False, "off": False}


def collect_logind():
    """KillUserProcesses=yes kills even tmux when the SSH session ends (seed 000).
    Drop-ins override the main file, later names win; None when nothing sets it."""
    base = os.path.join(ETC, "systemd")
    drop_ins = os.path.join(base, "logind.conf.d")
    try:
        names = sorted(n for n in os.listdir(drop_ins) if n.endswith(".conf"))
    except OSError:
        names = []
    paths = [os.path.join(base, "logind.conf")] + [os.path.join(drop_ins, n) for n in names]
    value, source = None, None
    for path in paths:
        try:
            setting = ini_value(read_text(path), "Login", "KillUserProcesses")
        except OSError:
            continue
        if setting is not None:
            value, source = SYSTEMD_BOOLEANS.get(setting.lower()), path
    return {"kill_user_processes": value, "source": source}


def ini_value(text, section, key):
    current, value = None, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line:
            name, _, setting = line.partition("=")
            if name.strip() == key:
                value = setting.strip()
    return value


# ---------------------------------------------------------------- kernel log (U3, U9, U22)

RAW_KERNEL_LINES = 2000
"""Without the parser, at most this many of the newest candidate lines go as they are (a box
whose kernel log was clean at the last poll and has more now is in an Xid storm: its Xid
counts then cover only these lines for that one poll; the client marks them partial, so the
next poll's full counts do not report the same codes again)."""


def kernel_candidate(line):
    """A line that may be an NVIDIA Xid, an OOM kill or a memory cgroup's part of an OOM report
    (its limit, and on old kernels its path: what parse_kernel_log looks at)."""
    return ("Xid" in line or "ut of memory" in line or "oom-kill" in line
            or "memory: usage" in line or "as a result of limit of" in line)


def collect_kernel(limits):
    """The kernel log's Xid and OOM lines, parsed (parse_kernel_log). The parser is sent only
    where the last poll saw such lines (most boxes have none, and it is an eighth of
    the probe); a box that has some now without it sends them as they are ("raw", the newest
    RAW_KERNEL_LINES of "raw_total") and the client parses them with the same code."""
    code, out, err = base.run_bounded(["dmesg"], limits["dmesg_timeout_s"])
    if code != 0:  # kernel.dmesg_restrict=1 for a non-root user is common
        raise base.ProbeFailure("dmesg not readable: %s" % base.first_line(err + "\n" + out))
    lines = [line for line in out.splitlines() if kernel_candidate(line)]
    parser = base.optional("kernel_log")
    if parser is not None:
        section = parser.parse_kernel_log(lines, limits["kernel_events"], limits["msg_chars"])
    else:
        section = {"xid": base.table(base.XID_FIELDS, []), "oom": base.table(base.OOM_FIELDS, []),
                   "xid_counts": {}}
        if lines:
            section.update(raw=lines[-RAW_KERNEL_LINES:], raw_total=len(lines))
    section["candidates"] = len(lines)
    return section


