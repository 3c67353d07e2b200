"""The simulated box: its /proc and cgroup files parse like the real ones, its stand-ins see
state changes, its kernel log and faults behave as on a real box."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
from gpuwatch.remote.sim import (
    Box,
    SimProcess,
    h100_sxm,
    training_process,
    training_then_xid,
    util_without_clock,
)
from gpuwatch.remote.sim.box import CLK_TCK, SIGHUP_MASK
from harness.captures import capture


def cgroup_capture() -> Path:
    """Our own cgroup v2 files in a 5.15 kernel's format (tests/data/captures/PROVENANCE.md)."""
    return capture("system", "cgroup", "gpuwatch-v2", "sys", "fs", "cgroup")


def sh(box: Box, *argv: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run a command as a session on the box would: the box's PATH and variables."""
    return subprocess.run(list(argv), env={**os.environ, **box.env()}, capture_output=True,
                          text=True, timeout=timeout, check=False)


def parse_stat(text: str) -> tuple[str, list[str]]:
    """The one correct rule: comm runs from the first '(' to the LAST ')'."""
    left, right = text.index("("), text.rindex(")")
    return text[left + 1:right], [text[:left].strip(), "comm", *text[right + 2:].split()]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path / "box", h100_sxm(2))


def test_layout_and_env(box: Box) -> None:
    for rel in ("proc/stat", "proc/uptime", "proc/loadavg", "proc/sys/kernel/random/boot_id",
                "proc/self/cgroup", "proc/mounts", "sys/fs/cgroup/memory.events",
                "sys/fs/cgroup/cpu.max", "bin/nvidia-smi", "bin/dmesg", "sim/gpus.json",
                "sim/dmesg.log"):
        assert (box.root / rel).exists(), rel
    assert os.access(box.bin / "nvidia-smi", os.X_OK)
    env = box.env(base_path="/usr/bin")
    assert env == {"PATH": f"{box.bin}:/usr/bin", "GPUWATCH_PROCFS": str(box.proc),
                   "GPUWATCH_SYSFS": str(box.sys), "GPUWATCH_SIM_DIR": str(box.sim),
                   "GPUWATCH_DEVFS": str(box.root / "dev")}


def test_stat_has_the_real_field_count_and_parses_by_the_same_rule(box: Box) -> None:
    real = Path("/proc/self/stat").read_text()
    _, real_fields = parse_stat(real)
    proc = box.add_process(SimProcess(pid=4321, cmdline=("python", "x.py"),
                                      comm="we) ird (name", session=4000, tty_nr=34816,
                                      threads=17, start_s=123.45))
    comm, fields = parse_stat((box.proc / "4321/stat").read_text())
    assert len(fields) == len(real_fields) == 52
    assert comm == "we) ird (name"
    assert fields[2] == "S" and fields[3] == str(proc.ppid)
    assert (fields[5], fields[6], fields[19]) == ("4000", "34816", "17")  # session tty threads
    assert int(fields[21]) == int(123.45 * CLK_TCK)  # starttime in clock ticks


def test_status_cmdline_environ_and_links(box: Box) -> None:
    real_keys = {line.split(":")[0] for line in Path("/proc/self/status").read_text().split("\n")
                 if line}
    p = box.add_process(training_process(777, nohup=True, workdir="/data/llama"))
    d = box.proc / "777"
    status = dict(line.split(":\t", 1) for line in (d / "status").read_text().splitlines())
    assert set(status) <= real_keys
    assert status["State"] == "R (running)" and status["PPid"] == "1"
    assert status["Uid"].split("\t") == ["1000"] * 4 and status["Threads"] == "24"
    assert int(status["SigIgn"], 16) & SIGHUP_MASK
    assert (d / "cmdline").read_bytes() == b"python\0train.py\0--config\0configs/run.yaml\0"
    assert b"CUDA_VISIBLE_DEVICES=0\0" in (d / "environ").read_bytes()
    assert (d / "cgroup").read_text() == "0::/\n"
    assert os.readlink(d / "cwd") == "/data/llama"
    assert os.readlink(d / "fd/1") == "/data/llama/train.log"
    assert {os.readlink(d / "fd" / n) for n in os.listdir(d / "fd")} >= {
        "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    box.update_process(p.pid, state="Z", threads=1)
    assert (d / "cmdline").read_bytes() == b"" and os.listdir(d / "fd") == []
    assert "Z (zombie)" in (d / "status").read_text()
    box.remove_process(p.pid)
    assert not d.exists() and not any(n.startswith(".") for n in os.listdir(box.proc))


def test_system_proc_files_have_real_formats(box: Box) -> None:
    stat = (box.proc / "stat").read_text()
    assert re.match(r"cpu  (\d+ ){9}\d+\n", stat)
    assert re.search(r"^btime 1784000000$", stat, re.M)
    assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d\n", (box.proc / "uptime").read_text())
    assert re.fullmatch(r"(\d+\.\d\d ){3}\d+/\d+ \d+\n", (box.proc / "loadavg").read_text())
    assert re.fullmatch(r"[0-9a-f-]{36}\n",
                        (box.proc / "sys/kernel/random/boot_id").read_text())
    mounts = (box.proc / "mounts").read_text().splitlines()
    assert all(len(line.split()) == 6 for line in mounts)
    assert any(line.split()[2] == "cgroup2" for line in mounts)


def test_cgroup_files_follow_the_v2_capture(box: Box) -> None:
    real = cgroup_capture()
    ours = box.sys / "fs/cgroup"

    def keyed(path: Path) -> dict[str, str]:
        return dict(line.split(" ", 1) for line in path.read_text().splitlines())

    assert set(keyed(real / "memory.events")) <= set(keyed(ours / "memory.events"))
    assert set(keyed(real / "cpu.stat")) == set(keyed(ours / "cpu.stat"))
    for f in ("memory.events", "cpu.stat"):
        assert all(v.isdigit() for v in keyed(ours / f).values())
    shape = re.compile(r"(max|\d+) \d+\n")
    assert shape.fullmatch((real / "cpu.max").read_text())
    assert (ours / "cpu.max").read_text() == "max 100000\n"
    box.set_cgroup(cpu_quota_us=400000, memory_max=8589934592)
    assert (ours / "cpu.max").read_text() == "400000 100000\n"
    assert re.fullmatch(r"\d+\n", (real / "memory.max").read_text())
    assert (ours / "memory.max").read_text() == "8589934592\n"
    box.set_cgroup(memory_max=None)
    assert (ours / "memory.max").read_text() == "max\n"
    box.oom_kill(box.add_process(training_process(99)))
    assert keyed(ours / "memory.events")["oom_kill"] == "1"
    assert not (box.proc / "99").exists()


def test_scenario_is_seen_by_successive_calls(box: Box) -> None:
    scenario = util_without_clock(box, gpu=0, ticks=2)
    q = ("nvidia-smi", "--query-gpu=utilization.gpu,clocks.sm,clocks_event_reasons.sw_power_cap",
         "--format=csv,noheader,nounits", "-i", "0")
    seen = []
    while scenario.step(box):
        seen.append(sh(box, *q).stdout.strip())
    assert seen == ["100, 1980, Not Active"] * 2 + ["100, 693, Active"] * 2
    assert (box.proc / "uptime").read_text().startswith("86440.00 ")


def test_xid_scenario_logs_and_breaks_the_gpu(box: Box) -> None:
    scenario = training_then_xid(box, gpu=1, code=79, pid=4242)
    while scenario.step(box):
        pass
    log = sh(box, "dmesg").stdout
    assert re.search(r"^\[\d+\.\d{6}\] NVRM: Xid \(PCI:0000:2a:00\): 79, pid=4242, name=python, "
                     r"GPU has fallen off the bus\.$", log, re.M)
    out = sh(box, "nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader", "-i", "1")
    assert out.stdout == "[Unknown Error]\n"


def test_dmesg_prints_lines_and_time_formats_and_can_be_denied(box: Box) -> None:
    box.append_dmesg("[   12.345678] nvidia-nvlink: Nvlink Core is being initialized",
                     "[86400.000001] Out of memory: Killed process 1234 (python) total-vm:1kB")
    out = sh(box, "dmesg")
    assert out.returncode == 0 and out.stdout.splitlines()[1].startswith("[86400.000001] Out of")
    iso = sh(box, "dmesg", "--time-format=iso").stdout.splitlines()[0]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,345678[+-]\d\d:\d\d nvidia-nvlink", iso)
    assert re.match(r"\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] nvidia",
                    sh(box, "dmesg", "-T").stdout)
    box.set_faults(dmesg_denied=True)
    denied = sh(box, "dmesg")
    assert (denied.returncode, denied.stdout, denied.stderr) == (
        1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")


def test_reboot_changes_boot_id_and_clears_processes(box: Box) -> None:
    before = (box.proc / "sys/kernel/random/boot_id").read_text()
    box.add_process(training_process(555))
    box.add_compute_app(0, 555, "python", 40000)
    box.append_dmesg("[ 1.000000] before")
    new_id = box.reboot()
    assert (box.proc / "sys/kernel/random/boot_id").read_text() == new_id + "\n" != before
    assert not (box.proc / "555").exists()
    assert sh(box, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
    assert sh(box, "dmesg").stdout == ""


def test_real_proc_box_lists_real_pids(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1), real_proc=True)
    assert "GPUWATCH_PROCFS" not in box.env() and not box.proc.exists()
    box.add_compute_app(0, os.getpid(), "pytest", 1234)
    out = sh(box, "nvidia-smi", "--query-compute-apps=pid,used_gpu_memory",
             "--format=csv,noheader")
    assert out.stdout == f"{os.getpid()}, 1234 MiB\n"
    with pytest.raises(RuntimeError):
        box.add_process(training_process(1))


def test_concurrent_reader_never_sees_half_a_file(box: Box) -> None:
    stop = threading.Event()
    errors: list[Exception] = []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads((box.sim / "gpus.json").read_text())
                int((box.sys / "fs/cgroup/memory.current").read_text())
            except Exception as exc:
                errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            box.set_gpu(0, util_pct=i % 101, mem_used_mib=i * 100)
            box.set_cgroup(memory_current=10**9 + i)
    finally:
        stop.set()
        reader.join()
    assert errors == []


def test_stand_in_starts_fast(box: Box) -> None:
    """Each poll pays for one call; it should cost about what a bare python3 start does."""
    import time

    t0 = time.perf_counter()
    for _ in range(5):
        sh(box, "nvidia-smi", "--query-gpu=name", "--format=csv")
    per_call = (time.perf_counter() - t0) / 5
    assert per_call < 1.0  # generous: this is a smoke check, not a benchmark
