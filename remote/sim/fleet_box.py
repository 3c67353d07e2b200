"""A box of the demo fleet (fleet.py): its simulated box, its real stand-in processes (the
trainers, a zombie rank) and what it does over the demo's timeline; the kinds of box are in
fleet_kinds.py."""

from __future__ import annotations

import asyncio
import json
import logging
import math
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
from gpuwatch.remote.sim.proc_view import ProcView
from gpuwatch.remote.sim.sshserver import BoxSshServer

if TYPE_CHECKING:
    from gpuwatch.remote.sim.fleet import DemoFleet

FLEET_ENV = "GPUWATCH_DEMO_FLEET"
"""Set in the environment of every process the fleet starts: how it finds them all at the end."""
BOX_ENV = "GPUWATCH_DEMO_BOX"
"""Set beside FLEET_ENV: the box a process belongs to (its /proc view shows it)."""
LIFELINE_ENV = "GPUWATCH_DEMO_LIFELINE"
"""The fd of a pipe whose other end only this process holds: the trainer ends when it closes."""
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GIB = 1 << 30
LOAD_SETTLE_S = 5.0
"""The load is at its level while the trainers start (they have run a while, in the story)."""
CPUS_PER_GPU = 26
"""A cloud GPU box's vCPUs per GPU (26 on a one-H100 instance; 208 on an eight)."""
TRAINER_SOURCE = Path(trainer_module.__file__)

demo_log = logging.getLogger("gpuwatch.demo")


# ---------------------------------------------------------------------------------------------
# This machine's /proc


@dataclass(frozen=True)
class RealProcess:
    pid: int
    argv: tuple[str, ...]
    state: str
    ppid: int
    comm: str
    start_ticks: int = 0
    """When it started (/proc/PID/stat field 22): with the pid, which process this is."""


def read_process(pid: int) -> RealProcess | None:
    """One live (non-zombie) user-space process of this machine, from the real /proc; None
    for a kernel thread, a zombie or a pid that is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
        if not raw:
            return None  # kernel thread, or a zombie that released its memory
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm = stat[stat.find("(") + 1: stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2:].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    argv = tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
    return RealProcess(pid, argv, rest[0], int(rest[1]), comm, int(rest[19]))


def scan_processes() -> dict[int, RealProcess]:
    """Every live (non-zombie) user-space process of this machine, from the real /proc."""
    found: dict[int, RealProcess] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            proc = read_process(int(entry.name))
            if proc is not None:
                found[proc.pid] = proc
    return found


def box_mark(pid: int, fleet_id: str) -> str | None:
    """The demo box a process belongs to: GPUWATCH_DEMO_BOX in its environment, where it also
    carries this fleet's mark (the fleet sets both for what it starts; its children inherit
    them). None for any other process."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    if f"{FLEET_ENV}={fleet_id}".encode() not in env:
        return None
    prefix = f"{BOX_ENV}=".encode()
    return next((v[len(prefix):].decode(errors="replace") for v in env
                 if v.startswith(prefix)), None)


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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)




def cmdline_of(pid: int) -> bytes | None:
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
                       memory_current=18 * GIB,
                       cgroup_path="/user.slice/user-1000.slice/session-4.scope")
        # The box's own /proc: its real processes only, its own name, load and CPUs (never
        # this machine's hostname, load or processes).
        self.view = ProcView(self.box.proc, hostname=name,
                             ncpu=CPUS_PER_GPU * max(1, len(self.box.gpus)), btime=self.box.btime,
                             cgroup=self.box.cgroup_path)
        self.load: float | None = None
        """The 1-minute load average; set at the first tick, as a box that has run a while."""
        self.runs: list[DemoRun] = []
        # Every disk the config lists is simulated (statvfs.json), / too: never this machine's.
        self.disks: dict[str, dict[str, int]] = {
            "/": {"bytes_total": 1_919_850_381_312, "bytes_free": 1_302_000_000_000,
                  "inodes_total": 117_211_136, "inodes_free": 115_900_000},
            "/data": {"bytes_total": 7_681_500_000_000, "bytes_free": 2_915_000_000_000,
                      "inodes_total": 468_750_000, "inodes_free": 466_020_000}}
        self.server: BoxSshServer | None = None
        self.live: dict[str, list[int]] = {}
        """Run name -> pids of its live trainer processes, as of the last tick."""
        self.started = time.monotonic()
        self._load_at = self.started
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
                    "LANG": "C.UTF-8", FLEET_ENV: self.fleet.id, BOX_ENV: self.name,
                    "GPUWATCH_PROCFS": str(self.view.root)})
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
        return {"ssh": self.name, "python": "python3", "disks": list(self.disks),
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
        self.show_processes(procs)
        self.step(procs)
        self.sync_compute_apps(procs)
        self.flush()
        self.write_statvfs()

    # -- the box's /proc ------------------------------------------------------------------------
    def load_target(self, trainers: int) -> float:
        """The 1-minute load a box settles at: a trainer keeps its dataloader workers and
        itself busy (about six runnable threads), an idle box a little."""
        return 0.4 + 6.0 * trainers

    def show_processes(self, procs: Mapping[int, RealProcess]) -> None:
        """The view shows this box's processes and the reaper any orphan of them was handed
        to (init or a subreaper: who adopted an orphaned rank is evidence, U11); the load
        follows the trainers as the kernel's 1-minute average does."""
        mine = {pid for pid, p in procs.items() if self.fleet.box_of(p) == self.name}
        reapers = {procs[pid].ppid for pid in mine} - mine - {os.getpid(), 0}
        self.view.show(mine | {pid for pid in reapers if pid in procs})
        now = time.monotonic()
        dt, self._load_at = now - self._load_at, now
        trainers = sum(1 for pids in self.live.values() if pids)
        target = self.load_target(trainers)
        settling = now - self.started < LOAD_SETTLE_S  # a box that has run for a while
        self.load = target if self.load is None or settling else (
            self.load + (target - self.load) * (1 - math.exp(-dt / 60)))
        jitter = self.rng.uniform(-0.15, 0.15)
        running = max(1, trainers * 6 + self.rng.randint(0, 2))
        self.view.system((max(0.0, self.load + jitter), self.load * 0.97, self.load * 0.93),
                         running=running, total=len(mine) + 180, last_pid=max(procs, default=1))

    def before_command(self) -> None:
        """The SSH server runs a command next: a process of this box started since the last
        tick (a relaunch, by the command before) is in the view already."""
        known = self.fleet.known_pids
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in known or int(name) in self.view.shown:
                continue
            proc = read_process(int(name))
            if proc is not None and self.fleet.box_of(proc) == self.name:
                self.view.add(proc.pid)

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


def tree_bytes(path: Path) -> int:
    """The bytes of a file, or of the files under a folder (a checkpoint's size on disk as the
    probe counts it)."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0


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
