"""Hand-made snapshots for the actions' planning: processes, a host's history of polls, and the
host they are planned on; no box, no SSH."""

from __future__ import annotations

from types import MappingProxyType

from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import GpuProcess, HostSnapshot, ProcessInfo

BOOT = "1f6c1a7e-0000-4000-8000-000000000001"


def proc(pid: int, *, ppid: int = 1, cmd: str = "python train.py", comm: str = "python",
         run: str | None = None, tty: int = 0, hup_ignored: bool = False, state: str = "S",
         session: int | None = None, start: int = 1000, gpu: int | None = None,
         mem: int | None = None) -> ProcessInfo:
    return ProcessInfo(
        pid=pid, ppid=ppid, user="alice", state=state, comm=comm, cmd=cmd, start_ticks=start,
        started_at=None, tty_nr=tty, session=session if session is not None else pid, pgrp=pid,
        sighup_ignored=hup_ignored, sighup_caught=False, threads=1, cgroup=None, cwd=None,
        exe=None, nvidia_devs=(), run=run, gpu_index=gpu, gpu_mem_mib=mem)


def snapshot(*procs: ProcessInfo, apps: tuple[GpuProcess, ...] = (),
             boot: str = BOOT) -> HostSnapshot:
    return HostSnapshot(
        host="gpu1", taken_at=1000.0, hostname="gpu1", boot_id=boot, uptime_s=100.0,
        loadavg=None, ncpu=8, gpus=(), gpu_processes=apps, gpu_source="nvidia-smi",
        processes=procs, process_counts=None, disks=(), cgroup=None,
        kill_user_processes=None, kernel_events=(), xid_counts=MappingProxyType({}),
        section_errors=MappingProxyType({}), probe_s=0.1, probe_cpu_s=0.1)


def history(*snaps: HostSnapshot) -> HostHistory:
    h = HostHistory("gpu1")
    for i, snap in enumerate(snaps):
        h.record(snap, 1000.0 + i)
    return h


HOST = HostConfig(name="gpu1", ssh="gpu1")
