"""When the GPUs cannot be read, gpuwatch says so loudly: a hung nvidia-smi, a
driver/library version mismatch, an unloaded driver, no devices, a GPU fallen off the bus, and
a box that lists fewer GPUs than it had, are each a finding with the fix in words, never
"ok, no GPU" with exit 0.

The failures come from the simulator's stand-in nvidia-smi, which prints what the real tool
prints in each case with its exit status (nvidia-smi(1)'s return values; the messages as users
have reported them: "Failed to initialize NVML: Driver/library version mismatch" and exit 18
after an unattended driver upgrade, "NVIDIA-SMI has failed because it couldn't communicate with
the NVIDIA driver" and 9, "No devices were found" and 6, "Unable to determine the device handle
for GPU 0000:3B:00.0: Unknown Error" for a GPU off the bus).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from findings_helpers import Watched
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.snapshot import classify_gpu_error
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.sim import nvidia_smi as smi
from harness.dying_runs import box_at, dead, running
from harness.sshd import SshdBox
from harness.sshd_cli import gpuwatch, ssh_config, start_box

QUERY = ["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]


def stand_in(box: Box, *args: str) -> tuple[int, str]:
    return smi.run(list(args) or QUERY, json.loads((box.sim / "gpus.json").read_text()))


@pytest.mark.parametrize(("driver", "status", "first"), [
    ("mismatch", 18, "Failed to initialize NVML: Driver/library version mismatch"),
    ("not_loaded", 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                      "driver. Make sure that the latest NVIDIA driver is installed and running."),
    ("no_devices", 6, "No devices were found"),
])
def test_the_stand_in_fails_as_the_real_tool_does(tmp_path: Path, driver: str, status: int,
                                                   first: str) -> None:
    box = Box(tmp_path / "box", h100_sxm(2))
    box.set_faults(driver=driver)
    code, out = stand_in(box)
    assert code == status and out.splitlines()[0] == first
    box.set_faults(driver="")
    assert stand_in(box)[0] == 0


def test_the_stand_in_leaves_a_lost_gpu_out_and_says_so(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(4))
    box.set_faults(lost=[2])
    code, out = stand_in(box)
    lines = out.splitlines()
    bus = box.gpus[2]["pci.bus_id"]
    assert code == 15 and len(lines) == 4
    assert [line.split(",")[0] for line in lines[:3]] == ["0", "1", "3"]
    assert lines[3] == f"Unable to determine the device handle for GPU {bus}: Unknown Error"


@pytest.mark.parametrize(("said", "kwargs", "kind"), [
    ("nvidia-smi timed out after 3.0s and was killed", {"timeout": True}, "timeout"),
    ("Failed to initialize NVML: Driver/library version mismatch", {"exit_status": 18},
     "driver_mismatch"),
    ("NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.", {},
     "driver_mismatch"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
     {"exit_status": 9}, "driver_not_loaded"),
    ("NVMLError_DriverNotLoaded: Driver Not Loaded", {}, "driver_not_loaded"),
    ("NVMLError_GpuIsLost: GPU is lost", {}, "gpu_lost"),
    ("No devices were found", {"exit_status": 6}, "no_devices"),
    ("nvidia-smi exited 255: Unknown Error", {"exit_status": 255}, "failed"),
    ("nvidia-smi not found on PATH", {"missing": True, "devices": True}, "failed"),
    ("nvidia-smi not found on PATH", {"missing": True, "devices": False}, None),
])
def test_classification(said: str, kwargs: dict[str, Any], kind: str | None) -> None:
    """Both paths' words: nvidia-smi's messages and exit statuses, and pynvml's error classes."""
    assert classify_gpu_error(said, **kwargs) == kind


CASES = {  # host → (how its driver fails, the gpu_error kind, the finding)
    "hung": ({"hang": True}, "timeout", "gpu.query_failed"),
    "upgraded": ({"driver": "mismatch"}, "driver_mismatch", "gpu.driver_mismatch"),
    "unloaded": ({"driver": "not_loaded"}, "driver_not_loaded", "gpu.query_failed"),
    "empty": ({"driver": "no_devices"}, "no_devices", "gpu.query_failed"),
    "offbus": ({"lost": [3]}, "gpu_lost", "gpu.lost"),
}


def test_each_failure_over_ssh_is_a_critical_finding_not_ok_no_gpu(
        tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> None:
    hosts: dict[str, dict[str, Any]] = {}
    for name, (faults, _kind, _code) in CASES.items():
        box = Box(tmp_path / name, h100_sxm(4))
        box.set_faults(**faults)
        sshd = start_box(sshd_factory, box)
        hosts[name] = {"ssh": "box1", "config_file": str(sshd.ssh_config),
                       "known_hosts": str(sshd.known_hosts)}
    config = ssh_config(sshd, hosts, command_timeout=6)

    run = gpuwatch(tmp_path / "home", "--once", "--json", config=config)
    assert run.returncode == 1, run.stderr  # polled, and a critical finding: not 0
    doc = run.json()
    jsonschema.validate(doc, load_schema())
    reported = {h["name"]: h for h in doc["hosts"]}
    for name, (_faults, kind, code) in CASES.items():
        host = reported[name]
        assert host["ok"], (name, host["error"])
        assert host["gpu_error"] is not None and host["gpu_error"]["kind"] == kind, name
        assert isinstance(host["gpu_error"]["query_s"], float)
        found = {f["code"]: f for f in host["findings"]}
        assert found[code]["severity"] == "critical", (name, host["findings"])
    assert reported["hung"]["gpu_error"]["query_s"] >= 1.0
    assert reported["upgraded"]["gpu_error"]["message"] == (
        "Failed to initialize NVML: Driver/library version mismatch")
    assert len(reported["offbus"]["gpus"]) == 3  # the three that answer stand
    lost = {f["code"]: f for f in reported["offbus"]["findings"]}["gpu.lost"]
    assert "device handle" in lost["message"]

    text = gpuwatch(tmp_path / "home", "--once", config=config)
    assert text.returncode == 1
    table = text.stdout.split("\n\n")[1]  # the host table, before the findings
    assert "no GPU" not in table, table
    for words in ("GPUS NOT ANSWERING", "DRIVER MISMATCH: REBOOT", "NVIDIA DRIVER NOT LOADED",
                  "DRIVER SEES NO GPU", "GPU LOST"):
        assert words in text.stdout, text.stdout


def test_a_box_without_any_nvidia_gpu_is_still_ok(tmp_path: Path) -> None:
    """No nvidia-smi and no /dev/nvidia*: not an error, not a finding (a CPU box)."""
    box = Box(tmp_path / "box", h100_sxm(1))
    w = Watched(box, env={"PATH": "/usr/bin:/bin", "GPUWATCH_DEVFS": str(tmp_path)})
    w.poll()
    snap = w.history.current
    assert snap is not None and snap.gpus == () and snap.gpu_error is None
    assert not [f for f in w.findings if f.code.startswith("gpu.")]


def test_an_unreadable_gpu_list_on_a_box_without_dev_nodes_is_a_warning(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(driver="not_loaded")
    w = Watched(box, env={"GPUWATCH_DEVFS": str(tmp_path)})  # no /dev/nvidia*, no history
    w.poll()
    assert w.one("gpu.query_failed").severity == Severity.WARNING


def test_eight_gpus_then_seven_across_two_cron_runs(tmp_path: Path) -> None:
    """A GPU gone from the list without a word (NVML just counts one fewer): the store keeps
    which GPUs the host had, so the next cron run names the one that is gone."""
    import subprocess
    import sys

    box = Box(tmp_path / "box", h100_sxm(8))
    env = {"PATH": f"{box.bin}:/usr/bin:/bin:{Path(sys.executable).parent}",
           "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"),
           **{k: v for k, v in box.env().items() if k != "PATH"}}

    def once() -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "--once", "--json",
                              "local"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode in (0, 1), out.stderr
        (host,) = json.loads(out.stdout)["hosts"]
        return host

    first = once()
    assert len(first["gpus"]) == 8 and not first["findings"]
    bus = box.gpus[5]["pci.bus_id"]
    state = json.loads((box.sim / "gpus.json").read_text())
    del state["gpus"][5]
    (box.sim / "gpus.json").write_text(json.dumps(state))
    second = once()
    assert len(second["gpus"]) == 7 and second["gpu_error"] is None
    lost = [f for f in second["findings"] if f["code"] == "gpu.lost"]
    assert len(lost) == 1 and lost[0]["severity"] == "critical"
    assert "GPU 5" in lost[0]["message"] and bus in lost[0]["message"]
    assert lost[0]["gpu"] == 5


def test_a_run_that_dies_as_its_gpu_is_lost_died_of_that(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.set_faults(lost=[0])
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "gpu_lost" and evidence["gpu_error"] == "gpu_lost", evidence
    assert "gpu.lost" in w.codes()


def test_a_run_that_dies_as_the_driver_hangs_died_of_that(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.set_faults(hang=True)
    box.remove_process(600)
    started = time.monotonic()
    w.poll()
    assert time.monotonic() - started < 30
    cause, evidence = dead(w)
    assert cause == "gpu_lost" and evidence["gpu_error"] == "timeout"
    assert w.one("gpu.query_failed").severity == Severity.CRITICAL  # it had GPUs


def test_relaunch_is_refused_while_the_driver_is_mismatched(tmp_path: Path) -> None:
    from gpuwatch.remote.actions import plan as actions

    box = box_at(tmp_path)
    w = running(tmp_path, box, relaunch="python train.py")
    box.remove_process(600)
    box.set_faults(driver="mismatch")
    w.poll()
    assert dead(w)[0] == "killed"  # a mismatch does not kill running processes
    plan = actions.plan_relaunch(w.host, "llama", w.history)
    assert plan.refusal is not None and "reboot" in plan.refusal, plan.refusal


def test_persistence_mode_off_is_info_and_a_warning_when_the_query_is_slow(
        tmp_path: Path) -> None:
    """Without persistence mode every nvidia-smi re-initialises the GPUs; the finding
    carries this poll's GPU query time, and is a warning when that time shows the cost."""
    box = Box(tmp_path / "box", h100_sxm(2))
    for i in range(2):
        box.set_gpu(i, {"persistence_mode": False})
    w = Watched(box)
    w.poll()
    snap = w.history.current
    assert snap is not None and [g.persistence for g in snap.gpus] == [False, False]
    assert snap.gpu_query_s is not None and snap.gpu_query_s < 2
    quick = w.one("gpu.persistence_off")
    assert quick.severity == Severity.INFO and "every GPU" in quick.message
    assert "nvidia-persistenced" in quick.message
    box.set_faults(delay_s=1.2)  # each of the two nvidia-smi calls re-initialising: 2.4 s
    w.poll()
    slow = w.one("gpu.persistence_off")
    assert slow.severity == Severity.WARNING and slow.evidence["gpu_query_s"] >= 2
    box.set_faults(delay_s=0)
    box.set_gpu(0, {"persistence_mode": True})
    box.set_gpu(1, {"persistence_mode": True})
    w.poll()
    assert "gpu.persistence_off" not in w.codes()


# --------------------------------------------------------------------- no wolf cried (review)

def crash(tmp_path: Path) -> None:
    """The run's own last words in its log: a Python traceback."""
    with open(tmp_path / "run" / "train.log", "a") as log:
        log.write("Traceback (most recent call last):\n  File \"train.py\", line 9\n"
                  "ValueError: bad batch\n")


def test_a_gpu_lost_elsewhere_is_not_the_death_of_a_run_on_a_healthy_gpu(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)  # on GPU 0
    crash(tmp_path)
    box.set_faults(lost=[1])
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "exception" and "ValueError: bad batch" in evidence["line"]
    assert w.one("gpu.lost").gpu == 1


def test_a_renumbered_list_still_names_the_gpu_that_went(tmp_path: Path) -> None:
    """The driver renumbers the GPUs that answer: the run's GPU 0 gone, old GPU 1 is now 0."""
    box = box_at(tmp_path)
    w = running(tmp_path, box)  # on GPU 0
    bus = box.gpus[0]["pci.bus_id"]
    box.remove_process(600)  # (rewrites gpus.json from the box's state: before the edit)
    state = json.loads((box.sim / "gpus.json").read_text())
    del state["gpus"][0]
    state["gpus"][0]["index"] = 0
    (box.sim / "gpus.json").write_text(json.dumps(state))
    w.poll()
    cause, evidence = dead(w)
    assert cause == "gpu_lost" and evidence["pci"] == [bus]
    assert bus in w.one("gpu.lost").message


def test_a_slow_query_without_persistence_mode_is_not_a_hung_driver(tmp_path: Path) -> None:
    """Without persistence mode the GPUs initialise again once their last process exits: the
    poll after a run ends may time out. The run died of its own error, the query failing is a
    warning, and a relaunch is not refused for a hung driver."""
    from gpuwatch.remote.actions import plan as actions

    box = box_at(tmp_path)
    w = running(tmp_path, box, relaunch="python train.py")
    for i in range(2):
        box.set_gpu(i, {"persistence_mode": False})
    w.poll()  # seen running without persistence mode
    crash(tmp_path)
    box.set_faults(hang=True)
    box.remove_process(600)
    w.poll()
    assert dead(w)[0] == "exception"
    slow = w.one("gpu.query_failed")
    assert slow.severity == Severity.WARNING and "persistence" in slow.message
    plan = actions.plan_relaunch(w.host, "llama", w.history)
    assert plan.refusal is None or "hung" not in plan.refusal, plan.refusal


def test_a_gpu_whose_uuid_reads_na_once_is_not_lost(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(2))
    w = Watched(box)
    w.poll()
    uuid = box.gpus[1]["uuid"]
    box.set_gpu(1, {"uuid": None})  # nvidia-smi prints [N/A] for a GPU in trouble
    w.poll()
    box.set_gpu(1, {"uuid": uuid})
    w.poll()
    assert "gpu.lost" not in w.codes(), w.findings
    assert len(w.history.known_gpus) == 2


def test_exit_255_is_an_exit_not_a_signal() -> None:
    import tui_fixtures as fx
    from gpuwatch.remote.findings.diagnosis import diagnose

    before = fx.snapshot("h", t=fx.NOW - 10, gpus=[fx.gpu(0, 90, 1900)])
    now = fx.snapshot("h", t=fx.NOW, gpus=[fx.gpu(0, 0, 345)])
    d = diagnose(before, now, [4242], exit_code=255)
    assert d.cause == "exited" and d.evidence["signal"] is None
    assert diagnose(before, now, [4242], exit_code=137).cause == "killed"


def test_gpus_the_probe_never_reached_are_not_a_failed_query() -> None:
    """A probe cut short by its deadline before the GPU query: that is the probe's problem
    (said as such), not "nvidia-smi failed"."""
    from gpuwatch.remote.wire.document import parse_probe_output

    doc = {"v": 1, "errors": {"gpus": "not read"},
           "gpus": {"error": "not read: the probe's deadline passed while it read host",
                    "not_read": True}}
    snap = parse_probe_output(json.dumps(doc).encode(), "h")
    assert snap.gpu_error is None and snap.gpus == ()


def test_every_kind_is_in_the_schema_and_has_its_words() -> None:
    from gpuwatch.remote.model.snapshot import GPU_ERRORS

    props = load_schema()["$defs"]["host"]["properties"]["gpu_error"]["oneOf"][1]["properties"]
    assert props["kind"]["enum"] == list(GPU_ERRORS)
    for kind, meaning in GPU_ERRORS.items():
        assert meaning.summary and (meaning.fix or kind in ("driver_mismatch", "gpu_lost"))


def test_nvidia_smi_off_the_ssh_path_on_a_host_with_runs_is_a_gpu_failure_everywhere(
        tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> None:
    """nvidia-smi missing from the PATH that SSH commands get (it is often only on an
    interactive shell's PATH) on a host whose config names runs: every output says the GPUs
    could not be read (gpu_error not_found, gpu.query_failed, gpuwatch_gpu_query_ok 0, check's
    verdict); a CPU host with no runs and no /dev/nvidia* stays "no GPU", not an error."""
    hosts: dict[str, dict[str, Any]] = {}
    for name in ("trains", "cpu"):
        box = Box(tmp_path / name, h100_sxm(2))
        (box.bin / "nvidia-smi").unlink()
        for node in (box.root / "dev").iterdir():
            node.unlink()
        sshd = start_box(sshd_factory, box)
        hosts[name] = {"ssh": "box1", "config_file": str(sshd.ssh_config),
                       "known_hosts": str(sshd.known_hosts)}
    hosts["trains"]["runs"] = {"llama": {"process": "train.py"}}
    config = ssh_config(sshd, hosts, command_timeout=6)

    run = gpuwatch(tmp_path / "home", "--once", "--json", "--fail-on", "warning", config=config)
    assert run.returncode == 1, run.stderr  # a finding, not healthy
    doc = run.json()
    jsonschema.validate(doc, load_schema())
    reported = {h["name"]: h for h in doc["hosts"]}
    trains, cpu = reported["trains"], reported["cpu"]
    assert trains["gpu_error"]["kind"] == "not_found", trains["gpu_error"]
    found = {f["code"]: f for f in trains["findings"]}
    # a warning: no GPU was ever seen there (runs may train on CPUs); one seen before, or a
    # /dev/nvidia* node, makes it critical (test_each_failure_over_ssh_...)
    assert found["gpu.query_failed"]["severity"] == "warning"
    assert "PATH" in found["gpu.query_failed"]["message"]
    assert trains["verdict"]["code"] == "gpu.query_failed"
    assert cpu["gpu_error"] is None and not [f for f in cpu["findings"]
                                             if f["code"].startswith("gpu.")]
    prom = gpuwatch(tmp_path / "home", "--once", "--prometheus", config=config).stdout
    assert 'gpuwatch_gpu_query_ok{host="trains",error="not_found"} 0' in prom, prom
    assert 'gpuwatch_gpu_query_ok{host="cpu"} 1' in prom
    checked = gpuwatch(tmp_path / "home", "check", config=config)
    assert "trains: verdict: " in checked.stdout and "GPUs unreadable" in checked.stdout, \
        checked.stdout
