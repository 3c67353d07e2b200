"""The probe, run as the SSH path runs it: `sh -c <command>` with the bundle on stdin.

Boxes are fixture /proc, /sys and /etc trees in the real file formats (tests/harness/README.md),
with minimal stand-ins for `nvidia-smi` and `dmesg` on PATH; the box simulator (remote/sim)
will provide richer ones. Parsers are also checked against real captures in tests/data/captures.
"""

from __future__ import annotations

import ast
import calendar
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from gpuwatch.remote.box import names as probe
from gpuwatch.remote.wire.bundle import (
    KERNEL,
    MODULES,
    NVML,
    POPEN,
    PYTHON_MISSING_EXIT,
    build_command,
    build_stdin,
    modules_for,
    strip_source,
)
from harness import smi_capture
from harness.captures import capture
from harness.probe_box import (
    BOOT_ID,
    BTIME,
    TTY_PTS0,
    UUIDS,
    Box,
    box_request,
    build_box,
    probe_doc,
    python36,
    rows,
    run_probe,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SMI = "nvidia-smi/exporter-captures/linux-x86_64__"
H100, H100_MIG = SMI + "nvidia-h100-80gb-hbm3__590.48.01", SMI + "nvidia-h100-mig__590.48.01"
RTX_2080, WIN_2080 = SMI + "nvidia-geforce-rtx-2080-super__595.71.05", \
    SMI.replace("linux", "windows") + "nvidia-geforce-rtx-2080-super__610.62"


def captures() -> Path:
    return capture()


# ---------------------------------------------------------------- fixture boxes

def old_driver_smi(box: Box) -> None:
    """A pre-rename driver: it rejects clocks_event_reasons.* as real old drivers do."""
    box.tool("nvidia-smi", f'echo "$1" >> "{box.root}/smi.calls"\n'
                           f'case "$1" in\n'
                           f'  *clocks_event_reasons*) echo \'Field "clocks_event_reasons.active" '
                           f'is not a valid field to query.\'; exit 2 ;;\n'
                           f'  --query-gpu=*) cat "{box.root}/gpus.csv" ;;\n'
                           f'  --query-compute-apps=*) cat "{box.root}/apps.csv" ;;\n'
                           f'esac\n')


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return build_box(tmp_path / "box")


# ---------------------------------------------------------------- this machine

def test_real_machine_without_gpu():
    env = {"PATH": "/usr/bin:/bin"}  # no nvidia-smi here; the real /proc, /sys, dmesg
    started = time.monotonic()
    doc = probe_doc({"v": 1, "disks": ["/"]}, env)
    assert time.monotonic() - started < 10
    assert doc["v"] == 1 and doc["probe_s"] < 5
    gpus = doc["gpus"]
    assert gpus["error"] == "nvidia-smi not found on PATH" and gpus["missing"] is True
    assert gpus["devices"] is False  # no /dev/nvidia* either: a box without an NVIDIA GPU
    assert doc["errors"]["gpus"] == "nvidia-smi not found on PATH"
    assert set(doc["errors"]) <= {"gpus", "kernel", "cgroup"}  # dmesg/cgroup may be closed to us
    host = doc["host"]
    assert host["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host["clk_tck"] == os.sysconf("SC_CLK_TCK") and host["btime"] > 1e9
    assert host["uptime_s"] > 0 and len(host["loadavg"]) == 3
    disk = doc["disks"][0]
    assert disk["mount"] == "/" and 0 < disk["bytes_free"] <= disk["bytes_total"]
    assert doc["processes"]["total"] > 1
    if "cgroup" not in doc["errors"]:
        assert doc["cgroup"]["version"] in (1, 2)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process from /proc, read here without the probe's parser."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_busy_process_shows_its_cpu_and_a_sleeping_one_none_through_the_real_probe():
    """Two real processes, one spinning and one asleep, polled twice through the real probe
    on this machine's /proc: the first poll knows their CPU time but no CPU% yet; the second
    shows the spinning one busy and the sleeping one near 0."""
    from gpuwatch.remote.model.history import HostHistory
    from gpuwatch.remote.wire.document import parse_probe_output

    mark = f"gpuwatch-cpu-{os.getpid()}"
    code = "import time\nprint('ready', flush=True)\n{}"
    children = {
        "busy": subprocess.Popen([sys.executable, "-c", code.format("while True: pass"),
                                  mark + "-busy"], stdout=subprocess.PIPE),
        "sleepy": subprocess.Popen([sys.executable, "-c", code.format("time.sleep(120)"),
                                    mark + "-sleepy"], stdout=subprocess.PIPE)}
    try:
        for child in children.values():  # started and past their imports
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        request = {"v": 1, "disks": [], "want": {"gpus": False},
                   "runs": [{"name": name, "process": f"{mark}-{name}"} for name in children]}
        env = {"PATH": "/usr/bin:/bin"}
        history = HostHistory("here")
        first = parse_probe_output(run_probe(request, env).stdout, "here")
        history.record(first, 0.0)
        pids = {name: child.pid for name, child in children.items()}
        busy_then = proc_cpu_s(pids["busy"])
        # The busy one spins until it has used a second of CPU since the first poll (however
        # slowly a loaded machine lets it): the span is the CPU it got, not a time waited for.
        while proc_cpu_s(pids["busy"]) < busy_then + 1.0:
            time.sleep(0.1)
        second = parse_probe_output(run_probe(request, env).stdout, "here")
        history.record(second, 1.0)
        shown = {p.pid: p for p in history.snapshots[-1].processes}
        before = {p.pid: p for p in first.processes}
        for name, pid in pids.items():
            assert before[pid].run == name and before[pid].cpu_pct is None  # first sighting
            assert before[pid].cpu_s is not None and shown[pid].cpu_s is not None
            assert shown[pid].cpu_s >= before[pid].cpu_s
        assert first.processes_uptime_s is not None and second.processes_uptime_s is not None
        span = second.processes_uptime_s - first.processes_uptime_s
        busy, sleepy = shown[pids["busy"]].cpu_pct, shown[pids["sleepy"]].cpu_pct
        assert busy is not None and sleepy is not None
        # what the box's own counters say, worked out here: the figure is that, not a guess
        busy_s = (before[pids["busy"]].cpu_s or 0.0, shown[pids["busy"]].cpu_s or 0.0)
        assert busy_s[0] <= busy_then and busy_s[1] - busy_then >= 1.0
        assert busy == pytest.approx(100 * (busy_s[1] - busy_s[0]) / span)
        assert busy >= 15 and sleepy <= 2, (busy, sleepy, span)
    finally:
        for child in children.values():
            child.kill()
            child.wait()


def test_missing_interpreter_is_exit_127():
    result = run_probe({"v": 1}, {"PATH": "/usr/bin:/bin"}, python="no-such-python3")
    assert result.returncode == PYTHON_MISSING_EXIT and result.stdout == b""


def test_interpreter_name_is_shell_quoted(tmp_path: Path):
    odd = tmp_path / "my python; touch pwned"
    odd.symlink_to(sys.executable)
    doc = probe_doc({"v": 1, "want": {"gpus": False, "kernel": False}},
                    {"PATH": "/usr/bin:/bin"}, python=str(odd))
    assert doc["v"] == 1 and not (Path.cwd() / "pwned").exists()


def test_modules_in_the_login_folder_are_never_imported(tmp_path: Path):
    """`python -c` puts the working folder (an SSH exec's: the login's home) first on sys.path;
    a json.py or zlib.py lying there must not be imported, that is run, by the probe."""
    marker = tmp_path / "ran"
    for name in ("json", "zlib", "os", "re"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                            input=build_stdin({"v": 1, "want": {"gpus": False, "kernel": False}}),
                            env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["v"] == 1
    assert not marker.exists(), marker.read_text()


def test_bad_request_still_yields_a_document():
    stdin = build_stdin({})[:-2] + b"{not json"
    result = subprocess.run(["sh", "-c", build_command(sys.executable)], input=stdin,
                            env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=30)
    doc = json.loads(result.stdout)
    assert doc["errors"]["request"].startswith("request is not JSON") and "host" in doc


def test_runs_under_python_36(box: Box):
    doc = probe_doc(box_request(box), box.env(), python=python36())
    assert doc["errors"] == {} and doc["host"]["python"].startswith("3.6.")
    assert len(doc["gpus"]["devices"]["rows"]) == 8


# ---------------------------------------------------------------- a fixture box

def test_fixture_box_document(box: Box):
    doc = probe_doc(box_request(box, future_key={"ignored": True}), box.env())
    assert doc["errors"] == {}
    assert doc["host"] == {**doc["host"], "hostname": "gpu-box-7", "boot_id": BOOT_ID,
                           "uptime_s": 86400.25, "loadavg": [3.1, 2.95, 2.8], "btime": BTIME}

    gpus = {g["index"]: g for g in rows(doc["gpus"]["devices"])}
    # lacks no field; GPU 2 has MIG on (this poll has every module: its instances are read)
    assert doc["gpus"]["source"] == "nvidia-smi" and doc["gpus"]["hints"] == {"mig": "1"}
    assert [(m["gpu"], m["gi"], m["profile"]) for m in rows(doc["gpus"]["mig"])] == [
        (2, 2, "3g.40gb"), (2, 3, "2g.20gb"), (2, 9, "1g.10gb"), (2, 10, "1g.10gb")]
    assert next(a for a in rows(doc["gpus"]["apps"]) if a["pid"] == 922)["gi"] == 2
    assert sorted(gpus) == list(range(8))
    assert gpus[0] == {"index": 0, "uuid": UUIDS[0], "name": "NVIDIA H100 80GB HBM3",
                       "util_pct": 100, "mem_used_mib": 70211, "mem_total_mib": 81559,
                       "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "power_w": 652.31,
                       "power_limit_w": 700.0, "temp_c": 61, "throttle_reasons": [],
                       "mig": False, "pci_bus_id": "00000000:1B:00.0", "persistence": True,
                       "ecc_corr_vol": 0, "ecc_unc_vol": 0, "ecc_corr_agg": 0, "ecc_unc_agg": 0,
                       "remap_corr": 0, "remap_unc": 0, "remap_pending": False,
                       "remap_failed": False, "remap_hist": [0, 0, 0, 0, 640],
                       "recovery": "None", "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16,
                       "pcie_width_max": 16}
    # retired pages are N/A on an H100 (it remaps rows): not sent at all, nor NVML's replays
    assert "retired_sbe" not in doc["gpus"]["devices"]["fields"]
    assert gpus[4]["persistence"] is False and gpus[7]["persistence"] is None
    assert gpus[1]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpus[2]["util_pct"] is None and gpus[2]["mig"] is True
    assert gpus[3]["power_w"] is None and gpus[3]["power_limit_w"] is None
    assert gpus[4]["throttle_reasons"] == ["gpu_idle"]
    assert gpus[5]["temp_c"] is None
    assert gpus[7]["util_pct"] is None and gpus[7]["throttle_reasons"] is None
    assert gpus[7]["mig"] is None
    apps = rows(doc["gpus"]["apps"])
    evil_app = {"uuid": UUIDS[3], "pid": 1100, "gpu_mem_mib": 1200, "process_name": "evil, name",
                "gi": None, "ci": None}  # not on a MIG GPU: no instance
    assert evil_app in apps

    procs = {p["pid"]: p for p in rows(doc["processes"]["procs"])}
    run = procs[830]
    assert run["run"] == "llama" and run["nvidia_devs"] == [0] and run["tty_nr"] == TTY_PTS0
    assert run["sighup_ignored"] is False and run["start_ticks"] == 7_200_000
    assert run["cmd"] == "python3.10 train.py --config cfg/llama.yaml" and run["threads"] == 42
    assert run["cwd"] == "/data/llama"
    assert run["cgroup"] == "/user.slice/user-1000.slice/session-3.scope"
    assert {820, 810, 800, 1}.issubset(procs)  # the parent chain: SIGHUP risk (seed 000)
    assert {900, 910, 920}.issubset(procs) and procs[920]["run"] == "pretrain"
    assert all(procs[920 + r]["nvidia_devs"] == [r] for r in range(1, 8))
    assert procs[930]["nvidia_devs"] == [] and procs[930]["run"] == "pretrain"
    zombie = procs[1000]
    assert zombie["state"] == "Z" and zombie["cmd"] == "[pt_data_worker]"
    assert zombie["cwd"] is None
    evil = procs[1100]
    assert evil["comm"] == "evil ) (name x" and evil["ppid"] == 1 and evil["nvidia_devs"] == [3]
    assert evil["sighup_ignored"] is True
    assert 4242 not in procs and 2000 not in procs and 2 not in procs
    counts = doc["processes"]
    assert counts["total"] == 81 and counts["kernel_threads"] == 2 and counts["zombies"] == 1
    assert counts["not_listed"] == 79 - len(procs) and counts["fd_skipped"] == [1300]

    assert doc["disks"][0]["path"] == str(box.root)
    assert doc["disks"][0]["mount"] == str(box.root.parent)
    assert doc["disks"][1] == {"path": "/no/such/disk",
                               "error": "No such file or directory: /no/such/disk"}
    assert doc["cgroup"] == {
        "version": 2, "path": "/user.slice/user-1000.slice/session-3.scope",
        "memory_current_bytes": 57982439424, "memory_max_bytes": None,
        "memory_events": {"low": 0, "high": 0, "max": 14, "oom": 2, "oom_kill": 1,
                          "oom_group_kill": 0},
        "cpu_quota_us": 400000, "cpu_period_us": 100000,
        "cpu_stat": {"usage_usec": 982341, "user_usec": 900000, "system_usec": 82341,
                     "nr_periods": 2914, "nr_throttled": 222, "throttled_usec": 2261444},
        "groups": {"fields": ["path", "oom_kill", "memory_max_bytes"], "rows": []}}
    assert doc["logind"] == {"kill_user_processes": False,
                             "source": str(box.etc / "systemd/logind.conf.d/50-keep.conf")}
    xids, ooms = rows(doc["kernel"]["xid"]), rows(doc["kernel"]["oom"])
    assert [(x["xid"], x["pid"], x["pci"]) for x in xids] == [(79, None, "0000:3b:00"),
                                                              (13, 921, "0000:9b:00")]
    assert xids[0]["t_mono_s"] == 4521.118263 and xids[0]["msg"] == "GPU has fallen off the bus."
    assert ooms == [{"t_mono_s": 5012.55453, "t_epoch": None, "pid": 930,
                     "name": "pt_data_worker", "memcg": True, "cgroup": "/user.slice",
                     "limit_bytes": 16 << 30}]
    assert doc["kernel"]["xid_counts"] == {"79": 1, "13": 1}


def test_compressed_output_is_the_same_document(box: Box):
    plain = run_probe(box_request(box), box.env()).stdout
    packed = run_probe(box_request(box, compress=True), box.env()).stdout
    unpacked = json.loads(zlib.decompress(packed))
    assert unpacked.keys() == json.loads(plain).keys() and len(packed) * 3 < len(plain)


def steady_request(request: dict, env: dict[str, str]) -> dict:
    """The request of the polls after the first, as the client makes it: the runs discovery
    found go back as remembered runs, and what it found for the probe to reuse
    instead of the discover module."""
    from gpuwatch.remote.config.schema import HostConfig, RunConfig
    from gpuwatch.remote.model.discovered import discovered_requests
    from gpuwatch.remote.model.history import HostHistory
    from gpuwatch.remote.wire.document import parse_probe_output

    snapshot = parse_probe_output(run_probe(request, env).stdout, "box")
    assert snapshot.discovery_reuse is not None
    history = HostHistory("box")
    history.record(snapshot, 0.0)
    host = HostConfig("box", "local", runs=tuple(RunConfig(r["name"], process=r["process"])
                                                 for r in request["runs"]))
    return {**request, "discovered_runs": discovered_requests(host, history.runs),
            "discovery_reuse": dict(snapshot.discovery_reuse)}


def test_steady_8_gpu_box_fits_the_8k_budget(box: Box):
    """An 8-GPU box in steady state fits 8 KB received even uncompressed; with dataloader
    workers under every rank (48 processes listed in full) it needs the compression the
    client asks for."""
    steady = steady_request(box_request(box), box.env())
    doc = run_probe(steady, box.env()).stdout
    # 8.1 KB uncompressed since the kernel rows name their cgroup and its limit, 8.6 KB since
    # the GPUs' health fields, 9.2 KB since GPU 2's four MIG instances (0.4 KB) and each app's
    # instance; what goes over the wire is compressed (the client asks for it), checked below
    assert len(doc) <= 9.5 * 1024 and json.loads(doc)["discovered"][0]["name"] == "evil-name-x"
    for rank in range(1, 8):
        for worker in range(6):
            box.process(3000 + 10 * rank + worker, "pt_data_worker", 920 + rank, uid=1000,
                        cmd=["/usr/bin/python3.10", "-u", "pretrain.py", "--resume"])
    packed = run_probe({**steady, "compress": True}, box.env()).stdout
    assert len(json.loads(zlib.decompress(packed))["processes"]["procs"]["rows"]) == 48
    assert len(packed) <= 8 * 1024
    # upstream: the first poll carries the probe, the event decoder and discovery;
    # the next ones the probe with its run files part only (no run reads events);
    # the probe's deadline took 0.8 KB of each; saying why the GPUs could not be
    # read and their persistence mode (16) 0.45 KB; the metrics readers (sent where
    # discovery may find metrics) learnt Keras' CSV, nested JSONL, a glob's every file in
    # order, over-long lines and the frameworks' end of training 1.2 KB of the
    # first; run identity by argv, cwd and descendants, and the runs' own cgroups 0.9 KB of
    # each; each listed process's CPU time and when the table was read 60 B of each (19.5 KB
    # here); the GPUs' memory health and PCIe fields, read by name with the fields a driver
    # lacks left out, 0.8 KB of each (20.2 KB here); then the capture formats only tests read
    # (headers, per-reason columns) went to tests/harness/smi_capture.py and each box gets one
    # GPU reader, nvidia-smi's or NVML's (bundle.SMI): 19.5 KB here, with the kernel log's
    # parser this box's Xid lines call for; an exit record read only as the launch wrapper
    # leaves it 0.2 KB more (20.2 KB), the spaces Python needs not dropped 0.4 KB (19.8 KB
    # here). The steady bound is DESIGN §6's figure: <= 20 KB up on a steady poll, NVML
    # reader included.
    first, then = (len(build_stdin(r, trim=True)) for r in (box_request(box), steady))
    assert first < 33 * 1024 and then <= 20_000
    nvml = {**{k: v for k, v in steady.items() if k != "want"}, "pynvml": True,
            "gpu_source": "nvml", "spawn": True, "cgroup": 2}
    assert NVML in modules_for(nvml) and "gpuwatch_gpus_nvidia_smi" not in modules_for(nvml)
    assert len(build_stdin(nvml, trim=True)) + len(build_command("python3")) <= 20_000


def test_cgroup_path_absent_falls_back_to_root(box: Box):
    box.write("proc/self/cgroup", "0::/docker/4f2a\n")  # the host's view, seen from a container
    box.write("sys/fs/cgroup/memory.max", "8589934592\n")
    box.write("sys/fs/cgroup/cpu.max", "max 100000\n")
    doc = probe_doc(box_request(box, want={"gpus": False}), box.env())
    assert doc["cgroup"]["memory_max_bytes"] == 8589934592
    assert doc["cgroup"]["cpu_quota_us"] is None
    assert doc["cgroup"]["memory_events"] == {} and "gpus" not in doc


def test_cgroup_v1_hierarchy(box: Box):
    box.write("proc/self/cgroup", "4:memory:/job/7\n3:cpu,cpuacct:/job/7\n0::/\n")
    memory, cpu = "sys/fs/cgroup/memory/job/7", "sys/fs/cgroup/cpu/job/7"
    box.write(f"{memory}/memory.limit_in_bytes", "17179869184\n")
    box.write(f"{memory}/memory.usage_in_bytes", "6852075520\n")
    box.write(f"{memory}/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    box.write(f"{cpu}/cpu.cfs_quota_us", "250000\n")
    box.write(f"{cpu}/cpu.cfs_period_us", "100000\n")
    box.write(f"{cpu}/cpu.stat",
              "nr_periods 13498\nnr_throttled 12651\nthrottled_time 6807531343393\n")
    cgroup = probe_doc(box_request(box, want={"gpus": False}), box.env())["cgroup"]
    assert cgroup == {"version": 1, "path": "/job/7", "memory_current_bytes": 6852075520,
                      "memory_max_bytes": 17179869184, "memory_events": {"oom_kill": 3},
                      "cpu_quota_us": 250000, "cpu_period_us": 100000,
                      "cpu_stat": {"nr_periods": 13498, "nr_throttled": 12651,
                                   "throttled_usec": 6807531343},
                      "groups": {"fields": ["path", "oom_kill", "memory_max_bytes"], "rows": []}}


DOCKER = "/system.slice/docker-4f2a9c.scope"
SLURM = "/system.slice/slurmstepd.scope/job_77/step_0"


def group_files(box: Box, path: str, oom_kill: int, memory_max: str) -> None:
    base = "sys/fs/cgroup" + path
    box.write(f"{base}/memory.events",
              f"low 0\nhigh 0\nmax 9\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n")
    box.write(f"{base}/memory.max", memory_max + "\n")


def test_the_runs_own_cgroups_are_read_not_only_the_probes(box: Box):
    """U41: a run in a Docker container (830) and a torchrun's ranks in a Slurm step are
    OOM-killed in their own cgroups; an idle process's cgroup is not read, nor one
    this box does not show (another cgroup namespace)."""
    box.write("proc/830/cgroup", f"0::{DOCKER}\n")
    for rank in range(1, 8):
        box.write(f"proc/{920 + rank}/cgroup", f"0::{SLURM}\n")
    box.write("proc/1100/cgroup", "0::/system.slice/docker-gone.scope\n")  # holds nvidia3
    box.write("proc/2000/cgroup", "0::/system.slice/cron.service\n")
    group_files(box, DOCKER, 2, "34359738368")
    group_files(box, SLURM, 0, "max")
    group_files(box, "/system.slice/cron.service", 5, "max")
    groups = rows(probe_doc(box_request(box, want={"gpus": False}), box.env())["cgroup"]["groups"])
    assert sorted(groups, key=lambda g: g["path"]) == [
        {"path": DOCKER, "oom_kill": 2, "memory_max_bytes": 34359738368},
        {"path": SLURM, "oom_kill": 0, "memory_max_bytes": None}]


def test_the_cgroups_the_request_names_are_read_though_nothing_lives_there(box: Box):
    """A run that died since the last poll has no process left to name its cgroup: the request
    names it (the client's run_cgroups), and its counter says whether it was OOM-killed."""
    group_files(box, DOCKER, 1, "34359738368")
    request = box_request(box, want={"gpus": False}, run_cgroups=[DOCKER, 7, "rel/ative"])
    groups = rows(probe_doc(request, box.env())["cgroup"]["groups"])
    assert groups == [{"path": DOCKER, "oom_kill": 1, "memory_max_bytes": 34359738368}]


def test_the_runs_cgroups_on_cgroup_v1(box: Box):
    box.write("proc/self/cgroup", "4:memory:/job/7\n3:cpu,cpuacct:/job/7\n0::/\n")
    box.write("proc/830/cgroup", "4:memory:/slurm/uid_1000/job_8\n3:cpu,cpuacct:/x\n0::/\n")
    memory = "sys/fs/cgroup/memory/slurm/uid_1000/job_8"
    box.write(f"{memory}/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    box.write(f"{memory}/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    groups = rows(probe_doc(box_request(box, want={"gpus": False}), box.env())["cgroup"]["groups"])
    assert groups == [{"path": "/slurm/uid_1000/job_8", "oom_kill": 4, "memory_max_bytes": None}]


def test_the_runs_cgroups_read_are_bounded(box: Box):
    """A box where every GPU holder sits in its own container: only the first few are read."""
    for rank in range(1, 8):
        path = f"/kubepods.slice/pod{rank}.slice"
        box.write(f"proc/{920 + rank}/cgroup", f"0::{path}\n")
        group_files(box, path, rank, "max")
    box.write("proc/830/cgroup", f"0::{DOCKER}\n")
    group_files(box, DOCKER, 0, "max")
    box.write("proc/1100/cgroup", "0::/kubepods.slice/pod-other.slice\n")
    group_files(box, "/kubepods.slice/pod-other.slice", 0, "max")
    groups = rows(probe_doc(box_request(box, want={"gpus": False}), box.env())["cgroup"]["groups"])
    assert len(groups) == probe.RUN_CGROUPS == 8  # of 9 cgroups, each of runs' processes
    assert {g["path"] for g in groups} < {DOCKER, "/kubepods.slice/pod-other.slice"} | {
        f"/kubepods.slice/pod{rank}.slice" for rank in range(1, 8)}


# ---------------------------------------------------------------- nvidia-smi behaviours

def test_old_driver_falls_back_to_throttle_reason_names(box: Box):
    old_driver_smi(box)
    doc = probe_doc(box_request(box), box.env())
    assert doc["errors"] == {}
    # GPU 2 has MIG on: its hint beside the lesson (and one call more, for the MIG table)
    assert doc["gpus"]["hints"] == {"lacks": "clocks_event_reasons.active", "mig": "1"}
    assert rows(doc["gpus"]["devices"])[1]["throttle_reasons"] == ["sw_power_cap",
                                                                   "hw_thermal_slowdown"]
    calls = [c for c in (box.root / "smi.calls").read_text().splitlines() if c]
    assert [c.split("=")[0] for c in calls] == ["--query-gpu", "--query-gpu",
                                                "--query-compute-apps"]
    assert "clocks_event_reasons.active" in calls[0]
    assert "clocks_throttle_reasons.active" in calls[1]


def test_reason_hint_from_last_poll_saves_the_failing_call(box: Box):
    old_driver_smi(box)
    probe_doc(box_request(box, gpu_hints={"lacks": "clocks_event_reasons.active"}), box.env())
    calls = [c for c in (box.root / "smi.calls").read_text().splitlines() if c]  # not MIG's
    assert len(calls) == 2 and "clocks_throttle_reasons.active" in calls[0]


def test_hung_nvidia_smi_is_killed_and_the_rest_stands(box: Box):
    box.tool("nvidia-smi", f'echo $$ > "{box.root}/smi.pid"\nexec sleep 60\n')
    started = time.monotonic()
    doc = probe_doc(box_request(box, nvidia_smi_timeout_s=1), box.env())
    assert time.monotonic() - started < 5
    gpus = doc["gpus"]
    assert gpus["error"] == "nvidia-smi timed out after 1.0s and was killed"
    assert gpus["timeout"] is True and 0.9 < gpus["query_s"] < 5  # said as a timeout, loudly
    assert set(doc["errors"]) == {"gpus"}
    assert doc["host"]["boot_id"] == BOOT_ID and rows(doc["processes"]["procs"])
    with pytest.raises(ProcessLookupError):
        os.kill(int((box.root / "smi.pid").read_text()), 0)


def test_a_child_that_closes_its_output_and_lingers_is_killed_at_the_deadline(box: Box):
    """run_bounded waits for the exit, not only for the end of the output (the probe spawns
    without subprocess): a dmesg that shuts its stdout and stderr and sleeps on must
    not hold the poll past its timeout."""
    box.tool("dmesg", f'echo $$ > "{box.root}/dmesg.pid"\nexec >/dev/null 2>&1\nexec sleep 60\n')
    started = time.monotonic()
    doc = probe_doc(box_request(box, limits={"dmesg_timeout_s": 1}), box.env())
    assert time.monotonic() - started < 5
    assert doc["kernel"] == {"error": "dmesg timed out after 1.0s and was killed",
                             "timeout": True}
    assert doc["errors"] == {"kernel": doc["kernel"]["error"]}
    with pytest.raises(ProcessLookupError):
        os.kill(int((box.root / "dmesg.pid").read_text()), 0)


def test_a_child_that_floods_both_streams_is_read_to_the_end(box: Box):
    """stdout and stderr are read together: 1 MiB on each, more than a pipe holds, neither
    blocks the child, and every line of stdout reaches the parser (its last Xid is found)."""
    xid = "[ 9999.000001] NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen"
    box.tool("dmesg", "i=0; while [ $i -lt 16 ]; do head -c 65536 /dev/zero | tr '\\0' e >&2; "
                      "head -c 65536 /dev/zero | tr '\\0' o | fold -w 128; i=$((i+1)); done\n"
                      f"echo '{xid} off the bus'\n")
    doc = probe_doc(box_request(box), box.env())
    assert doc["errors"] == {}, doc["errors"]
    assert rows(doc["kernel"]["xid"])[-1]["xid"] == 79


def test_a_python_without_posix_spawnp_gets_the_subprocess_part(box: Box, tmp_path: Path):
    """Python 3.6, 3.7 and PyPy have no os.posix_spawnp: the probe runs nvidia-smi and dmesg
    through subprocess there, a part sent only where the box did not say it has posix_spawnp
   . One that lacks both says what is missing, and that it has none, so the next
    poll sends the part. This python stands in for one without it (the function deleted
    before the bootstrap runs)."""
    python = tmp_path / "python-without-spawn"
    python.write_text(
        "#!/bin/sh\n"  # called as: python -S -c BOOTSTRAP
        f'exec {sys.executable} "$1" -c "import os;del os.posix_spawnp;'
        'import sys;exec(sys.argv[1])" "$3"\n')
    python.chmod(0o755)

    def poll(request: dict) -> dict:
        result = subprocess.run(["sh", "-c", build_command(str(python))],
                                input=build_stdin(request, trim=True), env=box.env(),
                                capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)

    told = box_request(box, spawn=True)  # what a box with posix_spawnp said
    assert POPEN not in modules_for(told) and POPEN in modules_for(box_request(box))
    lacking = poll(told)
    assert lacking["gpus"]["error"] == ("nvidia-smi not run: this python has no "
                                        "os.posix_spawnp; the next poll brings what it needs")
    assert lacking["host"]["spawn"] is False and "processes" not in lacking["errors"]
    fixed = poll(box_request(box, spawn=lacking["host"]["spawn"]))
    assert fixed["errors"] == {} and len(fixed["gpus"]["devices"]["rows"]) == 8
    assert fixed["kernel"]["xid"]["rows"]  # dmesg, through subprocess too


def test_xid_lines_go_raw_without_the_parser_and_read_the_same(box: Box):
    """The parser of Xid and OOM lines goes only where the last poll saw some; a box
    that has some now without it sends the lines as they are, and the client parses them with
    the probe's own code: the same kernel events and counts as the box's parser gives."""
    from gpuwatch.remote.model.snapshot import HostSnapshot
    from gpuwatch.remote.wire.document import parse_probe_output

    assert KERNEL in modules_for(box_request(box))  # not known yet: sent
    assert KERNEL in modules_for(box_request(box, kernel_lines=3))
    quiet = box_request(box, kernel_lines=0, spawn=True)
    assert KERNEL not in modules_for(quiet)

    def snap(stdin: bytes) -> tuple[dict, HostSnapshot]:
        result = subprocess.run(["sh", "-c", build_command(sys.executable)], input=stdin,
                                env=box.env(), capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout), parse_probe_output(result.stdout, "box")

    raw_doc, raw = snap(build_stdin(quiet, trim=True))
    parsed_doc, parsed = snap(build_stdin(quiet))  # every part: the box parses
    assert raw_doc["kernel"]["raw"] and raw_doc["kernel"]["xid"]["rows"] == []
    assert raw_doc["kernel"]["candidates"] == parsed_doc["kernel"]["candidates"] > 0
    assert "raw" not in parsed_doc["kernel"] and parsed_doc["kernel"]["xid"]["rows"]
    assert raw.kernel_events == parsed.kernel_events and raw.kernel_events
    assert raw.xid_counts == parsed.xid_counts and raw.kernel_lines == parsed.kernel_lines
    box.tool("dmesg", "echo '[    0.045121] Memory: 2029476K/2096632K available'\n")
    clean_doc, clean = snap(build_stdin(quiet, trim=True))
    assert clean_doc["kernel"] == {"xid": {"fields": list(probe.XID_FIELDS), "rows": []},
                                   "oom": {"fields": list(probe.OOM_FIELDS), "rows": []},
                                   "xid_counts": {}, "candidates": 0}
    assert clean.kernel_lines == 0 and clean.kernel_events == ()


def test_an_xid_storm_sent_raw_is_reported_once(box: Box):
    """A box clean at the last poll logs more Xid lines than go raw (RAW_KERNEL_LINES): that
    poll's counts cover the newest lines only. The next poll has the parser and counts them
    all; the code already reported must not come again for its older lines, while a code
    that only the older lines held is reported then (late, but never before)."""
    from gpuwatch.remote.findings.gpu import gpu_xid
    from gpuwatch.remote.model.finding import Severity
    from gpuwatch.remote.model.history import HostHistory
    from gpuwatch.remote.wire.document import parse_probe_output

    storm = probe.RAW_KERNEL_LINES + 500
    history = HostHistory("box")

    def poll(request: dict, at: float) -> list:
        result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                                input=build_stdin(request, trim=True), env=box.env(),
                                capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr.decode()
        history.record(parse_probe_output(result.stdout, "box"), at)
        return list(gpu_xid(history))

    quiet = box_request(box, kernel_lines=0, spawn=True)  # no Xid at the last poll
    box.tool("dmesg", "echo '[    0.045121] Memory: 2029476K/2096632K available'\n")
    assert poll(quiet, 1000.0) == []
    box.tool("dmesg", "echo '[   12.000000] NVRM: Xid (PCI:0000:1b:00): 13, pid=4242, "
                      "name=python, Graphics Exception'\n"
                      f"i=0; while [ $i -lt {storm - 1} ]; do "
                      "printf '[ %d.000000] NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, "
                      "name=python, GPU has fallen off the bus.\\n' $((100 + i)); "
                      "i=$((i + 1)); done\n")
    first = poll(quiet, 1010.0)  # without the parser: the newest lines went raw
    snap = history.current
    assert snap is not None and snap.xid_counts_partial and snap.kernel_lines == storm
    assert dict(snap.xid_counts) == {79: probe.RAW_KERNEL_LINES}
    assert [(f.evidence["xids"], f.severity) for f in first] == [([79], Severity.CRITICAL)]
    told = box_request(box, kernel_lines=storm, spawn=True)  # the parser goes now
    second = poll(told, 1020.0)
    snap = history.current
    assert snap is not None and not snap.xid_counts_partial
    assert dict(snap.xid_counts) == {13: 1, 79: storm - 1}
    assert [f.evidence["xids"] for f in second] == [[13]]  # 79 not again
    assert poll(told, 1030.0) == []  # quiet from then on


def test_a_probe_started_with_sigchld_ignored_still_reads_its_commands(box: Box):
    """With SIGCHLD ignored (a disposition that survives exec: some daemons start their
    children so; dash resets it, other shells need not) the kernel reaps the probe's children
    itself; run_bounded takes the end of their output for their exit, as subprocess does,
    instead of failing. The interpreter is started directly here, past any shell."""
    import signal

    from gpuwatch.remote.wire.bundle import BOOTSTRAP

    result = subprocess.run([sys.executable, "-S", "-c", BOOTSTRAP],
                            input=build_stdin(box_request(box)), env=box.env(),
                            capture_output=True, timeout=30,
                            preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    doc = json.loads(result.stdout)
    assert doc["errors"] == {} and len(doc["gpus"]["devices"]["rows"]) == 8
    assert doc["kernel"]["xid"]["rows"]


def test_failing_nvidia_smi_reports_its_message(box: Box):
    box.tool("nvidia-smi", "echo 'No devices were found'; exit 6\n")
    doc = probe_doc(box_request(box), box.env())
    gpus = doc["gpus"]
    assert gpus["error"] == "nvidia-smi exited 6: No devices were found"
    assert gpus["exit"] == 6 and gpus["said"] == "No devices were found" and gpus["lost"] == []


def test_unreadable_dmesg_is_a_section_error(box: Box):
    box.tool("dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
                      "exit 1\n")
    doc = probe_doc(box_request(box), box.env())
    assert doc["kernel"] == {"error": "dmesg not readable: dmesg: read kernel buffer failed: "
                                      "Operation not permitted"}
    assert set(doc["errors"]) == {"kernel"}


FAKE_PYNVML = """\
# A stand-in for the NVML library on a 2-GPU box: the calls the probe makes, nothing more.
from types import SimpleNamespace as NS

NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, NVML_DEVICE_MIG_ENABLE = 1, 0, 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return b"GPU-nvml-%d" % h  # old pynvml returns bytes
def nvmlDeviceGetName(h): return "NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUtilizationRates(h): return NS(gpu=97, memory=40)
def nvmlDeviceGetMemoryInfo(h): return NS(used=70211 << 20, total=81559 << 20)
def nvmlDeviceGetClockInfo(h, clock): return 1410
def nvmlDeviceGetMaxClockInfo(h, clock): return 1980
def nvmlDeviceGetPowerUsage(h): return 699870  # mW
def nvmlDeviceGetEnforcedPowerLimit(h): return 700000
def nvmlDeviceGetTemperature(h, sensor): return 86
def nvmlDeviceGetCurrentClocksEventReasons(h): return 0x44
def nvmlDeviceGetComputeRunningProcesses(h): return [NS(pid=830 + h, usedGpuMemory=None)]
def nvmlSystemGetProcessName(pid): return b"python3.10"
def nvmlDeviceGetPciInfo(h): return NS(busId=b"00000000:%02X:00.0" % (0x1B + h))
def nvmlDeviceGetPersistenceMode(h): return 1 - h  # NVML_FEATURE_ENABLED on GPU 0 only


def nvmlDeviceGetMigMode(h):
    if h == 1:
        raise NVMLError_NotSupported()
    return (0, 0)

def nvmlDeviceGetCurrPcieLinkGeneration(h): return 5 - 3 * h  # GPU 1's link trained at gen 2
def nvmlDeviceGetMaxPcieLinkGeneration(h): return 5
def nvmlDeviceGetCurrPcieLinkWidth(h): return 16
def nvmlDeviceGetMaxPcieLinkWidth(h): return 16
def nvmlDeviceGetRowRemapperHistogram(h):
    return NS(max=640 - h, high=h, partial=0, low=0, none=0)


def nvmlDeviceGetFieldValues(h, ids):
    # GPU 1: a remap pending after an uncorrected error, and the driver asks for a reset;
    # the retired-page fields are not supported (an H100 remaps rows instead)
    # ECC totals 3-6 (single/double bit, volatile/aggregate): GPU 1, 2 uncorrected this boot
    values = {3: 0, 4: 2 * h, 5: 0, 6: 0, 94: 3 * h, 142: 0, 143: h, 144: h, 145: 0, 230: h}
    return [NS(nvmlReturn=0 if i in values else 3, valueType=3 if i != 230 else 1,
               value=NS(ullVal=values.get(i, 0), uiVal=values.get(i, 0))) for i in ids]
"""


def test_nvml_path_yields_the_nvidia_smi_shape(box: Box, tmp_path: Path):
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_PYNVML)
    doc = probe_doc(box_request(box, want={}), {**box.env(), "PYTHONPATH": str(tmp_path / "nvml")})
    assert doc["errors"] == {} and doc["gpus"]["source"] == "nvml"
    assert "retired_sbe" not in doc["gpus"]["devices"]["fields"]  # no GPU answered it
    gpu0, gpu1 = rows(doc["gpus"]["devices"])
    assert gpu0 == {"index": 0, "uuid": "GPU-nvml-0", "name": "NVIDIA H100 80GB HBM3",
                    "util_pct": 97, "mem_used_mib": 70211, "mem_total_mib": 81559,
                    "sm_clock_mhz": 1410, "sm_clock_max_mhz": 1980, "power_w": 699.87,
                    "power_limit_w": 700.0, "temp_c": 86,
                    "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"], "mig": False,
                    "pci_bus_id": "00000000:1B:00.0", "persistence": True,
                    "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
                    "ecc_corr_vol": 0, "ecc_unc_vol": 0, "ecc_corr_agg": 0, "ecc_unc_agg": 0,
                    "pcie_replays": 0, "remap_corr": 0, "remap_unc": 0, "remap_pending": 0,
                    "remap_failed": 0, "recovery": 0, "remap_hist": [640, 0, 0, 0, 0]}
    assert gpu1["mig"] is None  # NotSupported → the box did not say
    assert gpu1["persistence"] is False
    assert (gpu1["ecc_unc_vol"], gpu1["remap_unc"], gpu1["remap_pending"], gpu1["recovery"],
            gpu1["pcie_gen"], gpu1["pcie_replays"]) == (2, 1, 1, 1, 2, 3)
    # NVML's numbers (flags 0/1, nvmlGpuRecoveryAction_t) read by the client as the same
    # yes/no and names nvidia-smi's words give
    from gpuwatch.remote.wire.document import parse_probe_output

    snap = parse_probe_output(json.dumps(doc).encode(), "gpu1")
    remap = snap.gpus[1].remap
    assert remap is not None and (remap.pending, remap.failed) == (True, False)
    assert snap.gpus[1].recovery_action == "gpu_reset" and snap.gpus[0].recovery_action == "none"
    # no process's memory known (the stand-in says None): the column is not sent
    assert rows(doc["gpus"]["apps"])[1] == {"uuid": "GPU-nvml-1", "pid": 831,
                                            "process_name": "python3.10"}
    assert not (box.root / "smi.calls").exists()


def test_the_nvml_reader_goes_only_where_pynvml_imports(box: Box, tmp_path: Path):
    """Most boxes' system python3 has no pynvml, so the NVML reader (~650 B of every
    poll) goes only where the last poll said it imports; a box where it starts to import says
    so and is read through NVML from the next poll on."""
    def poll(request: dict, env: dict[str, str]) -> dict:
        result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                                input=build_stdin(request, trim=True), env=env,
                                capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)

    assert NVML in modules_for({"v": 1})  # a host's first poll: not known yet
    assert NVML not in modules_for({"v": 1, "pynvml": False})
    assert NVML not in modules_for({"v": 1, "want": {"nvml": False}})
    bare = {k: v for k, v in box.env().items() if k != "PYTHONPATH"}
    request = box_request(box, want={})
    (tmp_path / "none").mkdir()  # a box whose python has no pynvml (ours has nvidia-ml-py)
    (tmp_path / "none" / "pynvml.py").write_text("raise ImportError('no pynvml here')\n")
    without = poll({**request, "pynvml": False}, {**bare, "PYTHONPATH": str(tmp_path / "none")})
    assert without["gpus"]["source"] == "nvidia-smi" and without["gpus"]["pynvml"] is False
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**bare, "PYTHONPATH": str(tmp_path / "nvml")}
    now = poll({**request, "pynvml": False}, env)  # installed since the client last looked
    assert now["gpus"]["source"] == "nvidia-smi" and now["gpus"]["pynvml"] is True
    assert "next poll" in now["gpus"]["nvml"]
    from gpuwatch.remote.wire.document import parse_probe_output

    assert parse_probe_output(json.dumps(now).encode(), "box").pynvml is True
    after = poll({**request, "pynvml": True}, env)
    assert after["gpus"]["source"] == "nvml" and len(rows(after["gpus"]["devices"])) == 2


def test_pynvml_is_found_in_site_packages_though_the_probe_starts_without_them(box: Box):
    """`python3 -S`: site-packages are loaded only to look for pynvml, which this python has
    (nvidia-ml-py, a dependency) where a box would: the probe says it imports. When the client
    does not ask (it asks a box without pynvml every NVML_RECHECK_S), the probe says nothing."""
    import pynvml  # noqa: F401  (installed with gpuwatch: the probe must find it without help)

    bare = {k: v for k, v in box.env().items() if k != "GPUWATCH_SIM_DIR"}  # NVML is tried
    assert "-S -c" in build_command(sys.executable)
    asked = probe_doc(box_request(box, want={}), bare)
    assert asked["gpus"].get("pynvml") is True, asked["gpus"]
    not_asked = probe_doc(box_request(box, want={"nvml": False}), bare)
    assert "pynvml" not in not_asked.get("gpus", {}), not_asked["gpus"]


def test_a_box_read_through_nvml_gets_no_nvidia_smi_reader(box: Box, tmp_path: Path):
    """Each box gets one GPU reader: where the last poll read NVML, the nvidia-smi reader
    stays home (2.8 KB of every poll). Should NVML fail then, that failure is the poll's GPU
    error, in NVML's words, and the next poll (the client drops the hint) brings nvidia-smi's
    reader again."""
    from gpuwatch.remote.config.load import parse_config
    from gpuwatch.remote.wire.collect import Collector
    from gpuwatch.remote.wire.document import parse_probe_output

    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**{k: v for k, v in box.env().items() if k != "PYTHONPATH"},
           "PYTHONPATH": str(tmp_path / "nvml")}
    request = {**box_request(box, want={}), "pynvml": True, "gpu_source": "nvml"}
    assert "gpuwatch_gpus_nvidia_smi" not in modules_for(request)
    assert "gpuwatch_gpus_nvidia_smi" in modules_for({**request, "gpu_source": "nvidia-smi"})

    def poll(req: dict) -> dict:
        result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                                input=build_stdin(req, trim=True), env=env, capture_output=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)

    doc = poll(request)
    assert doc["gpus"]["source"] == "nvml" and len(rows(doc["gpus"]["devices"])) == 2
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_PYNVML.replace(
        "def nvmlInit():", "class NVMLError_DriverNotLoaded(NVMLError):\n"
        "    def __str__(self): return 'Driver Not Loaded'\n\n"
        "def nvmlInit():\n    raise NVMLError_DriverNotLoaded()\n\n"
        "def _was_nvmlInit():"))
    failed = poll(request)
    assert failed["gpus"]["error"].startswith("NVML failed (") and \
        "nvidia-smi's reader comes with the next poll" in failed["gpus"]["error"]
    host = parse_config('[hosts.box]\nssh = "box"\n').host("box")
    assert host is not None
    collector = Collector()
    collector._learn(host, 0.0, parse_probe_output(json.dumps(doc).encode(), "box"), None)
    assert collector._hints["box"]["gpu_source"] == "nvml"
    snap = parse_probe_output(json.dumps(failed).encode(), "box")
    assert snap.gpu_error is not None and snap.gpu_error.kind == "driver_not_loaded"
    collector._learn(host, 0.0, snap, None)
    assert "gpu_source" not in collector._hints["box"]  # nvidia-smi's reader goes again
    again = poll({**request, "gpu_source": None})
    assert again["gpus"]["source"] == "nvidia-smi" and "NVML" not in again.get("errors", {})


def test_nvml_is_skipped_when_the_client_says_so(box: Box, tmp_path: Path):
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**box.env(), "PYTHONPATH": str(tmp_path / "nvml")}
    assert probe_doc(box_request(box, want={"nvml": False}), env)["gpus"]["source"] == "nvidia-smi"


# ---------------------------------------------------------------- parsers on real captures

def query_gpu_csvs() -> list[Path]:
    root = captures() / "nvidia-smi"
    old = root / "exporter-samples-2021" / "sample-output.csv"
    return [*sorted(root.glob("exporter-captures/*/*__query-gpu.csv")), old]


def capture_gpus(rel: str | Path) -> list[dict]:
    return smi_capture.gpu_rows((captures() / rel).read_text(encoding="utf-8"))


def capture_apps(rel: str) -> list[dict]:
    return smi_capture.app_rows((captures() / rel).read_text())


def test_every_captured_query_gpu_csv_parses():
    paths = query_gpu_csvs()
    assert len(paths) == 21
    for path in paths:
        (gpu,) = capture_gpus(path)
        assert gpu["index"] == 0 and gpu["uuid"].startswith("GPU-"), path
        assert gpu["name"].startswith("NVIDIA"), path
        assert 0 <= gpu["mem_used_mib"] < gpu["mem_total_mib"], path
        assert 1000 <= gpu["sm_clock_max_mhz"] <= 3500, path
        assert gpu["sm_clock_mhz"] <= gpu["sm_clock_max_mhz"], path
        assert 100 <= gpu["power_limit_w"] <= 700 and 0 < gpu["power_w"] < 800, path
        assert isinstance(gpu["throttle_reasons"], list) and 0 < gpu["temp_c"] < 100, path


def test_captured_h100_mig_and_old_driver_values():
    (h100,) = capture_gpus(f"{H100}/load__query-gpu.csv")
    assert (h100["power_limit_w"], h100["power_w"], h100["util_pct"]) == (700.0, 631.95, 100)
    assert (h100["mig"], h100["mem_used_mib"], h100["sm_clock_mhz"]) == (False, 19818, 1980)
    (mig,) = capture_gpus(f"{H100_MIG}/load__query-gpu.csv")
    assert mig["mig"] is True and mig["util_pct"] is None  # [N/A] under MIG
    (rtx,) = capture_gpus(f"{RTX_2080}/idle__query-gpu.csv")
    assert rtx["mig"] is None  # [N/A]: no MIG on a GeForce
    (old,) = capture_gpus("nvidia-smi/exporter-samples-2021/sample-output.csv")  # throttle names
    assert old["throttle_reasons"] == ["gpu_idle"] and old["power_w"] == 32.7
    assert old["sm_clock_mhz"] == 111 and old["sm_clock_max_mhz"] == 2280


def test_per_reason_columns_decode_without_the_bitmask():
    row = {"clocks_event_reasons.active": "[N/A]", "clocks_event_reasons.gpu_idle": "Not Active",
           "clocks_event_reasons.hw_slowdown": "Active",
           "clocks_event_reasons.sw_thermal_slowdown": "Active"}
    mask = smi_capture.reasons_mask(row)
    assert probe.decode_reasons({"clocks_event_reasons.active": mask}) == [
        "hw_slowdown", "sw_thermal_slowdown"]


def test_captured_compute_apps():
    apps = capture_apps(f"{H100}/load__query-compute-apps.csv")
    assert [(a["pid"], a["gpu_mem_mib"], a["process_name"]) for a in apps] == [
        (11327, 2566, "/root/tools/memhog"), (11328, 1542, "/root/tools/memhog"),
        (11345, 15690, "./gpu_burn")]
    apps = capture_apps(f"{WIN_2080}/load__query-compute-apps.csv")
    assert apps and all(a["gpu_mem_mib"] is None for a in apps)  # [N/A] under WDDM
    assert any(a["process_name"].startswith("C:\\Program Files (x86)") for a in apps)
    assert capture_apps(f"{H100}/idle__query-compute-apps.csv") == []  # only a header


def kernel_capture(name: str) -> dict:
    path = captures() / "system" / "dmesg" / name
    parsed = probe.parse_kernel_log(path.read_text().splitlines(), keep=10_000, msg_chars=160)
    return {"xid": rows(parsed["xid"]), "oom": rows(parsed["oom"]), "counts": parsed["xid_counts"]}


def test_captured_xid_lines_in_every_timestamp_format():
    found = {}
    for path in sorted((captures() / "system" / "dmesg").glob("*.log")):
        for xid in kernel_capture(path.name)["xid"]:
            found.setdefault(xid["xid"], []).append(xid)
    assert {13, 43, 48, 63, 94, 119} <= set(found)
    assert all(x["pid"] is None and x["name"] is None for x in found[48])
    assert {(x["pid"], x["name"]) for x in found[94] if x["pid"]} == {(1248209, "python3.10")}
    ctime = found[119][0]  # [Sun Feb 23 16:24:18 2025]: the box's local time
    assert ctime["pid"] == 2024380 and ctime["pci"] == "0000:9b:00"
    assert ctime["t_epoch"] == time.mktime((2025, 2, 23, 16, 24, 18, 0, 0, -1))
    iso = found[48][0]  # 2024-11-15T12:02:03,470068+00:00
    assert iso["t_epoch"] == pytest.approx(calendar.timegm((2024, 11, 15, 12, 2, 3)) + 0.470068)
    assert iso["msg"].startswith("An uncorrectable double bit error (DBE)")
    assert kernel_capture("gpud__dmesg-decode-iso-xid13-large.log")["counts"]["13"] > 500


def test_xid_79_in_plain_dmesg_format():  # no capture holds a 79; this is the plain format
    line = ("[ 4521.118263] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.")
    (xid,) = rows(probe.parse_kernel_log([line], 8, 160)["xid"])
    assert (xid["xid"], xid["t_mono_s"], xid["pid"]) == (79, 4521.118263, None)


def test_captured_oom_kill_lines():
    ooms = {o["pid"]: o for o in kernel_capture("gpud__dmesg-decode-iso-xid13-oom.log")["oom"]}
    assert set(ooms) == {123, 456, 863987}
    assert ooms[863987]["name"] == "node" and ooms[863987]["memcg"] is True
    assert ooms[456]["name"] == "python" and ooms[123]["name"] == "httpd"
    assert all(o["t_epoch"] for o in ooms.values())


KUBEPOD = ("/lxc.payload.ny2g2r5hh3-lxc/kubepods.slice/kubepods-burstable.slice/"
           "kubepods-burstable-poda8697f49_441d_4d4f_90d2_6d8e1fa3bbe7.slice")


def test_captured_memcg_oom_names_its_cgroup():
    """The real Kubernetes report: oom_memcg= is the pod's cgroup, whose limit was hit."""
    ooms = {o["pid"]: o for o in kernel_capture("gpud__dmesg-decode-iso-xid13-oom.log")["oom"]}
    assert ooms[863987]["cgroup"] == KUBEPOD and ooms[863987]["limit_bytes"] is None
    assert ooms[456]["memcg"] is False and ooms[456]["cgroup"] is None


# Memory cgroup OOM reports, written by us from the kernel's own format strings: mm/memcontrol.c
# mem_cgroup_print_oom_meminfo ("memory: usage %llukB, limit %llukB, failcnt %lu", "swap: …",
# "Memory cgroup stats for PATH:") and, before 4.19, mem_cgroup_print_oom_info ("Task in PATH
# killed as a result of limit of PATH"); mm/oom_kill.c dump_oom_summary ("oom-kill:constraint=%s,
# nodemask=%*pbl", ",cpuset=%s,mems_allowed=%*pbl", ",oom_memcg=PATH,task_memcg=PATH",
# ",task=%s,pid=%d,uid=%d"; 4.19 printed the memcg part first and pid=%5d), __oom_kill_process
# ("%s: Killed process %d (%s) total-vm:%lukB, …") and, before 5.1, oom_kill_process ("%s: Kill
# process %d (%s) score %u or sacrifice child").
MEMCG_REPORT_6X = """\
[ 7301.100200] pt_data_worker invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[ 7301.100390] memory: usage 33554432kB, limit 33554432kB, failcnt 8812
[ 7301.100391] swap: usage 0kB, limit 0kB, failcnt 0
[ 7301.100392] Memory cgroup stats for /system.slice/docker-4f2a9c.scope:
[ 7301.100530] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=docker-4f2a9c.scope,mems_allowed=0-1,oom_memcg=/system.slice/docker-4f2a9c.scope,task_memcg=/system.slice/docker-4f2a9c.scope,task=pt_data_worker,pid=4242,uid=1000
[ 7301.100601] Memory cgroup out of memory: Killed process 4242 (pt_data_worker) total-vm:9834216kB, anon-rss:8123400kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:16420kB oom_score_adj:0
"""  # noqa: E501
MEMCG_REPORT_419 = """\
[  812.004100] memory: usage 8388608kB, limit 8388608kB, failcnt 77
[  812.004101] memory+swap: usage 8388608kB, limit 9007199254740988kB, failcnt 0
[  812.004102] kmem: usage 30720kB, limit 9007199254740988kB, failcnt 0
[  812.004300] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),oom_memcg=/slurm/uid_1000/job_8,task_memcg=/slurm/uid_1000/job_8/step_0,cpuset=/,mems_allowed=0,task=python,pid=  931,uid= 1000
[  812.004400] Memory cgroup out of memory: Killed process 931 (python) total-vm:12345678kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB
"""  # noqa: E501
MEMCG_REPORT_4X = """\
[  301.500100] Task in /docker/4f2a9c killed as a result of limit of /docker/4f2a9c
[  301.500101] memory: usage 4194304kB, limit 4194304kB, failcnt 19
[  301.500102] memory+swap: usage 4194304kB, limit 9007199254740988kB, failcnt 0
[  301.500103] kmem: usage 0kB, limit 9007199254740988kB, failcnt 0
[  301.500104] Memory cgroup stats for /docker/4f2a9c: cache:0KB rss:4194304KB
[  301.500200] Memory cgroup out of memory: Kill process 2718 (python) score 1000 or sacrifice child
[  301.500201] Killed process 2718 (python) total-vm:8000000kB, anon-rss:4190000kB, file-rss:0kB, shmem-rss:0kB
"""  # noqa: E501


@pytest.mark.parametrize(("report", "pid", "cgroup", "limit_kb"), [
    (MEMCG_REPORT_6X, 4242, "/system.slice/docker-4f2a9c.scope", 33554432),
    (MEMCG_REPORT_419, 931, "/slurm/uid_1000/job_8", 8388608),
    (MEMCG_REPORT_4X, 2718, "/docker/4f2a9c", 4194304),
], ids=["6.x", "4.19", "4.x"])
def test_memcg_oom_report_gives_the_cgroup_and_its_limit(report, pid, cgroup, limit_kb):
    (oom,) = rows(probe.parse_kernel_log(report.splitlines(), 8, 160)["oom"])
    assert (oom["pid"], oom["memcg"], oom["cgroup"], oom["limit_bytes"]) == (
        pid, True, cgroup, limit_kb * 1024)


def test_a_global_oom_after_a_lost_memcg_kill_is_not_the_cgroups():
    """A memcg report whose kill line never came (rate-limited) says nothing of a global OOM a
    minute later."""
    lines = [*MEMCG_REPORT_6X.splitlines()[:4],
             "[ 7390.000001] Out of memory: Killed process 77 (java) total-vm:1kB, "
             "anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0"]
    (oom,) = rows(probe.parse_kernel_log(lines, 8, 160)["oom"])
    assert (oom["pid"], oom["memcg"], oom["cgroup"], oom["limit_bytes"]) == (77, False, None,
                                                                              None)


KERNEL_BITS = st.sampled_from([
    "[  12.500000] ", "[Sun Feb 23 16:24:18 2025] ", "[Mon Feb 31 99:99:99 2025] ",
    "2025-01-21T08:46:30,287197+00:00 ", "2025-13-45T25:61:61,1+99:99 ", "kern  :warn  : ",
    "6,3964,206764307,-;", "6,1,99999999999999999999999,-;", "gpu1 kernel: ",
    "NVRM: Xid (PCI:", "0000:3b:00", ":::", "): ", "31", ", pid=", "'<unknown>'", "12083",
    ", name=", "chrome", "<unknown>", ", ", "MMU Fault",
    "oom-kill:constraint=", "CONSTRAINT_MEMCG", "CONSTRAINT_NONE", ",nodemask=(null)",
    ",oom_memcg=", ",task_memcg=", ",cpuset=", ",global_oom", ",task=", ",pid=", "  931",
    ",uid=", "/docker/4f2a", "memory: usage ", "kB, limit ", "9007199254740988", "kB",
    "Task in ", " killed as a result of limit of ", "Memory cgroup out of memory",
    "Out of memory", ": Killed process ", ": Kill process ", " (", ")", " or sacrifice child",
    "9" * 5000, "\x00", "\udcff", "\u202e", "\n"])
KERNEL_LINE = st.lists(KERNEL_BITS | st.text(max_size=6), max_size=14).map("".join)


@settings(derandomize=True, max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(KERNEL_LINE, max_size=12), keep=st.integers(1, 4))
def test_the_kernel_log_parser_takes_any_lines(lines: list[str], keep: int) -> None:
    """Box text: whatever the lines, the parser raises nothing, keeps at most `keep` rows of
    each kind and gives rows of the documented shape and types (through the model too)."""
    parsed = probe.parse_kernel_log(lines, keep, 160)
    assert parsed["xid"]["fields"] == list(probe.XID_FIELDS)
    assert parsed["oom"]["fields"] == list(probe.OOM_FIELDS)
    assert len(parsed["xid"]["rows"]) <= keep and len(parsed["oom"]["rows"]) <= keep
    for xid in rows(parsed["xid"]):
        assert isinstance(xid["xid"], int) and (xid["pid"] is None or isinstance(xid["pid"], int))
        assert len(xid["msg"]) <= 160
    for oom in rows(parsed["oom"]):
        assert isinstance(oom["pid"], int) and isinstance(oom["memcg"], bool)
        assert oom["cgroup"] is None or len(oom["cgroup"]) <= probe.CGROUP_CHARS
        assert oom["limit_bytes"] is None or 0 <= oom["limit_bytes"] < probe.V1_UNLIMITED_BYTES
    json.dumps(parsed)  # goes on the wire as it is


def test_other_kernel_log_formats_parse_without_events():
    for name in ("gpud__journalctl-k-short-iso-a800.log", "gpud__dev-kmsg-raw-nvswitch.log",
                 "gpud__dmesg-decode-iso-peermem.log", "gpud__dmesg-decode-iso-nccl-segfault.log"):
        assert kernel_capture(name) == {"xid": [], "oom": [], "counts": {}}
    assert probe.split_timestamp("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == \
        (206.764307, None, "nvidia-nvswitch2: open (major=510)")
    assert probe.split_timestamp("2025-01-02T15:20:12+0800 a800 kernel: docker0: port 1") == \
        (None, calendar.timegm((2025, 1, 2, 7, 20, 12)), "docker0: port 1")


def test_stat_with_parens_and_spaces_in_comm():
    stat = probe.parse_stat("4242 (a) (b c)) R 1 4242 4242 0 -1 4194560 0 0 0 0 1 2 0 0 20 0 3 "
                            "0 98765 0 0")
    assert (stat["comm"], stat["state"], stat["ppid"], stat["threads"], stat["start_ticks"]) == \
        ("a) (b c)", "R", 1, 3, 98765)


def test_process_patterns_match_arguments_and_both_sides_agree():
    """A run's `process` is matched on arguments (probe.argv_match; a loose run, one without
    a workdir, on the words of its whole command line): the argument itself or a path ending
    in it, never a longer word; several words in a row. The action script that refuses a
    relaunch has its own copy (it runs alone on the box): both agree on every case."""
    from gpuwatch.remote.box.act import argv_match as box_match

    def match(argv: list[str], text: str) -> list[str] | None:
        found = probe.argv_match(argv, text.split())
        assert found == box_match(argv, text.split()), (argv, text)
        return found

    assert match(["python", "/data/llama/train.py", "--resume"], "train.py") == [
        "/data/llama/train.py"]
    assert match(["python", "./train.py"], "train.py") == ["./train.py"]
    assert match(["torchrun", "--nproc", "8", "-m", "llama.train"], "-m llama.train")
    assert match(["python", "llama/train.py"], "llama/train.py")
    for argv in (["python", "pretrain.py"], ["python", "train.pyc"], ["train.py/"],
                 ["python", "--out=train.py"], ["vim", "x/train.py.bak"], []):
        assert match(argv, "train.py") is None, argv
    assert match(["my-run: rank 0 train.py"], "train.py") == ["train.py"]  # setproctitle
    assert match(["python", "train.py"], "python train.py") == ["python", "train.py"]
    import random

    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("ab./ ") for _ in range(rng.randint(1, 4)))
        argv = ["".join(rng.choice("ab./ ") for _ in range(rng.randint(0, 4)))
                for _ in range(rng.randint(0, 4))]
        if text.split():
            match(argv, text)


def test_hand_parsers_agree_with_the_regular_expressions_they_replaced():
    """re is off the probe's steady path: nvidia-smi's numbers and CSV headers are
    parsed by hand. Against the expressions they replaced, on every string of a small
    alphabet up to 4 characters and on 20,000 random longer ones: the same answers."""
    import itertools
    import random
    import re

    number = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:[A-Za-z%]+)?$")
    field = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]*\])?$")

    def want_number(raw: str):
        value = probe.smi_value(raw)
        match = number.match(value) if value is not None else None
        if match is None:
            return None
        text = match.group(1)
        return float(text) if "." in text else int(text)

    alphabet = "0-1. %Wa\t"
    head = "a_.1 []x]"
    rng = random.Random(3)
    strings = ["".join(p) for n in range(5) for p in itertools.product(alphabet, repeat=n)]
    strings += ["".join(rng.choice(alphabet + "9MiBHz[]/N") for _ in range(rng.randint(5, 12)))
                for _ in range(20_000)]
    strings += ["81559 MiB", "631.95 W", "100 %", "59", "-3", "1.5e3", "12.", ".5", "1 2",
                "5 MiB ", " 5", "[N/A]", "N/A", "5\u00a0W", "\u0661\u0662"]
    for raw in strings:
        assert probe.smi_number(raw) == want_number(raw), repr(raw)
    headers = ["".join(p) for n in range(6) for p in itertools.product(head, repeat=n)]
    headers += ["memory.used [MiB]", "index", "clocks_event_reasons.active", "0", "a [b] [c]"]
    for cell in headers:
        assert smi_capture.is_field_name(cell) == bool(field.match(cell)), repr(cell)


def test_json_without_the_json_module_writes_and_reads_what_json_does():
    """The probe encodes and decodes through _json, json's own C half, so that a
    steady poll imports neither json nor re (9 ms of a bare python's 11 ms start)."""
    doc = {"v": 1, "s": "naïve \"quoted\" \\ \n\t\u2028 \U0001f600", "n": [0, -1, 2 ** 63, 1.5,
           1e-7, 123456789.123, float("nan"), float("inf"), True, False, None],
           "nested": {"a": [], "b": {}, "c": [[1, [2, {"d": "e"}]]]}, "": "empty key"}
    for separators in ((",", ":"), (", ", ": ")):
        assert probe.json_dumps(doc, separators) == json.dumps(doc, separators=separators)
    text = json.dumps(doc)
    back = probe.json_loads(text)
    assert json.dumps(back) == text and back["n"][2] == 2 ** 63
    assert probe.json_loads('  {"a": [1, 2.5, "x"]}\n') == {"a": [1, 2.5, "x"]}
    for bad in ("", "{", '{"a": 1} x', "[1,]", "nul", '{"a" 1}'):
        with pytest.raises(ValueError):
            probe.json_loads(bad)
    with pytest.raises(TypeError):
        probe.json_dumps({"x": object()})


def test_a_steady_poll_imports_neither_json_nor_re(box: Box):
    """What a steady poll sends (no discovery, no decoder) runs without importing json, re,
    subprocess or site on a box whose kernel log has no Xid or OOM line."""
    box.tool("dmesg", "echo '[    0.000000] Linux version 6.8.0-45-generic'\n"
                      "echo '[    0.045121] Memory: 2029476K/2096632K available'\n"
                      "echo '[    1.302214] Freeing unused kernel image (initmem) memory: 4K'\n")
    request = box_request(box, spawn=True, want={"nvml": False, "discover": False})
    watched = ("json", "re", "enum", "subprocess", "threading", "site")
    # the bootstrap, with os._exit (the probe's last call) first writing what was imported
    check = ("import sys;sys.path=[p for p in sys.path if p not in('','.')];import zlib,os;"
             "i=sys.stdin.buffer;p=zlib.decompress(i.read(int(i.readline())));x=os._exit;"
             f"os._exit=lambda c:(sys.stderr.write('MODULES:%s\\n'%' '.join(m for m in "
             f"{watched!r} if m in sys.modules)),x(c));exec(p)")
    result = subprocess.run([sys.executable, "-S", "-c", check],
                            input=build_stdin(request, trim=True), env=box.env(),
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr.decode()
    doc = json.loads(result.stdout)
    assert doc["errors"] == {} and len(doc["gpus"]["devices"]["rows"]) == 8
    assert doc["runs"] and doc["disks"] and doc["kernel"]["xid"]["rows"] == []
    (line,) = [ln for ln in result.stderr.decode().splitlines() if ln.startswith("MODULES:")]
    assert line == "MODULES:", line


def test_captured_cgroup_v2_files_read_as_the_probe_reads_them():
    """Our own cgroup v2 files in a 5.15 kernel's format (the real tree we learnt it from has no
    licence that lets it be copied: tests/data/captures/PROVENANCE.md)."""
    group = captures() / "system/cgroup/gpuwatch-v2/sys/fs/cgroup"
    info = probe.cgroup_v2(str(group), "/")
    assert info["memory_max_bytes"] == 34359738368 and info["memory_events"]["oom_kill"] == 1
    assert info["memory_current_bytes"] == 21474836480
    assert (info["cpu_quota_us"], info["cpu_period_us"]) == (800000, 100000)
    assert info["cpu_stat"]["nr_throttled"] == 3187


# ---------------------------------------------------------------- stdlib only, Python 3.6

def imported_modules(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node, node.module or ""))
    return found


@pytest.mark.parametrize("name", [name for name, _ in MODULES])
def test_bundled_modules_import_only_the_stdlib(name: str):
    tree = ast.parse(dict(MODULES)[name].read_text())
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "Exception")
                for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node, name in imported_modules(tree):
        top = name.split(".")[0]
        if top in ("pynvml", "crc32c", "gpuwatch_tfevents"):  # the last: the bundle's loader's
            assert id(node) in guarded, f"{top} only under try/except ImportError"
        else:
            assert top in sys.stdlib_module_names, f"non-stdlib import: {name}"
            assert top != "__future__", "no __future__ imports on 3.6 boxes"


def test_vermin_says_python_36_is_enough():
    vermin = shutil.which("vermin") or str(Path(sys.executable).with_name("vermin"))
    if not Path(vermin).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("vermin is not installed (pip install -e .[test])")
        pytest.skip("vermin is not installed")
    result = subprocess.run([vermin, "-t=3.6-", "--no-tips", "--violations",
                             *(str(path) for _, path in MODULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bundle_is_compressed_and_framed():
    stdin = build_stdin({"v": 1})
    length, _, rest = stdin.partition(b"\n")
    payload = zlib.decompress(rest[:int(length)]).decode()
    assert rest[int(length):] == b'{"v":1}'
    namespace: dict = {}
    exec(payload.split("\n", 1)[0], namespace)  # the first line: SOURCES = [(name, source)]
    assert [name for name, _ in namespace["SOURCES"]] == [name for name, _ in MODULES]
    assert [name for name, _ in MODULES][-1] == "gpuwatch_probe"  # installed last: main() runs
    for (name, shipped), (_, path) in zip(namespace["SOURCES"], MODULES, strict=True):
        assert shipped == strip_source(path.read_text()), name
        compile(shipped, name, "exec")
    originals = sum(len(path.read_bytes()) for _, path in MODULES)
    assert int(length) < originals / 4.5  # comments and docstrings out, then zlib


def _without_docstrings(tree: ast.AST) -> str:
    """The AST as strip_source leaves it: string statements gone, `0` where one was all."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            kept = [s for s in block if not (isinstance(s, ast.Expr) and isinstance(
                s.value, ast.Constant) and isinstance(s.value.value, str))]
            setattr(node, field, kept or [ast.Expr(ast.Constant(0))])
    return ast.dump(tree)


@pytest.mark.parametrize("name", [name for name, _ in MODULES])
def test_stripped_module_is_the_same_code(name: str):
    """Comments, docstrings, blank lines and indentation go; the code is the same."""
    original = dict(MODULES)[name].read_text()
    stripped = strip_source(original)
    assert _without_docstrings(ast.parse(stripped)) == _without_docstrings(ast.parse(original))
    assert len(stripped) < len(original) * 0.75


def test_strip_source_keeps_continued_lines_and_strings():
    """A line continued inside brackets (or after a backslash) loses its indentation; a
    string's lines keep every space, also where code follows the string on its last line;
    spaces between tokens go where Python needs none (not between names, nor in `1 .real`)."""
    source = ('def f(x):\n    if x:\n        y = g(1,\n              2)\n'
              '        s = """\n    kept   as is\n"""\n        t = ("""a\n   b""" +\n'
              '             "c")\n        return s + t + \\\n            ""\n'
              '    return (x +\n            1)\n\n\ndef g(a, b):\n    return a + b\n')
    stripped = strip_source(source)
    assert stripped.startswith("def f(x):\n if x:\n  y=g(1,\n2)\n")
    assert '"""\n    kept   as is\n"""' in stripped and '"""a\n   b"""+\n"c")' in stripped
    assert strip_source("x = 1 .real if not - 2 else f'{ 1 } a'\n") == \
        "x=1 .real if not-2 else f'{ 1 } a'\n"
    namespace: dict = {}
    exec(stripped, namespace)
    assert namespace["f"](1) == "\n    kept   as is\na\n   bc" and namespace["f"](0) == 1


def test_payload_is_built_once_and_kept_in_the_cache(tmp_path: Path, monkeypatch):
    """Stripping the sources costs tens of ms of tokenizing: a payload is kept under
    $XDG_CACHE_HOME/gpuwatch, named by what it is made from; a damaged one is rebuilt."""
    from gpuwatch.remote.wire import bundle as probe_bundle

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    probe_bundle.compressed_probe.cache_clear()
    parts = ("gpuwatch_probe", probe_bundle.RUN_FILES)
    blob = probe_bundle.compressed_probe(parts)
    kept = list((tmp_path / "gpuwatch").glob("probe-*.z"))
    assert len(kept) == 1 and kept[0].read_bytes() == blob
    assert zlib.decompress(blob).decode() == probe_bundle.payload(parts)
    kept[0].write_bytes(b"not zlib")
    probe_bundle.compressed_probe.cache_clear()
    assert probe_bundle.compressed_probe(parts) == blob and kept[0].read_bytes() == blob
    probe_bundle.compressed_probe.cache_clear()
    assert probe_bundle.compressed_probe(("gpuwatch_probe",)) != blob  # another payload
    assert len(list((tmp_path / "gpuwatch").glob("probe-*.z"))) == 2
    probe_bundle.compressed_probe.cache_clear()


def test_strip_source_keeps_the_code():
    source = ('"""Module doc."""\n# a comment\nX = "kept"  # trailing\n\n\n'
              'class Only:\n    """Only a docstring."""\n\n'
              'def f():\n    """Doc."""\n    "%s" % X\n    return "x".join(["a", "b"])\n')
    stripped = strip_source(source)
    assert "comment" not in stripped and "doc" not in stripped.lower() and "\n\n" not in stripped
    namespace: dict = {}
    exec(stripped, namespace)
    assert namespace["X"] == "kept" and namespace["f"]() == "axb" and namespace["Only"]


H100_MEMORY_PYNVML = FAKE_PYNVML.replace(
    "def nvmlDeviceGetMemoryInfo(h): return NS(used=70211 << 20, total=81559 << 20)\n", '''\
nvmlMemory_v2 = 0x02000028


def nvmlDeviceGetMemoryInfo(h, version=None):
    # An idle H100 80GB HBM3, driver 580.159.04, nvidia-ml-py 13.610.43 (tests/captures/
    # h100-driver580): v1 counts the 480 MiB the driver reserves as used; nvidia-smi -q says
    # "Reserved : 480 MiB, Used : 0 MiB", as v2 does. GPU 1: a driver without the _v2 call.
    if version is None:
        return NS(total=85520809984, free=85017493504, used=503316480)
    if h == 1:
        raise NVMLError_FunctionNotFound()
    return NS(version=version, total=85520809984, reserved=503316480, free=85017493504, used=0)


class NVMLError_FunctionNotFound(NVMLError):
    pass
''')


def test_nvml_memory_used_leaves_out_the_drivers_reserve(box: Box, tmp_path: Path):
    """Found on a real H100 (tests/device/run.sh): NVML's v1 memory info read 480 MiB used on
    an idle GPU where nvidia-smi read 0, so the two GPU paths disagreed by the reserve and an
    idle GPU with a bigger reserve would pass zombie_unattributed_mib (U11). v2 where the
    driver has it; v1 where it does not (and with a pynvml that has no `version`, above)."""
    assert H100_MEMORY_PYNVML != FAKE_PYNVML
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(H100_MEMORY_PYNVML)
    doc = probe_doc(box_request(box, want={}), {**box.env(), "PYTHONPATH": str(tmp_path / "nvml")})
    assert doc["errors"] == {} and doc["gpus"]["source"] == "nvml"
    gpu0, gpu1 = rows(doc["gpus"]["devices"])
    assert (gpu0["mem_used_mib"], gpu0["mem_total_mib"]) == (0, 81559)
    assert (gpu1["mem_used_mib"], gpu1["mem_total_mib"]) == (480, 81559)


def test_pynvml_is_imported_from_where_it_was_last_found_without_site(box: Box,
                                                                      tmp_path: Path):
    """On a real H100 box's torch venv, site.main() took 65 ms of a 138 ms NVML poll, all of
    it the venv's .pth files (tests/device/probe_cost.py). The probe says which folder pynvml
    came from; told it back, it puts only that folder on sys.path and never loads site. A
    folder that no longer holds pynvml costs nothing but site, as before."""
    from gpuwatch.remote.wire.document import parse_probe_output

    home = tmp_path / "only-here"
    home.mkdir()
    (home / "pynvml.py").write_text(FAKE_PYNVML + (
        "\nimport sys as _sys\n\n\ndef nvmlDeviceGetName(h):\n"
        "    return 'site loaded' if 'site' in _sys.modules else 'no site'\n"))
    # No PYTHONPATH: this pynvml is on no path the box's python knows of (site would find the
    # real nvidia-ml-py of this venv instead, and NVML would fail here, without a driver).
    env = {k: v for k, v in box.env().items() if k not in ("PYTHONPATH", "GPUWATCH_SIM_DIR")}

    def poll(request: dict) -> dict:  # a steady poll's payload: no event decoder, so no site
        result = subprocess.run(["sh", "-c", build_command(sys.executable)],
                                input=build_stdin(request, trim=True), env=env,
                                capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)

    steady = {"want": {"discover": False}, "runs": [], "pynvml": True}
    told = poll(box_request(box, **steady, pynvml_dir=str(home)))
    assert told["gpus"]["source"] == "nvml", told["gpus"]
    assert {r["name"] for r in rows(told["gpus"]["devices"])} == {"no site"}
    assert told["gpus"]["pynvml_dir"] == str(home)
    assert parse_probe_output(json.dumps(told).encode(), "box").pynvml_dir == str(home)

    gone = poll(box_request(box, **steady, pynvml_dir=str(tmp_path / "moved")))
    import pynvml  # this venv's nvidia-ml-py, found through site as before

    assert gone["gpus"]["pynvml"] is True and gone["gpus"]["source"] == "nvidia-smi"
    assert gone["gpus"]["pynvml_dir"] == os.path.dirname(pynvml.__file__)
