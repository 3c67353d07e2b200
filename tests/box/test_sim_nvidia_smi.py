"""The stand-in nvidia-smi against real captures, byte for byte, and its faults.

Each conformance test reads a real capture (tests/data/captures), turns its values into typed
gpus.json state with the stand-in's own parser, runs the stand-in as a subprocess with the same
field list and format, and compares bytes. Fields derived by the stand-in (count, index,
driver_version, the per-reason Active/Not Active flags, compute apps' gpu_* columns) are left
out of the state, so the comparison also checks that the derivations match the real driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.sim import Box, h100_mig, h100_sxm, old_driver, rtx_2080_super
from gpuwatch.remote.sim import nvidia_smi as ns
from harness.captures import CAPTURES as ALL_CAPTURES
from harness.captures import capture

CAPTURES = ALL_CAPTURES / "nvidia-smi"

STAND_IN = Path(ns.__file__)

# A datacenter GPU, two MIG boxes, consumer cards with [N/A] fields, an L40S, Windows drivers.
MACHINES = [
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01",
    "linux-x86_64__nvidia-h100-mig__590.48.01",
    "linux-x86_64__nvidia-h200-mig__590.48.01",
    "linux-x86_64__nvidia-h200__590.48.01",
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05",
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04",
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05",
    "linux-x86_64__nvidia-l40s__595.80",
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86",
]
DERIVED = {"count", "index", "driver_version"}


def captures() -> Path:
    """The captures folder, or fail (CI) / skip (elsewhere) saying why."""
    return capture("nvidia-smi")


def run_smi(sim_dir: Path, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWATCH_SIM_DIR": str(sim_dir)}
    return subprocess.run([sys.executable, "-S", str(STAND_IN), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def split_header(line: str) -> list[tuple[str, str]]:
    """[(field, unit)] from a CSV header like "memory.used [MiB]"."""
    out = []
    for col in line.split(", "):
        name, _, unit = col.partition(" [")
        out.append((name, unit[:-1]))
    return out


def state_from_capture(gpu_csv: str, apps_csv: str | None = None,
                       driver_version: str | None = None) -> dict[str, Any]:
    """gpus.json state from a captured --query-gpu CSV (and --query-compute-apps CSV); the
    driver version from its column unless given."""
    lines = gpu_csv.rstrip("\n").split("\n")
    cols = split_header(lines[0])
    names = [n for n, _ in cols]
    driver = driver_version or lines[1].split(", ")[names.index("driver_version")]
    state: dict[str, Any] = {"driver_version": driver, "gpus": [], "compute_apps": []}
    table, aliases = ns.gpu_table(state)
    for row in lines[1:]:
        gpu: dict[str, Any] = {}
        for (name, unit), text in zip(cols, row.split(", "), strict=True):
            spec = table[aliases.get(name, name)]
            assert spec[0] == unit, f"unit of {name}: table {spec[0]!r}, capture {unit!r}"
            if spec[1] != ns.REASON and name not in DERIVED:
                gpu[ns.state_key(name)] = ns.parse_value(spec, text)
        state["gpus"].append(gpu)
    if apps_csv:
        alines = apps_csv.rstrip("\n").split("\n")
        acols = split_header(alines[0])
        for row in alines[1:]:
            values = dict(zip((n for n, _ in acols), row.split(", "), strict=True))
            uuid = values["gpu_uuid"]
            gpu_index = next(i for i, g in enumerate(state["gpus"]) if g.get("uuid") == uuid)
            app: dict[str, Any] = {"gpu": gpu_index}
            for name, _ in acols:
                if name not in ns.APP_FROM_GPU:
                    app[name] = ns.parse_value(ns.APP_FIELDS[name], values[name])
            state["compute_apps"].append(app)
    return state


def write_state(tmp_path: Path, state: dict[str, Any]) -> Path:
    (tmp_path / "gpus.json").write_text(json.dumps(state), encoding="utf-8")
    return tmp_path


def query_of(csv_text: str) -> str:
    return ",".join(n for n, _ in split_header(csv_text.split("\n", 1)[0]))


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_query_gpu_matches_capture_bytes(tmp_path: Path, machine: str, phase: str) -> None:
    real = (captures() / "exporter-captures" / machine / (f"{phase}__query-gpu.csv")).read_text()
    sim = write_state(tmp_path, state_from_capture(real))
    out = run_smi(sim, "--query-gpu=" + query_of(real), "--format=csv")
    assert out.returncode == 0, out.stdout
    # Every capture ends in a newline, as the tool prints; none needs the trailing-newline leeway.
    assert out.stdout == real


@pytest.mark.parametrize("machine", MACHINES)
def test_query_compute_apps_matches_capture_bytes(tmp_path: Path, machine: str) -> None:
    folder = captures() / "exporter-captures" / machine
    gpu_csv = (folder / "load__query-gpu.csv").read_text()
    real = (folder / "load__query-compute-apps.csv").read_text()
    sim = write_state(tmp_path, state_from_capture(gpu_csv, real))
    out = run_smi(sim, "--query-compute-apps=" + query_of(real), "--format=csv")
    assert out.returncode == 0, out.stdout
    assert out.stdout == real


OWN_CAPTURES = Path(__file__).parents[1] / "captures"


@pytest.mark.parametrize("gpu", ["h100-driver580", "h200-driver580"])
@pytest.mark.parametrize("label", ["idle", "load1", "orphan", "after-reap"])
def test_probes_own_queries_match_our_driver_580_captures(tmp_path: Path, gpu: str,
                                                          label: str) -> None:
    """The stand-in asked exactly what the probe asks (tests/captures: an H100 and an H200
    we captured, driver 580.159.04) prints what the real tool printed: clocks.sm answered as
    clocks.current.sm, the old reason family under the new name, temperature.gpu with no unit,
    a compute-apps table with one process or none."""
    folder = OWN_CAPTURES / gpu / "smi"
    event, throttle, apps = (folder / "queries.txt").read_text().split()
    real = (folder / f"{label}.gpu-event.csv").read_text()
    real_apps = (folder / f"{label}.apps.csv").read_text()
    sim = write_state(tmp_path, state_from_capture(real, real_apps, "580.159.04"))
    assert run_smi(sim, "--query-gpu=" + event, "--format=csv").stdout == real
    # taken a moment later: the same header and GPU, load figures that moved
    said = run_smi(sim, "--query-gpu=" + throttle, "--format=csv").stdout.split("\n")
    later = (folder / f"{label}.gpu-throttle.csv").read_text().split("\n")
    assert said[0] == later[0] and said[1].split(", ")[:3] == later[1].split(", ")[:3]
    assert run_smi(sim, "--query-compute-apps=" + apps, "--format=csv").stdout == real_apps


def test_old_driver_sample_matches_bytes(tmp_path: Path) -> None:
    """A 2021 driver (471.x): clocks_throttle_reasons.* and no power/ECC extras."""
    real = (captures() / "exporter-samples-2021" / "sample-output.csv").read_text()
    state = state_from_capture(real)
    assert ns.driver_major(state["driver_version"]) < ns.EVENT_REASONS_SINCE
    sim = write_state(tmp_path, state)
    out = run_smi(sim, "--query-gpu=" + query_of(real), "--format=csv")
    assert out.stdout == real
    event = run_smi(sim, "--query-gpu=clocks_event_reasons.active", "--format=csv")
    assert (event.returncode, event.stdout) == (
        2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n\n')


@pytest.mark.parametrize("machine", ["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01",
                                     "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05"])
def test_noheader_nounits_rederives_the_same_values(tmp_path: Path, machine: str) -> None:
    """csv,noheader,nounits prints each captured value without its unit, nothing else."""
    real = (captures() / "exporter-captures" / machine / "load__query-gpu.csv").read_text()
    sim = write_state(tmp_path, state_from_capture(real))
    cols = split_header(real.split("\n", 1)[0])
    want = []
    for (_, unit), text in zip(cols, real.split("\n")[1].split(", "), strict=True):
        want.append(text[: -len(unit) - 1] if unit and text.endswith(" " + unit) else text)
    for fmt in ("csv,noheader,nounits", "nounits,noheader,csv"):
        out = run_smi(sim, "--query-gpu=" + query_of(real), "--format=" + fmt)
        assert out.stdout == ", ".join(want) + "\n"
    typed = {n: v for n, v in zip((n for n, _ in cols), want, strict=True)}
    assert float(typed["power.draw"]) > 0 and int(typed["memory.total"]) > 0


def test_header_keeps_units_with_nounits(tmp_path: Path) -> None:
    """As netdata's tesla-p100.csv capture (taken with nounits) shows; that file is GPL, so this
    reads our own file in its format (tests/data/captures/PROVENANCE.md)."""
    real = (captures() / "gpuwatch" / "a100-csv-nounits.csv").read_text()
    header = real.split("\n", 1)[0]
    sim = write_state(tmp_path, {"driver_version": "418.67", "gpus": [{}]})
    out = run_smi(sim, "--query-gpu=" + query_of(real), "--format=csv,nounits")
    assert out.stdout.split("\n", 1)[0] == header


def test_list_gpus_matches_mig_capture(tmp_path: Path) -> None:
    machine = captures() / "exporter-captures" / "linux-x86_64__nvidia-h100-mig__590.48.01"
    real = (machine / "capabilities__list-L.txt").read_text()
    gpu_line, *mig_lines = real.rstrip("\n").split("\n")
    name = gpu_line.split(": ", 1)[1].split(" (UUID")[0]
    uuid = gpu_line.split("UUID: ")[1].rstrip(")")
    migs = [{"profile": line.split()[1], "uuid": line.split("UUID: ")[1].rstrip(")")}
            for line in mig_lines]
    sim = write_state(tmp_path, {"driver_version": "590.48.01",
                                 "gpus": [{"name": name, "uuid": uuid, "mig_devices": migs}]})
    assert run_smi(sim, "-L").stdout == real


def test_new_driver_accepts_throttle_alias_and_prints_event_name(tmp_path: Path) -> None:
    sim = write_state(tmp_path, {"driver_version": "590.48.01",
                                 "gpus": [{"clocks_event_reasons.active": 0x44}]})
    out = run_smi(sim, "--query-gpu=clocks_throttle_reasons.active,"
                  "clocks_throttle_reasons.sw_power_cap,clocks_event_reasons.hw_thermal_slowdown,"
                  "clocks_event_reasons.gpu_idle", "--format=csv")
    assert out.stdout == ("clocks_event_reasons.active, clocks_event_reasons.sw_power_cap, "
                          "clocks_event_reasons.hw_thermal_slowdown, clocks_event_reasons.gpu_idle"
                          "\n0x0000000000000044, Active, Active, Not Active\n")


def test_unknown_field_is_refused_like_the_real_tool(tmp_path: Path) -> None:
    sim = write_state(tmp_path, {"driver_version": "590.48.01", "gpus": [{}]})
    out = run_smi(sim, "--query-gpu=name,device_minor", "--format=csv,noheader")
    assert out.returncode == 2
    assert out.stdout == 'Field "device_minor" is not a valid field to query.\n\n'


def test_errors_and_not_supported_print_bracketed(tmp_path: Path) -> None:
    sim = write_state(tmp_path, {"driver_version": "550.54.15", "gpus": [{
        "power.draw": {"error": "Not Supported"}, "fan.speed": {"error": "Unknown Error"},
        "temperature.memory": None, "memory.used": None}]})
    out = run_smi(sim, "--query-gpu=power.draw,fan.speed,temperature.memory,memory.used",
                  "--format=csv,noheader,nounits")
    assert out.stdout == "[Not Supported], [Unknown Error], N/A, [N/A]\n"


def test_select_by_index_and_uuid(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(4))
    uuid = box.gpus[2]["uuid"]
    out = run_smi(box.sim, "--query-gpu=index,uuid", "--format=csv,noheader", "-i", "1," + uuid)
    assert out.stdout == "1, {}\n2, {}\n".format(box.gpus[1]["uuid"], uuid)
    missing = run_smi(box.sim, "--query-gpu=index", "--format=csv", "--id=9")
    assert missing.returncode == 6


def test_presets_answer_plausibly(tmp_path: Path) -> None:
    fields = "name,utilization.gpu,mig.mode.current,ecc.mode.current,serial,memory.total"
    rows = {}
    for preset in (h100_sxm(), h100_mig(), rtx_2080_super()):
        box = Box(tmp_path / preset.name.replace(" ", "_"), preset)
        out = run_smi(box.sim, "--query-gpu=" + fields, "--format=csv,noheader")
        rows[preset.name] = out.stdout.split("\n")[0]
    assert rows["8x H100 80GB HBM3"] == ("NVIDIA H100 80GB HBM3, 0 %, Disabled, Enabled, "
                                         "1652123000017, 81559 MiB")
    assert rows["H100 with MIG"].split(", ")[1:3] == ["[N/A]", "Enabled"]
    assert rows["RTX 2080 SUPER"].split(", ")[3:5] == ["[N/A]", "[N/A]"]
    old = Box(tmp_path / "old", old_driver())
    out = run_smi(old.sim, "--query-gpu=clocks_throttle_reasons.gpu_idle", "--format=csv")
    assert out.stdout == "clocks_throttle_reasons.gpu_idle\nActive\n"


def test_fail_fault_prints_driver_error_and_exits_9(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(fail=True)
    out = run_smi(box.sim, "--query-gpu=name", "--format=csv")
    assert out.returncode == 9
    assert out.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with "
                                 "the NVIDIA driver.")


def test_hang_fault_really_hangs(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(hang=True)
    with pytest.raises(subprocess.TimeoutExpired):  # run() kills the child on timeout
        run_smi(box.sim, "--query-gpu=name", "--format=csv", timeout=1.0)


def test_delay_fault_answers_late(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    box.set_faults(delay_s=0.3)
    with pytest.raises(subprocess.TimeoutExpired):
        run_smi(box.sim, "--query-gpu=name", "--format=csv", timeout=0.1)
    assert run_smi(box.sim, "--query-gpu=name", "--format=csv,noheader").stdout == (
        "NVIDIA H100 80GB HBM3\n")


def test_version_says_it_is_a_simulator(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    out = subprocess.run(["nvidia-smi", "--version"], env={**os.environ, **box.env()},
                         capture_output=True, text=True, timeout=10, check=True)
    assert out.stdout.startswith("NVIDIA-SMI version  : 590.48.01\n")
    assert "gpuwatch simulator" in out.stdout
