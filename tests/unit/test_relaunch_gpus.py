"""A relaunch never walks into a broken GPU: a recovery action that asks for a reset or a
reboot, a remap pending or failed, an Xid that says the GPU fell off the bus. The run's command
is offered on free healthy GPUs instead (CUDA_VISIBLE_DEVICES, in the plan), or refused with
what to wait for; the watchdog, which asks nobody, refuses and says where a person could start
it. The broken GPU is a real one: gpud's A10 (driver 535) with a remap pending, its values read
from its `nvidia-smi -q` (test_gpu_health.a10_row), beside copies of it made healthy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwatch.remote.actions import gpu_choice
from gpuwatch.remote.actions.plan import plan_relaunch
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.findings.gpu_health import unusable_gpus
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.launches import LaunchRecord
from gpuwatch.remote.model.snapshot import HostSnapshot, KernelEvent, RunSample
from test_actions_plan import BOOT, proc
from test_gpu_health import a10_row
from test_gpu_health import snapshot as gpu_snapshot

RUN = RunConfig("llama", process="train.py", workdir="/data/llama", log="train.log",
                relaunch="torchrun --nproc_per_node=2 train.py", detach="setsid")
HOST = HostConfig(name="gpu1", ssh="gpu1", runs=(RUN,))


def box_row(i: int, **changes: Any) -> dict[str, Any]:
    """GPU i of a 4-GPU box of A10s: the real A10's row, healthy (no remap pending) unless
    `changes` say otherwise, with its own index, uuid and bus id."""
    base = a10_row(remap_pending=False, remap_unc=0)
    row = {**base, "index": i, "uuid": base["uuid"][:-1] + str(i),
           "pci_bus_id": f"00000000:0{7 + i}:00.0", "util_pct": 0, "mem_used_mib": 0,
           "mig": False, "recovery": "none"}  # the A10 printed no recovery action: driver 535
    row.update(changes)
    return row


def sample(pids: tuple[int, ...]) -> RunSample:
    return RunSample(name="llama", pids=pids, log=None, events_path=None, event_files=(),
                     events_capped=False, metrics=(), checkpoints=(), checkpoints_total=0,
                     leftovers=(), done=None, done_mtime=None, errors={})


def poll(rows: list[dict[str, Any]], *, on: dict[int, int] | None = None,
         at: float = 1000.0, events: tuple[KernelEvent, ...] = ()) -> HostSnapshot:
    """One poll: the GPU rows, and the run's ranks `on` {pid: GPU index} (none: it is dead)."""
    on = on or {}
    apps = [{"uuid": rows[i]["uuid"], "pid": pid} for pid, i in on.items()]
    snap = gpu_snapshot(rows, apps)
    procs = tuple(proc(pid, run="llama", gpu=i) for pid, i in on.items())
    return replace(snap, boot_id=BOOT, taken_at=at, processes=procs,
                   runs=(sample(tuple(on)),), kernel_events=events)


def history(*snaps: HostSnapshot) -> HostHistory:
    h = HostHistory("gpu1")
    for i, snap in enumerate(snaps):
        h.record(snap, 1000.0 + 10 * i)
    return h


HEALTHY = [box_row(i) for i in range(4)]
PENDING = [box_row(0), a10_row(**{k: box_row(1)[k] for k in ("index", "uuid", "pci_bus_id")}),
           box_row(2), box_row(3)]
"""GPU 1 is the real A10 as gpud captured it: 4 uncorrectable rows remapped, a remap pending."""


def env(plan: Any) -> dict[str, str]:
    assert plan.launch is not None
    return dict(plan.launch.env)


def test_a_relaunch_onto_healthy_gpus_is_as_it_was() -> None:
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), poll(HEALTHY))
    plan = plan_relaunch(HOST, "llama", h)
    assert plan.refusal is None and env(plan) == {}
    assert not any("CUDA_VISIBLE_DEVICES" in n for n in plan.notes)


def test_a_remap_pending_on_the_runs_gpu_moves_it_to_free_healthy_ones() -> None:
    """The run held GPUs 0 and 1; GPU 1 now waits for a reset: the plan keeps GPU 0 (its
    own, healthy, free) and takes GPU 2, the lowest free healthy one; GPU 3 is busy with
    another user's process. The person reads it in the plan before confirming."""
    other = poll(PENDING)
    other = replace(other, gpu_processes=(*other.gpu_processes,
                                          *poll(PENDING, on={99: 3}).gpu_processes))
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), other)
    assert unusable_gpus(h) == {1: "has memory rows waiting for a GPU reset (remap pending)"}
    plan = plan_relaunch(HOST, "llama", h)
    assert plan.refusal is None
    assert env(plan) == {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    said = plan.describe()
    assert "GPU 1 has memory rows waiting for a GPU reset (remap pending): not used" in said
    assert "starts on GPUs 0, 2 instead (CUDA_VISIBLE_DEVICES=0,2" in said
    assert "env: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,2 PYTHONUNBUFFERED=1" in said
    assert plan.notes[0].startswith("GPU 1 has memory rows")  # said first


def test_the_watchdog_refuses_and_says_where_a_person_could_start_it() -> None:
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), poll(PENDING))
    plan = plan_relaunch(HOST, "llama", h, elsewhere=False)
    assert plan.refusal is not None and plan.launch is None
    assert "GPU 1 has memory rows waiting for a GPU reset" in plan.refusal
    assert "`gpuwatch relaunch gpu1 llama` offers it on GPUs 0, 2 (free and healthy)" in \
        plan.refusal


def test_not_enough_free_healthy_gpus_is_a_wait() -> None:
    """Two GPUs needed; GPU 1 pending, GPU 2 failed (no spare rows), GPU 3 asks for a reboot:
    only GPU 0 is left."""
    rows = [box_row(0), PENDING[1], box_row(2, remap_failed=True, remap_hist=[0, 0, 0, 0, 192]),
            box_row(3, recovery="node_reboot")]
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), poll(rows))
    assert set(unusable_gpus(h)) == {1, 2, 3}
    assert unusable_gpus(h)[3] == "the driver asks for a reboot of the box"
    refusal = plan_relaunch(HOST, "llama", h).refusal or ""
    assert "only GPU 0 is free and healthy of the 2 it used: wait for one to free up" in refusal


def test_a_gpu_the_kernel_log_says_fell_off_the_bus_is_kept_out_till_a_reboot() -> None:
    """Xid 79 for GPU 1's bus, logged this boot (any poll of it that history holds), though
    nvidia-smi still lists the GPU; a GPU with uncorrected errors (GPU 2) or MIG on (GPU 3)
    is no place to move a run to either, so the one-GPU run goes to GPU 0."""
    xid = KernelEvent("xid", 990.0, 12.0, None, None, xid=79, pci="0000:08:00",
                      message="GPU has fallen off the bus.")
    rows = [box_row(0), box_row(1), box_row(2, ecc_unc_vol=3), box_row(3, mig=True)]
    one = replace(RUN, relaunch="python train.py", env={"CUDA_VISIBLE_DEVICES": "1"})
    host = replace(HOST, runs=(one,))
    h = history(poll(rows, events=(xid,)), poll(rows))
    assert unusable_gpus(h) == {1: "the kernel log says it fell off the bus (Xid 79) since the "
                                   "box booted: only a reboot brings it back"}
    plan = plan_relaunch(host, "llama", h)
    assert env(plan)["CUDA_VISIBLE_DEVICES"] == "0"
    rebooted = history(poll(rows, events=(xid,)), replace(poll(rows), boot_id="another boot"))
    assert unusable_gpus(rebooted) == {}
    assert env(plan_relaunch(host, "llama", rebooted)) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_a_run_whose_gpus_are_not_known_gets_every_free_healthy_gpu() -> None:
    """Never seen running, no CUDA_VISIBLE_DEVICES: a CUDA process would see GPU 1 too."""
    plan = plan_relaunch(HOST, "llama", history(poll(PENDING)))
    assert env(plan)["CUDA_VISIBLE_DEVICES"] == "0,2,3"
    assert "its GPUs are not known" in plan.notes[0]


def test_a_command_that_sets_its_own_gpus_is_not_moved() -> None:
    own = replace(RUN, relaunch="CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 train.py")
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), poll(PENDING))
    refusal = plan_relaunch(replace(HOST, runs=(own,)), "llama", h).refusal or ""
    assert "its command sets CUDA_VISIBLE_DEVICES itself" in refusal
    assert "edit the relaunch command to use GPUs 0, 2" in refusal


def test_a_discovered_run_is_moved_the_same_way() -> None:
    record = LaunchRecord(
        host="gpu1", run="llama", recorded_at=0.0, boot_id=BOOT, pid=10, start_ticks=9,
        cwd="/data/llama", argv=("python", "train.py"),
        env=(("CUDA_VISIBLE_DEVICES", "GPU-" + PENDING[1]["uuid"][4:]),),
        dropped_secret=(), dropped_session=(), env_error=None, process="train.py",
        script="train.py", kind="python", framework=None, log=None, detach="setsid")
    h = history(poll(PENDING))
    plan = plan_relaunch(HostConfig(name="gpu1", ssh="gpu1"), "llama", h, record)
    assert plan.refusal is None  # its UUID names GPU 1: moved to GPU 0
    assert env(plan)["CUDA_VISIBLE_DEVICES"] == "0"


def test_cuda_visible_devices_is_read_by_index_or_uuid() -> None:
    snap = poll(HEALTHY)
    assert gpu_choice._indexes("2, 0", snap) == [2, 0]
    assert gpu_choice._indexes(HEALTHY[3]["uuid"].upper(), snap) == [3]
    assert gpu_choice._indexes("MIG-1234", snap) is None


async def test_the_watchdog_does_not_restart_a_run_onto_a_broken_gpu() -> None:
    """The watchdog's restart goes through the same plan with nobody to confirm a move: it
    sends nothing, and its event says why and where a person could start it."""
    from gpuwatch.remote.actions.restart import Watchdog
    from gpuwatch.remote.store import Store

    store = Store.open(":memory:")
    run = replace(RUN, restart="on-failure")
    h = history(poll(HEALTHY, on={10: 0, 11: 1}), poll(PENDING))
    (event,) = await Watchdog(store, "test", lease_s=60)._restart(
        replace(HOST, runs=(run,)), run, h, "10,11", 0, 1020.0)
    assert event.kind == "refused"
    assert event.message.startswith("not restarted: GPU 1 has memory rows waiting")
    assert "offers it on GPUs 0, 2" in event.message
    assert store.restarts("gpu1", "llama", since=0.0) == []  # nothing was sent
