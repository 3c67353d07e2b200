"""The parser of NVIDIA Xid and OOM kill lines: sent unless the last poll of the host saw
no such line in its kernel log (bundle.KERNEL); the client uses it too
(model.snapshot) for lines a box sent raw.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
host = base.load_module("host")


TS_MONO = r"^\[\s*(\d+\.\d+)\]\s?(.*)$"  # dmesg: [  123.456789] msg
TS_CTIME = r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\s?(.*)$"  # dmesg -T
TS_ISO = (  # dmesg --time-format iso (maybe after -x "kern  :warn  : "), journalctl
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?"
    r"(Z|[+-]\d\d:?\d\d)?\s+(.*)$")
TS_KMSG = r"^\d+,\d+,(\d+),[^;]*;(.*)$"  # /dev/kmsg: prio,seq,usec,flags;msg
JOURNAL_PREFIX = r"^\S+ kernel: "

# Newer drivers write a subcode after the code ('149.37, NETIR_LINK_EVT Fatal ...'): the code
# is the Xid, the rest of the line (Fatal / Nonfatal words included) its message.
XID = r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:\.\d+)?,\s*(.*)$"
XID_PID = r"^pid=(?:'<unknown>'|(\d+)),\s*name=([^,]*),\s*(.*)$"
OOM_KILL = (
    r"(Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Kill(?:ed)? process (\d+)"
    r"(?:, UID \d+,)? \(([^)]*)\)")
# mm/oom_kill.c: "oom-kill:constraint=%s,nodemask=%*pbl" then, in an order that changed across
# kernels, ",cpuset=…,mems_allowed=…", ",oom_memcg=PATH" (or ",global_oom"), ",task_memcg=PATH",
# and ",task=%s,pid=%d,uid=%d" (4.19 printed pid=%5d: padded with spaces)
OOM_CONSTRAINT = r"oom-kill:constraint=(\w+)(?:.*?,task=([^,]*),pid=\s*(\d+))?"
OOM_MEMCG = r",oom_memcg=(.*?)(?=,task_memcg=|,cpuset=|,task=|$)"
# mm/memcontrol.c, memory cgroup OOMs only, before the kill: "memory: usage %llukB, limit
# %llukB, failcnt %lu"; kernels before 4.19 first "Task in PATH killed as a result of limit of
# PATH" (the second path: the cgroup whose limit was hit)
MEMCG_REPORT = (r"^(?:Task in .* killed as a result of limit of (.*)|"
                r"memory: usage \d+kB, limit (\d+)kB)")
OOM_REPORT_S = 10.0
"""The lines of one OOM report are printed within this many seconds of each other: a cgroup
path or limit older than that belongs to another report (one whose kill line was lost)."""
CGROUP_CHARS = 1024  # a Kubernetes pod's cgroup path is ~250 characters

def split_timestamp(line):
    """A kernel log line → (seconds since boot or None, epoch or None, message)."""
    match = base.rx(TS_MONO).match(line)
    if match:
        return float(match.group(1)), None, match.group(2)
    match = base.rx(TS_CTIME).match(line)
    if match:
        return None, time.mktime(time.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")), \
            match.group(2)
    match = base.rx(TS_ISO).match(line)
    if match:
        import calendar  # only here: it drags in locale and datetime, 4 ms of start-up

        stamp, fraction, zone, message = match.groups()
        epoch = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
        if fraction:
            epoch += float("0." + fraction)
        if zone and zone != "Z":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            epoch -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return None, epoch, base.rx(JOURNAL_PREFIX).sub("", message)
    match = base.rx(TS_KMSG).match(line)
    if match:
        return int(match.group(1)) / 1e6, None, match.group(2)
    return None, None, line


def small_int(digits):
    """A pid's digits as an int; None for none or for more than a pid has (int() of thousands
    of digits raises, and the client reads no int beyond int64)."""
    return int(digits) if digits and len(digits) <= 12 else None


def parse_kernel_log(lines, keep, msg_chars):
    """NVIDIA Xid lines and OOM kills, the last `keep` of each, plus Xid counts.

    An Xid names the process it hit where the driver knows it (an MMU fault, Xid 31, does:
    'pid=12083, name=chrome'); the row keeps that pid and name, so the client blames that
    process and not every run on the GPU. One OOM kill can log up to three lines
    ('oom-kill:constraint=…,task=,pid=', 'Out of memory: Killed process PID (name)', old
    kernels' 'Kill process … or sacrifice child'); lines naming the pid of the kill just seen
    merge into it. A memory-cgroup kill (U9, U41) says CONSTRAINT_MEMCG or 'Memory cgroup out
    of memory', and its report names the cgroup whose limit was hit (oom_memcg=, or old
    kernels' 'Task in … killed as a result of limit of …') and that limit ('memory: usage …,
    limit …'): the row carries both. Box text in, never an exception out.
    """
    xids, ooms, counts = [], [], {}
    report = {}  # what the lines before a kill said of it: memcg, cgroup, limit, their time
    for line in lines:
        if host.kernel_candidate(line):
            try:  # 4096: more than the kernel prints in one record (1024, 2048 since 6.1)
                report = kernel_line(line[:4096].rstrip("\n"), msg_chars, xids, ooms, counts,
                                     report)
            except (ValueError, OverflowError):  # a stamp no clock takes, a number int refuses
                pass
    return {"xid": base.table(base.XID_FIELDS, xids[-keep:]),
            "oom": base.table(base.OOM_FIELDS, ooms[-keep:]),
            "xid_counts": counts}


def kernel_line(line, msg_chars, xids, ooms, counts, report):
    """One candidate line into the Xid or the OOM rows; returns what the OOM report being read
    says so far (a kill's row takes it; a line naming the last kill's pid merges into it)."""
    mono, epoch, message = split_timestamp(line)
    mono = mono if mono is not None and -2.0 ** 53 < mono < 2.0 ** 53 else None  # inf, nan
    epoch = epoch if epoch is not None and -2.0 ** 53 < epoch < 2.0 ** 53 else None
    match = base.rx(XID).search(message)
    if match and len(match.group(2)) <= 9:  # Xid codes are small; int() may refuse more
        pci, code, rest = match.group(1), int(match.group(2)), match.group(3)
        detail = base.rx(XID_PID).match(rest)
        pid = small_int(detail.group(1)) if detail else None
        name = detail.group(2) if detail and detail.group(2) != "<unknown>" else None
        text = detail.group(3) if detail else rest
        counts[str(code)] = counts.get(str(code), 0) + 1
        xids.append([mono, epoch, pci, code, pid, name, text[:msg_chars]])
        return report
    stamp = mono if mono is not None else epoch
    then = report.get("at")
    if stamp is not None and then is not None and abs(stamp - then) > OOM_REPORT_S:
        report = {}
    match = base.rx(MEMCG_REPORT).match(message)
    if match:
        report.update(at=stamp, memcg=True)
        if match.group(1):
            report["cgroup"] = match.group(1)[:CGROUP_CHARS]
        if match.group(2) and int(match.group(2)) < 1 << 50:  # else v1's "no limit"
            report["limit"] = int(match.group(2)) * 1024
        return report
    match = base.rx(OOM_CONSTRAINT).search(message)
    if match:
        where = base.rx(OOM_MEMCG).search(message)
        report.update(at=stamp, memcg=match.group(1) == "CONSTRAINT_MEMCG")
        if where:
            report["cgroup"] = where.group(1)[:CGROUP_CHARS]
        if small_int(match.group(3)) is None:
            return report  # a truncated line: it still tells the next kill's kind
        pid, name = int(match.group(3)), match.group(2)
    else:
        match = base.rx(OOM_KILL).search(message)
        if not match or small_int(match.group(2)) is None:
            return report
        pid, name = int(match.group(2)), match.group(3)
        report["memcg"] = report.get("memcg") or match.group(1).startswith("Memory cgroup")
    row = [mono, epoch, pid, name, report.get("memcg", False), report.get("cgroup"),
           report.get("limit")]
    if ooms and ooms[-1][2] == pid:
        ooms[-1] = [b if a is None or a is False or a == "" else a for a, b in zip(ooms[-1], row)]
    else:
        ooms.append(row)
    return {}


