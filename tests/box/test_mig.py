"""MIG as rows: a GPU with MIG on is read with its instances (profile, memory, SMs) and each
compute process placed in its instance; utilisation is not reported under MIG.

The formats are real: the default `nvidia-smi` table and `-L` of an H100 and an H200 with MIG
on (driver 590, nvidia_gpu_exporter's captures, MIT), our own files in driver 535's table layout
and the pre-470 `-L` form (tests/data/captures/PROVENANCE.md). The stand-in nvidia-smi prints
the MIG and process blocks byte for byte as the captures do, so the simulator and the demo can
play a MIG box, and the probe reads it over the same code path as a real one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
from gpuwatch.remote.box.gpus import mig
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_mig
from gpuwatch.remote.sim import nvidia_smi as smi
from gpuwatch.remote.wire.bundle import MIG, build_command, build_stdin, modules_for
from gpuwatch.remote.wire.collect import build_request
from gpuwatch.remote.wire.document import decode_document, parse_probe_output
from harness.captures import capture
from hypothesis import given, settings
from hypothesis import strategies as st

H100 = ("nvidia-smi", "exporter-captures", "linux-x86_64__nvidia-h100-mig__590.48.01")
H200 = ("nvidia-smi", "exporter-captures", "linux-x86_64__nvidia-h200-mig__590.48.01")


def text(*parts: str) -> str:
    return capture(*parts).read_text(encoding="utf-8")


def test_the_h100s_table_reads_as_its_instances_and_processes() -> None:
    """3g.40gb + 2g.20gb + 2x 1g.10gb; gpu_burn and two memhogs in GI 2 (the 3g.40gb)."""
    rows, owners = mig.parse_table(text(*H100, "load__table.txt"))
    assert [(r["gpu"], r["gi"], r["ci"], r["dev"], r["mem_used_mib"], r["mem_total_mib"],
             r["sm"]) for r in rows] == [
        (0, 2, 0, 0, 11091, 40448, 60), (0, 3, 0, 1, 17, 20096, 32),
        (0, 9, 0, 2, 9, 9984, 16), (0, 10, 0, 3, 9, 9984, 16)]
    assert owners == {21180: (0, 2, 0), 21181: (0, 2, 0), 21198: (0, 2, 0)}
    names = mig.parse_list(text(*H100, "capabilities__list-L.txt"))
    assert [names[(0, d)][0] for d in range(4)] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert names[(0, 3)][1] == "MIG-00000003-0000-0000-0000-000000000003"
    idle_rows, idle_owners = mig.parse_table(text(*H100, "idle__table.txt"))
    assert len(idle_rows) == 4 and idle_owners == {}  # "No running processes found"


def test_the_h200s_gpu_instance_split_in_two_compute_instances() -> None:
    """GI 2 holds two compute instances (1c.3g.71gb and 2c.3g.71gb) that share its 71424 MiB;
    the load runs in CI 1."""
    rows, owners = mig.parse_table(text(*H200, "load__table.txt"))
    names = mig.parse_list(text(*H200, "capabilities__list-L.txt"))
    assert [(r["gi"], r["ci"], names[(0, r["dev"])][0], r["sm"]) for r in rows] == [
        (2, 0, "1c.3g.71gb", 16), (2, 1, "2c.3g.71gb", 32), (3, 0, "2g.35gb", 32),
        (9, 0, "1g.18gb", 16), (10, 0, "1g.18gb", 16)]
    assert rows[0]["mem_used_mib"] == rows[1]["mem_used_mib"] == 16925
    assert set(owners.values()) == {(0, 2, 1)} and len(owners) == 3


def test_pmon_prints_no_utilisation_under_mig() -> None:
    """What "not reported under MIG" rests on: `pmon -s um` prints '-' for every process's
    SM and memory share on both MIG boxes (and the GPU's own utilization.gpu is [N/A])."""
    for machine in (H100, H200):
        rows = [line.split() for line in text(*machine, "load__pmon.txt").splitlines()
                if not line.startswith("#")]
        assert rows and all(r[3] == "-" and r[4] == "-" for r in rows)


def test_driver_535s_narrower_table_and_the_old_list_form() -> None:
    rows, owners = mig.parse_table(text("nvidia-smi", "gpuwatch", "a30-mig-535-table.txt"))
    assert [(r["gi"], r["dev"], r["mem_used_mib"], r["mem_total_mib"], r["sm"]) for r in rows] \
        == [(1, 0, 9162, 11968, 28), (2, 1, 25, 11968, 28)]
    assert owners == {48211: (0, 1, 0)}
    names = mig.parse_list(text("nvidia-smi", "gpuwatch", "a100-mig-470-list.txt"))
    assert names[(0, 2)] == ("1g.5gb", "MIG-GPU-5b2a4f0e-8c3d-4a71-9e26-0f4d1c7b9a13/13/0")
    assert (1, 0) not in names and len(names) == 3


def capture_state(machine: tuple[str, ...]) -> dict[str, Any]:
    """The stand-in's state for a MIG capture: its instances and processes, as its table and
    -L say them (what the stand-in must print back)."""
    rows, owners = mig.parse_table(text(*machine, "load__table.txt"))
    names = mig.parse_list(text(*machine, "capabilities__list-L.txt"))
    table = text(*machine, "load__table.txt")
    bar1 = [line.split("|")[2].split("/")[1].split("MiB")[0].strip()
            for line in table.splitlines() if line.startswith("|                  |")
            and "MiB" in line]
    engines = [[int(w) for w in line.split("|")[4].split()] for line in table.splitlines()
               if line.startswith("|  0 ")]
    devices = [dict(gi=r["gi"], ci=r["ci"], dev=r["dev"], sm=r["sm"],
                    mem_used=r["mem_used_mib"], mem_total=r["mem_total_mib"], bar1_used=0,
                    bar1_total=int(bar1[i]), profile=names[(0, r["dev"])][0],
                    uuid=names[(0, r["dev"])][1], **dict(zip(("ce", "enc", "dec", "ofa", "jpg"),
                                                             engines[i], strict=True)))
               for i, r in enumerate(rows)]
    procs = [line for line in table.splitlines() if line.startswith("|    0 ")]
    apps = [{"gpu": 0, "gi": owners[int(p.split()[4])][1], "ci": owners[int(p.split()[4])][2],
             "pid": int(p.split()[4]), "type": p.split()[5], "process_name": p.split()[6],
             "used_gpu_memory": int(p.split()[7].removesuffix("MiB"))} for p in procs]
    return {"driver_version": "590.48.01", "cuda_version": "13.1", "compute_apps": apps,
            "gpus": [{"name": "NVIDIA H100", "mig.mode.current": True, "mig_devices": devices}]}


def blocks(table: str) -> str:
    """The MIG devices and Processes blocks of a table (from the first blank line on)."""
    return table[table.index("\n\n") + 2:]


def test_the_stand_ins_table_prints_the_mig_and_process_blocks_as_the_driver_does() -> None:
    for machine in (H100, H200):
        state = capture_state(machine)
        status, out = smi.run([], state)
        assert status == 0
        assert blocks(out) == blocks(text(*machine, "load__table.txt"))


def test_the_stand_ins_gpu_block_is_the_drivers_layout() -> None:
    """The GPU lines of the H100's table, from the values its query-gpu capture holds."""
    real = text(*H100, "load__table.txt").splitlines()
    gpu = {"name": "NVIDIA H100 80GB HBM3", "persistence_mode": True,
           "pci.bus_id": "00000000:00:09.0", "mig.mode.current": True, "fan.speed": None,
           "temperature.gpu": 52, "pstate": "P0", "power.draw": 432.0,
           "enforced.power.limit": 700.0, "memory.used": 11125, "memory.total": 81559,
           "compute_mode": "Default"}
    _, out = smi.run([], {"driver_version": "590.48.01", "cuda_version": "13.1",
                          "gpus": [gpu]})
    assert out.splitlines()[1:12] == real[1:12]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 14), st.integers(0, 7), st.integers(0, 99999),
                          st.integers(1, 99999), st.integers(1, 200)), min_size=1, max_size=7),
       st.lists(st.tuples(st.integers(2, 4_000_000), st.integers(0, 6),
                          st.text("abcdefghij_/.- ", min_size=1, max_size=80)), max_size=6))
def test_any_table_the_stand_in_prints_reads_back(devices: list[tuple[int, ...]],
                                                  procs: list[tuple[Any, ...]]) -> None:
    """Property: whatever instances and processes (long names are cut as nvidia-smi cuts
    them), the probe's reader gets back each instance's ids, memory and SMs, and each pid's
    instance."""
    state_devices = [dict(gi=gi, ci=ci, dev=j, mem_used=min(used, total), mem_total=total,
                          sm=sm) for j, (gi, ci, used, total, sm) in enumerate(devices)]
    apps = [dict(gpu=0, pid=pid, gi=state_devices[k % len(devices)]["gi"],
                 ci=state_devices[k % len(devices)]["ci"], process_name=name.strip() or "x",
                 used_gpu_memory=1)
            for k, (pid, _, name) in enumerate(procs)]
    state = {"gpus": [{"name": "G", "mig.mode.current": True, "mig_devices": state_devices}],
             "compute_apps": apps}
    rows, owners = mig.parse_table(smi.run([], state)[1])
    assert [(r["gi"], r["ci"], r["dev"], r["mem_used_mib"], r["mem_total_mib"], r["sm"])
            for r in rows] == [(d["gi"], d["ci"], d["dev"], d["mem_used"], d["mem_total"],
                                d["sm"]) for d in state_devices]
    assert owners == {a["pid"]: (0, a["gi"], a["ci"]) for a in apps}


@given(st.text(max_size=400))
def test_the_readers_take_any_text(said: str) -> None:
    """Box text: whatever nvidia-smi prints, the readers answer rows or nothing, never raise."""
    mig.parse_table("MIG devices:\n" + said + "\nProcesses:\n" + said)
    mig.parse_list("GPU 0: x\n" + said)


# ---------------------------------------------------------------- the probe, end to end

def probe(box: Box, gpu_hints: dict[str, str] | None) -> dict[str, Any]:
    host = parse_config('[hosts.gpu1]\nssh = "local"\n').host("gpu1")
    assert host is not None
    request = build_request(host, {"gpu_hints": gpu_hints} if gpu_hints else None)
    request["want"] = {"nvml": False}
    result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                            input=build_stdin(request, trim=True),
                            env=box.env(base_path="/usr/bin:/bin"),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(decode_document(result.stdout))


def test_a_mig_box_polled_through_the_probe(tmp_path: Path) -> None:
    """The simulator's H100 with MIG: the first poll says MIG is on (the hint), the next
    brings the MIG reader and reads the instances with their processes; the JSON counts them
    and follows the schema."""
    box = Box(tmp_path / "box", h100_mig())
    box.add_compute_app(0, 4242, "python3", 30100, gi=2, ci=0)
    box.add_compute_app(0, 4343, "python3", 9000, gi=9, ci=0)
    first = probe(box, None)
    assert first["gpus"]["hints"] == {"mig": "1"} and "mig" not in first["gpus"]
    assert MIG in modules_for({"v": 1, "gpu_hints": first["gpus"]["hints"]})
    assert MIG not in modules_for({"v": 1})
    doc = probe(box, first["gpus"]["hints"])
    snap = parse_probe_output(json.dumps(doc).encode(), "gpu1")
    (gpu,) = snap.gpus
    assert gpu.mig is True and gpu.util_pct is None
    assert [(m.profile, m.gpu_instance, m.sm_count, m.mem_total_mib, m.pids)
            for m in gpu.mig_instances] == [
        ("3g.40gb", 2, 60, 40448, (4242,)), ("2g.20gb", 3, 32, 20096, ()),
        ("1g.10gb", 9, 16, 9984, (4343,)), ("1g.10gb", 10, 16, 9984, ())]
    assert all(m.util_pct is None for m in gpu.mig_instances)
    assert {(p.pid, p.gpu_instance, p.compute_instance) for p in snap.gpu_processes} == {
        (4242, 2, 0), (4343, 9, 0)}
    out = gpu.to_json()
    assert len(out["mig_instances"]) == 4 and out["mig_instances"][0]["pids"] == [4242]
    jsonschema.validate(out, {**load_schema()["$defs"]["gpu"], "$defs": load_schema()["$defs"]})


def test_a_bad_mig_table_loses_the_instances_only(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_mig())
    doc = probe(box, {"mig": "1"})
    doc["gpus"]["mig"]["rows"][0][0] = "zero"  # the GPU index, not an integer
    snap = parse_probe_output(json.dumps(doc).encode(), "gpu1")
    assert len(snap.gpus) == 1 and snap.gpus[0].mig_instances == ()
    assert "gpus.mig" in snap.section_errors and "integer" in snap.section_errors["gpus.mig"]


def test_mig_off_again_is_said_once(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_mig())
    box.set_gpu(0, {"mig.mode.current": False})
    assert probe(box, {"mig": "1"})["gpus"]["hints"] == {"mig": "0"}
    assert "hints" not in probe(box, {"mig": "0"})["gpus"]


# ---------------------------------------------------------------- NVML

class NVMLError(Exception):
    pass


def test_the_nvml_reader_of_mig_devices() -> None:
    """NVML's calls for MIG device handles (pynvml's names), answered as the nvidia-smi
    capture's H100 says: index 1 is empty (no instance), utilisation Not Supported."""
    rows, _ = mig.parse_table(text(*H100, "load__table.txt"))
    names = mig.parse_list(text(*H100, "capabilities__list-L.txt"))
    by_dev = {r["dev"]: r for r in rows}
    slots = {0: 0, 2: 1, 3: 2, 4: 3}  # NVML index → MIG device (a gap at 1)

    def need(handle: Any) -> dict[str, Any]:
        return by_dev[handle[1]]

    def mig_handle(gpu: Any, i: int) -> Any:
        if i not in slots:
            raise NVMLError("Not Found")
        return ("mig", slots[i])

    def not_supported(handle: Any) -> Any:
        raise NVMLError("Not Supported")

    nvml = SimpleNamespace(
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetGpuInstanceId=lambda h: need(h)["gi"],
        nvmlDeviceGetComputeInstanceId=lambda h: need(h)["ci"],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(
            used=need(h)["mem_used_mib"] << 20, total=need(h)["mem_total_mib"] << 20),
        nvmlDeviceGetAttributes=lambda h: SimpleNamespace(multiprocessorCount=need(h)["sm"]),
        nvmlDeviceGetUtilizationRates=not_supported,
        nvmlDeviceGetName=lambda h: ("NVIDIA H100 80GB HBM3 MIG " + names[(0, h[1])][0]).encode(),
        nvmlDeviceGetUUID=lambda h: names[(0, h[1])][1],
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=21198)]
        if h[1] == 0 else [])

    def ask(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except NVMLError:
            return None

    def decode(value: Any) -> Any:
        return value.decode() if isinstance(value, bytes) else value

    got, owners = mig.read_nvml(nvml, "gpu0", 0, ask, decode)
    assert [(r["dev"], r["gi"], r["profile"], r["sm"], r["mem_total_mib"], r["util_pct"])
            for r in got] == [(0, 2, "3g.40gb", 60, 40448, None), (2, 3, "2g.20gb", 32, 20096,
                                                                  None),
                              (3, 9, "1g.10gb", 16, 9984, None),
                              (4, 10, "1g.10gb", 16, 9984, None)]
    assert owners == {21198: (0, 2, 0)}
    apps = [{"uuid": "GPU-0", "pid": 21198}, {"uuid": "GPU-0", "pid": 1}]
    mig.place_apps(apps, owners, {0: "GPU-0"})
    assert apps == [{"uuid": "GPU-0", "pid": 21198, "gi": 2, "ci": 0},
                    {"uuid": "GPU-0", "pid": 1, "gi": None, "ci": None}]


def test_the_text_report_and_prometheus_count_the_instances(tmp_path: Path) -> None:
    from gpuwatch.remote import report

    box = Box(tmp_path / "box", h100_mig())
    box.add_compute_app(0, 4242, "python3", 30100, gi=2, ci=0)
    snap = parse_probe_output(json.dumps(probe(box, {"mig": "1"})).encode(), "gpu1")
    assert report._gpu_cell(snap) == "0:MIG 4 inst/17"  # no util under MIG; SM clock 345 MHz
    m = report._Metrics()
    report._gpu_health_metrics(m, snap.gpus[0], {"host": "gpu1", "gpu": 0})
    text = m.text()
    assert 'gpuwatch_gpu_mig_instances{host="gpu1",gpu="0"} 4' in text
    assert ('gpuwatch_gpu_mig_memory_total_mib{host="gpu1",gpu="0",gpu_instance="2",'
            'compute_instance="0",profile="3g.40gb"} 40448') in text
