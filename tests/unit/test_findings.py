"""Every finding code of DESIGN §3 on a simulated box polled by the real probe (and, where a
real capture exists, on the real text): what fires, what stays quiet, and the severity."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from findings_helpers import Watched, host_config, touch
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.findings.rules import CODES, RULES, evaluate
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.model.history import HostHistory, PollFailure
from gpuwatch.remote.model.snapshot import GpuSample
from gpuwatch.remote.sim import Box, SimProcess, h100_sxm, training_process, util_without_clock
from harness import smi_capture
from harness.captures import capture

NOW = time.time()


def box_at(tmp_path: Path, gpus: int = 2, **kwargs: object) -> Box:
    """A box booted a day ago on this machine's clock (process start times are real times)."""
    return Box(tmp_path / "box", h100_sxm(gpus), btime=int(time.time()) - 86_400,
               uptime_s=86_400.0, **kwargs)  # type: ignore[arg-type]


def run_toml(workdir: Path, name: str = "llama", **keys: str) -> str:
    lines = [f"[hosts.gpu1.runs.{name}]", 'process = "train.py"', f'workdir = "{workdir}"']
    lines += [f'{k} = "{v}"' for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def test_every_code_has_a_rule_and_a_gotcha() -> None:
    assert len(RULES) == len(set(RULES))
    assert {"gpu.util_without_clock", "gpu.throttled", "gpu.xid", "gpu.vram_zombie",
            "gpu.idle_while_running", "run.dead", "run.rank_dead", "run.sighup_risk",
            "host.kill_user_processes", "run.stalled", "run.log_buffered", "run.events_empty",
            "ckpt.overdue", "ckpt.tmp_leftover", "disk.low", "disk.inodes_low",
            "disk.full_soon", "host.unreachable", "host.rebooted", "host.cgroup_oom",
            "host.cpu_oversubscribed", "run.code_changed", "gpu.query_failed",
            "gpu.driver_mismatch", "gpu.lost", "gpu.persistence_off", "run.loss_nan",
            "run.diverging", "run.loss_spike", "run.plateau", "run.overfitting", "run.hung",
            "run.slowed", "gpu.ecc_uncorrected", "gpu.remap_pending", "gpu.remap_failed",
            "gpu.recovery_action", "gpu.hw_slowdown_rate", "gpu.pcie_degraded",
            "run.straggler"} == set(CODES)


def test_a_quiet_box_has_no_findings(tmp_path: Path) -> None:
    w = Watched(box_at(tmp_path))
    assert w.poll() == [] and w.poll() == []


# ---------------------------------------------------------------- GPUs (U21, U23, U22)

def test_util_without_clock_needs_several_polls(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    w = Watched(box)
    scenario = util_without_clock(box, 0, ticks=3, clock_fraction=0.35)
    seen = []
    while scenario.step(box):
        w.poll()
        seen.append([f.code for f in w.findings if f.code == "gpu.util_without_clock"])
    # two healthy frames, then the slow ones: one slow poll alone says nothing (U21)
    assert seen[:3] == [[], [], []]
    assert seen[3:] == [["gpu.util_without_clock"]] * 2
    f = w.one("gpu.util_without_clock")
    assert f.severity == Severity.WARNING and f.gpu == 0
    assert f.evidence["util_pct"] == [100, 100]
    assert f.evidence["clock_ratio"] == pytest.approx(0.35, abs=0.01)
    assert "35% of max" in f.message


def test_util_without_clock_polls_threshold_is_configurable(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    w = Watched(box, thresholds=Thresholds(sustain_polls=3))
    box.set_gpu(0, util_pct=100, sm_clock_mhz=693, power_w=200.0)
    assert "gpu.util_without_clock" not in [f.code for f in w.poll() + w.poll()]
    assert "gpu.util_without_clock" in [f.code for f in w.poll()]


def test_util_without_clock_ignores_a_stale_previous_poll(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    w = Watched(box)
    box.set_gpu(0, util_pct=100, sm_clock_mhz=693, power_w=200.0)
    w.poll(at=NOW - 7200)  # cron stopped for two hours: not one sustained stretch
    assert "gpu.util_without_clock" not in [f.code for f in w.poll(at=NOW)]


def test_throttled_decodes_reasons_and_grades_them(tmp_path: Path) -> None:
    box = box_at(tmp_path, 2)
    w = Watched(box)
    box.set_throttle(0, ["hw_thermal_slowdown", "sw_thermal_slowdown"])
    box.set_gpu(0, temp_c=88)
    box.set_throttle(1, ["sw_power_cap"])
    assert "gpu.throttled" not in w.codes() and w.poll() == []  # one poll: nothing
    w.poll()
    hot, capped = sorted((f for f in w.findings if f.code == "gpu.throttled"),
                         key=lambda f: f.gpu or 0)
    assert hot.severity == Severity.WARNING and hot.gpu == 0
    assert hot.evidence["reasons"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert "88 °C" in hot.message
    assert capped.severity == Severity.INFO and capped.evidence["reasons"] == ["sw_power_cap"]
    box.set_throttle(0, ["gpu_idle"])  # idle is not a slowdown
    w.poll()
    assert [f.gpu for f in w.findings if f.code == "gpu.throttled"] == [1]


def _history_of(gpus: list[GpuSample], polls: int = 2) -> HostHistory:
    """A history whose snapshots carry these GPU samples (from real nvidia-smi text)."""
    from gpuwatch.remote.model.snapshot import HostSnapshot

    history = HostHistory("real")
    for i in range(polls):
        history.record(HostSnapshot(
            host="real", taken_at=NOW + 10 * i, hostname="h", boot_id="b", uptime_s=1e5,
            loadavg=None, ncpu=8, gpus=tuple(gpus), gpu_processes=(), gpu_source="nvidia-smi",
            processes=(), process_counts=None, disks=(),
            cgroup=None, kill_user_processes=None, kernel_events=(), xid_counts={},
            section_errors={}, probe_s=None, probe_cpu_s=None), NOW + 10 * i)
    return history


def _real_gpus(*parts: str) -> list[GpuSample]:
    rows = smi_capture.rows(capture(*parts).read_text(encoding="utf-8", errors="replace"))
    out = []
    for row in rows:
        values = {k: v for k, v in probe.gpu_row(row).items()
                  if k in GpuSample.__dataclass_fields__}
        reasons = values["throttle_reasons"]
        values["throttle_reasons"] = None if reasons is None else tuple(reasons)
        out.append(GpuSample(**values))
    return out


@pytest.mark.parametrize("machine", [
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "linux-x86_64__nvidia-h200__590.48.01",
    "linux-x86_64__nvidia-l40s__595.80", "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86"])
def test_real_nvidia_smi_rows_of_healthy_gpus_raise_nothing(machine: str) -> None:
    """Real captures under load and idle: full clocks, no slowdown reasons (gpu_idle at most)."""
    for phase in ("load", "idle"):
        gpus = _real_gpus("nvidia-smi", "exporter-captures", machine, f"{phase}__query-gpu.csv")
        assert gpus and all(g.throttle_reasons is not None for g in gpus)
        codes = [f.code for f in evaluate(_history_of(gpus))]
        assert "gpu.throttled" not in codes and "gpu.util_without_clock" not in codes


def test_real_nvidia_smi_row_with_reasons_set_is_judged(tmp_path: Path) -> None:
    """The real H100 load row, its reasons bitmask turned to HW slowdown + SW power cap (the
    same text format: 0x…08 | 0x…04) and its SM clock cut to a third."""
    path = capture("nvidia-smi", "exporter-captures",
                   "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "load__query-gpu.csv")
    header, *rows = path.read_text().splitlines()
    names = [c.strip() for c in header.split(",")]
    cells = [c.strip() for c in rows[0].split(",")]
    cells[names.index("clocks_event_reasons.active")] = "0x000000000000000C"
    cells[names.index("clocks.current.sm [MHz]")] = "660 MHz"
    edited = tmp_path / "q.csv"
    edited.write_text(header + "\n" + ", ".join(cells) + "\n")
    (gpu,) = _real_gpus(str(edited))
    assert gpu.throttle_reasons == ("sw_power_cap", "hw_slowdown")
    found = {f.code: f for f in evaluate(_history_of([gpu]))}
    assert found["gpu.throttled"].severity == Severity.WARNING
    assert found["gpu.util_without_clock"].evidence["clock_ratio"] == pytest.approx(1 / 3, 0.01)


def test_xid_79_is_critical_once_and_named_by_gpu(tmp_path: Path) -> None:
    box = box_at(tmp_path, 4)
    w = Watched(box)
    w.poll()
    box.xid(2, 79)
    f = next(f for f in w.poll() if f.code == "gpu.xid")
    assert f.severity == Severity.CRITICAL and f.gpu == 2 and f.evidence["xids"] == [79]
    assert "re-rent" in f.message and "fallen off the bus" in f.message
    assert "gpu.xid" not in [f.code for f in w.poll()]  # reported once (dedupe by time+text)
    box.xid(1, 13, pid=4242, name="python")
    f = next(f for f in w.poll() if f.code == "gpu.xid")
    assert f.severity == Severity.WARNING and f.gpu == 1 and f.evidence["pids"] == [4242]


def test_real_xid_48_line_is_critical_on_its_gpu(tmp_path: Path) -> None:
    lines = capture("system", "dmesg", "gpud__dmesg-iso-xid48-63-94.log").read_text().splitlines()
    box = box_at(tmp_path, 2)
    box.set_gpu(1, {"pci.bus_id": "00000000:19:00.0"})
    w = Watched(box)
    w.poll()
    box.append_dmesg(*lines)
    xids = {f.gpu: f for f in w.poll() if f.code == "gpu.xid"}
    assert xids[1].severity == Severity.CRITICAL and 48 in xids[1].evidence["xids"]
    assert w.poll() == []


def test_real_xid_13_and_119_lines_are_warnings(tmp_path: Path) -> None:
    for name, code in (("gpud__dmesg-decode-iso-xid13-large.log", 13),
                       ("gpud__dmesg-ctime-xid119.log", 119)):
        text = capture("system", "dmesg", name).read_text(errors="replace")
        box = Box(tmp_path / name, h100_sxm(1))
        w = Watched(box)
        w.poll()
        box.append_dmesg(*text.splitlines())
        (f,) = [f for f in w.poll() if f.code == "gpu.xid"]
        assert f.severity == Severity.WARNING and code in f.evidence["xids"]


# ---------------------------------------------------------------- VRAM zombies (U11)

def test_defunct_holder_is_a_zombie_that_cannot_be_signalled(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    box.add_process(SimProcess(500, ("bash",), ppid=1))
    box.add_process(SimProcess(501, ("python", "eval.py"), ppid=500, state="Z", session=500))
    box.add_compute_app(0, 501, "python", 20_000)
    box.set_gpu(0, mem_used_mib=20_000)
    w = Watched(box)
    f = w.one("gpu.vram_zombie") if "gpu.vram_zombie" in [x.code for x in w.poll()] else None
    assert f is not None and f.gpu == 0
    (holder,) = f.evidence["holders"]
    assert holder["reason"] == "defunct" and holder["signallable"] is False
    assert holder["parent_pid"] == 500 and "signal the parent" in holder["explanation"]


def orphaned_rank(tmp_path: Path) -> Watched:
    """Rank 701 of a run launched by 700 on GPU 1, watched; then the launcher dies, the rank
    is re-parented to init and its GPU goes idle: polled once since."""
    box = box_at(tmp_path, 2)
    box.add_process(SimProcess(700, ("bash", "launch.sh"), ppid=1))
    box.add_process(replace(training_process(701, ppid=700, gpu=1), session=700, pgrp=700))
    box.add_compute_app(1, 701, "python", 30_000)
    box.set_gpu(1, util_pct=98, mem_used_mib=30_000)
    w = Watched(box)
    w.poll()
    box.remove_process(700)
    box.update_process(701, ppid=1, state="S")
    box.set_gpu(1, util_pct=0)
    w.poll()
    return w


def test_orphaned_holder_on_an_idle_gpu_after_its_run_died(tmp_path: Path) -> None:
    from gpuwatch.remote.findings.zombies import zombie_holders

    w = orphaned_rank(tmp_path)
    assert "gpu.vram_zombie" not in w.codes()  # idle for one poll only
    w.poll()
    f = w.one("gpu.vram_zombie")
    (holder,) = zombie_holders(w.history)
    assert holder.reason == "orphaned" and holder.signallable and holder.pid == 701
    assert holder.start_ticks is not None and holder.gpu_index == 1
    assert holder.gpu_mem_mib == 30_000 and f.evidence["signallable"] == [701]


def test_a_holder_is_no_zombie_on_its_first_sighting(tmp_path: Path) -> None:
    """Seen on a real H100 (tests/device/run.sh): a rank orphaned between two polls was
    flagged on the first poll that saw it, because the polls before it found the GPU idle. An
    idle GPU says nothing of a holder that was not there: a run started in a `( ... &)`
    subshell also has ppid 1 and no session of its own, and holds VRAM idle through its CUDA
    start-up. Each holder must itself be seen over the window (U21); so must a pid that only
    the driver lists (invisible)."""
    from gpuwatch.remote.findings.zombies import zombie_holders

    box = box_at(tmp_path, 2)
    w = Watched(box)
    w.poll()
    w.poll()  # GPU 1 idle and empty for two polls
    box.add_process(replace(training_process(701, ppid=1, gpu=1), session=650, pgrp=650))
    box.add_compute_app(1, 701, "python", 30_000)
    box.add_compute_app(0, 4242, "python", 20_000)  # not in this /proc: another namespace
    box.set_gpu(1, util_pct=0, mem_used_mib=30_000)
    box.set_gpu(0, util_pct=0, mem_used_mib=20_000)
    w.poll()
    assert zombie_holders(w.history) == [] and "gpu.vram_zombie" not in w.codes()
    w.poll()
    assert {(z.pid, z.reason) for z in zombie_holders(w.history)} == {
        (701, "orphaned"), (4242, "invisible")}
    # A holder that came back as another process under the same pid starts anew.
    box.remove_process(701)
    box.add_process(replace(training_process(701, ppid=1, gpu=1), session=650, pgrp=650,
                            start_s=999.0))
    w.poll()
    assert [z.pid for z in zombie_holders(w.history)] == [4242]


def test_setsid_nohup_run_and_live_runs_are_never_zombies(tmp_path: Path) -> None:
    box = box_at(tmp_path, 2)
    # setsid nohup python train.py: ppid 1, but it leads its own session (seed 000)
    box.add_process(training_process(800, gpu=0, nohup=True))
    box.add_compute_app(0, 800, "python", 30_000)
    # a configured run's rank with ppid 1 that does not lead its session: still live
    box.add_process(replace(training_process(900, gpu=1), session=850))
    box.add_compute_app(1, 900, "python", 30_000)
    box.set_gpu(0, mem_used_mib=30_000)
    box.set_gpu(1, mem_used_mib=30_000)
    w = Watched(box, host_config(run_toml(tmp_path)))
    for _ in range(3):
        w.poll()
    assert "gpu.vram_zombie" not in w.codes()


def test_invisible_and_unattributed_memory(tmp_path: Path) -> None:
    box = box_at(tmp_path, 3)
    box.add_compute_app(0, 31337, "python", 12_000)  # pid of another PID namespace
    box.set_gpu(0, mem_used_mib=12_000)
    box.set_gpu(1, mem_used_mib=40_000)  # nobody at all
    box.set_gpu(2, mem_used_mib=100)  # the driver's own few MiB
    w = Watched(box)
    w.poll()
    assert "gpu.vram_zombie" not in w.codes()
    w.poll()
    found = {f.gpu: f for f in w.findings if f.code == "gpu.vram_zombie"}
    assert set(found) == {0, 1}
    (inv,) = found[0].evidence["holders"]
    assert inv["reason"] == "invisible" and inv["pid"] == 31337 and not inv["signallable"]
    assert "restart the container" in inv["explanation"]
    (nobody,) = found[1].evidence["holders"]
    assert nobody["reason"] == "unattributed" and nobody["pid"] is None
    box.set_gpu(1, util_pct=60)  # a neighbour's busy job, not a zombie
    w.poll()
    assert {f.gpu for f in w.findings if f.code == "gpu.vram_zombie"} == {0}


def test_idle_while_running_needs_time_and_says_which(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    box.add_process(training_process(600, gpu=0, nohup=True, workdir=str(tmp_path)))
    box.add_compute_app(0, 600, "python", 30_000)
    box.set_gpu(0, util_pct=0, mem_used_mib=30_000)
    w = Watched(box, host_config(run_toml(tmp_path)))
    w.poll(at=NOW)
    w.poll(at=NOW + 300)
    assert "gpu.idle_while_running" not in w.codes()
    w.poll(at=NOW + 700)
    f = w.one("gpu.idle_while_running")
    assert f.run == "llama" and f.gpu == 0 and f.evidence["span_s"] == 700
    assert f.evidence["steps_advancing"] is False and "hung" in f.message


# ---------------------------------------------------------------- runs

def test_sighup_risk_walks_the_ancestry(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    pts0 = (136 << 8) | 0
    box.add_process(SimProcess(300, ("sshd: alice@pts/0",), comm="sshd", ppid=1))
    box.add_process(SimProcess(310, ("-bash",), comm="bash", ppid=300, tty_nr=pts0))
    box.add_process(replace(training_process(320, ppid=310, tty_nr=pts0,
                                             workdir=str(tmp_path)), session=310))
    w = Watched(box, host_config(run_toml(tmp_path)))
    w.poll()
    f = w.one("run.sighup_risk")
    assert f.severity == Severity.WARNING and f.run == "llama"
    assert f.evidence["pids"] == [320] and f.evidence["ancestry"][:2] == ["bash", "sshd"]
    box.update_process(320, sig_ignored=1)  # nohup
    w.poll()
    assert "run.sighup_risk" not in w.codes()
    box.update_process(320, sig_ignored=0)
    box.add_process(SimProcess(290, ("tmux", "new"), comm="tmux: server", ppid=1))
    box.update_process(310, ppid=290)  # the shell is a tmux pane's
    w.poll()
    assert "run.sighup_risk" not in w.codes()


def test_kill_user_processes(tmp_path: Path) -> None:
    etc = tmp_path / "etc" / "systemd"
    etc.mkdir(parents=True)
    (etc / "logind.conf").write_text("[Login]\nKillUserProcesses=yes\n")
    w = Watched(box_at(tmp_path, 1), env={"GPUWATCH_ETC": str(tmp_path / "etc")})
    w.poll()
    assert w.one("host.kill_user_processes").severity == Severity.WARNING
    (etc / "logind.conf").write_text("[Login]\nKillUserProcesses=no\n")
    assert w.poll() == []


def test_stalled_vs_log_buffered(tmp_path: Path) -> None:
    work = tmp_path / "run"
    box = box_at(tmp_path, 1)
    box.add_process(training_process(600, workdir=str(work), nohup=True, start_s=3600.0))
    log = touch(work / "train.log", NOW - 1500, b"step 1\n")
    ckpt = touch(work / "ckpt" / "step-100.pt", NOW - 60)
    w = Watched(box, host_config(run_toml(work, log="train.log", checkpoints="ckpt/*.pt")))
    w.poll(at=NOW)
    f = w.one("run.log_buffered")
    assert f.severity == Severity.INFO and "PYTHONUNBUFFERED" in f.message
    assert "run.stalled" not in w.codes()
    touch(ckpt, NOW - 2400)
    touch(log, NOW - 2400)
    w.poll(at=NOW)
    f = w.one("run.stalled")
    assert f.severity == Severity.WARNING and f.evidence["quiet_s"] == pytest.approx(2400, 2)
    assert "run.log_buffered" not in w.codes()


def test_events_empty_after_the_grace(tmp_path: Path) -> None:
    work = tmp_path / "run"
    (work / "runs").mkdir(parents=True)
    box = box_at(tmp_path, 1)
    box.add_process(training_process(600, workdir=str(work), nohup=True, start_s=3600.0))
    w = Watched(box, host_config(run_toml(work, events="runs")))
    w.poll()
    f = w.one("run.events_empty")
    assert f.run == "llama" and "no event file" in f.message
    box.update_process(600, start_s=86_000.0)  # started 400 s ago: within the grace
    w.poll()
    assert "run.events_empty" not in w.codes()


def test_checkpoint_overdue_against_its_own_cadence(tmp_path: Path) -> None:
    work = tmp_path / "run"
    box = box_at(tmp_path, 1)
    box.add_process(training_process(600, workdir=str(work), nohup=True, start_s=3600.0))
    for i, age in enumerate((4 * 3600, 3.5 * 3600, 3 * 3600)):  # every 30 min, then silence
        touch(work / "ckpt" / f"step-{i}.pt", NOW - age)
    w = Watched(box, host_config(run_toml(work, checkpoints="ckpt/*.pt")))
    w.poll(at=NOW)
    f = w.one("ckpt.overdue")
    assert f.evidence["cadence_s"] == pytest.approx(1800, 1)
    assert f.evidence["age_s"] == pytest.approx(3 * 3600, 2) and "6.0×" in f.message
    touch(work / "ckpt" / "step-3.pt", NOW - 600)
    w.poll(at=NOW)
    assert "ckpt.overdue" not in w.codes()


def test_tmp_leftover_only_when_nobody_writes_it(tmp_path: Path) -> None:
    work = tmp_path / "run"
    box = box_at(tmp_path, 1)
    box.add_process(training_process(600, workdir=str(work), nohup=True))
    touch(work / "ckpt" / "step-1.pt", NOW - 900)
    tmp = touch(work / "ckpt" / "latest.pt.tmp", NOW - 30, b"x" * 4096)
    w = Watched(box, host_config(run_toml(work, checkpoints="ckpt/*.pt")))
    w.poll(at=NOW)
    assert "ckpt.tmp_leftover" not in w.codes()  # a save in progress
    touch(tmp, NOW - 3600)
    w.poll(at=NOW)
    f = w.one("ckpt.tmp_leftover")
    assert f.evidence["paths"] == [str(tmp)] and f.evidence["bytes"] == 4096


def test_code_changed_after_start(tmp_path: Path) -> None:
    work = tmp_path / "run"
    box = box_at(tmp_path, 1)
    proc = box.add_process(training_process(600, workdir=str(work), nohup=True, start_s=3600.0))
    started = box.btime + proc.start_s
    script = touch(work / "train.py", started - 60, b"print('v1')\n")
    w = Watched(box, host_config(run_toml(work)))
    w.poll()
    assert "run.code_changed" not in w.codes()
    touch(script, started + 600, b"print('v2')\n")
    w.poll()
    f = w.one("run.code_changed")
    assert f.evidence["script"] == str(script) and f.evidence["pid"] == 600
    assert "10 min" in f.message


# ---------------------------------------------------------------- disks (U6, U7)

def test_disk_low_inodes_low_and_full_soon(tmp_path: Path) -> None:
    import json

    box = box_at(tmp_path, 1)
    data = tmp_path / "data"
    data.mkdir()
    stat = {"bytes_total": 1000 * 2**30, "bytes_free": 200 * 2**30,
            "inodes_total": 1_000_000, "inodes_free": 500_000}
    (box.sim / "statvfs.json").write_text(json.dumps({str(data): stat}))
    w = Watched(box, host_config(disks=(str(data),)))
    w.poll(at=NOW)
    assert w.findings == []
    stat.update(bytes_free=190 * 2**30, inodes_free=30_000)  # 60 GiB/h: 3.2 h left
    (box.sim / "statvfs.json").write_text(json.dumps({str(data): stat}))
    w.poll(at=NOW + 600)
    soon = w.one("disk.full_soon")
    assert soon.severity == Severity.WARNING and soon.evidence["hours_left"] == pytest.approx(
        190 / 60, 0.01)
    assert w.one("disk.inodes_low").severity == Severity.WARNING
    stat.update(bytes_free=5 * 2**30, inodes_free=5_000)
    (box.sim / "statvfs.json").write_text(json.dumps({str(data): stat}))
    w.poll(at=NOW + 1200)
    assert w.one("disk.low").severity == Severity.CRITICAL  # 0.5% free
    assert w.one("disk.inodes_low").severity == Severity.CRITICAL
    assert w.one("disk.full_soon").severity == Severity.CRITICAL


# ---------------------------------------------------------------- host (U41, U40, U3)

def test_cgroup_oom_counter(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1, memory_max=64 * 2**30)
    box.add_process(training_process(600, nohup=True))
    w = Watched(box)
    w.poll()
    box.oom_kill(600)
    f = w.one("host.cgroup_oom") if w.poll() else None
    assert f is not None and f.severity == Severity.CRITICAL
    assert f.evidence["oom_kill_before"] == 0 and f.evidence["oom_kill_now"] == 1
    assert f.evidence["victims"] == [{"pid": 600, "name": "python"}]
    assert "host.cgroup_oom" not in [x.code for x in w.poll()]


def test_cpu_oversubscribed_against_the_quota(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1, cpu_quota_us=400_000)  # 4 vCPUs of a 32-core host
    box.add_process(training_process(600, threads=64, nohup=True))
    w = Watched(box, host_config(run_toml(tmp_path)))
    w.poll()
    assert "host.cpu_oversubscribed" not in w.codes()
    w.poll()
    f = w.one("host.cpu_oversubscribed")
    assert f.evidence["threads"] == 64 and f.evidence["cgroup_cpus"] == 4
    assert "OMP_NUM_THREADS=4" in f.message
    box.update_process(600, threads=8)
    w.poll()
    assert "host.cpu_oversubscribed" not in w.codes()


def test_unreachable_and_rebooted(tmp_path: Path) -> None:
    box = box_at(tmp_path, 1)
    w = Watched(box)
    w.poll()
    w.history.record_failure(PollFailure("timeout", "no answer in 30 s", NOW))
    (f,) = evaluate(w.history)
    assert f.code == "host.unreachable" and f.severity == Severity.CRITICAL
    box.reboot()
    w.poll()
    assert w.one("host.rebooted").severity == Severity.WARNING


def test_findings_json_and_keys() -> None:
    f = Finding("disk.low", Severity.WARNING, "x", evidence={"a": 1}, subject="/data")
    assert f.to_json() == {"code": "disk.low", "severity": "warning", "message": "x",
                           "evidence": {"a": 1}}
    assert f.key == ("disk.low", None, None, "/data")


# ---------------------------------------------------------------- the store and the config

def test_store_keeps_first_seen_last_seen_and_cleared(tmp_path: Path) -> None:
    from gpuwatch.remote.store import Store

    low = Finding("disk.low", Severity.WARNING, "low", evidence={"free": 1}, subject="/data")
    xid = Finding("gpu.xid", Severity.CRITICAL, "xid 79", gpu=3)
    with Store.open(tmp_path / "s.db") as store:
        store.update_findings("gpu1", [low, xid], 100.0)
        store.update_findings("gpu1", [low], 200.0)
        records = {r.code: r for r in store.findings("gpu1")}
        assert records["disk.low"].first_seen == 100.0 and records["disk.low"].last_seen == 200.0
        assert records["disk.low"].subject == "/data" and records["disk.low"].active
        assert records["gpu.xid"].cleared_at == 200.0 and records["gpu.xid"].gpu == 3
        store.update_findings("gpu1", [], 300.0, clear=False)  # a failed poll clears nothing
        assert [r.code for r in store.findings("gpu1", active=True)] == ["disk.low"]
        store.update_findings("gpu1", [xid], 400.0)  # back again: a new life
        records = {r.code: r for r in store.findings("gpu1")}
        assert records["gpu.xid"].first_seen == 400.0 and records["gpu.xid"].active
        assert records["disk.low"].cleared_at == 400.0
        assert store.findings("other") == []


def test_thresholds_config_table(tmp_path: Path) -> None:
    from gpuwatch.remote.config.load import parse_config
    from gpuwatch.remote.config.schema import ConfigError

    config = parse_config('[thresholds]\nsustain_polls = 3\nclock_low_ratio = 0.4\n'
                          'xid_critical = [48, 79, 95]\n[hosts.a]\nssh = "local"\n')
    assert config.thresholds == Thresholds(sustain_polls=3, clock_low_ratio=0.4,
                                           xid_critical=(48, 79, 95))
    assert parse_config('[hosts.a]\nssh = "local"\n').thresholds is None
    for bad, key in (("nope = 1", "thresholds.nope"), ("sustain_polls = 1.5",
                                                       "thresholds.sustain_polls"),
                     ('xid_critical = ["48"]', "thresholds.xid_critical"),
                     ("stalled_s = -1", "thresholds.stalled_s")):
        with pytest.raises(ConfigError) as err:
            parse_config(f"[thresholds]\n{bad}\n")
        assert key in str(err.value)


def test_every_threshold_is_documented() -> None:
    import ast
    import inspect
    import itertools

    tree = ast.parse(inspect.getsource(Thresholds))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {node.target.id for node, doc in itertools.pairwise(body)
                  if isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Expr)
                  and isinstance(doc.value, ast.Constant)}
    from dataclasses import fields
    assert {f.name for f in fields(Thresholds)} - documented == set()


def test_a_discovered_run_that_is_only_a_zombie_reads_left_behind(tmp_path: Path) -> None:
    """U11 with discovered runs: the orphaned rank has a cwd and a script, so discovery groups
    it as a run of its own; once it is a zombie holder that run reads "left behind" (not
    running) and its own findings give way to gpu.vram_zombie, which says what to do."""
    w = orphaned_rank(tmp_path)
    found = [r.name for r in w.history.current.runs if 701 in r.pids]
    assert found and w.history.runs[found[0]].discovery is not None  # discovery's own run
    assert w.history.left_behind == frozenset()  # idle one poll: not yet a zombie
    w.poll()
    assert "gpu.vram_zombie" in w.codes()
    assert w.history.left_behind == frozenset(found)
    start = time.time()
    for i in range(1, 6):  # long enough for gpu.idle_while_running, were it a live run
        w.poll(at=start + 120 * i)
    assert w.codes() == ["gpu.vram_zombie"] and w.history.left_behind == frozenset(found)
    (holder,) = w.history.zombies or []
    assert holder.pid == 701 and holder.run is None  # discovery's name for it is no owner
    assert "of run" not in holder.explanation

    # `--once --json`: not among the runs (the schema's statuses would say "running"); the
    # process says why it holds VRAM.
    import jsonschema
    from gpuwatch.remote.report import host_json, load_schema
    from gpuwatch.remote.watch.landing import judge
    from gpuwatch.remote.wire.collect import PollOutcome

    outcome = PollOutcome(w.host, time.time(), 0.1, w.snapshot(), b"{}")
    doc = host_json(judge(w.history, outcome))
    schema = load_schema()
    jsonschema.validate(doc, {"$defs": schema["$defs"], "$ref": "#/$defs/host"})
    assert found[0] not in [r["name"] for r in doc["runs"]]
    assert {p["pid"]: p["zombie"] for p in doc["processes"] if p["zombie"]} == {701: "orphaned"}
    assert [f["code"] for f in doc["findings"]] == ["gpu.vram_zombie"]
    # A failed poll keeps what the last good one found (its runs are shown stale, not revived).
    w.history.record_failure(PollFailure("timeout", "no answer", time.time()))
    evaluate(w.history)
    assert w.history.left_behind == frozenset(found)


def test_a_left_behind_run_is_gone_once_its_zombie_is_reaped(tmp_path: Path) -> None:
    """Seen on a real H100 (tests/device/run.sh): after `gpuwatch reap` ended the orphaned
    rank, the run discovery had made of it read "dead" (cause: killed) in `--once --json`,
    and the dead configured run's leftover checkpoint was reported again under its name. Its
    only processes were zombies that gpuwatch reaped: it is gone, not dead; in the TUI's long
    history and in a cron `--once` that rebuilds the history from the store alike."""
    from gpuwatch.remote.actions.plan import mark_reaped, plan_reap
    from gpuwatch.remote.model.series import RunSeries
    from gpuwatch.remote.report import host_json
    from gpuwatch.remote.watch.landing import judge
    from gpuwatch.remote.wire.collect import PollOutcome

    w = orphaned_rank(tmp_path)
    w.poll()
    (name,) = w.history.left_behind
    plan = plan_reap(w.host, w.history)
    assert [t.pid for t in plan.targets] == [701]
    mark_reaped(plan, w.history)  # what `z` and `gpuwatch reap` do once the signal is sent
    w.box.remove_process(701)
    w.box.remove_compute_app(701)
    w.box.set_gpu(1, util_pct=0, mem_used_mib=0)
    w.poll()
    assert w.history.current is not None
    assert [r.pids for r in w.history.current.runs if r.name == name] == [()]
    assert w.history.left_behind == frozenset({name}) and w.codes() == []
    doc = host_json(judge(w.history, PollOutcome(w.host, time.time(), 0.1, w.snapshot(), b"{}")))
    assert name not in [r["name"] for r in doc["runs"]] and doc["findings"] == []

    # The store's copy of the run's state says so too (a cron `--once` after the reap).
    series = w.history.runs[name]
    w.history.runs[name] = RunSeries.from_state(name, series.state())
    assert w.history.runs[name].reaped and w.history.runs[name].discovery is not None
    w.poll()
    assert w.history.left_behind == frozenset({name}) and w.codes() == []

    # Relaunched (a live process of its own again), it is a run like any other.
    w.box.add_process(training_process(702, gpu=1, nohup=True))
    w.box.add_compute_app(1, 702, "python", 30_000)
    w.box.set_gpu(1, util_pct=97, mem_used_mib=30_000)
    w.poll()
    running = [r.name for r in w.history.current.runs if 702 in r.pids]
    assert running and not set(running) & w.history.left_behind
    assert not w.history.runs[running[0]].reaped


def test_a_run_taken_for_a_zombie_that_then_dies_by_itself_is_dead(tmp_path: Path) -> None:
    """Only a reap makes a left-behind run's end "gone": one whose processes vanish without
    it (a run started with `nohup ... &`, whose ppid is 1, idle on its GPU through a long
    evaluation, then OOM-killed) is a dead run, reported as one."""
    w = orphaned_rank(tmp_path)
    w.poll()
    (name,) = w.history.left_behind
    w.box.remove_process(701)
    w.box.remove_compute_app(701)
    w.poll()
    assert w.history.left_behind == frozenset()
    assert w.history.runs[name].status == "dead"


def torchrun_rank(pid: int, ppid: int, gpu: int) -> SimProcess:
    """A rank as torch 2.11's torchrun starts it (tests/captures/h100-driver580/
    torchrun-ranks.txt): a session and process group of its own, TORCHELASTIC_RUN_ID set."""
    rank = training_process(pid, ppid=ppid, gpu=gpu)
    return replace(rank, environ={**rank.environ, "TORCHELASTIC_RUN_ID": "none",
                                  "LOCAL_RANK": "0", "WORLD_SIZE": "1"})


def test_a_torchrun_rank_whose_torchrun_died_stays_a_zombie(tmp_path: Path) -> None:
    """Seen on a real H100 with torch 2.11 (tests/device/run.sh): SIGKILL torchrun and its
    ranks, ppid 1 and each leading its own session, were called zombies for one poll only
    (the poll that saw them re-parented), read "running" ever after, and a gpuwatch started
    after the death never flagged them. Their environment says they are torchrun's."""
    from gpuwatch.remote.findings.zombies import zombie_holders

    box = box_at(tmp_path, 2)
    box.add_process(SimProcess(700, ("python", "/usr/bin/torchrun", "train.py"), ppid=1))
    box.add_process(torchrun_rank(701, 700, 1))
    box.add_compute_app(1, 701, "python", 30_000)
    box.set_gpu(1, util_pct=98, mem_used_mib=30_000)
    w = Watched(box)
    w.poll()
    box.remove_process(700)
    box.update_process(701, ppid=1)
    box.set_gpu(1, util_pct=0)
    w.poll()  # the GPU was busy a poll ago: not yet
    assert zombie_holders(w.history) == []
    for _ in range(4):  # then on every poll, not only on one
        w.poll()
        (holder,) = zombie_holders(w.history)
        assert holder.pid == 701 and holder.reason == "orphaned" and holder.signallable
        assert "torchrun" in holder.explanation
    late = Watched(box)  # never saw torchrun alive
    late.poll()
    late.poll()
    assert [z.pid for z in zombie_holders(late.history)] == [701]

    # A `setsid nohup python train.py` run idle on its GPU for as long: not a zombie.
    box2 = box_at(tmp_path / "two", 2)
    box2.add_process(training_process(801, gpu=1, nohup=True))
    box2.add_compute_app(1, 801, "python", 30_000)
    box2.set_gpu(1, util_pct=0, mem_used_mib=30_000)
    quiet = Watched(box2)
    for _ in range(3):
        quiet.poll()
    assert zombie_holders(quiet.history) == []


def test_a_shell_job_left_running_at_logout_is_no_zombie(tmp_path: Path) -> None:
    """`nohup python train.py &` typed in an interactive shell: job control gives the job a
    process group of its own; at logout the shell exits and the job is re-parented to init,
    in the shell's session. Idle on its GPU for a while (a long checkpoint save), it is still a
    live run: never offered for reaping. A rank its launcher left behind is in the launcher's
    process group, and is (test_orphaned_holder_on_an_idle_gpu_after_its_run_died)."""
    from gpuwatch.remote.findings.zombies import zombie_holders

    box = box_at(tmp_path, 2)
    box.add_process(SimProcess(600, ("-bash",), comm="bash", tty_nr=34816))  # the login shell
    job = replace(training_process(601, ppid=600, gpu=1, nohup=True, tty_nr=34816),
                  session=600, pgrp=601)
    box.add_process(job)
    box.add_compute_app(1, 601, "python", 30_000)
    box.set_gpu(1, util_pct=97, mem_used_mib=30_000)
    w = Watched(box)
    w.poll()
    box.remove_process(600)  # logout
    box.update_process(601, ppid=1)
    box.set_gpu(1, util_pct=0)
    for _ in range(4):
        w.poll()
        assert zombie_holders(w.history) == [] and "gpu.vram_zombie" not in w.codes()
    late = Watched(box)  # a gpuwatch that never saw the shell
    for _ in range(3):
        late.poll()
    assert zombie_holders(late.history) == []
