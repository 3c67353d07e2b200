"""gpu.xid says each code in words with the immediate action of NVIDIA's Xid catalog (cited),
says "not in the catalog" with the raw line for a code it lacks, and names the run whose pid or
GPU the line names. Real kernel lines from gpud's captures (tests/data/captures/PROVENANCE.md),
the newer forms (a subcode, Fatal/Nonfatal words) included."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from findings_helpers import Watched, host_config
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.xid_catalog import CATALOG, CATALOG_VERSION, xid_advice
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from harness.captures import capture
from test_findings import box_at, run_toml


def test_the_catalog_covers_1_to_162_with_one_action_each() -> None:
    assert sorted(CATALOG) == list(range(1, 163))
    assert (CATALOG[13], CATALOG[79], CATALOG[48], CATALOG[119], CATALOG[63]) == (
        "RESTART_APP", "RESTART_BM", "WORKFLOW_XID_48", "RESET_GPU", "IGNORE")
    assert xid_advice(163).action is None and "not in" in xid_advice(163).words()


def test_real_xid_119_says_reset_the_gpu_citing_the_catalog(tmp_path: Path) -> None:
    text = capture("system", "dmesg", "gpud__dmesg-ctime-xid119.log").read_text(errors="replace")
    box = Box(tmp_path / "box", h100_sxm(1))
    w = Watched(box)
    w.poll()
    box.append_dmesg(*text.splitlines())
    (f,) = [f for f in w.poll() if f.code == "gpu.xid"]
    assert "Xid 119 (GSP RPC timeout" in f.message
    assert f"{CATALOG_VERSION} says reset the GPU" in f.message
    assert f.evidence["actions"]["119"] == "RESET_GPU" and f.evidence["catalog"] == CATALOG_VERSION


def test_real_xid_48_63_94_each_with_its_action(tmp_path: Path) -> None:
    lines = capture("system", "dmesg", "gpud__dmesg-iso-xid48-63-94.log").read_text().splitlines()
    box = box_at(tmp_path, 2)
    box.set_gpu(1, {"pci.bus_id": "00000000:19:00.0"})
    w = Watched(box)
    w.poll()
    box.append_dmesg(*lines)
    xids = {f.gpu: f for f in w.poll() if f.code == "gpu.xid"}
    f = xids[1]
    assert f.severity == Severity.CRITICAL and f.message.startswith("GPU 1 logged Xid 48")
    assert "reset the GPU if a row remap is pending" in f.message


def test_an_xid_with_a_pid_is_the_runs_and_an_unknown_code_shows_its_line(
        tmp_path: Path) -> None:
    box = box_at(tmp_path, 2)
    box.add_process(replace(training_process(900, gpu=1, workdir=str(tmp_path)), session=900))
    box.add_compute_app(1, 900, "python", 30_000)
    w = Watched(box, host_config(run_toml(tmp_path)))
    w.poll()
    box.xid(1, 13, pid=900, name="python")
    (f,) = [f for f in w.poll() if f.code == "gpu.xid"]
    assert f.run == "llama" and f.gpu == 1 and "(run llama)" in f.message
    assert "restart the application (the GPU itself is fine)" in f.message
    box.xid(0, 171, detail="Fatal, a code from a newer driver")  # no pid: GPU 0 has no run
    (f,) = [f for f in w.poll() if f.code == "gpu.xid"]
    assert f.run is None and f"Xid 171: not in {CATALOG_VERSION}" in f.message
    assert "a code from a newer driver" in f.message


def test_newer_xid_line_forms_parse() -> None:
    """A subcode after the code (149.37) and the Fatal/Nonfatal words of NVLink5 lines."""
    lines = ["[ 812.118201] NVRM: Xid (PCI:0000:19:00): 149.37, NETIR_LINK_EVT Fatal XC0 i0 "
             "Link 12 (0x00000000 0x00000001 0x00000000)",
             "[ 813.000000] NVRM: Xid (PCI:0000:19:00): 145, RLW_REMAP Nonfatal XC1 i0 Link 3 "
             "(0x00000002)"]
    parsed = probe.parse_kernel_log(lines, 8, 160)
    rows = parsed["xid"]["rows"]
    assert [r[3] for r in rows] == [149, 145]
    assert "NETIR_LINK_EVT Fatal" in rows[0][6]
