"""Deterministic fleets for the TUI tests and snapshots: hand-built model objects (the same
frozen dataclasses the probe's parser builds), a store with their history, a frozen clock.

Nothing here depends on this machine: no probe run, no real time, no real paths."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from gpuwatch.remote.config.schema import Config, HostConfig, RunConfig
from gpuwatch.remote.model.gpu import EccCounts, MemoryRemap, MigInstance, PcieLink
from gpuwatch.remote.model.snapshot import (
    CgroupInfo,
    Checkpoint,
    DiskUsage,
    EventFile,
    GpuError,
    GpuSample,
    HostSnapshot,
    KernelEvent,
    LogInfo,
    ProcessCounts,
    ProcessInfo,
    RunSample,
    Scalars,
)
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome

NOW = 1_784_100_000.0
"""The frozen clock of every TUI test (this machine's and the boxes' alike)."""
BTIME = 1_784_000_000
HOSTILE = "[bold red]x[/]"
"""Text from a box that looks like Rich markup: it must render as written."""
EMPTY: MappingProxyType = MappingProxyType({})
CPU_S = 36_000.0
"""Each listed process's CPU time (utime + stime) in `latest`."""
CPU_PCT = {4121: 98.0, 4122: 103.0, 4123: 312.0, 4124: 7.5, 777: 100.0, 5150: 0.0}
"""Each listed process's CPU% from `earlier` to `latest` (a zombie holder uses none)."""


def clock() -> float:
    return NOW


def gpu(index: int, util: float | None, clock_mhz: int | None, *, power: float = 690.0,
        limit: float = 700.0, temp: int = 64, used: int = 61_440,
        throttle: tuple[str, ...] | None = (), max_mhz: int = 1980) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index:08d}", name="NVIDIA H100 80GB HBM3",
                     util_pct=util, mem_used_mib=used, mem_total_mib=81_559,
                     sm_clock_mhz=clock_mhz, sm_clock_max_mhz=max_mhz, power_w=power,
                     power_limit_w=limit, temp_c=temp, throttle_reasons=throttle, mig=False)


def process(pid: int, *, cmd: str, run: str | None, gpu_index: int | None = 0,
            mem: int | None = 61_000, state: str = "S", start_s: float = 7200.0,
            user: str = "alice", ppid: int = 1, cpu_s: float | None = CPU_S) -> ProcessInfo:
    return ProcessInfo(
        pid=pid, ppid=ppid, user=user, state=state, comm=cmd.split()[0][:15], cmd=cmd,
        start_ticks=int(start_s * 100), started_at=BTIME + start_s, tty_nr=0, session=pid,
        pgrp=pid, sighup_ignored=True, sighup_caught=False, threads=24, cgroup="/",
        cwd="/data/run", exe="/usr/bin/python3", nvidia_devs=(0,), run=run,
        gpu_index=gpu_index, gpu_mem_mib=mem, cpu_s=cpu_s)


def disk(path: str, total: int, free: int, inodes_total: int | None = 10_000_000,
         inodes_free: int | None = 9_000_000) -> DiskUsage:
    return DiskUsage(path=path, mount=path, bytes_total=total, bytes_free=free,
                     inodes_total=inodes_total, inodes_free=inodes_free)


def loss_at(step: int) -> float:
    return 2.0 * math.exp(-step / 600) + 0.4 + 0.05 * math.sin(step / 7)


def run_sample(name: str, *, pids: tuple[int, ...], steps: range, t_end: float,
               step_s: float = 6.0, ckpt_every: int = 200, tail: str | None = None,
               leftover: bool = False, first_read: bool = True) -> RunSample:
    """A run's sample: an event file with loss and lr over `steps`, checkpoints, a log."""
    steps_t = tuple(steps)
    walls = tuple(t_end - (steps_t[-1] - s) * step_s for s in steps_t) if steps_t else ()
    scalars = {
        "train/loss": Scalars(steps_t, tuple(loss_at(s) for s in steps_t), walls),
        "train/learning_rate": Scalars(steps_t, tuple(3e-4 * min(1.0, s / 100)
                                                      for s in steps_t), walls),
    }
    path = f"/data/{name}/runs/events.out.tfevents.1784000000.box.1.0"
    events = EventFile(path=path, bytes=4096, mtime=t_end, offset=4096,
                       start=0 if first_read else 2048, stopped="eof",
                       first_wall_time=walls[0] if walls and first_read else None,
                       reset=False, scalars=MappingProxyType(scalars), errors=())
    last = steps_t[-1] if steps_t else 0
    ckpts = tuple(Checkpoint(path=f"/data/{name}/outputs/checkpoint-{s}",
                             mtime=t_end - (last - s) * step_s, bytes=(2 << 30) + s)
                  for s in range(ckpt_every, last + 1, ckpt_every))[-3:]
    leftovers = (Checkpoint(path=f"/data/{name}/outputs/checkpoint-{last}.tmp",
                            mtime=t_end - 30, bytes=1024),) if leftover else ()
    log = LogInfo(path=f"/data/{name}/train.log", bytes=10_000, mtime=t_end - 3,
                  tail=tail if tail is not None else
                  "".join(f"step {s} | loss {loss_at(s):.4f}\n" for s in steps_t[-8:]))
    return RunSample(name=name, pids=pids, log=log, events_path=f"/data/{name}/runs",
                     event_files=(events,), events_capped=False, metrics=(),
                     checkpoints=ckpts, checkpoints_total=len(ckpts), leftovers=leftovers,
                     done=None, done_mtime=None, errors=EMPTY)


def snapshot(host: str, *, t: float, gpus: Iterable[GpuSample],
             processes: Iterable[ProcessInfo] = (), runs: Iterable[RunSample] = (),
             disks: Iterable[DiskUsage] | None = None, boot_id: str = "boot-1") -> HostSnapshot:
    procs = tuple(processes)
    return HostSnapshot(
        host=host, taken_at=t, hostname=f"{host}.lab", boot_id=boot_id, uptime_s=t - BTIME,
        loadavg=(12.5, 12.1, 11.8), ncpu=64, gpus=tuple(gpus), gpu_processes=(),
        gpu_source="nvml", processes=procs,
        process_counts=ProcessCounts(total=400, kernel_threads=200, zombies=0,
                                     not_listed=400 - len(procs), fd_unreadable=0,
                                     fd_skipped=()),
        disks=tuple(disks if disks is not None else (
            disk("/", 1 << 40, 600 << 30), disk("/data", 8 << 40, 3 << 40))),
        cgroup=CgroupInfo(version=2, path="/", memory_current_bytes=40 << 30,
                          memory_max_bytes=64 << 30, memory_events=EMPTY, cpu_quota_us=None,
                          cpu_period_us=100_000, cpu_stat=EMPTY),
        kill_user_processes=False, kernel_events=(), xid_counts=EMPTY, section_errors=EMPTY,
        probe_s=0.12, probe_cpu_s=0.05, poll_s=0.31, runs=tuple(runs),
        processes_uptime_s=t - BTIME)


def ok(host: HostConfig, snap: HostSnapshot, at: float) -> PollOutcome:
    return PollOutcome(host=host, started_at=at - 0.31, poll_s=0.31, snapshot=snap, doc=None)


def failed(host: HostConfig, at: float, kind: str = "unreachable",
           message: str = "connect to 10.0.0.9 port 22: no route to host") -> PollOutcome:
    return PollOutcome(host=host, started_at=at - 10.0, poll_s=10.0, snapshot=None, doc=None,
                       error_kind=kind, error_message=message)


# ------------------------------------------------------------------------- the fleet

def run_config(name: str) -> RunConfig:
    return RunConfig(name=name, process="train.py", workdir=f"/data/{name}", log="train.log",
                     events="runs", checkpoints="outputs/checkpoint-*",
                     relaunch="python train.py --resume {latest_checkpoint}", detach="tmux")


HOSTS = (
    HostConfig(name="gpu-healthy", ssh="gpu-healthy", disks=("/", "/data"),
               runs=(run_config("llama-7b"),)),
    HostConfig(name="gpu-capped", ssh="gpu-capped", disks=("/", "/data"),
               runs=(run_config("mistral"),)),
    HostConfig(name="gpu-zombie", ssh="gpu-zombie", disks=("/", "/data"),
               runs=(run_config("bert-ddp"),)),
    HostConfig(name="gpu-down", ssh="gpu-down", disks=("/",), runs=()),
    HostConfig(name="gpu-new", ssh="gpu-new", disks=("/",), runs=()),
)


MORE_HOSTS = (
    HostConfig(name="gpu-oom", ssh="gpu-oom", disks=("/", "/data"),
               runs=(run_config("gpt-sft"),)),
    HostConfig(name="gpu-driver", ssh="gpu-driver", disks=("/",), runs=(run_config("vit-l"),)),
    HostConfig(name="gpu-mig", ssh="gpu-mig", disks=("/",), runs=(run_config("qwen-lora"),)),
)
"""The demo's other troubles, for the snapshots (`config(more=True)`): a run its memory cgroup
OOM-killed 75 s ago (demo-oom), a driver upgraded under the running one (demo-driver), and a
box whose GPU 0 is split into MIG instances (one runs a LoRA fine-tune) beside a GPU 1 whose
memory lost data: uncorrected ECC errors, a row remap pending, the driver asking for a reset,
its link at x8 of x16."""

MIG_PROFILES = (("3g.40gb", 2, 60, 40_448), ("2g.20gb", 3, 32, 20_096),
                ("1g.10gb", 9, 16, 9_984), ("1g.10gb", 10, 16, 9_984))
"""The H100 MIG layout of the exporter's capture: profile, GPU instance, SMs, memory (MiB)."""


def mig_gpus(t_used: int = 30_100) -> tuple[GpuSample, GpuSample]:
    """gpu-mig's two GPUs: GPU 0 with MIG on (no util; pid 7001 in GI 2), GPU 1 broken."""
    instances = tuple(MigInstance(gpu_instance=gi, compute_instance=0, device=d, profile=p,
                                  uuid=f"MIG-{d:08d}", mem_used_mib=t_used if gi == 2 else 9,
                                  mem_total_mib=mem, sm_count=sm,
                                  pids=(7001,) if gi == 2 else ())
                      for d, (p, gi, sm, mem) in enumerate(MIG_PROFILES))
    mig0 = replace(gpu(0, None, 1980, power=412.0, used=t_used + 27), mig=True,
                   mig_instances=instances)
    broken = replace(gpu(1, 0, 345, power=71.0, used=0, temp=33), recovery_action="gpu_reset",
                     ecc=EccCounts(0, 2, 0, 2),
                     remap=MemoryRemap(0, 1, True, False, (639, 1, 0, 0, 0)),
                     pcie=PcieLink(5, 5, 8, 16, 0))
    return mig0, broken


def config(n_extra: int = 0, readonly: bool = False, more: bool = False) -> Config:
    extra = tuple(HostConfig(name=f"node-{i:03d}", ssh=f"node-{i:03d}") for i in range(n_extra))
    return Config(interval=10.0, readonly=readonly,
                  hosts=HOSTS + (MORE_HOSTS if more else ()) + extra)


def more_snapshot(host: HostConfig, i: int) -> HostSnapshot:
    """The i-th of the last 60 polls of a MORE_HOSTS host (i = 60: now). gpu-oom's run is
    seen training until poll 54, then gone, the kernel having logged its cgroup's OOM kill;
    gpu-driver's run trains on while, from poll 58, the GPUs cannot be read."""
    t = NOW - (60 - i) * 10 - 1
    run = host.runs[0].name
    if host.name == "gpu-mig":
        return snapshot(host.name, t=t, gpus=mig_gpus(),
                        processes=[process(7001, cmd="python train.py --lora qwen.yaml", run=run,
                                           mem=30_100)],
                        runs=[run_sample(run, pids=(7001,), steps=range(1, 300 + i * 5),
                                         t_end=t)])
    alive = host.name == "gpu-driver" or i < 55
    snap = snapshot(host.name, t=t, gpus=[gpu(g, 97, 1950) for g in range(2)],
                    processes=[process(6001, cmd="python train.py --config sft.yaml",
                                       run=run)] if alive else [],
                    runs=[run_sample(run, pids=(6001,) if alive else (),
                                     steps=range(1, 600 + min(i, 54) * 10), t_end=t)])
    if not alive:
        snap = replace(
            snap, gpus=tuple(gpu(g, 0, 345, power=70.0, used=0) for g in range(2)),
            kernel_events=(KernelEvent(kind="oom", at=NOW - 76, since_boot_s=NOW - 76 - BTIME,
                                       pid=6001, name="python", memcg=True,
                                       cgroup="/user.slice/train", limit_bytes=64 << 30),),
            cgroup=replace(snap.cgroup, memory_current_bytes=2 << 30,
                           memory_events=MappingProxyType({"oom_kill": 1})))
    if host.name == "gpu-driver" and i >= 58:
        snap = replace(snap, gpus=(), gpu_error=GpuError(
            "driver_mismatch", "Failed to initialize NVML: Driver/library version mismatch",
            0.2, devices=True))
    return snap


def history_points(i: int) -> dict[str, list[GpuSample]]:
    """The GPUs of each host at the i-th of the last 60 polls (10 s apart)."""
    wobble = (i * 7) % 5
    return {
        "gpu-healthy": [gpu(g, 96 + wobble - g % 2, 1950 - 10 * wobble) for g in range(4)],
        "gpu-capped": [gpu(0, 100, 1900 if i < 20 else 740 + 5 * wobble, power=249.2,
                           limit=250.0, throttle=("sw_power_cap",) if i >= 20 else ())],
        "gpu-zombie": [gpu(g, 0, 345, power=70.0, used=0 if g != 3 else 38_912, temp=35)
                       for g in range(4)],
        "gpu-down": [gpu(0, 88, 1800)],
    }


def latest(cfg: Config) -> list[PollOutcome]:
    """The poll outcome of each host at NOW (gpu-new never answers in these tests)."""
    hosts = {h.name: h for h in cfg.hosts}
    t = NOW - 1
    healthy = snapshot(
        "gpu-healthy", t=t, gpus=history_points(60)["gpu-healthy"],
        processes=[process(4121 + g, cmd=f"python train.py --config llama.yaml --rank {g}",
                           run="llama-7b", gpu_index=g) for g in range(4)],
        runs=[run_sample("llama-7b", pids=(4121, 4122, 4123, 4124), steps=range(1, 1201),
                         t_end=t)])
    capped = snapshot(
        "gpu-capped", t=t, gpus=history_points(60)["gpu-capped"],
        processes=[process(777, cmd=f"python train.py --name {HOSTILE}", run="mistral")],
        runs=[run_sample("mistral", pids=(777,), steps=range(1, 801), t_end=t,
                         tail=f"step 799 | loss 0.91\n{HOSTILE} a log line that looks like "
                              "markup\nstep 800 | loss 0.90\n")])
    zombie = snapshot(
        "gpu-zombie", t=t, gpus=history_points(60)["gpu-zombie"],
        processes=[process(5150, cmd="python3 -u ddp_worker.py --local_rank=3 --world_size=4",
                           run=None, gpu_index=3, mem=38_400, start_s=3600)],
        runs=[run_sample("bert-ddp", pids=(), steps=range(1, 1201), t_end=t - 3 * 3600,
                         leftover=True)],
        disks=[disk("/", 1 << 40, 600 << 30), disk("/data", 4 << 40, 80 << 30,
                                                    inodes_free=400_000)])
    return [ok(hosts["gpu-healthy"], healthy, NOW), ok(hosts["gpu-capped"], capped, NOW),
            ok(hosts["gpu-zombie"], zombie, NOW), failed(hosts["gpu-down"], NOW)] + [
        ok(h, more_snapshot(h, 60), NOW) for h in MORE_HOSTS if h.name in hosts] + [
        ok(h, snapshot(h.name, t=t, gpus=[gpu(0, 50.0, 1500)]), NOW)
        for h in cfg.hosts if h.name.startswith("node-")]


def earlier(cfg: Config, span_s: float = 10.0) -> list[PollOutcome]:
    """The good polls of `latest`, `span_s` earlier, as far as the processes go: the same ones,
    each with the CPU time it had then (CPU_PCT). No GPUs: a rule that looks back at them
    (gpu.util_without_clock, sustained over two polls) finds what it finds in `latest` alone."""
    out = []
    for o in latest(cfg):
        snap = o.snapshot
        if snap is None:
            continue
        procs = tuple(p if p.cpu_s is None else replace(
            p, cpu_s=p.cpu_s - CPU_PCT.get(p.pid, 0.0) * span_s / 100) for p in snap.processes)
        t = (snap.taken_at or NOW) - span_s
        out.append(ok(o.host, replace(snap, taken_at=t, uptime_s=t - BTIME, gpus=(),
                                      processes_uptime_s=t - BTIME, processes=procs),
                      NOW - span_s))
    return out


def prime(app: Any) -> None:
    """Each host's history holding its `earlier` poll, as a TUI started with the store's last
    snapshot holds it (watch.history_from_store): the next poll's processes show CPU%."""
    for o in earlier(app.config):
        assert o.snapshot is not None
        app.hosts[o.host.name].history.record(o.snapshot, o.ended_at, runs=False)


def seeded_store(cfg: Config) -> Store:
    """A store holding an hour of history of the fleet, as a gpuwatch run overnight left it."""
    store = Store.open(":memory:")
    hosts = {h.name: h for h in cfg.hosts}
    fleet = FleetWatch(cfg, store, role="once")  # the pipeline lands each night's poll
    for i in range(60):
        at = NOW - (60 - i) * 10
        for name, gpus in history_points(i).items():
            if name not in hosts:
                continue
            runs = ([run_sample("bert-ddp", pids=(4121,) if i < 30 else (), steps=range(0),
                                t_end=at - 1)] if name == "gpu-zombie" else [])
            snap = snapshot(name, t=at - 1, gpus=gpus, runs=runs)
            zombie_disk = name == "gpu-zombie"
            if zombie_disk:  # /data fills 1 GiB a minute: the forecast must say when it is full
                snap = replace(snap, disks=(disk("/", 1 << 40, 600 << 30),
                                            disk("/data", 4 << 40, (80 << 30) + (60 - i) * (
                                                1 << 30) // 6, inodes_free=400_000)))
            fleet.land(ok(hosts[name], snap, at))
        for host in MORE_HOSTS:
            if host.name in hosts:
                fleet.land(ok(host, more_snapshot(host, i), at))
    return store


_SVG_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="([\d.]+)" '
                       r'clip-path="url\(#[^)]*-line-(\d+)\)">(.*?)</text>')


def svg_lines(svg: str) -> list[str]:
    """The screen's text, line by line, from Textual's SVG screenshot (columns kept)."""
    rows: dict[int, list[tuple[float, str]]] = {}
    widths = []
    for m in _SVG_TEXT.finditer(svg):
        x, length, line, raw = m.groups()
        text = html.unescape(raw).replace("\xa0", " ")
        rows.setdefault(int(line), []).append((float(x), text))
        if text:
            widths.append(float(length) / len(text))
    if not widths:
        return []
    char = sorted(widths)[len(widths) // 2]
    out = []
    for line in range(max(rows, default=-1) + 1):
        s = ""
        for x, text in sorted(rows.get(line, [])):
            col = round(x / char)
            s = s.ljust(col)[:col] + text
        out.append(s.rstrip())
    return out
