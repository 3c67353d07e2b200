"""run.straggler: one GPU of a 4-rank run whose SM clock and power sit well below its peers'
while they are busy, over several polls, named with its rank's pid and throttle reasons; the
real probe reads a simulated box (the stand-in nvidia-smi in a real driver's format)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from findings_helpers import Watched, host_config
from gpuwatch.remote.sim import training_process
from test_findings import box_at, run_toml


def four_ranks(tmp_path: Path) -> tuple[Watched, object]:
    box = box_at(tmp_path, 4)
    for rank in range(4):
        pid = 900 + rank
        box.add_process(replace(training_process(pid, gpu=rank, workdir=str(tmp_path)),
                                session=900))
        box.add_compute_app(rank, pid, "python", 30_000)
        # the real H100 under the training loop (tests/captures/h100-driver580, load1..3):
        # ~1.6 GHz at the 700 W cap, util 98-99 %
        box.set_gpu(rank, util_pct=99, sm_clock_mhz=1605, power_w=690.0, mem_used_mib=30_000)
        box.set_throttle(rank, ["sw_power_cap"])
    return Watched(box, host_config(run_toml(tmp_path))), box


def test_one_slow_gpu_of_a_run_is_its_straggler(tmp_path: Path) -> None:
    w, box = four_ranks(tmp_path)
    box.set_gpu(2, sm_clock_mhz=1005, power_w=410.0)
    box.set_throttle(2, ["hw_thermal_slowdown"])
    codes = [[f for f in w.poll() if f.code == "run.straggler"] for _ in range(3)]
    assert codes[0] == codes[1] == []  # never one or two samples (U21)
    (f,) = codes[2]
    assert f.gpu == 2 and f.run == "llama" and f.evidence["pids"] == [902]
    assert f.message.startswith("GPU 2 (pid 902) holds run llama back: SM clock 1005 MHz vs "
                                "1605, power 410 W vs 690 of its 3 peers, over 3 polls")
    assert "hw_thermal_slowdown" in f.message


def test_a_blip_or_an_idle_run_is_no_straggler(tmp_path: Path) -> None:
    w, box = four_ranks(tmp_path)
    w.poll()
    box.set_gpu(1, sm_clock_mhz=900)  # one slow sample (a checkpoint save, U21)
    w.poll()
    box.set_gpu(1, sm_clock_mhz=1605)
    assert not [f for f in w.poll() if f.code == "run.straggler"]
    for rank in range(4):  # all idle (between epochs): nobody waits for anybody
        box.set_gpu(rank, util_pct=0, sm_clock_mhz=345, power_w=80.0)
    box.set_gpu(3, sm_clock_mhz=210, power_w=40.0)
    assert not [f for _ in range(3) for f in w.poll() if f.code == "run.straggler"]
