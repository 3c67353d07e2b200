"""A simulated process as the box simulator (box.py) writes it under BOX/proc, and the way
every file of a box is written (aside, then renamed in) or a stand-in tool installed."""

from __future__ import annotations

import os
import tempfile
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

STATE_NAMES = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped",
               "t": "tracing stop", "X": "dead", "Z": "zombie", "P": "parked", "I": "idle"}

SIGHUP_MASK = 1 << (1 - 1)
"""Bit for SIGHUP in SigIgn/SigCgt: `nohup` sets it in SigIgn (seed 000)."""



@dataclass(frozen=True)
class SimProcess:
    """One process of the simulated box, as /proc/<pid>/ will describe it.

    start_s is seconds after boot (starttime = start_s * CLK_TCK); session/pgrp default to the
    pid (a session leader, as setsid/tmux leave a run); tty_nr 0 means no controlling terminal.
    """

    pid: int
    cmdline: tuple[str, ...]
    comm: str | None = None
    ppid: int = 1
    state: str = "S"
    uid: int = 1000
    gid: int = 1000
    start_s: float = 10.0
    threads: int = 1
    session: int | None = None
    pgrp: int | None = None
    tty_nr: int = 0
    sig_ignored: int = 0
    sig_caught: int = 0
    cwd: str = "/"
    environ: Mapping[str, str] = field(default_factory=dict)
    fds: Mapping[int, str] = field(default_factory=dict)
    cgroup: str = "/"
    rss_kb: int = 102400
    vsize_kb: int = 4194304
    utime_ticks: int = 0
    stime_ticks: int = 0

    @property
    def name(self) -> str:
        """The kernel's comm: argv[0]'s basename cut to 15 bytes unless given."""
        if self.comm is not None:
            return self.comm[:15]
        first = self.cmdline[0] if self.cmdline else ""
        return os.path.basename(first)[:15]


def proc_stat_line(p: SimProcess) -> str:
    """/proc/<pid>/stat: 52 fields, comm in parentheses (parse with rfind(')'))."""
    session = p.session if p.session is not None else p.pid
    pgrp = p.pgrp if p.pgrp is not None else p.pid
    tpgid = pgrp if p.tty_nr else -1
    rss_pages = p.rss_kb * 1024 // PAGE_SIZE
    fields: list[int | str] = [
        p.pid, f"({p.name})", p.state, p.ppid, pgrp, session, p.tty_nr, tpgid,
        4194560,  # 9 flags
        1000, 0, 0, 0,  # 10-13 minflt cminflt majflt cmajflt
        p.utime_ticks, p.stime_ticks, 0, 0,  # 14-17 utime stime cutime cstime
        20, 0,  # 18 priority, 19 nice
        p.threads, 0,  # 20 num_threads, 21 itrealvalue
        int(p.start_s * CLK_TCK),  # 22 starttime
        p.vsize_kb * 1024, rss_pages, 18446744073709551615,  # 23-25
        94000000000000, 94000000100000, 140700000000000, 0, 0,  # 26-30
        0, 0, p.sig_ignored, p.sig_caught,  # 31-34 signal blocked sigignore sigcatch
        0, 0, 0, 17, 0, 0, 0, 0, 0, 0,  # 35-44
        94000000200000, 94000000300000, 94000000400000,  # 45-47 data, brk
        140700000001000, 140700000002000, 140700000002000, 140700000003000,  # 48-51 args/env
        0,  # 52 exit_code
    ]
    return " ".join(str(f) for f in fields) + "\n"


def proc_status_text(p: SimProcess) -> str:
    """/proc/<pid>/status, the lines a probe reads, in the kernel's order and spacing."""
    name = p.name.replace("\\", "\\\\").replace("\n", "\\n")
    ids = "\t".join([str(p.uid)] * 4)  # real, effective, saved, filesystem
    gids = "\t".join([str(p.gid)] * 4)
    session = p.session if p.session is not None else p.pid
    pgrp = p.pgrp if p.pgrp is not None else p.pid
    lines = [
        f"Name:\t{name}", "Umask:\t0022",
        "State:\t{} ({})".format(p.state, STATE_NAMES.get(p.state, "unknown")),
        f"Tgid:\t{p.pid}", "Ngid:\t0", f"Pid:\t{p.pid}", f"PPid:\t{p.ppid}",
        "TracerPid:\t0", "Uid:\t" + ids, "Gid:\t" + gids, "FDSize:\t64", f"Groups:\t{p.gid} ",
        f"NStgid:\t{p.pid}", f"NSpid:\t{p.pid}", f"NSpgid:\t{pgrp}", f"NSsid:\t{session}",
    ]
    if p.state != "Z":
        lines += [f"VmPeak:\t{p.vsize_kb:8d} kB", f"VmSize:\t{p.vsize_kb:8d} kB",
                  f"VmHWM:\t{p.rss_kb:8d} kB", f"VmRSS:\t{p.rss_kb:8d} kB"]
    lines += [
        f"Threads:\t{p.threads}", "SigQ:\t0/513515", "SigPnd:\t0000000000000000",
        "ShdPnd:\t0000000000000000", "SigBlk:\t0000000000000000",
        f"SigIgn:\t{p.sig_ignored:016x}", f"SigCgt:\t{p.sig_caught:016x}",
        "CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
        "CapBnd:\t000001ffffffffff", "CapAmb:\t0000000000000000", "NoNewPrivs:\t0",
        f"Cpus_allowed_list:\t0-{(os.cpu_count() or 1) - 1}",
        "voluntary_ctxt_switches:\t1200", "nonvoluntary_ctxt_switches:\t34",
    ]
    return "\n".join(lines) + "\n"


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write aside, then rename over: readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the box from an sshd user
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_symlink(target: str, path: Path) -> None:
    tmp = path.parent / (f".tmp-{path.name}-{uuidlib.uuid4().hex[:8]}")
    os.symlink(target, tmp)
    os.replace(tmp, path)


def install_stand_in(source: Path, dest: Path, python: str) -> None:
    """Copy a stand-in script with our interpreter in its shebang and make it executable.

    -S skips site-packages: the stand-ins are stdlib only and start faster without (a venv's
    editable-install hooks alone cost several milliseconds per call).
    """
    body = source.read_text(encoding="utf-8").split("\n", 1)[1]
    shebang = f"#!{python} -S" if " " not in python else f"#!{python}"
    atomic_write(dest, shebang + "\n" + body)
    dest.chmod(0o755)
