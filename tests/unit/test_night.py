"""A simulated night through the real pipeline: FleetWatch (role "once", as a cron `--once` every
minute) with a collector that returns the polls a night would bring, under a fake clock. One
host, one run on two GPUs, eight hours:

    22:00  the run trains (a step a second, a checkpoint every 30 min)
    23:00  it stalls for 45 min (alive, no step): run.hung
    01:00  its memory cgroup OOM-kills it: run.dead, oom_cgroup
    01:04  the watchdog (another gpuwatch, a `watch` on this store) relaunches it: its restart
           and the relaunch's audit row are what that watcher leaves in the store
    01:05  it runs again, new processes, resumed from its checkpoint
    02:00  /data fills, 1 % of the disk every 5 min: disk.full_soon, then disk.low
    04:30  the host stops answering for an hour (the run lives on: the same processes after)
    05:30  it answers again; /data was cleaned meanwhile
    06:00  the morning

and the test asserts the timeline the store holds (`gpuwatch events`), the fleet replayed at
chosen times (remote/replay.py, the TUI's replay; its screen: tests/tui/test_replay.py), and the
run's report (`gpuwatch report`): times alive, dead, stalled; the death, its cause and the work
it lost; the restart and who made it; GPU-hours, energy (the unreachable hour a gap) and cost."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.snapshot import (
    Checkpoint,
    EventFile,
    HostSnapshot,
    KernelEvent,
    LogInfo,
    RunSample,
    Scalars,
)
from gpuwatch.remote.replay import host_at
from gpuwatch.remote.runreport import STALL_CODES, report_of, text
from gpuwatch.remote.store import Store
from gpuwatch.remote.timeline import text as timeline_text
from gpuwatch.remote.timeline import timeline
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome
from tui_fixtures import BTIME, disk, failed, gpu, ok, process, snapshot

T0 = 1_784_160_000.0
"""The night's 22:00 (times are compared as numbers: this machine's zone does not matter)."""
MIN = 60.0
STALL = (60, 105)  # minutes from T0: no progress
DEATH, RESTART = 180, 185
FILL = (120 * 2, 390)  # /data filling from 02:00 until the host goes away
DOWN = (390, 450)  # 04:30 to 05:30: unreachable
END = 480
WATTS = (600.0, 650.0)  # each GPU's draw while the run trains
CONFIG = """
interval = 60

[hosts.gpu1]
ssh = "gpu1"
disks = ["/", "/data"]
price_per_gpu_hour = 2.5
price_per_kwh = 0.3

[hosts.gpu1.runs.llama]
process = "train.py"
workdir = "/data/llama"
log = "train.log"
events = "runs"
checkpoints = "ckpt/step-*"
relaunch = "python train.py --resume {latest_checkpoint}"
"""


def loss(step: int) -> float:
    return 2.0 * math.exp(-step / 5000) + 0.5


class Night:
    """The box, minute by minute: what a poll at minute i sees."""

    def __init__(self, host: HostConfig) -> None:
        self.host = host
        self.step = 0
        self.steps_at: list[tuple[int, float]] = []  # (step, wall) of every point written
        self.checkpoints: list[Checkpoint] = []
        self.last_write = T0
        self.sent_to = 0  # the event file's points already read
        self.oom_kills = 0

    def pids(self, i: int) -> tuple[int, ...]:
        if i < DEATH:
            return (100, 101)
        if i < RESTART:
            return ()
        return (200, 201)

    def started(self, i: int) -> float:
        """When the processes of minute i started (a process's identity: pid + start)."""
        return T0 - 600 if i < DEATH else T0 + (RESTART - 0.5) * MIN

    def progress(self, i: int) -> bool:
        return bool(self.pids(i)) and not STALL[0] <= i < STALL[1]

    def advance(self, i: int, t: float) -> None:
        if i == RESTART:  # resumed from its latest checkpoint: the steps after it are redone
            self.step = int(self.checkpoints[-1].path.rsplit("-", 1)[1])
        if not self.progress(i):
            return
        for k in range(60):
            self.step += 1
            self.steps_at.append((self.step, t - 60 + k + 1))
            if self.step % 1800 == 0:
                self.checkpoints.append(Checkpoint(f"/data/llama/ckpt/step-{self.step}",
                                                   t - 60 + k + 1, 4 << 30))
        self.last_write = t

    def free_pct(self, i: int) -> float:
        if i < FILL[0]:
            return 30.0
        if i < DOWN[1]:
            return max(0.5, 30.0 - (min(i, FILL[1]) - FILL[0]) * 0.2)
        return 45.0  # cleaned while it was away

    def snapshot(self, i: int, t: float) -> HostSnapshot:
        self.advance(i, t)
        pids = self.pids(i)
        new = self.steps_at[self.sent_to:]
        self.sent_to = len(self.steps_at)
        scalars = {"train/loss": Scalars(tuple(s for s, _ in new),
                                         tuple(loss(s) for s, _ in new),
                                         tuple(w for _, w in new))}
        events = EventFile(path="/data/llama/runs/events.out.tfevents.1", bytes=4096 + i,
                           mtime=self.last_write, offset=4096 + i, start=0 if i == 0 else 4096,
                           stopped="eof", first_wall_time=new[0][1] if i == 0 and new else None,
                           reset=False, scalars=MappingProxyType(scalars), errors=())
        sample = RunSample(
            name="llama", pids=pids,
            log=LogInfo("/data/llama/train.log", 10_000 + i, self.last_write,
                        f"step {self.step} | loss {loss(self.step):.4f}\n"),
            events_path="/data/llama/runs", event_files=(events,), events_capped=False,
            metrics=(), checkpoints=tuple(self.checkpoints[-3:]),
            checkpoints_total=len(self.checkpoints), leftovers=(), done=None, done_mtime=None,
            errors=MappingProxyType({}))
        total = 8 << 40
        free = int(total * self.free_pct(i) / 100)
        snap = snapshot("gpu1", t=t, runs=[sample],
                        gpus=[gpu(g, 97.0 if pids else 0.0, 1950 if pids else 345,
                                  power=WATTS[g] if pids else 70.0,
                                  used=61_440 if pids else 0) for g in range(2)],
                        processes=[process(p, cmd="python train.py --config llama.yaml",
                                           run="llama", gpu_index=k,
                                           start_s=self.started(i) - BTIME)
                                   for k, p in enumerate(pids)],
                        disks=[disk("/", 1 << 40, 600 << 30), disk("/data", total, free)])
        if i == DEATH:  # the run's memory cgroup OOM-killed its first rank
            self.oom_kills = 1
            snap = replace(snap, kernel_events=(KernelEvent(
                kind="oom", at=t - 20, since_boot_s=t - 20 - BTIME, pid=100, name="python",
                memcg=True, cgroup="/user.slice/train", limit_bytes=64 << 30),))
        assert snap.cgroup is not None
        return replace(snap, cgroup=replace(snap.cgroup, memory_events=MappingProxyType(
            {"oom_kill": self.oom_kills})))


class FakeCollector:
    """Stands in for the SSH collector: the night's poll at the clock's minute."""

    def __init__(self, night: Night, clock: list[float]) -> None:
        self.night, self.clock = night, clock

    async def poll(self, host: HostConfig, runs: Any) -> PollOutcome:
        t = self.clock[0]
        i = round((t - T0) / MIN)
        if DOWN[0] <= i < DOWN[1]:  # the run trains on; nobody sees it
            self.night.advance(i, t)
            return failed(host, t, "timeout", "no answer within 30 s")
        return ok(host, self.night.snapshot(i, t), t)

    def restore(self, host: HostConfig, memory: Any) -> None:
        pass

    def memory(self, host: HostConfig) -> Any:
        return None


def run_night() -> tuple[Store, HostConfig]:
    """The night, landed through the pipeline into a store of its own (the TUI's replay test
    borrows it)."""
    config = parse_config(CONFIG)
    host = config.hosts[0]
    clock = [T0]
    store = Store.open(":memory:")
    fleet = FleetWatch(config, store, role="once", clock=lambda: clock[0],
                       collector=FakeCollector(Night(host), clock))  # type: ignore[arg-type]
    for i in range(END + 1):
        clock[0] = T0 + i * MIN
        if i == RESTART - 1:  # what the watcher that restarted it left in the store
            store.record_restart("gpu1", "llama", death="100,101", holder="watch@box:7:ab12",
                                 outcome="sent", message="restart 1 of 3 in 6 h",
                                 at=clock[0] + 30)
            store.record_action(who="alice@box", host="gpu1", action="relaunch",
                                phase="execute", targets=[{"run": "llama"}],
                                command="python train.py --resume /data/llama/ckpt/step-7200",
                                outcome="sent", ok=True, message="started in tmux",
                                at=clock[0] + 31)
        asyncio.run(fleet.round())
    return store, host


@pytest.fixture(scope="module")
def night() -> Any:
    store, host = run_night()
    yield store, host
    store.close()


def at(minute: float) -> float:
    return T0 + minute * MIN


def test_the_nights_events(night: Any) -> None:
    store, _ = night
    entries = timeline(store, since=T0 - 1)
    said = [(e.kind, e.code, e.at) for e in entries]
    # the run starts, stalls and comes back
    assert said[0] == ("started", None, T0)
    stalled = [e for e in entries if e.code in STALL_CODES]
    assert [(e.kind, e.code) for e in stalled] == [("finding", "run.hung"),
                                                   ("cleared", "run.hung")]
    # no step for 10 min against its usual second (hung_min_s), all its processes alive: hung
    # (which says more than run.stalled's 15 min of nothing written, and stands for it)
    assert stalled[0].at == at(STALL[0] + 9)
    assert stalled[1].at == at(STALL[1])
    # the death, its cause and the work it lost; the restart and who made it
    (death,) = [e for e in entries if e.kind == "death"]
    assert death.at == at(DEATH) and death.detail["cause"] == "oom_cgroup"
    assert death.severity == "critical" and death.run == "llama"
    # a step a second for 135 min before it died: its last checkpoint, step 7200, was
    # written at minute 164, 15 min before the last poll that saw it running
    assert death.detail["work_lost_s"] == pytest.approx(15 * MIN)
    kinds_then = [e.kind for e in entries if at(DEATH) <= e.at <= at(RESTART)
                  and e.run == "llama"]
    assert kinds_then == ["death", "restart", "action", "cleared", "started"]
    # the kernel's word on it is the host's own finding, beside the death
    assert [e.kind for e in entries if e.code == "host.cgroup_oom"] == ["finding", "cleared"]
    restarted = [e for e in entries if e.kind == "started"][1]
    assert restarted.detail["pids"] == [200, 201] and restarted.detail["pids_before"] == [100, 101]
    # the disk fills: a forecast first, then low; both clear after the cleaning
    full_soon = [e for e in entries if e.code == "disk.full_soon"]
    low = [e for e in entries if e.code == "disk.low"]
    assert full_soon[0].kind == "finding" and at(FILL[0]) < full_soon[0].at < low[0].at
    assert [e.kind for e in low] == ["finding", "changed", "cleared"]  # warning, critical
    assert low[0].at == at(FILL[0] + 125) and low[1].severity == "critical"  # 5%, then 1%
    assert full_soon[-1].kind == "cleared" and low[-1].at == at(DOWN[1])
    # unreachable for an hour: two events, not sixty; nothing cleared while it was away
    (down,) = [e for e in entries if e.kind == "unreachable"]
    (up,) = [e for e in entries if e.kind == "reachable"]
    assert down.at == at(DOWN[0]) and up.at == at(DOWN[1])
    assert up.detail["down_s"] == pytest.approx(3600)
    assert not [e for e in entries if e.kind == "cleared" and at(DOWN[0]) < e.at < at(DOWN[1])]
    # nothing else happened: the whole night, in order
    assert [k for k, _, _ in said if k not in ("finding", "changed", "cleared")] == [
        "started", "death", "restart", "action", "started", "unreachable", "reachable"]
    out = timeline_text(entries, since=T0 - 1)
    assert "1 death" in out.splitlines()[0] and "answering again after 1 h" in out


def test_the_runs_report(night: Any) -> None:
    store, host = night
    r = report_of(store, host, "llama", now=at(END))
    assert (r.since, r.until, r.status) == (T0, at(END), "running")
    # alive: the first processes until the poll before the death, the new ones from the
    # restart to the morning (the unreachable hour inside: the same processes both sides)
    assert r.alive_s == pytest.approx((DEATH - 1) * MIN + (END - RESTART) * MIN)
    assert r.dead_s == pytest.approx((RESTART - DEATH + 1) * MIN)
    assert r.unknown_s == 0
    assert r.stalled_s == pytest.approx((STALL[1] - STALL[0] - 9) * MIN)
    (death,) = r.deaths
    assert death.cause == "oom_cgroup" and death.work_lost_s == pytest.approx(15 * MIN)
    assert death.steps_lost == pytest.approx(15 * MIN, rel=0.02)  # a step a second
    (restart,) = r.restarts
    assert (restart.at, restart.answered, restart.by) == (at(RESTART), "oom_cgroup",
                                                          "the watchdog")
    # a step a second, whatever part of the night
    assert r.pace and all(v == pytest.approx(1.0, rel=0.02) for *_, v in r.pace)
    assert r.loss_tag == "train/loss"
    # the loss at the run's first sighting (the store keeps a tag's points decimated, so the
    # first kept one) and at the last poll: resumed at step 7200, a step a second since
    assert r.loss_start is not None and 60 <= r.loss_start[0] <= 120
    assert r.loss_start[1] == pytest.approx(loss(r.loss_start[0]))
    last = 7200 + (END - RESTART + 1) * 60
    assert r.loss_end == (last, pytest.approx(loss(last)))
    # GPU-hours: two GPUs while alive; energy: their draw while measured, the hour away a gap
    u = r.usage
    assert u.gpu_hours == pytest.approx(2 * r.alive_s / 3600)
    # the gap: from the last poll that answered (minute 389) to the first again (450)
    gap_s = (DOWN[1] - DOWN[0] + 1) * MIN
    assert u.gaps == 1 and u.unmeasured_gpu_s == pytest.approx(2 * gap_s)
    measured_s = r.alive_s - gap_s
    assert u.energy_j == pytest.approx(sum(WATTS) * measured_s, rel=1e-9)
    assert u.avg_power_w == pytest.approx(sum(WATTS) / 2)
    assert u.energy_kwh_estimated == pytest.approx(sum(WATTS) * r.alive_s / 3.6e6)
    assert r.cost == pytest.approx(2.5 * u.gpu_hours + 0.3 * u.energy_kwh_estimated)
    out = text(r)
    assert "deaths: 1" in out and "after oom_cgroup, by the watchdog" in out
    assert "2.03 GPU-hours not measured (1 gap)" in out


def test_the_night_replayed_at_chosen_times(night: Any) -> None:
    store, _ = night
    hung = host_at(store, "gpu1", at(STALL[0] + 20))  # 23:20: hung, running, answering
    assert hung.reachable and [f.code for f in hung.findings] == ["run.hung"]
    assert [(r.name, r.status, r.pids, r.gpus) for r in hung.runs] == [
        ("llama", "running", (100, 101), (0, 1))]
    assert hung.gpus_span == 0 and hung.gpus_at == at(STALL[0] + 20)
    assert [g.power_w for g in hung.gpus] == list(WATTS)
    dead = host_at(store, "gpu1", at(DEATH + 2))  # 01:02: dead, critical, its GPUs idle
    assert dead.worst is not None and dead.worst.code == "run.dead"
    assert dead.worst.severity == "critical" and dead.worst.since == at(DEATH)
    assert [r.status for r in dead.runs] == ["dead"] and [g.power_w for g in dead.gpus] == [
        70.0, 70.0]
    assert [e.kind for e in dead.events if e.run == "llama"] == [
        "death", "restart", "action", "cleared", "started"]  # the half hour around
    away = host_at(store, "gpu1", at(DOWN[0] + 30))  # 05:00: not answering; disk findings
    assert away.reachable is False  # held as they were (a failed poll clears nothing)
    assert {f.code for f in away.findings} >= {"disk.low", "disk.full_soon"}
    assert [r.status for r in away.runs] == ["running"]  # the same processes after the hour
    morning = host_at(store, "gpu1", at(END))
    assert morning.reachable and not morning.findings and morning.gpus_at == at(END)
