"""A box of the demo fleet (fleet.py): its simulated box, its real stand-in processes (the
trainers, a zombie rank) and what it does over the demo's timeline; the kinds of box are in
fleet_kinds.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatch.remote.sim import trainer as trainer_module
from gpuwatch.remote.sim.box import GPU_KNOBS, Box
from gpuwatch.remote.sim.nvidia_smi import REASON_BITS
from gpuwatch.remote.sim.presets import Preset, h100_sxm
from gpuwatch.remote.sim.sshserver import BoxSshServer

if TYPE_CHECKING:
    from gpuwatch.remote.sim.fleet import DemoFleet

FLEET_ENV = "GPUWATCH_DEMO_FLEET"
"""Set in the environment of every process the fleet starts: how it finds them all at the end."""
LIFELINE_ENV = "GPUWATCH_DEMO_LIFELINE"
"""The fd of a pipe whose other end only this process holds: the trainer ends when it closes."""
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GIB = 1 << 30
TRAINER_SOURCE = Path(trainer_module.__file__)

_log = logging.getLogger("gpuwatch.demo")


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




def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return None



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
    """False: left out of the config, for gpuwatch to discover."""

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
        # a discovered run is named after its script: sft.py is found as "sft"
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
