"""``gpuwatch --demo``'s fleet: simulated GPU boxes served over real SSH on loopback.

Each box is a ``Box`` (remote/sim/box.py) with the REAL /proc, so real processes can be seen and
signalled, and simulated GPUs, cgroup, kernel log and data disk, served by its own in-process
SSH server (remote/sim/sshserver.py) on 127.0.0.1 with its own host key. The fleet writes an
OpenSSH client config, a known_hosts and a gpuwatch config.toml, so gpuwatch reaches the boxes
through exactly the pipeline it uses for real hosts, host-key checking included.

A controller task steps every box once per tick (1 s): GPU state follows the real processes of
each run, logs, event files and checkpoints move because real (pretend) trainers write them,
and each box plays its scenario:

- ``demo-healthy``: a trainer that trains: GPU busy at full clock, loss going down, checkpoints;
  and on GPU 1 a second run, ``sft``, that the config does not name: gpuwatch finds it from the
  GPU's process (issue 8), with its log, event files and checkpoints.
- ``demo-capped``: the same, on a GPU capped to 250 W: util 100 % at ~37 % of max SM clock,
  power at the limit, ``sw_power_cap`` active (U21, U23).
- ``demo-zombie``: a DDP job died; an orphaned rank 3 (a real process) still holds VRAM on GPU 3
  while no live run owns it (U11). Reap it over SSH and the VRAM comes back.
- ``demo-oom``: the trainer's cgroup memory climbs to its limit and the (simulated) OOM killer
  SIGKILLs it: memory.events oom_kill +1, the kernel's line in dmesg, GPU idle (U41). Relaunch it
  over SSH from its latest checkpoint and it runs on without running out of memory again.
- ``demo-disk``: a fine-tune that keeps every checkpoint while /data fills toward full (U6).
- ``demo-driver``: an unattended driver upgrade left the running kernel module and the new
  library apart: nvidia-smi says "Driver/library version mismatch" (exit 18), as every box does
  until it is rebooted. A wedged driver is not "no GPU": gpuwatch says so, and refuses a
  relaunch there (every new CUDA process would fail).

The simulated /data disk is the simulator hook ``BOX/sim/statvfs.json`` (the probe reads it only
under ``GPUWATCH_SIM_DIR``): ``{"/data": {"bytes_total": int, "bytes_free": int,
"inodes_total": int, "inodes_free": int}}``, keyed by the path exactly as the config lists it.

``async with DemoFleet.start() as fleet: ...`` runs it; ``python -m gpuwatch.remote.sim.fleet``
serves it until Ctrl-C. Every process the fleet or its SSH servers start carries
``GPUWATCH_DEMO_FLEET=<id>`` in its environment and a lifeline pipe; on exit (or if this process
dies) they all end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from gpuwatch.remote.sim import trainer as trainer_module
from gpuwatch.remote.sim.box import GPU_KNOBS, Box, SimProcess
from gpuwatch.remote.sim.nvidia_smi import REASON_BITS
from gpuwatch.remote.sim.presets import Preset, h100_sxm
from gpuwatch.remote.sim.scenario import Scenario, util_without_clock
from gpuwatch.remote.sim.sshserver import BoxSshServer, write_key_pair

__all__ = ["BOX_NAMES", "DemoBox", "DemoFleet", "DemoRun", "Timeline", "main"]

BOX_NAMES = ("demo-healthy", "demo-capped", "demo-zombie", "demo-oom", "demo-disk",
             "demo-driver")
"""Every box of the demo, in the order the config lists them."""

FLEET_ENV = "GPUWATCH_DEMO_FLEET"
"""Set in the environment of every process the fleet starts: how it finds them all at the end."""
LIFELINE_ENV = "GPUWATCH_DEMO_LIFELINE"
"""The fd of a pipe whose other end only this process holds: the trainer ends when it closes."""
ROOT_MARKER = ".gpuwatch-demo-fleet"
"""The file that makes a folder a demo root: only such a folder (or an empty one) is reused."""
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GIB = 1 << 30
TRAINER_SOURCE = Path(trainer_module.__file__)

_log = logging.getLogger("gpuwatch.demo")

ZOMBIE_SOURCE = '''#!/usr/bin/env python3
"""gpuwatch --demo: a STAND-IN for rank 3 of a torchrun job whose launcher died.

It trains nothing: it sleeps, as a rank blocked in an NCCL collective does, while the demo's
simulated nvidia-smi lists it as holding VRAM on GPU 3. Its parent is gone (it is an orphan), so
nothing will ever end it: reap it (kill it) and the simulated VRAM comes back.
"""
import os, sys, threading, time

print("rank 3/4: waiting in all_reduce (NCCL) ...", flush=True)
fd = os.environ.get("GPUWATCH_DEMO_LIFELINE")
if fd and fd.isdigit():
    def watch():
        try:
            while os.read(int(fd), 1):
                pass
        except OSError:
            pass
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()
while os.path.isdir(os.path.dirname(os.path.abspath(__file__))):
    time.sleep(2)
'''


@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds of the demo (tests shrink these)."""

    step_s: float = 0.5
    """Seconds per training step of the healthy, OOM and disk trainers."""
    capped_step_s: float = 1.4
    """The capped box trains ~2.7x slower: its clock sits at 37 % of max."""
    save_every: int = 40
    """Steps between checkpoints of the healthy and capped runs."""
    capped_interval_s: float = 4.0
    """demo-capped plays util_without_clock one frame per this: two healthy, then capped."""
    oom_after_s: float = 45.0
    """demo-oom's trainer is OOM-killed this long after it started (once per fleet)."""
    oom_save_every: int = 20
    disk_save_every: int = 30
    disk_start_free: float = 0.09
    """Fraction of /data free on demo-disk at the start."""
    disk_fill_bytes_s: float = 0.25e9
    """Steady growth on demo-disk's /data (caches, logs), besides each checkpoint."""
    disk_checkpoint_bytes: int = 14_000_000_000
    """What each demo-disk checkpoint costs on the simulated /data."""
    disk_floor: float = 0.006
    """demo-disk's /data stops filling at this fraction free (it cannot really run out)."""


# ---------------------------------------------------------------------------------------------
# This machine's /proc


@dataclass(frozen=True)
class RealProcess:
    pid: int
    argv: tuple[str, ...]
    state: str
    ppid: int
    comm: str


def scan_processes() -> dict[int, RealProcess]:
    """Every live (non-zombie) user-space process of this machine, from the real /proc."""
    found: dict[int, RealProcess] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                raw = fh.read()
            if not raw:
                continue  # kernel thread, or a zombie that released its memory
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.find("(") + 1: stat.rfind(")")]
        rest = stat[stat.rfind(")") + 2:].split()
        if not rest or rest[0] in ("Z", "X"):
            continue
        argv = tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
        found[int(entry.name)] = RealProcess(int(entry.name), argv, rest[0], int(rest[1]), comm)
    return found


def fleet_pids(fleet_id: str) -> list[int]:
    """Live processes carrying this fleet's mark in their environment."""
    mark = f"{FLEET_ENV}={fleet_id}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:][:1] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _real_uptime() -> float:
    with open("/proc/uptime", encoding="ascii") as fh:
        return float(fh.read().split()[0])


def _real_btime() -> int:
    with open("/proc/stat", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("btime "):
                return int(line.split()[1])
    return int(time.time() - _real_uptime())


def _uses_cgroup_v1_memory() -> bool:
    """Whether this machine's /proc/self/cgroup has a v1 memory line (the probe then reads the
    v1 files, so the simulated cgroup must offer them too)."""
    try:
        text = Path("/proc/self/cgroup").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return any("memory" in line.split(":")[1].split(",") for line in text.splitlines()
               if line.count(":") >= 2)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Runs and boxes


@dataclass
class DemoRun:
    """A training run on a demo box: where it lives and how it is (re)started."""

    name: str
    workdir: Path
    gpu: int
    script: Path
    """The run's own train.py (a copy of remote/sim/trainer.py), by absolute path."""
    trainer_args: tuple[str, ...] = ()
    relaunchable: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    configured: bool = True
    """False: left out of the config, for gpuwatch to discover (issue 8)."""

    @property
    def log(self) -> Path:
        return self.workdir / "train.log"

    def command(self, resume: str | None = None) -> str:
        """The shell command that starts it; resume is a checkpoint or a template field."""
        words = ["python3", str(self.script), "--run", self.name, "--workdir", str(self.workdir),
                 *self.trainer_args]
        cmd = " ".join(shlex.quote(w) for w in words)
        return cmd + (f" --resume {resume}" if resume is not None else "")

    def matches(self, proc: RealProcess) -> bool:
        """A python process running this run's train.py (not the shell that starts it)."""
        return (len(proc.argv) > 1 and os.path.basename(proc.argv[0]).startswith("python")
                and str(self.script) in proc.argv[1:])


class DemoBox:
    """One simulated box of the fleet: its Box, home, SSH server and scenario state."""

    memory_max: int | None = None
    story = ""

    def __init__(self, fleet: DemoFleet, name: str, root: Path) -> None:
        self.fleet = fleet
        self.name = name
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.timeline = fleet.timeline
        self.rng = random.Random(name)
        self.box = Box(root / "box", self.make_gpus(), real_proc=True, btime=_real_btime(),
                       uptime_s=_real_uptime(), memory_max=self.memory_max,
                       memory_current=18 * GIB)
        self.runs: list[DemoRun] = []
        self.disks: dict[str, dict[str, int]] = {
            "/data": {"bytes_total": 7_681_500_000_000, "bytes_free": 2_915_000_000_000,
                      "inodes_total": 468_750_000, "inodes_free": 466_020_000}}
        self.server: BoxSshServer | None = None
        self.live: dict[str, list[int]] = {}
        """Run name -> pids of its live trainer processes, as of the last tick."""
        self.started = time.monotonic()
        self._written: dict[Path, str] = {}
        self._gpus_written = ""

    # -- set-up ------------------------------------------------------------------------------
    @classmethod
    def make_gpus(cls) -> Preset:
        return h100_sxm(1)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def env(self) -> dict[str, str]:
        base = STD_PATH
        if shutil.which("python3", path=base) is None:
            base = os.path.dirname(sys.executable) + os.pathsep + base
        env = self.box.env(base_path=base)
        user = self.fleet.user
        env.update({"HOME": str(self.home), "USER": user, "LOGNAME": user, "SHELL": "/bin/sh",
                    "LANG": "C.UTF-8", FLEET_ENV: self.fleet.id,
                    "GPUWATCH_DEMO_BOX": self.name})
        if self.fleet.lifeline_fd is not None:
            env[LIFELINE_ENV] = str(self.fleet.lifeline_fd)
        return env

    def add_run(self, name: str, *, gpu: int = 0, trainer_args: Sequence[str] = (),
                relaunchable: bool = True, configured: bool = True) -> DemoRun:
        workdir = self.home / name
        workdir.mkdir(parents=True, exist_ok=True)
        # a discovered run is named after its script (issue 8): sft.py is found as "sft"
        script = workdir / ("train.py" if configured else f"{name}.py")
        shutil.copyfile(TRAINER_SOURCE, script)
        run = DemoRun(name, workdir, gpu, script, tuple(trainer_args), relaunchable,
                      {"CUDA_VISIBLE_DEVICES": str(gpu)}, configured)
        self.runs.append(run)
        return run

    def prepare(self) -> None:
        """Files and runs before the server starts (subclasses add their story)."""

    async def launch(self) -> None:
        """Start this box's processes (after the servers listen)."""

    def run_config(self, run: DemoRun) -> dict[str, Any]:
        table: dict[str, Any] = {
            "process": str(run.script), "workdir": str(run.workdir), "log": "train.log",
            "events": "runs", "checkpoints": "outputs/checkpoint-*",
        }
        if run.relaunchable:
            table["relaunch"] = run.command("{latest_checkpoint}")
            table["detach"] = "setsid"
        if run.env:
            table["env"] = dict(run.env)
        return table

    def host_config(self) -> dict[str, Any]:
        return {"ssh": self.name, "python": "python3", "disks": ["/", *self.disks],
                "runs": {run.name: self.run_config(run) for run in self.runs
                         if run.configured}}

    # -- starting processes ------------------------------------------------------------------
    async def start_detached(self, command: str, *, log: Path, cwd: Path,
                             env: Mapping[str, str] | None = None,
                             own_session: bool = True) -> int:
        """Start a command the way gpuwatch's relaunch does (setsid nohup, stdin from
        /dev/null, output appended to the log), so it is an orphan in its own session.
        own_session=False leaves it in the session of a launcher shell that exits at once: an
        orphan that does not lead its session, as a rank is when torchrun dies under it.
        Returns its pid (setsid and nohup exec in place: the pid is the command's own)."""
        full = dict(self.env())
        full["PYTHONUNBUFFERED"] = "1"
        full.update(env or {})
        line = (f"{'setsid ' if own_session else ''}nohup {command} >> "
                f"{shlex.quote(str(log))} 2>&1 < /dev/null & echo $!")
        pass_fds = (self.fleet.lifeline_fd,) if self.fleet.lifeline_fd is not None else ()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", line, cwd=cwd, env=full, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, pass_fds=pass_fds,
            start_new_session=not own_session)
        out, _ = await proc.communicate()
        pid = int(out.decode().split()[0])
        self.fleet.started_pids.add(pid)
        return pid

    async def start_run(self, run: DemoRun, resume: str | None = None) -> int:
        return await self.start_detached(run.command(resume), log=run.log, cwd=run.workdir,
                                         env=run.env)

    # -- every tick ----------------------------------------------------------------------------
    def tick(self, procs: Mapping[int, RealProcess]) -> None:
        self.box.uptime_s = _real_uptime()
        self.live = {run.name: sorted(pid for pid, p in procs.items() if run.matches(p))
                     for run in self.runs}
        self.step(procs)
        self.sync_compute_apps(procs)
        self.flush()
        self.write_statvfs()
        self.write_cgroup_v1()

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        """The scenario's move this tick (GPU knobs, cgroup, disks)."""
        for run in self.runs:
            if self.live.get(run.name):
                self.gpu_busy(run.gpu)
            else:
                self.gpu_idle(run.gpu)

    def holders(self, procs: Mapping[int, RealProcess]) -> dict[int, tuple[int, str, int]]:
        """pid -> (gpu, process name, MiB) of every process the stand-in should list."""
        out: dict[int, tuple[int, str, int]] = {}
        for run in self.runs:
            for pid in self.live.get(run.name, [])[:1]:
                used = int(self.box.gpus[run.gpu].get("memory.used") or 0)
                out[pid] = (run.gpu, procs[pid].argv[0], max(0, used - 512))
        return out

    def sync_compute_apps(self, procs: Mapping[int, RealProcess]) -> None:
        """The stand-in's compute apps follow real processes: a pid that is gone is dropped."""
        wanted = self.holders(procs)
        current = {a["pid"]: (a["gpu"], a["process_name"], a["used_gpu_memory"])
                   for a in self.box.state["compute_apps"]}
        if current != wanted:
            self.box.state["compute_apps"] = [
                {"gpu": gpu, "pid": pid, "process_name": name, "used_gpu_memory": mib}
                for pid, (gpu, name, mib) in sorted(wanted.items())]

    # -- GPU states ----------------------------------------------------------------------------
    # Box.set_gpu rewrites gpus.json on every call; a tick changes many fields of several GPUs,
    # so these change the state in memory and flush() writes it once, if it changed.
    def set_gpu(self, index: int, fields: Mapping[str, Any] | None = None,
                **knobs: Any) -> None:
        """Box.set_gpu's semantics (knob names from GPU_KNOBS), written at the next flush."""
        gpu = self.box.gpus[index]
        gpu.update(fields or {})
        for knob, value in knobs.items():
            for name in GPU_KNOBS[knob]:
                gpu[name] = value
            if knob == "mem_used_mib" and isinstance(gpu.get("memory.total"), int):
                gpu["memory.free"] = max(0, gpu["memory.total"] - gpu.get("memory.reserved", 0)
                                         - value)

    def set_throttle(self, index: int, reasons: Iterable[str]) -> None:
        mask = 0
        for reason in reasons:
            mask |= REASON_BITS[reason]
        self.box.gpus[index]["clocks_event_reasons.active"] = mask

    def flush(self) -> None:
        text = json.dumps(self.box.state, sort_keys=True)
        if text != self._gpus_written:
            self.box._write_gpus()  # the Box's own writer: temp file, then rename
            self._gpus_written = text

    def gpu_busy(self, index: int, *, mem_mib: int = 61_440) -> None:
        r = self.rng
        gpu = self.box.gpus[index]
        sm_max = int(gpu.get("clocks.max.sm") or 1980)
        limit = float(gpu.get("enforced.power.limit") or 700.0)
        temp = int(gpu.get("temperature.gpu") or 31)
        self.set_gpu(index, {"utilization.memory": r.randint(38, 52)},
                         util_pct=r.randint(93, 99),
                         sm_clock_mhz=sm_max if r.random() < 0.8 else sm_max - 15 * r.randint(1, 3),
                         power_w=round(limit * r.uniform(0.86, 0.95), 2),
                         temp_c=min(67, temp + 3) if temp < 61 else r.randint(61, 67),
                         mem_used_mib=mem_mib + r.randint(-64, 64), pstate="P0")
        self.set_throttle(index, [])

    def gpu_idle(self, index: int, *, mem_mib: int = 0) -> None:
        gpu = self.box.gpus[index]
        temp = int(gpu.get("temperature.gpu") or 31)
        self.set_gpu(index, {"utilization.memory": 0}, util_pct=0, sm_clock_mhz=345,
                         power_w=round(self.rng.uniform(70.5, 74.5), 2),
                         temp_c=max(31, temp - 3), mem_used_mib=mem_mib, pstate="P0")
        self.set_throttle(index, ["gpu_idle"])

    # -- simulated files -------------------------------------------------------------------------
    def _write_if_changed(self, path: Path, text: str) -> None:
        if self._written.get(path) != text:
            _atomic_write(path, text)
            self._written[path] = text

    def write_statvfs(self) -> None:
        self._write_if_changed(self.box.sim / "statvfs.json",
                               json.dumps(self.disks, indent=1, sort_keys=True) + "\n")

    def write_cgroup_v1(self) -> None:
        """The cgroup v1 files mirroring the Box's v2 state, where this machine is v1 (hybrid):
        the probe follows /proc/self/cgroup, which is this machine's, to pick the layout."""
        if not self.fleet.cgroup_v1:
            return
        c = self.box.cgroup
        base = self.box.sys / "fs" / "cgroup"
        limit = c["memory.max"] if c["memory.max"] is not None else 9223372036854771712
        events = c["events"]
        self._write_if_changed(base / "memory" / "memory.usage_in_bytes",
                               f"{c['memory.current']}\n")
        self._write_if_changed(base / "memory" / "memory.limit_in_bytes", f"{limit}\n")
        self._write_if_changed(base / "memory" / "memory.oom_control",
                               f"oom_kill_disable 0\nunder_oom 0\noom_kill {events['oom_kill']}\n")
        quota = c["cpu_quota_us"] if c["cpu_quota_us"] is not None else -1
        self._write_if_changed(base / "cpu" / "cpu.cfs_quota_us", f"{quota}\n")
        self._write_if_changed(base / "cpu" / "cpu.cfs_period_us", f"{c['cpu_period_us']}\n")
        self._write_if_changed(base / "cpu" / "cpu.stat",
                               f"nr_periods {c['nr_periods']}\nnr_throttled {c['nr_throttled']}\n"
                               f"throttled_time {c['throttled_usec'] * 1000}\n")


class HealthyBox(DemoBox):
    story = ("a healthy run: GPU busy at full clock, loss going down, checkpoints on schedule; "
             "on GPU 1 a run nobody configured (sft), found from its GPU process")

    @classmethod
    def make_gpus(cls) -> Preset:
        return h100_sxm(2)

    def prepare(self) -> None:
        t = self.timeline
        self.add_run("llama-7b", trainer_args=(
            "--step-s", f"{t.step_s:g}", "--save-every", str(t.save_every),
            "--save-total-limit", "3"))
        self.add_run("sft", gpu=1, configured=False, trainer_args=(
            "--step-s", f"{t.step_s * 1.5:g}", "--save-every", str(t.save_every),
            "--save-total-limit", "2", "--seed", "99"))

    async def launch(self) -> None:
        for run in self.runs:
            await self.start_run(run)


class CappedBox(DemoBox):
    story = ("util 100 % but the SM clock at 37 % of max: the board is power-capped to 250 W "
             "(sw_power_cap), so the run is ~2.7x slower than it looks")
    CAP_W = 250.0

    def prepare(self) -> None:
        t = self.timeline
        self.add_run("vit-huge", trainer_args=(
            "--step-s", f"{t.capped_step_s:g}", "--save-every", str(max(1, t.save_every // 2)),
            "--save-total-limit", "3", "--seed", "77"))
        self.scenario: Scenario = util_without_clock(self.box, 0, ticks=1, clock_fraction=0.37)
        self.scenario.interval_s = t.capped_interval_s
        self.alive_s = 0.0
        self._last = time.monotonic()

    async def launch(self) -> None:
        await self.start_run(self.runs[0])

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        now = time.monotonic()
        dt, self._last = now - self._last, now
        if not self.live.get("vit-huge"):
            self.gpu_idle(0)
            return
        self.alive_s += dt
        uptime = self.box.uptime_s
        if self.scenario.tick < len(self.scenario.frames):
            self.scenario.play_until(self.box, self.alive_s)
            self.box.uptime_s = uptime  # the scenario's frames advance a clock of their own
        if self.scenario.tick >= len(self.scenario.frames):
            # Capped: 100 % busy, SM clock ~37 % of max, drawing right at the lowered limit.
            gpu = self.box.gpus[0]
            sm_max = int(gpu.get("clocks.max.sm") or 1980)
            r = self.rng
            self.set_gpu(0, {"utilization.memory": r.randint(20, 28)}, util_pct=100,
                             sm_clock_mhz=int(sm_max * r.uniform(0.35, 0.39)),
                             power_limit_w=self.CAP_W,
                             power_w=round(self.CAP_W * r.uniform(0.985, 1.0), 2),
                             temp_c=r.randint(52, 56), mem_used_mib=47_104 + r.randint(-32, 32))
            self.set_throttle(0, ["sw_power_cap"])
        else:
            self.set_gpu(0, mem_used_mib=47_104)


class ZombieBox(DemoBox):
    story = ("a DDP job died; its orphaned rank 3 still holds 38 GiB on GPU 3 while no live run "
             "owns it: reap it and the VRAM comes back")
    ZOMBIE_GPU = 3
    ZOMBIE_MIB = 38_912

    @classmethod
    def make_gpus(cls) -> Preset:
        return h100_sxm(4)

    def prepare(self) -> None:
        run = self.add_run("bert-ddp", gpu=self.ZOMBIE_GPU, relaunchable=False)
        run.env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
        self.zombie_pid: int | None = None
        self.zombie_script = run.workdir / "ddp_worker.py"
        self.zombie_script.write_text(ZOMBIE_SOURCE, encoding="utf-8")
        write_history(run.workdir, steps=1200, seed=5, save_every=200, hours_ago=3.0,
                      tmp_leftover=True)
        with run.log.open("a", encoding="utf-8") as fh:
            fh.write(
                "step 1200 | loss 1.9132 | lr 2.71e-04 | 3.1 it/s\n"
                "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, NumelIn=1048576) "
                "ran for 600014 milliseconds before timing out.\n"
                "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) "
                "local_rank: 0 (pid: 4121) of binary: /usr/bin/python3\n"
                "torch.distributed.elastic.agent.server.api: [WARNING] Received Signals.SIGKILL "
                "death signal, shutting down workers\n")

    def run_config(self, run: DemoRun) -> dict[str, Any]:
        table = super().run_config(run)
        # The launcher is what made this run a run; it is gone, so the run is dead.
        table["process"] = "torchrun"
        return table

    async def launch(self) -> None:
        run = self.runs[0]
        command = " ".join(shlex.quote(w) for w in (
            "python3", "-u", str(self.zombie_script), "--local_rank=3", "--world_size=4",
            "--master_port=29500"))
        # Not a session leader: U11's orphaned rank, left in the session of a launcher that died
        # (a `setsid nohup` run leads its own session on purpose and is not a zombie for that).
        self.zombie_pid = await self.start_detached(
            command, log=run.workdir / "rank3.log", cwd=run.workdir, own_session=False,
            env={"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "3", "RANK": "3", "WORLD_SIZE": "4"})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until setsid and nohup have exec'd python
            cmd = _cmdline(self.zombie_pid)
            if cmd is None or str(self.zombie_script).encode() in cmd:
                break
            await asyncio.sleep(0.02)

    def holders(self, procs: Mapping[int, RealProcess]) -> dict[int, tuple[int, str, int]]:
        out = super().holders(procs)
        if self.zombie_pid is not None and self.zombie_pid in procs:
            out[self.zombie_pid] = (self.ZOMBIE_GPU, procs[self.zombie_pid].argv[0],
                                    self.ZOMBIE_MIB - 512)
        return out

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        alive = self.zombie_pid is not None and self.zombie_pid in procs
        for index in range(len(self.box.gpus)):
            if index == self.ZOMBIE_GPU and alive:
                # VRAM held, nothing running on it: idle clocks, a little more power.
                self.gpu_idle(index, mem_mib=self.ZOMBIE_MIB)
                self.set_gpu(index, power_w=round(self.rng.uniform(112.0, 121.0), 2))
            else:
                self.gpu_idle(index)


class OomBox(DemoBox):
    story = ("the run's cgroup memory climbs to its 64 GiB limit and the OOM killer takes it "
             "(memory.events oom_kill +1, the kernel's line in dmesg): relaunch it from its "
             "latest checkpoint")
    memory_max = 64 * GIB

    def prepare(self) -> None:
        t = self.timeline
        self.add_run("gpt2-xl", trainer_args=(
            "--step-s", f"{t.step_s:g}", "--save-every", str(t.oom_save_every),
            "--save-total-limit", "3", "--seed", "42"))
        self.first_pid: int | None = None
        self.first_seen: float | None = None
        self.oom_done = False

    async def launch(self) -> None:
        self.first_pid = await self.start_run(self.runs[0])
        self.first_seen = time.monotonic()

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        pids = self.live.get("gpt2-xl", [])
        assert self.box.cgroup["memory.max"] is not None
        limit = int(self.box.cgroup["memory.max"])
        if not pids:
            self.gpu_idle(0)
            self.memory(2 * GIB)
            return
        self.gpu_busy(0, mem_mib=72_704)
        if self.oom_done or self.first_seen is None:
            # The relaunched run (smaller eval batch, say) sits well under the limit.
            self.memory(41 * GIB + self.rng.randint(0, 1024) * (1 << 20))
            return
        frac = min(1.0, (time.monotonic() - self.first_seen) / self.timeline.oom_after_s)
        self.memory(int(28 * GIB + frac * (limit - 28 * GIB - GIB)), force=frac >= 1.0)
        if frac >= 1.0:
            self.oom_kill(procs[pids[0]])

    def memory(self, current: int, *, force: bool = False) -> None:
        """Move the cgroup's memory.current when it changed by 512 MiB or more (each change
        rewrites the whole simulated cgroup)."""
        if force or abs(current - int(self.box.cgroup["memory.current"])) >= 512 << 20:
            self.box.set_cgroup(memory_current=current)

    def oom_kill(self, victim: RealProcess) -> None:
        """What the kernel does when the cgroup hits memory.max and nothing can be reclaimed:
        SIGKILL the biggest task, count it in memory.events, say so in the kernel log."""
        self.oom_done = True
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        limit = int(self.box.cgroup["memory.max"])
        self.box.set_cgroup(memory_current=limit)
        self.box.oom_kill(SimProcess(pid=victim.pid, cmdline=victim.argv, comm=victim.comm,
                                     uid=os.getuid(), rss_kb=(limit - 3 * GIB) >> 10,
                                     cgroup=self.box.cgroup_path))
        self.box.set_cgroup(memory_current=2 * GIB)
        self.live["gpt2-xl"] = []
        self.gpu_idle(0)
        _log.info("%s: OOM-killed pid %d", self.name, victim.pid)


class DiskBox(DemoBox):
    story = ("a fine-tune that keeps every checkpoint (no save_total_limit) while /data fills "
             "toward full")

    def prepare(self) -> None:
        t = self.timeline
        self.add_run("sdxl-finetune", trainer_args=(
            "--step-s", f"{t.step_s:g}", "--save-every", str(t.disk_save_every),
            "--save-total-limit", "0", "--checkpoint-kib", "128", "--seed", "9"))
        total = 3_840_755_982_336
        self.disks["/data"] = {
            "bytes_total": total, "bytes_free": int(total * t.disk_start_free),
            "inodes_total": 234_422_272, "inodes_free": 201_300_000}
        self.seen_checkpoints: set[str] = set()
        self._last = time.monotonic()

    async def launch(self) -> None:
        await self.start_run(self.runs[0])

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        super().step(procs)
        now = time.monotonic()
        dt, self._last = now - self._last, now
        t = self.timeline
        disk = self.disks["/data"]
        used = t.disk_fill_bytes_s * dt if self.live.get("sdxl-finetune") else 0.0
        inodes = 40 * dt if self.live.get("sdxl-finetune") else 0.0
        outputs = self.runs[0].workdir / "outputs"
        try:
            names = {n for n in os.listdir(outputs) if n.startswith("checkpoint-")
                     and not n.endswith(".tmp")}
        except OSError:
            names = set()
        new = names - self.seen_checkpoints
        self.seen_checkpoints |= names
        used += len(new) * t.disk_checkpoint_bytes
        inodes += len(new) * 1500
        floor = int(disk["bytes_total"] * t.disk_floor)
        disk["bytes_free"] = max(floor, int(disk["bytes_free"] - used))
        disk["inodes_free"] = max(1_000_000, int(disk["inodes_free"] - inodes))


class DriverBox(DemoBox):
    story = ("its NVIDIA driver was upgraded under the running one: nvidia-smi answers "
             "'Driver/library version mismatch' until the box is rebooted")

    @classmethod
    def make_gpus(cls) -> Preset:
        return h100_sxm(2)

    def prepare(self) -> None:
        self.box.set_faults(driver="mismatch")


BOX_KINDS: dict[str, type[DemoBox]] = {
    "demo-healthy": HealthyBox, "demo-capped": CappedBox, "demo-zombie": ZombieBox,
    "demo-oom": OomBox, "demo-disk": DiskBox, "demo-driver": DriverBox,
}


def write_history(workdir: Path, *, steps: int, seed: int, save_every: int, hours_ago: float,
                  tmp_leftover: bool = False) -> None:
    """A run's past, as its trainer would have left it: an event file, checkpoints, a log."""
    start = time.time() - hours_ago * 3600
    step_s = hours_ago * 3600 * 0.9 / steps
    runs = workdir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    records = [trainer_module.tfrecord(trainer_module.event_bytes(
        start, 0, file_version="brain.Event:2"))]
    lines = [f"[{workdir.name}] starting a new run in {workdir}\n"]
    for step in range(1, steps + 1):
        loss = trainer_module.loss_at(step, seed)
        lr = trainer_module.lr_at(step)
        records.append(trainer_module.tfrecord(trainer_module.event_bytes(
            start + step * step_s, step,
            scalars=(("train/loss", loss), ("train/learning_rate", lr)))))
        if step % 50 == 0:
            lines.append(f"step {step} | loss {loss:.4f} | lr {lr:.2e} | 3.1 it/s\n")
    host = "gpu-node-7"
    (runs / f"events.out.tfevents.{int(start):010d}.{host}.4121.0").write_bytes(
        b"".join(records))
    (workdir / "train.log").write_text("".join(lines), encoding="utf-8")
    outputs = workdir / "outputs"
    for step in range(save_every, steps + 1, save_every):
        ckpt = outputs / f"checkpoint-{step}"
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}) + "\n",
                                                 encoding="utf-8")
        (ckpt / "model.bin").write_bytes(b"\0" * 4096)
        when = start + step * step_s
        for path in (ckpt / "trainer_state.json", ckpt / "model.bin", ckpt):
            os.utime(path, (when, when))
    if tmp_leftover:  # the save that was under way when the job died (U6)
        tmp = outputs / f"checkpoint-{steps}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "model.bin").write_bytes(b"\0" * 1024)
        when = start + steps * step_s
        os.utime(tmp, (when, when))


# ---------------------------------------------------------------------------------------------
# The fleet


class DemoFleet:
    """Simulated boxes behind real SSH servers on loopback, with the files to reach them.

    Use ``async with DemoFleet.start(...) as fleet``: ``fleet.config_path`` (gpuwatch's
    config.toml), ``fleet.ssh_config``, ``fleet.known_hosts``, ``fleet.client_key``,
    ``fleet.hosts`` (names), ``fleet.box(name)`` (its Box), ``fleet.demo_box(name)``.
    """

    def __init__(self, root: Path, *, boxes: Sequence[str], tick_s: float,
                 timeline: Timeline) -> None:
        unknown = [b for b in boxes if b not in BOX_KINDS]
        if unknown:
            raise ValueError(f"unknown demo boxes {unknown} (known: {', '.join(BOX_KINDS)})")
        self.root = root
        self.id = uuid.uuid4().hex
        self.tick_s = tick_s
        self.timeline = timeline
        self.user = getpass.getuser()
        self.ssh_dir = root / "ssh"
        self.config_path = root / "config.toml"
        self.ssh_config = self.ssh_dir / "config"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.client_key = self.ssh_dir / "id_ed25519"
        self.cgroup_v1 = _uses_cgroup_v1_memory()
        self.started_pids: set[int] = set()
        self.lifeline_fd: int | None = None
        self._lifeline_w: int | None = None
        self._names = list(dict.fromkeys(boxes))
        self._boxes: dict[str, DemoBox] = {}
        self._controller: asyncio.Task[None] | None = None
        self.ticks = 0

    # -- the public face ---------------------------------------------------------------------
    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, root: Path | None = None, *, boxes: Iterable[str] = BOX_NAMES,
                    tick_s: float = 1.0, timeline: Timeline | None = None,
                    ) -> AsyncIterator[DemoFleet]:
        """Build the boxes, start their SSH servers, processes and the controller; on exit
        (or cancellation) stop all of it. root=None: a private temp folder, removed after;
        a root given must be empty or an earlier demo's (its boxes are then started afresh)."""
        own_root = root is None
        base = Path(tempfile.mkdtemp(prefix="gpuwatch-demo-")) if root is None else Path(root)
        _claim_root(base)
        fleet = cls(base.resolve(), boxes=list(boxes), tick_s=tick_s,
                    timeline=timeline or Timeline())
        try:
            await fleet._start()
            yield fleet
        finally:
            try:
                await fleet._stop()
            finally:
                fleet._kill_all_now()
                if own_root:
                    shutil.rmtree(base, ignore_errors=True)

    @property
    def hosts(self) -> list[str]:
        return list(self._names)

    def box(self, name: str) -> Box:
        return self._boxes[name].box

    def demo_box(self, name: str) -> DemoBox:
        return self._boxes[name]

    def run_pids(self, host: str, run: str) -> list[int]:
        """Live trainer pids of a run, from the real /proc now."""
        demo = self._boxes[host]
        spec = next(r for r in demo.runs if r.name == run)
        return sorted(pid for pid, p in scan_processes().items() if spec.matches(p))

    def tick(self) -> None:
        """One step of every box (the controller calls it every tick_s; tests may too)."""
        procs = scan_processes()
        for demo in self._boxes.values():
            try:
                demo.tick(procs)
            except Exception:  # one box's trouble must not stop the others
                _log.exception("demo box %s: tick failed", demo.name)
        self.ticks += 1

    def processes(self) -> list[int]:
        """Live processes this fleet started (directly or through its SSH servers)."""
        return fleet_pids(self.id)

    # -- start and stop ------------------------------------------------------------------------
    async def _start(self) -> None:
        self.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.ssh_dir, 0o700)
        read_fd, write_fd = os.pipe()
        self.lifeline_fd, self._lifeline_w = read_fd, write_fd
        client_key = write_key_pair(self.client_key, f"gpuwatch-demo-client@{self.id[:8]}")
        known: list[str] = []
        for name in self._names:
            demo = BOX_KINDS[name](self, name, self.root / "boxes" / name)
            self._boxes[name] = demo
            demo.prepare()
            host_key = write_key_pair(self.ssh_dir / f"host_{name}_ed25519",
                                      f"gpuwatch-demo-host:{name}")
            demo.server = BoxSshServer(name, host_key=host_key, authorized_keys=[client_key],
                                       user=self.user, home=demo.home, env=demo.env(),
                                       pass_fds=(read_fd,))
            port = await demo.server.start()
            known.append(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}")
        self._write_ssh_files(known)
        self._write_config()
        for demo in self._boxes.values():
            await demo.launch()
        self.tick()
        self._controller = asyncio.create_task(self._control(), name="gpuwatch-demo-controller")

    async def _control(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.tick_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if time.monotonic() - next_at > self.tick_s:
                next_at = time.monotonic()  # fell behind (a suspended laptop): no burst
            self.tick()

    async def _stop(self) -> None:
        if self._controller is not None:
            self._controller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._controller
            self._controller = None
        # all at once: each close is bounded (sshserver.py), and five in a row added up
        await asyncio.gather(*(demo.server.close() for demo in self._boxes.values()
                               if demo.server is not None))
        await self._end_processes(grace_s=2.0)

    async def _end_processes(self, grace_s: float) -> None:
        """TERM every process of the fleet, then KILL what is left after the grace."""
        pids = set(self.processes()) | {p for p in self.started_pids if _alive(p)}
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            pids = {p for p in pids if _alive(p)}
        self._kill_all_now()

    def _kill_all_now(self) -> None:
        """SIGKILL every process of the fleet; close the lifeline (survivors end by it)."""
        for pid in set(self.processes()) | {p for p in self.started_pids if _alive(p)}:
            _signal(pid, signal.SIGKILL)
        for fd in (self._lifeline_w, self.lifeline_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lifeline_w = self.lifeline_fd = None

    # -- files -----------------------------------------------------------------------------------
    def _write_ssh_files(self, known: list[str]) -> None:
        def q(path: Path) -> str:
            text = str(path)
            return f'"{text}"' if any(c.isspace() for c in text) else text

        lines = ["# gpuwatch --demo: simulated GPU boxes, each served over real SSH on loopback",
                 "# by gpuwatch's in-process server (remote/sim/sshserver.py). Try:",
                 f"#   ssh -F {q(self.ssh_config)} {self._names[0]} nvidia-smi", ""]
        for name in self._names:
            demo = self._boxes[name]
            lines += [f"Host {name}", "    HostName 127.0.0.1", f"    Port {demo.port}",
                      f"    User {self.user}", f"    IdentityFile {q(self.client_key)}",
                      "    IdentitiesOnly yes", f"    UserKnownHostsFile {q(self.known_hosts)}",
                      "    StrictHostKeyChecking yes", "    PasswordAuthentication no",
                      "    KbdInteractiveAuthentication no", "    BatchMode yes", ""]
        _private_write(self.ssh_config, "\n".join(lines))
        _private_write(self.known_hosts, "".join(line + "\n" for line in known))

    def _write_config(self) -> None:
        data: dict[str, Any] = {
            "interval": 2,
            "ssh": {"config_file": str(self.ssh_config), "known_hosts": str(self.known_hosts),
                    "connect_timeout": 5, "command_timeout": 20},
            "hosts": {name: self._boxes[name].host_config() for name in self._names},
        }
        header = ("# gpuwatch --demo: a simulated fleet served over real SSH on loopback.\n"
                  "# Its GPUs are stand-ins (remote/sim/), its processes are real.\n")
        for name in self._names:
            header += f"#   {name}: {self._boxes[name].story}\n"
        _private_write(self.config_path, header + "\n" + tomli_w.dumps(data))


def _claim_root(root: Path) -> None:
    """Make root the fleet's folder: create it, or reuse an empty one or an earlier demo's
    (wiping what that demo left); refuse anything else rather than delete it."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / ROOT_MARKER
    if any(root.iterdir()) and not marker.exists():
        raise ValueError(f"{root} is not empty and not a gpuwatch demo folder; "
                         "give an empty or new folder")
    for name in ("boxes", "ssh"):
        shutil.rmtree(root / name, ignore_errors=True)
    (root / "config.toml").unlink(missing_ok=True)
    marker.write_text("gpuwatch --demo keeps a simulated fleet here; safe to delete\n",
                      encoding="utf-8")


def _private_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# ---------------------------------------------------------------------------------------------
# Standalone: python -m gpuwatch.remote.sim.fleet


async def _serve(root: Path | None, boxes: Sequence[str], tick_s: float) -> None:
    async with DemoFleet.start(root, boxes=boxes, tick_s=tick_s) as fleet:
        print(f"gpuwatch demo fleet: {len(fleet.hosts)} simulated boxes over SSH on 127.0.0.1")
        for name in fleet.hosts:
            print(f"  {name:<14} port {fleet.demo_box(name).port}  "
                  f"{fleet.demo_box(name).story}")
        print(f"config:     {fleet.config_path}")
        print(f"ssh config: {fleet.ssh_config}")
        print(f"try:        ssh -F {fleet.ssh_config} {fleet.hosts[0]} nvidia-smi")
        print(f"            gpuwatch --config {fleet.config_path}")
        print("serving until Ctrl-C", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwatch.remote.sim.fleet",
        description="Serve gpuwatch's demo fleet (simulated GPU boxes over SSH on loopback) "
                    "until Ctrl-C; prints the config to point gpuwatch at.")
    parser.add_argument("--root", type=Path, help="keep the fleet's files here (default: a "
                        "temporary folder, removed at exit)")
    parser.add_argument("--boxes", nargs="+", default=list(BOX_NAMES), choices=BOX_NAMES)
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between steps")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        asyncio.run(_serve(args.root, args.boxes, args.tick))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
