"""HostSnapshot from real probe output (the probe run on a fixture box), and what a garbage
or foreign document turns into: a ProbeError that names the place."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from gpuwatch.remote.model.snapshot import HostSnapshot, ProbeError
from gpuwatch.remote.wire.document import parse_probe_output
from harness.probe_box import BOOT_ID, BTIME, UUIDS, Box, box_request, build_box, run_probe

DESIGN_GPU_KEYS = ["index", "uuid", "name", "util_pct", "mem_used_mib", "mem_total_mib",
                   "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temp_c",
                   "throttle_reasons", "mig", "persistence_mode",
                   # the third milestone's GPU health fields, additive (DESIGN §3)
                   "vendor", "ecc", "remap", "recovery_action", "pcie", "mig_instances"]
DESIGN_PROCESS_KEYS = ["pid", "ppid", "user", "state", "started_at", "gpu_index", "gpu_mem_mib",
                       "cmd", "run", "zombie", "cpu_pct"]  # cpu_pct: added to gpuwatch/1 later
DESIGN_DISK_KEYS = ["path", "mount", "bytes_total", "bytes_free", "inodes_total", "inodes_free"]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return build_box(tmp_path / "box")


def probe_output(box: Box, **changes: object) -> bytes:
    result = run_probe(box_request(box, **changes), box.env())
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def snapshot(box: Box, **changes: object) -> HostSnapshot:
    return parse_probe_output(probe_output(box, compress=True, **changes), "gpu1")


def test_snapshot_of_a_fixture_box(box: Box):
    snap = snapshot(box)
    assert snap.host == "gpu1" and snap.hostname == "gpu-box-7" and snap.boot_id == BOOT_ID
    assert snap.section_errors == {} and snap.uptime_s == 86400.25 and snap.poll_s is None
    assert snap.probe_s is not None and snap.probe_cpu_s is not None
    assert snap.gpu_source == "nvidia-smi" and snap.gpu_hints == {"mig": "1"}  # GPU 2

    gpus = {g.index: g for g in snap.gpus}
    assert gpus[1].throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert gpus[1].sm_clock_mhz == 1410 and gpus[1].temp_c == 86 and gpus[1].power_w == 699.87
    assert gpus[2].util_pct is None and gpus[2].mig is True
    assert gpus[3].power_w is None and gpus[7].throttle_reasons is None

    apps = {a.pid: a for a in snap.gpu_processes}
    assert apps[4242].gpu_index == 5 and apps[1100].process_name == "evil, name"

    procs = {p.pid: p for p in snap.processes}
    run = procs[830]
    assert (run.gpu_index, run.gpu_mem_mib, run.run) == (0, 70000, "llama")
    assert run.started_at == BTIME + 7_200_000 / os.sysconf("SC_CLK_TCK")
    assert run.has_tty and not run.sighup_ignored and run.holds_nvidia_dev
    assert procs[930].holds_nvidia_dev is False and procs[930].gpu_index is None
    assert procs[1000].zombie and procs[1000].to_json()["zombie"] == "defunct"
    assert procs[1100].comm == "evil ) (name x" and procs[1100].nvidia_devs == (3,)
    assert snap.process_counts is not None and snap.process_counts.fd_skipped == (1300,)

    assert snap.cgroup is not None
    assert (snap.cgroup.oom_kill, snap.cgroup.cpus, snap.cgroup.memory_max_bytes) == (1, 4.0, None)
    assert snap.kill_user_processes is False
    xid79 = next(e for e in snap.kernel_events if e.xid == 79)
    assert xid79.at == BTIME + 4521.118263 and xid79.pci == "0000:3b:00"
    (oom,) = (e for e in snap.kernel_events if e.kind == "oom")
    assert (oom.pid, oom.name, oom.memcg) == (930, "pt_data_worker", True)
    assert (oom.cgroup, oom.limit_bytes) == ("/user.slice", 16 << 30)
    assert snap.xid_counts == {79: 1, 13: 1}
    assert snap.disks[0].mount == str(box.root.parent) and snap.disks[1].error


def test_the_runs_cgroups_and_the_probes_own(box: Box):
    """A run in a Docker container: its counter is read beside the probe's own (U41)."""
    docker = "/system.slice/docker-4f2a9c.scope"
    box.write("proc/830/cgroup", f"0::{docker}\n")
    box.write(f"sys/fs/cgroup{docker}/memory.events", "max 3\noom 1\noom_kill 1\n")
    box.write(f"sys/fs/cgroup{docker}/memory.max", "34359738368\n")
    cg = snapshot(box).cgroup
    assert cg is not None and cg.path == "/user.slice/user-1000.slice/session-3.scope"
    ours = cg.counter(docker)
    assert ours is not None and (ours.oom_kill, ours.memory_max_bytes) == (1, 34359738368)
    own = cg.counter(cg.path)
    assert own is not None and (own.oom_kill, own.memory_max_bytes) == (1, None)
    assert cg.counter("/system.slice/cron.service") is None  # not a run's: not read


def test_to_json_uses_the_design_field_names(box: Box):
    snap = snapshot(box)
    assert list(snap.gpus[0].to_json()) == DESIGN_GPU_KEYS
    assert list(snap.processes[0].to_json()) == DESIGN_PROCESS_KEYS
    assert list(snap.disks[0].to_json()) == DESIGN_DISK_KEYS
    gpu = snap.gpus[1].to_json()
    assert gpu["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    json.dumps([g.to_json() for g in snap.gpus] + [p.to_json() for p in snap.processes])


def test_snapshots_are_frozen_plain_data(box: Box):
    snap = snapshot(box)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.gpus[0].util_pct = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.cgroup.memory_events["oom_kill"] = 0  # type: ignore[index, union-attr]
    assert not hasattr(snap.gpus[0], "__dict__")
    assert dataclasses.replace(snap, poll_s=0.25).poll_s == 0.25


def test_plain_and_compressed_output_read_the_same(box: Box):
    plain = parse_probe_output(probe_output(box), "gpu1")
    packed = snapshot(box)
    assert plain.gpus == packed.gpus and plain.processes == packed.processes


def test_failed_sections_are_recorded_and_the_rest_stands(box: Box):
    box.tool("nvidia-smi", "exec sleep 60\n")
    snap = snapshot(box, nvidia_smi_timeout_s=0.5)
    assert snap.gpus == () and snap.section_errors["gpus"].startswith("nvidia-smi timed out")
    assert snap.boot_id == BOOT_ID and snap.processes


def test_gpu_table_without_the_process_list(box: Box):
    box.tool("nvidia-smi", f'case "$1" in --query-gpu=*) cat "{box.root}/gpus.csv" ;;\n'
                           f'*) echo "Unknown Error"; exit 255 ;; esac\n')
    snap = snapshot(box)
    assert len(snap.gpus) == 8 and snap.gpu_processes == ()
    # the same tool fails the table MIG's instances come from (GPU 2): said apart, GPUs stand
    assert snap.section_errors == {
        "gpus.apps": "nvidia-smi compute-apps exited 255: Unknown Error",
        "gpus.mig": "nvidia-smi's table has no MIG devices (exit 255: Unknown Error)"}


# ---------------------------------------------------------------- garbage and foreign documents

@pytest.mark.parametrize(("data", "problem"), [
    (b"", "the probe printed nothing"),
    (b"Traceback (most recent call last):\n", "neither JSON nor zlib-compressed JSON"),
    (b"{\"v\": 1,", "not JSON"),
    (zlib.compress(b"[1, 2]"), "expected an object, got a list"),
    (b'{"v": 2}', "version 2; this gpuwatch reads version 1"),
    (b'{"gpus": {}}', "version None; this gpuwatch reads version 1"),
])
def test_unreadable_documents(data: bytes, problem: str):
    with pytest.raises(ProbeError) as caught:
        parse_probe_output(data, "gpu1")
    assert caught.value.host == "gpu1" and problem in str(caught.value)
    assert str(caught.value).startswith("gpu1: probe output ")


def damaged(box: Box, damage) -> ProbeError:
    doc = json.loads(probe_output(box))
    damage(doc)
    with pytest.raises(ProbeError) as caught:
        parse_probe_output(json.dumps(doc).encode(), "gpu1")
    return caught.value


def test_a_wrong_type_deep_inside_is_named_by_its_place(box: Box):
    def text_util(doc: dict) -> None:
        doc["gpus"]["devices"]["rows"][3][3] = "97 %"
    error = damaged(box, text_util)
    assert error.where == "gpus.devices.rows[3].util_pct"
    assert error.problem == "expected a number or null, got a string"


def test_a_short_row_and_a_missing_field_are_named(box: Box):
    def short_row(doc: dict) -> None:
        doc["processes"]["procs"]["rows"][2].pop()
    assert damaged(box, short_row).where == "processes.procs.rows[2]"

    def no_pid(doc: dict) -> None:
        procs = doc["processes"]["procs"]
        index = procs["fields"].index("pid")
        procs["fields"].pop(index)
        for row in procs["rows"]:
            row.pop(index)
    error = damaged(box, no_pid)
    assert (error.where, error.problem) == ("processes.procs.rows[0].pid",
                                            "expected an integer, got null")

    def boolean_count(doc: dict) -> None:
        doc["cgroup"]["memory_events"]["oom_kill"] = True
    assert damaged(box, boolean_count).where == "cgroup.memory_events"


def test_unknown_keys_and_fields_are_ignored(box: Box):
    doc = json.loads(probe_output(box))
    newer = copy.deepcopy(doc)
    newer["gpus"]["devices"]["fields"].append("nvlink_gbps")
    for row in newer["gpus"]["devices"]["rows"]:
        row.append(450.0)
    newer["ecc"] = {"volatile": 0}
    newer["host"]["kernel"] = "6.8.0"
    old = parse_probe_output(json.dumps(doc).encode(), "gpu1")
    new = parse_probe_output(json.dumps(newer).encode(), "gpu1")
    assert new.gpus == old.gpus and new.boot_id == old.boot_id


def test_model_imports_neither_textual_nor_asyncssh():
    code = ("import sys, gpuwatch.remote.model.snapshot; "
            "print([m for m in sys.modules if m.split('.')[0] in ('textual', 'asyncssh')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_uuids_map_apps_to_gpu_indexes(box: Box):
    snap = snapshot(box)
    assert {a.uuid: a.gpu_index for a in snap.gpu_processes}[UUIDS[7]] == 7


# ---------------------------------------------------------------- CPU% between two polls

TCK = os.sysconf("SC_CLK_TCK")


def rewrite_stat(box: Box, pid: int, *, utime: int | None = None, stime: int | None = None,
                 start: int | None = None) -> None:
    """Change a fixture process's CPU ticks or start time in its /proc/PID/stat."""
    path = box.proc / str(pid) / "stat"
    head, tail = path.read_text().rsplit(")", 1)
    rest = tail.split()  # rest[0] is field 3 (state): field n is rest[n - 3]
    for n, value in ((14, utime), (15, stime), (22, start)):
        if value is not None:
            rest[n - 3] = str(value)
    path.write_text(head + ") " + " ".join(rest) + "\n")


def test_cpu_pct_is_the_cpu_time_used_between_two_polls_of_the_same_process(box: Box):
    from gpuwatch.remote.model.history import HostHistory

    history = HostHistory("gpu1")
    first = snapshot(box)
    history.record(first, 0.0)
    procs = {p.pid: p for p in history.snapshots[-1].processes}
    assert procs[830].cpu_s == pytest.approx(15 / TCK)  # the fixture's utime 12 + stime 3
    assert first.processes_uptime_s == 86400.25
    assert all(p.cpu_pct is None for p in procs.values())  # first sighting: not known yet

    box.write("proc/uptime", "86410.25 170000.50\n")  # 10 s later
    rewrite_stat(box, 830, utime=12 + 4 * TCK, stime=3 + TCK)  # 5 s of CPU in 10 s
    rewrite_stat(box, 921, utime=12 + 10_000 * TCK)  # more than every core could give
    rewrite_stat(box, 930, utime=0, stime=0)  # its CPU time went back: not the same process
    rewrite_stat(box, 922, start=7_300_000, utime=12 + 2 * TCK)  # pid reused by a new process
    history.record(snapshot(box), 10.0)
    procs = {p.pid: p for p in history.snapshots[-1].processes}
    assert procs[830].cpu_pct == pytest.approx(50.0)
    assert procs[820].cpu_pct == 0.0  # listed twice, no CPU used in between
    assert procs[921].cpu_pct == 100.0 * (os.cpu_count() or 1)  # at most 100 per core
    assert procs[930].cpu_pct is None and procs[922].cpu_pct is None

    # only this poll's processes are compared with the next: a pid gone and back is new
    box.write("proc/uptime", "86420.25 170000.50\n")
    rewrite_stat(box, 922, start=7_400_000)
    history.record(snapshot(box), 20.0)
    procs = {p.pid: p for p in history.snapshots[-1].processes}
    assert procs[922].cpu_pct is None and procs[930].cpu_pct == 0.0
    assert procs[830].cpu_pct == 0.0


def test_cpu_pct_is_not_carried_over_a_reboot_or_a_clock_that_went_back(box: Box):
    from gpuwatch.remote.model.history import HostHistory

    history = HostHistory("gpu1")
    history.record(snapshot(box), 0.0)
    box.write("proc/uptime", "86400.00 170000.50\n")  # a quarter of a second back
    rewrite_stat(box, 830, utime=500)
    history.record(snapshot(box), 10.0)
    assert all(p.cpu_pct is None for p in history.snapshots[-1].processes)
    box.write("proc/uptime", "86410.00 170000.50\n")
    box.write("proc/sys/kernel/random/boot_id", "another-boot\n")  # same pids, same starts
    rewrite_stat(box, 830, utime=600)
    history.record(snapshot(box), 20.0)
    assert all(p.cpu_pct is None for p in history.snapshots[-1].processes)


def test_cpu_pct_of_two_cpu_times_and_a_span():
    from gpuwatch.remote.model.processes import MIN_CPU_SPAN_S, cpu_pct

    assert cpu_pct(None, 5.0, 10.0) is None and cpu_pct(1.0, None, 10.0) is None
    assert cpu_pct(1.0, 2.0, None) is None
    assert cpu_pct(1.0, 6.0, 10.0) == 50.0 and cpu_pct(1.0, 1.0, 10.0) == 0.0
    assert cpu_pct(1.0, 41.0, 10.0) == 400.0 and cpu_pct(1.0, 41.0, 10.0, cap=200.0) == 200.0
    assert cpu_pct(2.0, 1.0, 10.0) is None  # back: another process's figure, not garbage
    assert cpu_pct(1.0, 1.01, MIN_CPU_SPAN_S / 2) is None  # too short to say
    assert cpu_pct(1.0, 2.0, 0.0) is None and cpu_pct(1.0, 2.0, -3.0) is None
    assert cpu_pct(0.0, 2.0**53, 1.0) == 100.0 * 2.0**53  # big, but a number
    assert cpu_pct(0.0, 2.0, float("nan")) is None


@pytest.mark.parametrize("bad", ["12", -1, -0.5, 2**64, 1e300 * 1e10, float("nan"), True,
                                 [1], {"a": 1}])
def test_a_hostile_cpu_figure_is_no_figure_and_the_rest_is_read(box: Box, bad: object):
    """The CPU ticks of a row, the table's uptime and the clock ticks per second are figures
    nothing else hangs on: a bad one is None, never the host's probe error."""
    from gpuwatch.remote.model.history import HostHistory

    doc = json.loads(zlib.decompress(probe_output(box, compress=True)))
    at = doc["processes"]["procs"]["fields"].index("cpu_ticks")
    history = HostHistory("gpu1")
    history.record(parse_probe_output(json.dumps(doc).encode(), "gpu1"), 0.0)
    later = copy.deepcopy(doc)
    later["processes"]["uptime_s"] += 10
    for row in later["processes"]["procs"]["rows"]:
        row[at] += 100
    later["processes"]["procs"]["rows"][0][at] = bad
    snap = parse_probe_output(json.dumps(later).encode(), "gpu1")
    assert snap.processes[0].cpu_s is None and snap.processes[1].cpu_s is not None
    history.record(snap, 10.0)
    procs = history.snapshots[-1].processes
    assert procs[0].cpu_pct is None and procs[1].cpu_pct == pytest.approx(100 / TCK * 10)
    for where in ("uptime", "clk_tck"):
        worse = copy.deepcopy(later)
        if where == "uptime":
            worse["processes"]["uptime_s"] = bad
        elif not isinstance(bad, int) or isinstance(bad, bool) or bad >= 2**63:
            continue  # any other clk_tck is the host section's error, as it always was
        else:
            worse["host"]["clk_tck"] = bad
        snap = parse_probe_output(json.dumps(worse).encode(), "gpu1")
        fresh = HostHistory("gpu1")
        fresh.record(parse_probe_output(json.dumps(doc).encode(), "gpu1"), 0.0)
        fresh.record(snap, 10.0)
        assert all(p.cpu_pct is None for p in fresh.snapshots[-1].processes), where
