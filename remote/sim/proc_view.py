"""A demo box's own /proc (GPUWATCH_PROCFS): this machine's real processes of that box only,
beside box-wide files of the box's own.

The demo's runs are real processes, so that a kill or a relaunch over SSH does to them what it
does on a real box. The probe read them from this machine's /proc, and with them everything
else of this machine: its hostname ("hostname vm"), its load and CPU count ("load 9.3/2 CPUs"),
its cgroup, and every process on it, a defunct `[sshd]` of someone else's session listed as a
zombie of the simulated box. A view is the box's /proc instead:

    proc/<pid>/  for each real process of this box (the fleet marks every process it starts
                 for a box, and what those start inherit the mark: remote/sim/fleet_box.py),
                 and for the reaper an orphan of it was handed to (init or a subreaper: who
                 adopted an orphaned rank is evidence, U11):
                   stat status cmdline comm environ fd   links to this machine's /proc/<pid>/…
                                                         (live: read, they are the process's)
                   cwd exe    links to where the process's point (kept up to date each refresh)
                   cgroup     the box's own cgroup, not this machine's
    proc/self/   cgroup (the box's own) and mounts (the box's mount table)
    proc/uptime, proc/sys/kernel/random/boot_id
                 links to this machine's: a process's age and identity are counted from this
                 boot (the action script checks the boot id and each start time, DESIGN §4)
    proc/stat    this machine's btime, the box's own CPUs
    proc/loadavg, proc/sys/kernel/hostname
                 the box's own

Every file is written whole (temp file, then rename) and a process's folder is built aside and
renamed in, so a probe reading the view while it changes never sees half of it. A process that
ended leaves links to nothing until the next refresh: the probe skips a process that vanished
mid-scan, as it must on a real box.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from gpuwatch.remote.sim.proc_files import atomic_symlink, atomic_write

__all__ = ["LIVE_ENTRIES", "ProcView"]

LIVE_ENTRIES = ("stat", "status", "cmdline", "comm", "environ", "fd")
"""A process's files the view links to this machine's, as they are."""
RESOLVED_ENTRIES = ("cwd", "exe")
"""A process's links the view points where the process's point (a link to /proc/PID/cwd would
read as "/proc/PID/cwd")."""


class ProcView:
    """The /proc of one demo box: `show(pids)` makes exactly those real processes its
    processes; `system(...)` writes the box-wide files."""

    def __init__(self, root: Path, *, hostname: str, ncpu: int, btime: int,
                 cgroup: str) -> None:
        self.root = root
        self.ncpu = ncpu
        self.btime = btime
        self.cgroup_line = f"0::{cgroup}\n"
        self.shown: dict[int, dict[str, str | None]] = {}
        """pid -> where its cwd and exe links point."""
        self._written: dict[str, str] = {}
        (root / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
        atomic_symlink("/proc/uptime", root / "uptime")
        atomic_symlink("/proc/sys/kernel/random/boot_id", root / "sys/kernel/random/boot_id")
        atomic_write(root / "sys/kernel/hostname", hostname + "\n")
        atomic_write(root / "self/cgroup", self.cgroup_line)
        atomic_write(root / "self/mounts", (
            "/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n"
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
            "/dev/md0 /data ext4 rw,noatime,stripe=256 0 0\n"))
        self.system((0.0, 0.0, 0.0), running=1, total=1, last_pid=1)

    def system(self, loadavg: tuple[float, float, float], *, running: int, total: int,
               last_pid: int) -> None:
        """/proc/stat (this boot's btime, the box's CPUs) and /proc/loadavg, where changed."""
        one, five, fifteen = loadavg
        self._write("loadavg", f"{one:.2f} {five:.2f} {fifteen:.2f} {running}/{total} "
                               f"{last_pid}\n")
        # CPU times as a mostly idle box's; nothing reads them but a person with cat
        cpu = "".join(f"cpu{i} 0 0 0 0 0 0 0 0 0 0\n" for i in range(self.ncpu))
        self._write("stat", f"cpu  0 0 0 0 0 0 0 0 0 0\n{cpu}intr 0\nctxt 0\n"
                            f"btime {self.btime}\nprocesses {last_pid}\n"
                            f"procs_running {running}\nprocs_blocked 0\n")

    def _write(self, name: str, text: str) -> None:
        if self._written.get(name) != text:
            atomic_write(self.root / name, text)
            self._written[name] = text

    def show(self, pids: Iterable[int]) -> None:
        """Make the view's processes exactly these; bring their cwd and exe up to date."""
        wanted = set(pids)
        for pid in wanted:
            self.add(pid)
        for pid in set(self.shown) - wanted:
            self.hide(pid)

    def add(self, pid: int) -> None:
        """A process in the view (built aside, renamed in: it appears whole), or, where it is
        already, its cwd and exe pointed where the process's point now (an exec moves exe)."""
        now = {name: _readlink(f"/proc/{pid}/{name}") for name in RESOLVED_ENTRIES}
        folder = self.root / str(pid)
        if pid in self.shown:
            for name, target in now.items():
                if target != self.shown[pid].get(name) and target is not None:
                    atomic_symlink(target, folder / name)
            self.shown[pid] = now
            return
        aside = self.root / f".new-{pid}-{uuid.uuid4().hex[:8]}"
        aside.mkdir()
        for name in LIVE_ENTRIES:
            os.symlink(f"/proc/{pid}/{name}", aside / name)
        for name, target in now.items():
            if target is not None:
                os.symlink(target, aside / name)
        atomic_write(aside / "cgroup", self.cgroup_line)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(folder)  # a folder left by a pid that was reused
        os.rename(aside, folder)
        self.shown[pid] = now

    def hide(self, pid: int) -> None:
        """The process is no longer the box's: its folder goes in one rename."""
        aside = self.root / f".gone-{pid}-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.root / str(pid), aside)
            shutil.rmtree(aside)
        self.shown.pop(pid, None)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None
