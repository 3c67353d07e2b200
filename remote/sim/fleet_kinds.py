"""The kinds of box of the demo fleet (fleet.py), one per problem gpuwatch shows: healthy,
capped, a zombie rank, an OOM kill, a full disk, a driver fault, a MIG GPU beside one whose
memory lost data."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time
from collections.abc import Mapping
from typing import Any

from gpuwatch.remote.sim.box import SimProcess
from gpuwatch.remote.sim.fleet_box import (
    GIB,
    DemoBox,
    DemoRun,
    RealProcess,
    cmdline_of,
    demo_log,
    read_process,
    tree_bytes,
    write_history,
)
from gpuwatch.remote.sim.presets import Preset, h100_mig, h100_sxm

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
        # Capped before the demo began (`nvidia-smi -pl 250` by someone, long ago): the first
        # poll sees it, and the second makes it sustained (U21: never one snapshot).
        self.set_gpu(0, power_limit_w=self.CAP_W)

    async def launch(self) -> None:
        run = self.runs[0]
        pid = await self.start_run(run)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until setsid and nohup have exec'd python: the
            proc = read_process(pid)        # fleet's first tick sees it training, capped
            if proc is None or run.matches(proc):
                break
            await asyncio.sleep(0.02)

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        if not self.live.get("vit-huge"):
            self.gpu_idle(0)
            return
        # Capped: 100 % busy, SM clock ~37 % of max, drawing right at the lowered limit.
        gpu = self.box.gpus[0]
        sm_max = int(gpu.get("clocks.max.sm") or 1980)
        r = self.rng
        self.set_gpu(0, {"utilization.memory": r.randint(20, 28)}, util_pct=100,
                     sm_clock_mhz=int(sm_max * r.uniform(0.35, 0.39)),
                     power_limit_w=self.CAP_W,
                     power_w=round(self.CAP_W * r.uniform(0.985, 1.0), 2),
                     temp_c=r.randint(52, 56), mem_used_mib=47_104 + r.randint(-32, 32),
                     pstate="P0")
        self.set_throttle(0, ["sw_power_cap"])


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
            cmd = cmdline_of(self.zombie_pid)
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
        demo_log.info("%s: OOM-killed pid %d", self.name, victim.pid)


class DiskBox(DemoBox):
    story = ("a fine-tune that keeps every checkpoint (no save_total_limit) on the root disk "
             "while its caches fill it toward full")

    def prepare(self) -> None:
        t = self.timeline
        self.add_run("sdxl-finetune", trainer_args=(
            "--step-s", f"{t.step_s:g}", "--save-every", str(t.disk_save_every),
            "--save-total-limit", "0", "--checkpoint-kib", "128", "--seed", "9"))
        # The run lives on / (its folder is under this machine's /tmp, on the simulated /):
        # its checkpoints are on the filesystem that fills, and the findings size its next save
        # from them.
        total = 3_840_755_982_336
        self.disks["/"] = {
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
        disk = self.disks["/"]
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
        # each new checkpoint takes what its files take (and what the timeline adds)
        used += sum(tree_bytes(outputs / n) for n in new) + len(new) * t.disk_checkpoint_bytes
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


class MigBox(DemoBox):
    story = ("GPU 0 is split into MIG instances, a LoRA fine-tune in its 3g.40gb (the driver "
             "reports no util under MIG); GPU 1's memory lost data: 2 uncorrected ECC errors "
             "and a row remap waiting for a GPU reset, so nothing new should start on it")
    RUN_MIB = 30_100
    """What the fine-tune holds in its instance (GPU instance 2: 40448 MiB)."""

    @classmethod
    def make_gpus(cls) -> Preset:
        preset = h100_mig()
        broken = h100_sxm(2).gpus[1]
        # the state of gpud's A10 capture (driver 535): uncorrectable rows remapped, a remap
        # pending; the driver's recovery action stays "None", the only word captured for it
        broken.update({"ecc.errors.uncorrected.volatile.total": 2,
                       "ecc.errors.uncorrected.aggregate.total": 2,
                       "remapped_rows.uncorrectable": 1, "remapped_rows.pending": True})
        return Preset("H100 with MIG, and an H100 awaiting a reset", preset.driver_version,
                      preset.cuda_version, [*preset.gpus, broken])

    def prepare(self) -> None:
        t = self.timeline
        run = self.add_run("qwen-lora", trainer_args=(
            "--step-s", f"{t.step_s:g}", "--save-every", str(t.save_every),
            "--save-total-limit", "3", "--seed", "31"))
        # a MIG instance is named by its UUID where a GPU would be by its index
        run.env = {"CUDA_VISIBLE_DEVICES": self.box.gpus[0]["mig_devices"][0]["uuid"]}

    async def launch(self) -> None:
        await self.start_run(self.runs[0])

    def step(self, procs: Mapping[int, RealProcess]) -> None:
        live = bool(self.live.get("qwen-lora"))
        instance = self.box.gpus[0]["mig_devices"][0]  # the 3g.40gb, GPU instance 2
        instance["mem_used"] = self.RUN_MIB + self.rng.randint(-32, 32) if live else 17
        # under MIG the driver gives no utilisation: clocks, power and memory only
        if live:
            self.gpu_busy(0, mem_mib=instance["mem_used"] + 27)
        else:
            self.gpu_idle(0, mem_mib=44)
        self.set_gpu(0, {"utilization.gpu": None, "utilization.memory": None})
        self.gpu_idle(1)

    def sync_compute_apps(self, procs: Mapping[int, RealProcess]) -> None:
        """The fine-tune's process listed in its instance (GPU instance 2, compute 0), as the
        table's Processes block places it."""
        super().sync_compute_apps(procs)
        for app in self.box.state["compute_apps"]:
            if app["gpu"] == 0:
                app.update(gi=2, ci=0)


BOX_KINDS: dict[str, type[DemoBox]] = {
    "demo-healthy": HealthyBox, "demo-capped": CappedBox, "demo-zombie": ZombieBox,
    "demo-oom": OomBox, "demo-disk": DiskBox, "demo-driver": DriverBox, "demo-mig": MigBox,
}
