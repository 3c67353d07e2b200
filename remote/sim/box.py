"""A simulated GPU box in a folder: fixture /proc and /sys trees plus stand-in tools.

Layout (tests/harness/README.md is the contract)::

    BOX/proc/  GPUWATCH_PROCFS: stat, uptime, loadavg, sys/kernel/{random/boot_id,hostname},
               self/cgroup, mounts, and per process
               <pid>/{stat,status,cmdline,comm,environ,cgroup,cwd,fd/N}
    BOX/sys/   GPUWATCH_SYSFS: fs/cgroup/ (cgroup v2 memory.*, cpu.*, pids.*; the groups of
               add_cgroup, memory.*, under their paths)
    BOX/bin/   nvidia-smi and dmesg stand-ins (python3 scripts)
    BOX/sim/   gpus.json and dmesg.log, re-read by the stand-ins on every call

Every write is a temp file plus os.replace (a new process directory is built aside and renamed
in), so a probe reading the box while a test mutates it never sees half a file. A box made with
``real_proc=True`` has no proc/ tree: the probe reads this machine's /proc (real processes that
actions can signal) and only the GPUs, cgroup and kernel log are simulated.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwatch.remote.sim import kmsg
from gpuwatch.remote.sim.nvidia_smi import REASON_BITS
from gpuwatch.remote.sim.presets import Preset, h100_sxm
from gpuwatch.remote.sim.proc_files import (
    CLK_TCK,
    SIGHUP_MASK,
    SimProcess,
    atomic_symlink,
    atomic_write,
    install_stand_in,
    proc_stat_line,
    proc_status_text,
)

_HERE = Path(__file__).resolve().parent

# Friendly names accepted by Box.set_gpu, each the nvidia-smi fields it drives.
GPU_KNOBS: dict[str, tuple[str, ...]] = {
    "util_pct": ("utilization.gpu",),
    "mem_util_pct": ("utilization.memory",),
    "sm_clock_mhz": ("clocks.current.sm", "clocks.current.graphics"),
    "mem_clock_mhz": ("clocks.current.memory",),
    "power_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "power_limit_w": ("power.limit", "enforced.power.limit"),
    "temp_c": ("temperature.gpu",),
    "mem_used_mib": ("memory.used",),
    "pstate": ("pstate",),
    "fan_pct": ("fan.speed",),
}

class Box:
    """A simulated box rooted at a folder; every mutator rewrites the files it changes.

    The in-memory state is the source of truth; files are derived from it. Nothing here reads
    the files back, so tests may also damage them on purpose.
    """

    def __init__(self, root: str | os.PathLike[str], gpus: Preset | None = None, *,
                 real_proc: bool = False, python: str = sys.executable,
                 boot_id: str | None = None, btime: int = 1_784_000_000,
                 uptime_s: float = 86_400.0, ncpu: int = 32,
                 loadavg: tuple[float, float, float] = (4.12, 3.98, 3.75),
                 memory_max: int | None = None, memory_current: int = 34_359_738_368,
                 cpu_quota_us: int | None = None, cpu_period_us: int = 100_000,
                 cgroup_path: str = "/", hostname: str | None = None) -> None:
        self.root = Path(root).resolve()
        self.hostname = hostname or self.root.name  # a real box's /proc/sys/kernel/hostname
        self.real_proc = real_proc
        self.python = python
        preset = (gpus or h100_sxm()).copy()
        self.state: dict[str, Any] = {
            "simulator": "gpuwatch box simulator: stand-in GPU state, not hardware",
            "driver_version": preset.driver_version, "cuda_version": preset.cuda_version,
            "btime": btime, "faults": {}, "gpus": preset.gpus, "compute_apps": [],
        }
        self.boot_id = boot_id or str(uuidlib.uuid4())
        self.btime = btime
        self.uptime_s = uptime_s
        self.ncpu = ncpu
        self.loadavg = loadavg
        self.cgroup_path = cgroup_path
        self.cgroup: dict[str, Any] = {
            "memory.current": memory_current, "memory.max": memory_max,
            "cpu_quota_us": cpu_quota_us, "cpu_period_us": cpu_period_us,
            "events": dict.fromkeys(("low", "high", "max", "oom", "oom_kill",
                                     "oom_group_kill"), 0),
            "usage_usec": 0, "nr_periods": 0, "nr_throttled": 0, "throttled_usec": 0,
        }
        self.groups: dict[str, dict[str, Any]] = {}
        """Other cgroups than the probe's own (add_cgroup): a container's, a Slurm job's."""
        self.processes: dict[int, SimProcess] = {}
        self.dmesg_lines: list[str] = []
        for d in ("bin", "sim", "dev", "sys/fs/cgroup") + (() if real_proc else ("proc",)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._write_dev()
        install_stand_in(_HERE / "nvidia_smi.py", self.bin / "nvidia-smi", python)
        atomic_write(self.bin / "nvidia_smi_fields.py",  # what the stand-in imports
                      (_HERE / "nvidia_smi_fields.py").read_text(encoding="utf-8"))
        install_stand_in(_HERE / "dmesg.py", self.bin / "dmesg", python)
        self._write_gpus()
        self._write_dmesg()
        self._write_cgroup()
        if not real_proc:
            self._write_proc_system()

    # -- paths and environment -------------------------------------------------------------
    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def sim(self) -> Path:
        return self.root / "sim"

    def env(self, base_path: str | None = None) -> dict[str, str]:
        """The variables a session on this box needs (the sshd harness sets them)."""
        rest = base_path if base_path is not None else os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": str(self.bin) + os.pathsep + rest, "GPUWATCH_SYSFS": str(self.sys),
               "GPUWATCH_SIM_DIR": str(self.sim), "GPUWATCH_DEVFS": str(self.root / "dev")}
        if not self.real_proc:
            env["GPUWATCH_PROCFS"] = str(self.proc)
        return env

    # -- GPUs --------------------------------------------------------------------------------
    @property
    def gpus(self) -> list[dict[str, Any]]:
        gpus: list[dict[str, Any]] = self.state["gpus"]
        return gpus

    def set_gpu(self, index: int, fields: Mapping[str, Any] | None = None,
                **knobs: Any) -> None:
        """Set nvidia-smi fields of one GPU, by field name or by a GPU_KNOBS name.

        mem_used_mib also moves memory.free, as the driver's books do.
        """
        gpu = self.gpus[index]
        for name, value in (fields or {}).items():
            gpu[name] = value
        for knob, value in knobs.items():
            if knob not in GPU_KNOBS:
                known = ", ".join(GPU_KNOBS)
                raise TypeError(f"unknown GPU knob {knob!r} (known: {known})")
            for name in GPU_KNOBS[knob]:
                gpu[name] = value
            if knob == "mem_used_mib" and isinstance(gpu.get("memory.total"), int):
                gpu["memory.free"] = max(0, gpu["memory.total"] - gpu.get("memory.reserved", 0)
                                         - value)
        self._write_gpus()

    def set_throttle(self, index: int, reasons: Iterable[str]) -> None:
        """Make these clock event reasons active (names as in REASON_BITS, e.g. sw_power_cap)."""
        mask = 0
        for r in reasons:
            mask |= REASON_BITS[r]
        self.gpus[index]["clocks_event_reasons.active"] = mask
        self._write_gpus()

    def add_compute_app(self, gpu: int, pid: int, process_name: str, used_mib: int | None,
                        **extra: Any) -> None:
        """A process holding VRAM as --query-compute-apps reports it (pid may be a real one)."""
        self.state["compute_apps"].append({"gpu": gpu, "pid": pid, "process_name": process_name,
                                           "used_gpu_memory": used_mib, **extra})
        self._write_gpus()

    def remove_compute_app(self, pid: int) -> None:
        self.state["compute_apps"] = [a for a in self.state["compute_apps"] if a["pid"] != pid]
        self._write_gpus()

    def set_faults(self, *, hang: bool | None = None, fail: bool | str | None = None,
                   delay_s: float | None = None, dmesg_denied: bool | None = None,
                   invalid_fields: Iterable[str] | None = None, driver: str | None = None,
                   lost: Iterable[int] | None = None) -> None:
        """Break the stand-ins: hang forever, fail like a lost driver (exit 9), answer late,
        deny dmesg like kernel.dmesg_restrict, or reject fields as an older driver would.
        `driver`: "mismatch" | "not_loaded" | "no_devices" | "" (healthy again), each with the
        real tool's message and exit status; `lost`: GPU indexes that fell off the bus."""
        faults = self.state["faults"]
        for key, value in (("hang", hang), ("fail", fail), ("delay_s", delay_s),
                           ("dmesg_denied", dmesg_denied), ("driver", driver)):
            if value is not None:
                faults[key] = value
        if lost is not None:
            faults["lost"] = sorted(set(lost))
        if invalid_fields is not None:
            self.state["invalid_fields"] = list(invalid_fields)
        self._write_gpus()

    def _write_dev(self) -> None:
        """GPUWATCH_DEVFS: /dev/nvidiactl and /dev/nvidiaN of a box with GPUs (empty files:
        the probe only looks at their names)."""
        dev = self.root / "dev"
        if self.gpus:
            (dev / "nvidiactl").touch()
        for i in range(len(self.gpus)):
            (dev / f"nvidia{i}").touch()

    def _write_gpus(self) -> None:
        atomic_write(self.sim / "gpus.json", json.dumps(self.state, indent=1) + "\n")

    # -- kernel log ----------------------------------------------------------------------------
    def append_dmesg(self, *lines: str) -> None:
        """Add raw kernel log lines ("[  123.456789] ..."; kmsg builds them)."""
        self.dmesg_lines.extend(lines)
        self._write_dmesg()

    def xid(self, gpu: int, code: int, *, pid: int | None = None, name: str | None = None,
            detail: str | None = None) -> str:
        """Log an NVRM Xid for one GPU, stamped now (the box's uptime); returns the line."""
        line = kmsg.xid(self.uptime_s, self.gpus[gpu]["pci.bus_id"], code, pid=pid, name=name,
                        detail=detail)
        self.append_dmesg(line)
        return line

    def _write_dmesg(self) -> None:
        atomic_write(self.sim / "dmesg.log", "".join(line + "\n" for line in self.dmesg_lines))

    # -- cgroup --------------------------------------------------------------------------------
    def set_cgroup(self, *, memory_current: int | None = None,
                   memory_max: int | str | None = "keep",
                   cpu_quota_us: int | str | None = "keep") -> None:
        """Change usage or limits; None means "max" (no limit), "keep" leaves a limit alone."""
        if memory_current is not None:
            self.cgroup["memory.current"] = memory_current
        if memory_max != "keep":
            self.cgroup["memory.max"] = memory_max
        if cpu_quota_us != "keep":
            self.cgroup["cpu_quota_us"] = cpu_quota_us
        self._write_cgroup()

    def add_cgroup(self, path: str, *, memory_max: int | None = None) -> None:
        """Another cgroup v2 than the probe's own, for processes whose `cgroup` names it (a
        Docker container's scope, a Slurm job's): its memory.events, memory.max and
        memory.current under sys/fs/cgroup/<path>/."""
        self.groups[path] = {"memory.max": memory_max, "memory.current": 0,
                             "events": dict.fromkeys(("low", "high", "max", "oom", "oom_kill",
                                                      "oom_group_kill"), 0)}
        self._write_groups()

    def oom_kill(self, victim: SimProcess | int | None = None, *, kernel: bool = False,
                 remove: bool = True) -> None:
        """A cgroup OOM kill (U41): bump memory.events max/oom/oom_kill, log it, drop the pid.

        The counters bumped are those of the victim's cgroup (add_cgroup) and, where it lies
        in the probe's own or under it, the probe's (v2 counts a cgroup's descendants too).
        kernel=True is a whole-machine OOM instead: the kernel log only, the counter stays.
        """
        proc = self.processes.get(victim) if isinstance(victim, int) else victim
        group = self.groups.get(proc.cgroup) if proc is not None else None
        if not kernel:
            own = self.cgroup_path.rstrip("/") + "/"
            if group is None or (proc is not None and (proc.cgroup + "/").startswith(own)):
                for key in ("max", "oom", "oom_kill"):
                    self.cgroup["events"][key] += 1
                self._write_cgroup()
            if group is not None:
                for key in ("max", "oom", "oom_kill"):
                    group["events"][key] += 1
                self._write_groups()
        if proc is not None:
            limit = (group or self.cgroup)["memory.max"]
            self.append_dmesg(*kmsg.oom_kill(self.uptime_s, proc.pid, proc.name, uid=proc.uid,
                                             anon_rss_kb=proc.rss_kb, cgroup=not kernel,
                                             memcg=proc.cgroup,
                                             limit_kb=None if limit is None else limit // 1024))
            if remove and proc.pid in self.processes:
                self.remove_process(proc.pid)

    def _write_groups(self) -> None:
        for path, c in self.groups.items():
            cg = self.root / "sys/fs/cgroup" / path.lstrip("/")
            cg.mkdir(parents=True, exist_ok=True)
            atomic_write(cg / "memory.current", f"{c['memory.current']}\n")
            atomic_write(cg / "memory.max", ("max" if c["memory.max"] is None
                                              else str(c["memory.max"])) + "\n")
            atomic_write(cg / "memory.events",
                          "".join(f"{k} {v}\n" for k, v in c["events"].items()))

    def _write_cgroup(self) -> None:
        cg = self.root / "sys/fs/cgroup"
        c = self.cgroup
        mem_max = "max" if c["memory.max"] is None else str(c["memory.max"])
        quota = "max" if c["cpu_quota_us"] is None else str(c["cpu_quota_us"])
        atomic_write(cg / "memory.current", f"{c['memory.current']}\n")
        atomic_write(cg / "memory.max", mem_max + "\n")
        atomic_write(cg / "memory.high", "max\n")
        atomic_write(cg / "memory.events",
                      "".join(f"{k} {v}\n" for k, v in c["events"].items()))
        atomic_write(cg / "cpu.max", f"{quota} {c['cpu_period_us']}\n")
        usage = int(c["usage_usec"])
        user = usage * 9 // 10
        atomic_write(cg / "cpu.stat", (
            f"usage_usec {usage}\nuser_usec {user}\nsystem_usec {usage - user}\n"
            f"nr_periods {c['nr_periods']}\nnr_throttled {c['nr_throttled']}\n"
            f"throttled_usec {c['throttled_usec']}\n"))
        atomic_write(cg / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
        atomic_write(cg / "pids.current", f"{max(1, len(self.processes))}\n")
        atomic_write(cg / "pids.max", "max\n")

    # -- time and boots ------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Let time pass: uptime, CPU time of the cgroup and of running processes grow."""
        self.uptime_s += seconds
        busy = sum(p.threads for p in self.processes.values() if p.state == "R")
        self.cgroup["usage_usec"] += int(seconds * 1e6 * min(busy, self.ncpu))
        self.cgroup["nr_periods"] += int(seconds * 1e6 / self.cgroup["cpu_period_us"])
        share = min(1.0, self.ncpu / busy) if busy else 1.0  # cores shared by busy threads
        for pid, p in list(self.processes.items()):
            if p.state == "R":
                self.processes[pid] = replace(p, utime_ticks=p.utime_ticks + int(
                    seconds * CLK_TCK * p.threads * share))
                self._write_process_files(self.processes[pid])
        self._write_cgroup()
        if not self.real_proc:
            self._write_proc_system()

    def reboot(self, *, boot_id: str | None = None, down_s: float = 120.0) -> str:
        """A new boot: new boot_id and btime, uptime from 0, every process and VRAM holder gone.

        The kernel log starts over too, as a real one does (U3: that is why the reason for a
        death must be read before the box reboots).
        """
        for pid in list(self.processes):
            self.remove_process(pid)
        self.state["compute_apps"] = []
        self.btime = int(self.btime + self.uptime_s + down_s)
        self.state["btime"] = self.btime
        self.uptime_s = 30.0
        self.boot_id = boot_id or str(uuidlib.uuid4())
        self.dmesg_lines = []
        for events in [self.cgroup["events"]] + [g["events"] for g in self.groups.values()]:
            for k in events:
                events[k] = 0
        self.cgroup["usage_usec"] = 0
        self._write_groups()
        for gpu in self.gpus:
            gpu.update({"memory.used": 0, "utilization.gpu": 0 if gpu.get("utilization.gpu")
                        is not None else None, "clocks_event_reasons.active": 0x1})
        self._write_gpus()
        self._write_dmesg()
        self._write_cgroup()
        if not self.real_proc:
            self._write_proc_system()
        return self.boot_id

    # -- processes -------------------------------------------------------------------------
    def add_process(self, proc: SimProcess) -> SimProcess:
        """Create /proc/<pid>/ (built aside, renamed in: it appears whole)."""
        self._need_proc()
        if proc.pid in self.processes:
            raise ValueError(f"pid {proc.pid} already exists on this box")
        tmp = self.proc / f".new-{proc.pid}-{uuidlib.uuid4().hex[:8]}"
        tmp.mkdir()
        self._write_process_files(proc, tmp)
        os.rename(tmp, self.proc / str(proc.pid))
        self.processes[proc.pid] = proc
        self._write_proc_system()
        return proc

    def update_process(self, pid: int, **changes: Any) -> SimProcess:
        """Change a live process (state, threads, fds ...); each file is replaced whole."""
        self._need_proc()
        proc = replace(self.processes[pid], **changes)
        self.processes[pid] = proc
        self._write_process_files(proc)
        return proc

    def remove_process(self, pid: int) -> None:
        """The process is gone: its directory vanishes in one rename."""
        self._need_proc()
        self.processes.pop(pid, None)
        self.state["compute_apps"] = [a for a in self.state["compute_apps"] if a["pid"] != pid]
        self._write_gpus()
        path = self.proc / str(pid)
        if path.exists():
            trash = self.proc / f".gone-{pid}-{uuidlib.uuid4().hex[:8]}"
            os.rename(path, trash)
            shutil.rmtree(trash)
        self._write_proc_system()

    def _need_proc(self) -> None:
        if self.real_proc:
            raise RuntimeError("this box reads the real /proc: start a real process instead")

    def _write_process_files(self, p: SimProcess, into: Path | None = None) -> None:
        d = into or self.proc / str(p.pid)
        zombie = p.state == "Z"
        atomic_write(d / "stat", proc_stat_line(p))
        atomic_write(d / "status", proc_status_text(p))
        atomic_write(d / "comm", p.name + "\n")
        # A zombie has released its memory: empty cmdline and environ, no fds (U11).
        atomic_write(d / "cmdline", b"" if zombie else
                      b"".join(a.encode() + b"\0" for a in p.cmdline))
        atomic_write(d / "environ", b"" if zombie else
                      b"".join(("{}={}".format(*kv)).encode() + b"\0" for kv in p.environ.items()))
        atomic_write(d / "cgroup", f"0::{p.cgroup}\n")
        atomic_symlink(p.cwd, d / "cwd")
        fd_dir = d / "fd"
        fd_dir.mkdir(exist_ok=True)
        wanted = {} if zombie else {str(n): t for n, t in p.fds.items()}
        for entry in os.listdir(fd_dir):
            if entry not in wanted:
                os.unlink(fd_dir / entry)
        for n, target in wanted.items():
            atomic_symlink(target, fd_dir / n)

    def _write_proc_system(self) -> None:
        """The box-wide /proc files: stat, uptime, loadavg, boot_id, self/cgroup, mounts."""
        up = self.uptime_s
        idle = int(up * CLK_TCK * 0.8)
        busy = int(up * CLK_TCK * 0.2)
        n = self.ncpu
        # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
        cpu = f"cpu  {busy * n * 9 // 10} 0 {busy * n // 10} {idle * n} 120 0 40 0 0 0\n"
        per_cpu = "".join(f"cpu{i} {busy * 9 // 10} 0 {busy // 10} {idle} 4 0 1 0 0 0\n"
                          for i in range(n))
        running = max(1, sum(1 for p in self.processes.values() if p.state == "R"))
        last = max(self.processes, default=1)
        atomic_write(self.proc / "stat", cpu + per_cpu + (
            f"intr 0\nctxt 123456789\nbtime {self.btime}\nprocesses {100000 + last}\n"
            f"procs_running {running}\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n"))
        atomic_write(self.proc / "uptime", f"{up:.2f} {up * n * 0.8:.2f}\n")
        one, five, fifteen = self.loadavg
        atomic_write(self.proc / "loadavg", f"{one:.2f} {five:.2f} {fifteen:.2f} "
                      f"{running}/{300 + len(self.processes)} {last}\n")
        atomic_write(self.proc / "sys/kernel/random/boot_id", self.boot_id + "\n")
        atomic_write(self.proc / "sys/kernel/hostname", self.hostname + "\n")
        atomic_write(self.proc / "self/cgroup", f"0::{self.cgroup_path}\n")
        atomic_write(self.proc / "mounts", (
            "/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n"
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,"
            "memory_recursiveprot 0 0\n"
            "tmpfs /dev/shm tmpfs rw,nosuid,nodev,inode64 0 0\n"
            "/dev/md0 /data ext4 rw,noatime,stripe=256 0 0\n"))


def training_process(pid: int, *, script: str = "train.py", workdir: str = "/data/run",
                     gpu: int = 0, log: str = "train.log", start_s: float = 600.0,
                     threads: int = 24, user_uid: int = 1000, nohup: bool = False,
                     tty_nr: int = 0, ppid: int = 1) -> SimProcess:
    """A typical `python train.py` holding a GPU: fds on the NVIDIA devices, stdout to a log.

    nohup=True sets SIGHUP in SigIgn (what `nohup` does); tty_nr != 0 ties it to a terminal
    (seed 000: such a run dies with the SSH session unless SIGHUP is ignored).
    """
    return SimProcess(
        pid=pid, cmdline=("python", script, "--config", "configs/run.yaml"), comm="python",
        ppid=ppid, state="R", uid=user_uid, gid=user_uid, start_s=start_s, threads=threads,
        tty_nr=tty_nr, sig_ignored=SIGHUP_MASK if nohup else 0,
        sig_caught=1 << (2 - 1),  # SIGINT: CPython's KeyboardInterrupt handler
        cwd=workdir, environ={"CUDA_VISIBLE_DEVICES": str(gpu), "HOME": "/home/user",
                              "PATH": "/usr/bin:/bin"},
        fds={0: "/dev/null", 1: os.path.join(workdir, log), 2: os.path.join(workdir, log),
             3: "/dev/nvidiactl", 4: "/dev/nvidia-uvm", 5: f"/dev/nvidia{gpu}"},
        rss_kb=12_582_912, vsize_kb=98_765_432,
    )
