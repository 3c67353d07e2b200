"""gpuwatch against what real GPUs said: captures we took on an H100 and an H200 (driver
580.159.04, nvidia-ml-py 13.610.43) with tests/device/run.sh, kept in tests/captures/.

Each GPU was captured idle, under a real PyTorch training loop (tests/device/train_gpu.py), with
an orphaned rank holding 6 GiB (tests/device/orphan_gpu.py) and after `gpuwatch reap`: the
probe's exact nvidia-smi queries in both output formats, the probe's own documents on the NVML
and the nvidia-smi path a second apart, and `gpuwatch --once --json` through the run's life.
See tests/captures/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.wire.document import parse_probe_output
from harness import smi_capture

CAPTURES = Path(__file__).parents[1] / "captures"
GPUS = ("h100-driver580", "h200-driver580")
LABELS = ("idle", "load1", "load2", "load3", "orphan", "after-reap")
BUS_ID = "00000000:00:06.0"


def smi(gpu: str, name: str) -> str:
    return (CAPTURES / gpu / "smi" / name).read_text(encoding="utf-8")


def queries(gpu: str) -> tuple[list[str], list[str], list[str]]:
    """The probe's own field lists the capture was taken with (event, throttle, apps)."""
    event, throttle, apps = smi(gpu, "queries.txt").split()
    return event.split(","), throttle.split(","), apps.split(",")


def gpu_rows(text: str, fields: list[str] | None = None) -> list[dict[str, Any]]:
    return smi_capture.gpu_rows(text, fields)


def probe_doc(gpu: str, name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / gpu / "probe" / name).read_text(encoding="utf-8"))


def devices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    table = doc["gpus"]["devices"]
    return [dict(zip(table["fields"], row, strict=True)) for row in table["rows"]]


SINCE_CAPTURED = tuple(probe.SMI_GPU_QUERY[probe.SMI_GPU_QUERY.index("persistence_mode"):])
"""Fields the probe asks for since these captures were taken (persistence mode, and the
memory health and PCIe fields after it, whose formats the H200's health capture holds:
tests/captures/h200-driver580/health, test_real_gpu_health_captures.py). The
real captures of every field (tests/data/captures exporter-captures, `persistence_mode` among
them) hold their format; the next run of tests/device/run.sh on a lent GPU takes these again
with them, and this tuple empties."""


NOT_ASKED_THEN = ("persistence", "ecc_corr_vol", "ecc_unc_vol", "ecc_corr_agg", "ecc_unc_agg",
                  "retired_sbe", "retired_dbe", "retired_pending", "remap_corr", "remap_unc",
                  "remap_pending", "remap_failed", "remap_hist", "recovery", "pcie_gen",
                  "pcie_gen_max", "pcie_width", "pcie_width_max")
"""The GPU row's fields read from SINCE_CAPTURED."""


def test_the_captures_used_the_probes_queries_of_today() -> None:
    """Were the probe's query to change, these captures would no longer show what it reads:
    the captured query is today's, less only the fields named in SINCE_CAPTURED, at its end."""
    today = [f for f in probe.SMI_GPU_QUERY if f not in SINCE_CAPTURED]
    assert probe.SMI_GPU_QUERY[len(today):] == SINCE_CAPTURED
    for gpu in GPUS:
        event, throttle, apps = queries(gpu)
        assert event == today  # the older name of the reason field for old drivers (OLDER)
        assert throttle == [probe.OLDER.get(f, f) if f.startswith("clocks") else f
                            for f in today]
        assert apps == list(probe.SMI_APP_QUERY)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("label", LABELS)
def test_both_output_formats_parse_to_every_field(gpu: str, label: str) -> None:
    """Units and header on (`--format=csv`) or off (as the probe asks): every one of the 14
    fields a number, a name or a list on these GPUs (none is N/A on a bare-metal H100/H200),
    the same GPU in both (two calls a moment apart: the load figures may move)."""
    event, _, _ = queries(gpu)
    (with_units,) = gpu_rows(smi(gpu, f"{label}.gpu-event.csv"))
    (bare,) = gpu_rows(smi(gpu, f"{label}.gpu-event.noheader-nounits.csv"), event)
    for row in (with_units, bare):
        for field in NOT_ASKED_THEN:  # not asked for when these were taken (SINCE_CAPTURED)
            row.pop(field)
        assert all(value is not None for value in row.values()), row
        assert row["index"] == 0 and row["uuid"].startswith("GPU-") and row["mig"] is False
        assert row["pci_bus_id"] == BUS_ID and row["sm_clock_max_mhz"] == 1980
        assert row["power_limit_w"] == 700.0
        assert 0 <= row["util_pct"] <= 100 and 0 < row["sm_clock_mhz"] <= 1980
        assert set(row["throttle_reasons"]) <= {name for _, name in probe.REASON_BITS}
    stable = ("index", "uuid", "name", "mem_total_mib", "sm_clock_max_mhz", "power_limit_w",
              "mig", "pci_bus_id")
    assert {k: with_units[k] for k in stable} == {k: bare[k] for k in stable}


@pytest.mark.parametrize(("gpu", "name", "total"), [
    ("h100-driver580", "NVIDIA H100 80GB HBM3", 81559), ("h200-driver580", "NVIDIA H200", 143771)])
def test_idle_and_loaded_gpus_read_as_the_captures_say(gpu: str, name: str, total: int) -> None:
    """Idle: 345 MHz, 0% and `gpu_idle`. Under the training loop: 98-99%, ~3 GiB, and the
    700 W cap holding the SM clock at 1.5-1.6 GHz of 1.98 (`sw_power_cap`, U23: a GPU at full
    load, not a fault)."""
    (idle,) = gpu_rows(smi(gpu, "idle.gpu-event.csv"))
    assert (idle["name"], idle["mem_total_mib"], idle["mem_used_mib"]) == (name, total, 0)
    assert (idle["util_pct"], idle["sm_clock_mhz"], idle["throttle_reasons"]) == (
        0, 345, ["gpu_idle"])
    assert 60 < idle["power_w"] < 120
    (load,) = gpu_rows(smi(gpu, "load1.gpu-event.csv"))
    assert load["util_pct"] >= 98 and load["mem_used_mib"] == 3055
    assert 1500 <= load["sm_clock_mhz"] <= 1620 and load["throttle_reasons"] == ["sw_power_cap"]
    assert load["power_w"] > 600


@pytest.mark.parametrize("gpu", GPUS)
def test_driver_580_still_takes_the_old_reason_family(gpu: str) -> None:
    """`clocks_throttle_reasons.active` is accepted and printed under the new name: the probe's
    event-first order costs a second nvidia-smi call only on drivers older than the rename."""
    _, throttle, _ = queries(gpu)
    for label in LABELS:
        text = smi(gpu, f"{label}.gpu-throttle.csv")
        assert "clocks_event_reasons.active" in text.splitlines()[0]
        (row,) = gpu_rows(text)
        (as_asked,) = gpu_rows(text.split("\n", 1)[1], throttle)  # no header: the asked names
        assert row["throttle_reasons"] == as_asked["throttle_reasons"] is not None


@pytest.mark.parametrize("gpu", GPUS)
def test_compute_apps_both_formats(gpu: str) -> None:
    _, _, apps = queries(gpu)
    for label, want_mib in (("load1", 3046), ("orphan", 6754), ("idle", None),
                            ("after-reap", None)):
        with_units = smi_capture.app_rows(smi(gpu, f"{label}.apps.csv"))
        bare = smi_capture.app_rows(smi(gpu, f"{label}.apps.noheader-nounits.csv"), apps)
        assert with_units == bare  # the same call twice: the same process
        if want_mib is None:
            assert bare == []  # a header alone, or nothing at all
        else:
            ((uuid, pid, mib, name),) = [tuple(app.values()) for app in bare]
            assert uuid.startswith("GPU-") and pid > 1 and mib == want_mib
            assert name.endswith("python3")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_nvml_and_nvidia_smi_paths_agree_on_a_real_gpu(gpu: str, phase: str) -> None:
    """The probe's two GPU paths, run a second apart on the same GPU, say the same. Memory
    used agrees within 1 MiB: NVML's v1 call read the driver's reserve as used (480 MiB on the
    H100, 616 on the H200, over zombie_unattributed_mib) until the probe asked for v2."""
    nvml, smi_doc = probe_doc(gpu, f"{phase}.nvml.json"), probe_doc(gpu, f"{phase}.smi.json")
    assert (nvml["gpus"]["source"], smi_doc["gpus"]["source"]) == ("nvml", "nvidia-smi")
    assert nvml["errors"] == {} and smi_doc["errors"] == {}
    (a,), (b,) = devices(nvml), devices(smi_doc)
    same = ("index", "uuid", "name", "mem_total_mib", "sm_clock_max_mhz", "power_limit_w",
            "mig", "pci_bus_id")
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    assert abs(a["mem_used_mib"] - b["mem_used_mib"]) <= 1
    assert abs(a["temp_c"] - b["temp_c"]) <= 2
    if phase == "idle":
        assert a["util_pct"] == b["util_pct"] == 0 and a["mem_used_mib"] == 0
        assert a["sm_clock_mhz"] == b["sm_clock_mhz"] == 345
        assert a["throttle_reasons"] == b["throttle_reasons"] == ["gpu_idle"]
    else:
        assert a["util_pct"] >= 90 and b["util_pct"] >= 90
        assert a["throttle_reasons"] == b["throttle_reasons"] == ["sw_power_cap"]
    apps_a, apps_b = nvml["gpus"]["apps"]["rows"], smi_doc["gpus"]["apps"]["rows"]
    assert apps_a == apps_b  # the training process, the same MiB, or nobody


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("doc", ["idle.nvml.json", "idle.smi.json", "load.nvml.json",
                                 "load.smi.json"])
def test_real_probe_documents_become_snapshots(gpu: str, doc: str) -> None:
    raw = (CAPTURES / gpu / "probe" / doc).read_bytes()
    snap = parse_probe_output(raw, "box")
    assert snap.section_errors == {} or set(snap.section_errors) <= {"cgroup"}
    (sample,) = snap.gpus
    (row,) = devices(json.loads(raw))
    assert (sample.index, sample.uuid, sample.name) == (row["index"], row["uuid"], row["name"])
    assert (sample.util_pct, sample.mem_used_mib, sample.sm_clock_mhz, sample.power_w) == (
        row["util_pct"], row["mem_used_mib"], row["sm_clock_mhz"], row["power_w"])
    assert list(sample.throttle_reasons or ()) == row["throttle_reasons"]
    if doc.startswith("load"):
        (app,) = snap.gpu_processes
        assert app.gpu_index == 0 and app.gpu_mem_mib == 3046


def test_the_probe_with_its_sources_tightened_runs_on_a_real_h200() -> None:
    """The probe as sent since its sources lost the spaces Python does not need (bundle._tighten),
    run on a lent H200 by the box's own python3 (3.12.3, whose tokenizer splits f-strings) through
    build_command and build_stdin(trim=True) on a first poll: the GPU read through NVML, every
    health field there, no section failed (tests/captures/README.md)."""
    raw = (CAPTURES / "h200-driver580" / "probe" / "idle.nvml.tightened.json").read_bytes()
    snap = parse_probe_output(raw, "box")
    assert snap.section_errors == {} and snap.gpu_source == "nvml"
    (gpu,) = snap.gpus
    assert gpu.name == "NVIDIA H200" and gpu.mem_total_mib == 143771
    assert gpu.ecc is not None and gpu.ecc.uncorrected_volatile == 0
    assert gpu.pcie is not None and (gpu.pcie.gen, gpu.pcie.width) == (5, 16)
    assert gpu.remap is not None and not gpu.remap.pending and gpu.recovery_action == "none"


@pytest.mark.parametrize("gpu", GPUS)
def test_real_once_documents_follow_the_shipped_schema(gpu: str) -> None:
    """`gpuwatch --once --json` as it ran on the real GPU box (idle, training, SIGKILLed,
    relaunched, an orphaned rank, reaped), checked against today's schema."""
    import jsonschema

    schema = load_schema()
    docs = sorted((CAPTURES / gpu / "once").glob("*.json"))
    assert len(docs) >= 8
    for path in docs:
        jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), schema)


def test_the_client_tells_the_box_where_its_pynvml_is() -> None:
    """The probe's document says which folder pynvml came from; the collector sends it back
    with the next request (and in its memory, for a cron `--once`), and forgets it when the
    box's python no longer imports pynvml."""
    from gpuwatch.remote.config.load import parse_config
    from gpuwatch.remote.wire.collect import Collector, build_request

    host = parse_config('[hosts.box]\nssh = "box"\n').host("box")
    assert host is not None
    doc = probe_doc("h100-driver580", "load.nvml.json")
    folder = "/opt/torch/.venv/lib/python3.12/site-packages"
    doc["gpus"]["pynvml_dir"] = folder
    collector = Collector()
    snap = parse_probe_output(json.dumps(doc).encode(), "box")
    assert snap.pynvml is True and snap.pynvml_dir == folder
    collector._learn(host, 0.0, snap, None)
    assert build_request(host, collector._hints.get("box"))["pynvml_dir"] == folder
    assert collector.memory(host)["hints"]["pynvml_dir"] == folder
    again = Collector()
    again.restore(host, collector.memory(host))
    assert again._hints["box"]["pynvml_dir"] == folder
    doc["gpus"]["pynvml"] = False
    del doc["gpus"]["pynvml_dir"]
    collector._learn(host, 0.0, parse_probe_output(json.dumps(doc).encode(), "box"), None)
    assert "pynvml_dir" not in build_request(host, collector._hints.get("box"))
