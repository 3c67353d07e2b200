"""GPU memory health and recovery findings (gpu.ecc_uncorrected, gpu.remap_pending,
gpu.remap_failed, gpu.recovery_action), judged on a real GPU's values: gpud's `nvidia-smi -q`
of an A10 (driver 535) with 4 uncorrectable rows remapped and a remap pending
(tests/data/captures/PROVENANCE.md). Each poll goes the real way from the probe's document
(rows keyed by field name) through wire/document.py into the model and the rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.findings.gpu_health import (
    gpu_ecc_uncorrected,
    gpu_recovery_action,
    gpu_remap_failed,
    gpu_remap_pending,
)
from gpuwatch.remote.findings.rules import evaluate
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.snapshot import HostSnapshot
from gpuwatch.remote.wire.document import parse_probe_output
from harness.captures import capture

A10 = ("nvidia-smi", "gpud", "nvidia-smi-query.535.129.03.out.0.valid.a10.txt")


def q_sections(text: str) -> dict[str, str]:
    """`nvidia-smi -q` → {"Remapped Rows/Pending": "Yes", ...}: each "key : value" line under
    the headings that enclose it (by indentation), the GPU's own heading left out."""
    out: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("=", "Timestamp", "Driver", "CUDA", "Attached")):
            continue
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(" : ") if " : " in line else (
            line.strip().rstrip(":").strip(), "", "")
        while path and path[-1][0] >= indent:
            path.pop()
        if colon:
            out["/".join([p for _, p in path[1:]] + [key.strip()])] = value.strip()
        else:
            path.append((indent, key))
    return out


def a10_row(**changes: Any) -> dict[str, Any]:
    """The A10's GPU row as the probe sends it, read from its real `-q` values."""
    q = q_sections(capture(*A10).read_text(encoding="utf-8"))
    number = lambda key: int(q[key].split()[0].rstrip("x"))  # noqa: E731  "192 bank(s)", "16x"
    row = {
        "index": 0, "uuid": q["GPU UUID"], "name": q["Product Name"],
        "pci_bus_id": q["PCI/Bus Id"], "util_pct": number("Utilization/Gpu"),
        "ecc_corr_vol": number("ECC Errors/Volatile/DRAM Correctable"),
        "ecc_unc_vol": number("ECC Errors/Volatile/DRAM Uncorrectable"),
        "ecc_corr_agg": number("ECC Errors/Aggregate/DRAM Correctable"),
        "ecc_unc_agg": number("ECC Errors/Aggregate/DRAM Uncorrectable"),
        "remap_corr": number("Remapped Rows/Correctable Error"),
        "remap_unc": number("Remapped Rows/Uncorrectable Error"),
        "remap_pending": q["Remapped Rows/Pending"] == "Yes",
        "remap_failed": q["Remapped Rows/Remapping Failure Occurred"] == "Yes",
        "remap_hist": [number(f"Remapped Rows/Bank Remap Availability Histogram/{h}")
                       for h in ("Max", "High", "Partial", "Low", "None")],
        "pcie_gen": number("PCI/GPU Link Info/PCIe Generation/Current"),
        "pcie_gen_max": number("PCI/GPU Link Info/PCIe Generation/Max"),
        "pcie_width": number("PCI/GPU Link Info/Link Width/Current"),
        "pcie_width_max": number("PCI/GPU Link Info/Link Width/Max"),
    }
    row.update(changes)
    return row


def snapshot(rows: list[dict[str, Any]], apps: list[dict[str, Any]] = ()) -> HostSnapshot:
    fields = list(rows[0])
    doc = {"v": 1, "errors": {}, "gpus": {
        "source": "nvidia-smi", "vendor": "nvidia",
        "devices": {"fields": fields, "rows": [[r.get(f) for f in fields] for r in rows]},
        "apps": {"fields": ["uuid", "pid", "gpu_mem_mib", "process_name"],
                 "rows": [[a["uuid"], a["pid"], 100, "python"] for a in apps]}}}
    return parse_probe_output(json.dumps(doc).encode(), "a10-box")


def history_of(*snaps: HostSnapshot) -> HostHistory:
    history = HostHistory("a10-box")
    for i, snap in enumerate(snaps):
        history.record(snap, 1000.0 + 10 * i)
    return history


def test_the_real_a10_reads_as_its_nvidia_smi_said() -> None:
    (gpu,) = snapshot([a10_row()]).gpus
    assert gpu.name == "NVIDIA A10" and gpu.pci_bus_id == "00000000:07:00.0"
    assert gpu.remap is not None and (gpu.remap.uncorrected, gpu.remap.pending,
                                      gpu.remap.failed) == (4, True, False)
    assert gpu.remap.histogram == (192, 0, 0, 0, 0)
    assert gpu.ecc is not None and gpu.ecc.uncorrected_volatile == 0
    assert gpu.pcie is not None and (gpu.pcie.gen, gpu.pcie.width) == (4, 16)
    assert gpu.to_json()["remap"]["histogram"] == {"max": 192, "high": 0, "partial": 0,
                                                   "low": 0, "none": 0}


def test_a_pending_remap_asks_for_a_reset_when_the_gpu_is_free() -> None:
    uuid = a10_row()["uuid"]
    busy = history_of(snapshot([a10_row()], [{"uuid": uuid, "pid": 4242}]))
    (finding,) = gpu_remap_pending(busy)
    assert finding.severity == Severity.WARNING and finding.gpu == 0
    assert "reset the GPU when its run (4242) has stopped" in finding.message
    assert "nvidia-smi -r -i 0" in finding.message
    (idle,) = gpu_remap_pending(history_of(snapshot([a10_row()])))
    assert "reset the GPU now (nothing runs on it)" in idle.message
    # the A10 did not run out of spare rows (192 banks at max) and says no recovery action
    assert list(gpu_remap_failed(busy)) == [] and list(gpu_recovery_action(busy)) == []


def test_an_uncorrected_error_is_critical_when_it_appears_then_a_warning() -> None:
    uuid = a10_row()["uuid"]
    run = [{"uuid": uuid, "pid": 4242}]
    before, after = snapshot([a10_row()], run), snapshot([a10_row(ecc_unc_vol=1)], run)
    assert list(gpu_ecc_uncorrected(history_of(before))) == []  # the A10's own count: 0
    (new,) = gpu_ecc_uncorrected(history_of(before, after))
    assert new.severity == Severity.CRITICAL and "pids 4242 on it may have crashed" in new.message
    assert new.evidence["before"] == 0 and new.evidence["uncorrected_volatile"] == 1
    (stands,) = gpu_ecc_uncorrected(history_of(before, after, after))
    assert stands.severity == Severity.WARNING and "4242" not in stands.message


def test_a_failed_remap_is_for_replacement_and_says_so_once() -> None:
    history = history_of(snapshot([a10_row(remap_failed=True, remap_hist=[0, 0, 0, 0, 192])]))
    (failed,) = gpu_remap_failed(history)
    assert failed.severity == Severity.CRITICAL and "replaced" in failed.message
    assert list(gpu_remap_pending(history)) == []  # the failure says more than the pending


def test_the_drivers_recovery_action_is_said_in_words() -> None:
    (reboot,) = gpu_recovery_action(history_of(snapshot([a10_row(recovery="node_reboot")])))
    assert reboot.severity == Severity.CRITICAL
    assert reboot.message.startswith("the driver says GPU 0 (00000000:07:00.0) needs a reboot")
    assert list(gpu_recovery_action(history_of(snapshot([a10_row(recovery="none")])))) == []
    (unknown,) = gpu_recovery_action(history_of(snapshot([a10_row(recovery="quantum_fix")])))
    assert "quantum fix" in unknown.message


def test_the_rules_run_with_the_rest() -> None:
    codes = {f.code for f in evaluate(history_of(snapshot([a10_row()])))}
    assert "gpu.remap_pending" in codes


def test_the_health_fields_are_in_the_json_and_the_prometheus_text() -> None:
    import jsonschema
    from gpuwatch.remote.config.load import parse_config
    from gpuwatch.remote.report import (
        HostReport,
        document,
        load_schema,
        prometheus_text,
        to_json_text,
    )
    from gpuwatch.remote.wire.collect import PollOutcome

    host = parse_config('[hosts.a10]\nssh = "local"\n').hosts[0]
    snap = snapshot([a10_row(recovery="gpu_reset", pcie_replays=7)])
    history = history_of(snap)
    report = HostReport(PollOutcome(host, 1_795_617_700.0, 0.5, snap, b""),
                        findings=evaluate(history))
    doc = json.loads(to_json_text(document([report], 1.0)))
    jsonschema.validate(doc, load_schema())
    (gpu,) = doc["hosts"][0]["gpus"]
    assert gpu["remap"]["uncorrected"] == 4 and gpu["remap"]["pending"] is True
    assert gpu["recovery_action"] == "gpu_reset" and gpu["pcie"]["replays"] == 7
    assert gpu["ecc"] == {"corrected_volatile": 0, "uncorrected_volatile": 0,
                          "corrected_aggregate": 0, "uncorrected_aggregate": 0}
    text = prometheus_text([report])
    labels = f'host="a10",gpu="0",uuid="{gpu["uuid"]}"'
    assert f"gpuwatch_gpu_remap_pending{{{labels}}} 1" in text
    assert f'gpuwatch_gpu_remapped_rows{{{labels},cause="uncorrected"}} 4' in text
    assert f'gpuwatch_gpu_recovery_action{{{labels},action="gpu_reset"}} 1' in text
    assert f"gpuwatch_gpu_pcie_link_width_max{{{labels}}} 16" in text
    assert f'gpuwatch_gpu_ecc_errors{{{labels},type="uncorrected",span="volatile"}} 0' in text


def test_the_simulator_plays_memory_going_bad(tmp_path: Path) -> None:
    """The simulator's nvidia-smi answers the probe's health fields in a real driver's format
    (Yes/No, 'Reset'): the real probe reads them and the rules judge each stage."""
    from findings_helpers import Watched
    from gpuwatch.remote.sim import Box, h100_sxm
    from gpuwatch.remote.sim.scenario import memory_errors

    box = Box(tmp_path / "box", gpus=h100_sxm(2))
    w, scenario = Watched(box), memory_errors(box, gpu=1)
    seen = []
    while scenario.step(box):
        seen.append(sorted(f.code for f in w.poll() if f.code.startswith(
            ("gpu.ecc", "gpu.remap", "gpu.recovery"))))
    assert seen == [[], [], ["gpu.ecc_uncorrected", "gpu.remap_pending"],
                    ["gpu.ecc_uncorrected", "gpu.remap_pending"],
                    ["gpu.ecc_uncorrected", "gpu.recovery_action", "gpu.remap_failed"]]
    gpu = w.history.current.gpus[1] if w.history.current else None
    assert gpu is not None and gpu.recovery_action == "gpu_reset"
    assert gpu.remap is not None and gpu.remap.histogram == (639, 0, 0, 0, 1)
    assert w.history.current is not None and w.history.current.gpus[0].remap is not None


def history_at(*snaps: HostSnapshot, step_s: float = 10.0) -> HostHistory:
    """Polls step_s apart on the box's clock."""
    from dataclasses import replace

    history = HostHistory("a10-box")
    for i, snap in enumerate(snaps):
        history.record(replace(snap, taken_at=1000.0 + step_s * i, boot_id="b"), 1000.0 + i)
    return history


def test_a_narrow_or_slow_link_under_load_is_said_with_its_slot() -> None:
    from gpuwatch.remote.findings.gpu_health import gpu_pcie_degraded

    healthy = snapshot([a10_row(util_pct=95)])  # the real A10: gen 4 of 4, x16 of 16
    assert list(gpu_pcie_degraded(history_at(healthy, healthy, healthy))) == []
    narrow = snapshot([a10_row(util_pct=95, pcie_width=8)])
    (f,) = gpu_pcie_degraded(history_at(healthy, narrow, narrow))
    assert "GPU 0 in slot 00000000:07:00.0 runs on x8 of its x16 lanes" in f.message
    idle_gen1 = snapshot([a10_row(util_pct=0, pcie_gen=1)])  # the link saves power at idle
    assert list(gpu_pcie_degraded(history_at(idle_gen1, idle_gen1, idle_gen1))) == []
    busy_gen1 = snapshot([a10_row(util_pct=99, pcie_gen=1)])
    (f,) = gpu_pcie_degraded(history_at(busy_gen1, busy_gen1))
    assert "runs at PCIe gen 1 of 4 while busy" in f.message
    rising = [snapshot([a10_row(util_pct=95, pcie_replays=n)]) for n in (3, 9, 40)]
    (f,) = gpu_pcie_degraded(history_at(*rising))
    assert "retransmitted 37 times" in f.message and f.evidence["replays_rise"] == 37


def test_hw_slowdown_is_a_rate_over_a_window_not_one_sample() -> None:
    from gpuwatch.remote.findings.gpu_health import gpu_hw_slowdown_rate

    calm = snapshot([a10_row(throttle_reasons=[])])
    slowed = snapshot([a10_row(throttle_reasons=["hw_slowdown"])])
    once = [calm] * 9 + [slowed] + [calm] * 8  # 1 poll in 3 minutes: a blip
    assert list(gpu_hw_slowdown_rate(history_at(*once))) == []
    often = [calm, slowed] * 9  # every other poll for 3 minutes: 3/min
    (f,) = gpu_hw_slowdown_rate(history_at(*often))
    assert f.evidence["hw_slowdown_polls"] == 9 and f.evidence["rate_per_min"] == pytest.approx(
        9 / (17 * 10 / 60), 0.01)
    assert "hw_slowdown" in f.message and "the provider has to check" in f.message


def test_nvidia_smis_recovery_words_are_named_by_the_client() -> None:
    """The probe sends gpu_recovery_action's words as printed ('None' on driver 580,
    tests/captures/h200-driver580/health); the client names the action."""
    from gpuwatch.remote.model.gpu import recovery_name

    assert [recovery_name(w) for w in ("None", "Reset", "Reboot", "Drain P2P", "Drain-And-Reset",
                                       "Some New Word")] == [
        "none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "some_new_word"]
    (gpu,) = snapshot([a10_row(recovery="Reboot")]).gpus
    assert gpu.recovery_action == "node_reboot"
