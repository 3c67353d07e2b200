"""The GPU health fields against what a real H200 said: tests/captures/h200-driver580/health/,
taken 2026-11-27 on a lent NVIDIA H200 (driver 580.159.04, nvidia-ml-py's pynvml) by
tests/device/health_capture.sh, read-only (no GPU setting changed), idle and under a small torch
load. See tests/captures/README.md.

Each test reads the capture through the probe's own readers: the CSV through `gpu_row`, the
refusals through `invalid_field` and the retry of `smi_gpus`, NVML's answers through
`read_nvml` (a stand-in pynvml that answers what the real one answered, call by call).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.wire.document import parse_probe_output
from harness import smi_capture

HEALTH = Path(__file__).parents[1] / "captures" / "h200-driver580" / "health"
UUID = "GPU-d48083ae-ff64-2b37-05e9-ad53ff607aa4"


def text(name: str) -> str:
    return (HEALTH / name).read_text(encoding="utf-8")


def nvml_dump(phase: str) -> dict[str, Any]:
    return json.loads(text(f"nvml-{phase}.json"))


def queries() -> dict[str, list[str]]:
    """The capture's field sets (queries.txt: NAME=field,field,...)."""
    out = {}
    for line in text("queries.txt").splitlines():
        name, _, fields = line.partition("=")
        out[name] = fields.split(",")
    return out


def documented(help_text: str) -> set[str]:
    """The field names `nvidia-smi --help-query-*` lists (each '"name"' or '"a" or "b"')."""
    names = set()
    for line in help_text.splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([^"]+)"', line))
    return names


def test_every_field_the_probe_asks_is_one_driver_580_knows() -> None:
    """The probe's GPU query (and the older names it falls back to) and its compute-apps query
    are all in driver 580's own lists, so a 580 box answers them in one call."""
    gpu_fields = documented(text("help-query-gpu.txt"))
    assert len(gpu_fields) > 200
    asked = set(probe.SMI_GPU_QUERY) | set(probe.OLDER.values())
    assert asked <= gpu_fields, sorted(asked - gpu_fields)
    assert set(probe.SMI_APP_QUERY) <= documented(text("help-query-compute-apps.txt"))


def test_driver_580_has_no_instance_fields_for_compute_apps() -> None:
    """`gpu_instance_id` and `compute_instance_id` are no `--query-compute-apps` fields on
    driver 580 (refused, exit 2): a process's MIG instance comes from elsewhere (NVML, or
    `nvidia-smi -q -d PIDS`, whose 'GPU instance ID' reads N/A on a GPU without MIG)."""
    apps = documented(text("help-query-compute-apps.txt"))
    assert "gpu_instance_id" not in apps and "compute_instance_id" not in apps
    for phase in ("idle", "load"):
        refused = text(f"{phase}.apps.noheader-nounits.csv")
        assert probe.invalid_field(refused) == "gpu_instance_id"
    assert "GPU instance ID                   : N/A" in text("load-q-d-PIDS.txt")
    exits = dict(line.split("\t")[:2] for line in text("exits.tsv").splitlines()[1:])
    assert exits["load.apps.noheader-nounits.csv"] == "2"


@pytest.mark.parametrize("name", ["invalid-first.txt", "invalid-middle.txt", "invalid-two.txt",
                                  "invalid-apps.txt"])
def test_driver_580s_refusal_names_the_first_unknown_field(name: str) -> None:
    """`Field "X" is not a valid field to query.` (exit 2), wherever X stands; of two unknown
    fields only the first is named, so the probe learns one per query (MAX_RETRIES)."""
    said = text(name)
    assert said.startswith("Field \"") and "is not a valid field to query." in said
    want = {"invalid-first.txt": "bogus_field", "invalid-middle.txt": "not.a.field",
            "invalid-two.txt": "bogus.one", "invalid-apps.txt": "bogus_app_field"}[name]
    assert probe.invalid_field(said) == want
    exits = dict(line.split("\t")[:2] for line in text("exits.tsv").splitlines()[1:])
    assert exits[name] == "2"


def h200_value_of() -> dict[str, str]:
    """The H200's idle answer to every field the captures asked for, by the name asked: the
    probe's base and health query as the probe asks it (noheader, nounits), and the field sets
    of histogram, retired pages, PCIe, remap, recovery action and MIG (values without units)."""
    sets = queries()
    (line,) = text("idle.gpu-base+health.noheader-nounits.csv").splitlines()
    values = dict(zip(sets["BASEQ"] + sets["HEALTHQ"], (c.strip() for c in line.split(",")),
                      strict=True))
    for label in ("HIST", "RETIRED", "PCIE", "REMAP", "RECOVERY", "MIG"):
        (line,) = text(f"idle.gpu-{label}.csv").splitlines()[1:]
        values.update(zip(sets["ID"] + sets[label], (c.strip() for c in line.split(",")),
                          strict=True))
    return values


def test_the_h200s_health_fields_read_as_it_said_them() -> None:
    """Idle and under load, in both formats: no ECC error, no row remapped, nothing pending,
    every bank with all its spare rows (3072 at 'max'), gpu_recovery_action 'None' (sent as
    said, read by the client as the recovery action "none"), the link at gen 5 x16 of 5 x16;
    retired pages [N/A] (an H200 remaps rows instead), MIG off."""
    sets = queries()
    fields = sets["BASEQ"] + sets["HEALTHQ"]
    health = {"ecc_corr_vol": 0, "ecc_unc_vol": 0, "ecc_corr_agg": 0, "ecc_unc_agg": 0,
              "remap_corr": 0, "remap_unc": 0, "remap_pending": False, "remap_failed": False,
              "recovery": "None", "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16,
              "pcie_width_max": 16, "retired_pending": None, "mig": False,
              "persistence": True, "pci_bus_id": "00000000:00:06.0"}
    for phase in ("idle", "load"):
        (with_units,) = smi_capture.gpu_rows(text(f"{phase}.gpu-base+health.csv"))
        (bare,) = smi_capture.gpu_rows(
            text(f"{phase}.gpu-base+health.noheader-nounits.csv"), fields)
        for row in (with_units, bare):  # two calls a moment apart: power, temp may move
            assert {k: row[k] for k in health} == health
    from gpuwatch.remote.model.gpu import recovery_name

    assert recovery_name(bare["recovery"]) == "none"  # the driver's words, the client's name
    assert "gpu_recovery_action" in text("idle.gpu-RECOVERY.csv").splitlines()[0]
    assert text("idle.gpu-RECOVERY.csv").splitlines()[1].endswith(", None")
    (hist,) = smi_capture.gpu_rows(text("idle.gpu-HIST.csv"))
    assert hist["remap_hist"] == [3072, 0, 0, 0, 0]
    (retired,) = smi_capture.gpu_rows(text("idle.gpu-RETIRED.csv"))
    assert (retired["retired_sbe"], retired["retired_dbe"], retired["retired_pending"]) == (
        None, None, None)
    (pcie,) = smi_capture.gpu_rows(text("idle.gpu-PCIE.csv"))
    assert (pcie["pcie_gen"], pcie["pcie_gen_max"]) == (5, 5)  # gen.gpucurrent, gen.max
    assert "Bank Remap Availability Histogram" in text("q-d-ROW_REMAPPER.txt")


def test_the_probes_query_on_the_h200_with_a_field_an_older_driver_lacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's whole query, answered field by field with the H200's own idle values; one
    field refused in driver 580's exact words (as a driver older than gpu_recovery_action
    refuses it): the query is asked again without it, every other field stands, and the
    lesson goes back to the client as a hint."""
    values = h200_value_of()
    refusal = text("invalid-middle.txt").replace("not.a.field", "gpu_recovery_action")
    calls: list[list[str]] = []

    def nvidia_smi(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        assert argv[0] == "nvidia-smi" and timeout_s > 0
        if argv[1].startswith("--query-compute-apps="):
            return 0, "", ""
        asked = argv[1].split("=", 1)[1].split(",")
        calls.append(asked)
        if "gpu_recovery_action" in asked:
            return 2, refusal, ""
        # a field the captures never asked for alone (the clock event reasons' old family,
        # the instant power) is not in the probe's query
        return 0, ", ".join(values[name] for name in asked) + "\n", ""

    monkeypatch.setattr(probe, "run_bounded", nvidia_smi)
    section = probe.read({}, time.monotonic() + 30)
    assert len(calls) == 2 and "gpu_recovery_action" not in calls[1]
    assert section["hints"] == {"lacks": "gpu_recovery_action"}
    table = section["devices"]
    (row,) = [dict(zip(table["fields"], r, strict=True)) for r in table["rows"]]
    assert "recovery" not in row  # None in every row: not sent
    assert row["remap_hist"] == [3072, 0, 0, 0, 0] and row["ecc_unc_agg"] == 0
    assert (row["uuid"], row["mem_total_mib"], row["pcie_width_max"]) == (UUID, 143771, 16)
    calls.clear()
    probe.read({"lacks": "gpu_recovery_action"}, time.monotonic() + 30)
    assert len(calls) == 1  # the next poll pays nothing


# ---------------------------------------------------------------- NVML, replayed


def test_nvml_field_values_3_to_6_are_the_total_ecc_counts() -> None:
    """nvmlDeviceGetFieldValues ids 3-6 (ECC single/double bit, volatile/aggregate totals)
    answer what nvmlDeviceGetTotalEccErrors answers for (corrected/uncorrected, volatile/
    aggregate), idle and under load: the probe's one call stands for the four. (0 on this
    healthy H200 in both: equal, though a count above 0 was not seen.) The recovery action
    (230) and the replay counter (94) come as unsigned int (valueType 1), the rest as unsigned
    long long (3); retired pages (29-31) are not supported (nvmlReturn 3) on an H200."""
    ids = {3: ("CORRECTED", "VOLATILE"), 4: ("UNCORRECTED", "VOLATILE"),
           5: ("CORRECTED", "AGGREGATE"), 6: ("UNCORRECTED", "AGGREGATE")}
    for phase in ("idle", "load"):
        calls = {c["call"]: c for c in nvml_dump(phase)["gpus"][0]["calls"]}
        batch = {v["id"]: v for v in calls["nvmlDeviceGetFieldValues(batch)"]["result"]}
        for fid, (kind, span) in ids.items():
            total = calls[f"nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_{kind},"
                          f"NVML_{span}_ECC)"]["result"]
            assert batch[fid]["nvmlReturn"] == 0 and batch[fid]["value"] == total == 0
        # an unsupported one says so in words and carries no value
        assert batch[29].get("error_text") == "Not Supported" and "value" not in batch[29]
        types = {fid: batch[fid]["valueType"] for fid, _ in probe.FIELD_IDS}
        assert types[230] == types[94] == 1 and types[3] == types[142] == 3
        assert {fid for fid, _ in probe.FIELD_IDS if batch[fid]["nvmlReturn"] != 0} == \
            {29, 30, 31}


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


def replayed_pynvml(dump: dict[str, Any]) -> SimpleNamespace:
    """A pynvml that answers each call the probe makes with what the real one answered in
    `dump` (one GPU); a call the dump did not make raises NotSupported, as NVML does for a
    field it lacks (that field is then None)."""
    calls = {c["call"]: c for c in dump["gpus"][0]["calls"]}

    def answer(label: str) -> Any:
        call = calls.get(label)
        if call is None or "error" in call:
            raise NotSupported(label)
        result = call["result"]
        return SimpleNamespace(**result) if isinstance(result, dict) else result

    def field_values(handle: int, ids: list[int]) -> list[SimpleNamespace]:
        batch = {v["id"]: v for v in calls["nvmlDeviceGetFieldValues(batch)"]["result"]}
        return [SimpleNamespace(nvmlReturn=batch[i]["nvmlReturn"], valueType=batch[i]["valueType"],
                                value=SimpleNamespace(uiVal=batch[i].get("value"),
                                                      ullVal=batch[i].get("value")))
                for i in ids]

    def mig_mode(handle: int) -> tuple[int, int]:
        return tuple(answer("nvmlDeviceGetMigMode"))  # type: ignore[return-value]

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=0, NVML_TEMPERATURE_GPU=0,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(dump["gpus"]),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: answer("nvmlDeviceGetUUID"),
        nvmlDeviceGetName=lambda h: answer("nvmlDeviceGetName"),
        nvmlDeviceGetUtilizationRates=lambda h: answer("nvmlDeviceGetUtilizationRates"),
        nvmlDeviceGetMemoryInfo=lambda h, **kw: answer("nvmlDeviceGetMemoryInfo"),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: answer(
            "nvmlDeviceGetCurrentClocksEventReasons"),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetPciInfo=lambda h: answer("nvmlDeviceGetPciInfo"),
        nvmlDeviceGetPersistenceMode=lambda h: answer("nvmlDeviceGetPersistenceMode"),
        nvmlDeviceGetClockInfo=lambda h, c: answer("nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"),
        nvmlDeviceGetMaxClockInfo=lambda h, c: answer(
            "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)"),
        nvmlDeviceGetPowerUsage=lambda h: answer("nvmlDeviceGetPowerUsage"),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: answer("nvmlDeviceGetEnforcedPowerLimit"),
        nvmlDeviceGetTemperature=lambda h, s: answer("nvmlDeviceGetTemperature"),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: answer(
            "nvmlDeviceGetCurrPcieLinkGeneration"),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: answer(
            "nvmlDeviceGetMaxPcieLinkGeneration"),
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: answer("nvmlDeviceGetCurrPcieLinkWidth"),
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: answer("nvmlDeviceGetMaxPcieLinkWidth"),
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetRowRemapperHistogram=lambda h: answer("nvmlDeviceGetRowRemapperHistogram"),
        # the dump kept only the process objects' repr: the replay lists none
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
    )


@pytest.mark.parametrize("phase", ["idle", "load"])
def test_the_nvml_reader_on_the_h200s_answers(phase: str) -> None:
    """read_nvml on what the H200's NVML answered: the health fields as NVML's numbers
    (recovery action 0, flags 0), which the client reads as nvidia-smi's words read; the
    calls the dump did not make (memory, temperature) None for their field alone."""
    section = probe.read_nvml(replayed_pynvml(nvml_dump(phase)), {})
    table = section["devices"]
    (row,) = [dict(zip(table["fields"], r, strict=True)) for r in table["rows"]]
    assert "mem_used_mib" not in table["fields"] and "temp_c" not in table["fields"]
    assert (row["uuid"], row["name"], row["pci_bus_id"]) == (
        UUID, "NVIDIA H200", "00000000:00:06.0")
    assert {k: row[k] for k in ("ecc_corr_vol", "ecc_unc_vol", "ecc_corr_agg", "ecc_unc_agg",
                                "remap_corr", "remap_unc", "remap_pending", "remap_failed",
                                "recovery", "pcie_replays")} == dict.fromkeys(
        ("ecc_corr_vol", "ecc_unc_vol", "ecc_corr_agg", "ecc_unc_agg", "remap_corr",
         "remap_unc", "remap_pending", "remap_failed", "recovery", "pcie_replays"), 0)
    assert "retired_sbe" not in row  # nvmlReturn 3 on an H200
    assert row["remap_hist"] == [3072, 0, 0, 0, 0]
    assert (row["pcie_gen"], row["pcie_gen_max"], row["pcie_width"], row["pcie_width_max"]) \
        == (5, 5, 16, 16)
    assert row["mig"] is False and row["persistence"] is True
    assert row["throttle_reasons"] == (["gpu_idle"] if phase == "idle" else ["sw_power_cap"])
    doc = {"v": 1, "host": {"boot_id": "b", "uptime_s": 1.0}, "gpus": section, "errors": {}}
    snap = parse_probe_output(json.dumps(doc).encode(), "h200")
    (gpu,) = snap.gpus
    assert gpu.recovery_action == "none" and gpu.remap is not None
    assert (gpu.remap.pending, gpu.remap.failed, gpu.remap.histogram) == (
        False, False, (3072, 0, 0, 0, 0))
    assert gpu.ecc is not None and gpu.ecc.uncorrected_aggregate == 0
    assert gpu.pcie is not None and (gpu.pcie.gen, gpu.pcie.width_max, gpu.pcie.replays) == (
        5, 16, 0)


def test_per_process_utilisation_is_there_under_load_only() -> None:
    """nvmlDeviceGetProcessUtilization: Not Found at idle (no process), the load's pid with its
    SM share under load, as `nvidia-smi pmon -s um` prints it (98%, 874 MB)."""
    idle = {c["call"]: c for c in nvml_dump("idle")["gpus"][0]["calls"]}
    load = {c["call"]: c for c in nvml_dump("load")["gpus"][0]["calls"]}
    assert idle["nvmlDeviceGetProcessUtilization(0)"]["error"] == "NVMLError_NotFound"
    (sample,) = load["nvmlDeviceGetProcessUtilization(0)"]["result"]
    assert sample["pid"] == 832 and sample["smUtil"] >= 90
    rows = [line.split() for line in text("pmon.txt").splitlines() if not line.startswith("#")]
    assert rows and all(r[1] == "832" and r[2] == "C" and int(r[3]) >= 90 and r[9] == "874"
                        for r in rows)
    ((uuid, pid, mib, _),) = [tuple(a.values())
                              for a in smi_capture.app_rows(text("load.apps.csv"))]
    assert (uuid, pid, mib) == (UUID, 832, 874)


def test_the_lead_s_once_json_follows_the_schema() -> None:
    """`gpuwatch --once --json` on the H200 (NVML path) from main before the health fields
    landed: it follows today's schema, and the figures NVML gave agree with nvidia-smi's
    capture of the same minute (143771 MiB, 345 MHz idle, 700 W, persistence on)."""
    import jsonschema

    doc = json.loads(text("once-local.json"))
    jsonschema.validate(doc, load_schema())
    (gpu,) = doc["hosts"][0]["gpus"]
    (smi,) = smi_capture.gpu_rows(text("idle.gpu-base+health.csv"))
    assert (gpu["uuid"], gpu["mem_total_mib"], gpu["sm_clock_mhz"], gpu["power_limit_w"]) == (
        smi["uuid"], smi["mem_total_mib"], smi["sm_clock_mhz"], smi["power_limit_w"])
    assert gpu["persistence_mode"] is smi["persistence"] is True


# ---------------------------------------------------------------- the probe on a real H200


def test_the_probes_two_paths_agree_on_the_h200s_health() -> None:
    """The probe (main at 5b10b74, the health fields merged) on another lent H200, idle and
    under load, through NVML and through nvidia-smi a moment apart: read by today's client,
    both say the same health (NVML's numbers, nvidia-smi's words), and the JSON follows the
    schema."""
    import jsonschema

    schema = load_schema()
    for phase in ("idle", "load"):
        snaps = [parse_probe_output(text(f"probe/{phase}.{path}.json").encode(), "h200")
                 for path in ("nvml", "smi")]
        assert [s.gpu_source for s in snaps] == ["nvml", "nvidia-smi"]
        (a,), (b,) = (s.gpus for s in snaps)
        assert a.uuid == b.uuid and a.name == "NVIDIA H200"
        for gpu in (a, b):
            assert gpu.recovery_action == "none" and gpu.mig is False
            assert gpu.ecc is not None and gpu.ecc.uncorrected_volatile == 0
            assert gpu.remap is not None and (gpu.remap.pending, gpu.remap.failed,
                                              gpu.remap.histogram) == (
                False, False, (3072, 0, 0, 0, 0))
            assert gpu.pcie is not None and (gpu.pcie.gen, gpu.pcie.width) == (5, 16)
            jsonschema.validate(gpu.to_json(), {**schema["$defs"]["gpu"],
                                                "$defs": schema["$defs"]})
        assert a.pcie is not None and a.pcie.replays == 0  # NVML only
        if phase == "load":
            assert a.throttle_reasons == b.throttle_reasons == ("sw_power_cap",)
            assert [p.pid for p in snaps[0].gpu_processes] == \
                [p.pid for p in snaps[1].gpu_processes]


def test_driver_580s_table_without_mig() -> None:
    """`nvidia-smi`'s table on a GPU without MIG: no MIG block, and its Processes block says
    N/A for the instances, which the MIG reader places nowhere; the stand-in prints that block
    as the driver does."""
    from gpuwatch.remote.box.gpus import mig
    from gpuwatch.remote.sim import nvidia_smi as smi

    real = text("load.table.txt")
    rows, owners = mig.parse_table(real)
    assert rows == [] and owners == {}
    line = next(x for x in real.splitlines() if "/opt/torch/.venv/bin/python3" in x)
    pid = int(line.split()[4])
    state = {"gpus": [{"mig.mode.current": False}], "compute_apps": [
        {"gpu": 0, "pid": pid, "process_name": "/opt/torch/.venv/bin/python3",
         "used_gpu_memory": 874}]}
    out = smi.run([], state)[1]
    processes = real[real.index("| Processes:"):]
    assert out[out.index("| Processes:"):] == processes
