"""U3: a vanished run's cause, decided from two polls of a simulated box (and real kernel and
training-log text), with run.dead / run.rank_dead, and the store keeping it for cron."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from findings_helpers import Watched, host_config, touch
from gpuwatch.remote.findings.diagnosis import Diagnosis, crash_line
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.sim import Box, SimProcess, kmsg, training_process
from gpuwatch.remote.store import Store
from harness.captures import capture
from harness.cli import gpuwatch_on_box
from harness.dying_runs import box_at, dead, running


def test_killed_when_nothing_else_explains_it(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "killed" and evidence["pids"] == [600]
    assert "killed by a signal" in w.one("run.dead").message
    w.poll()  # still dead: still critical until it is relaunched, finished or acknowledged
    again = w.one("run.dead")
    assert again.severity == Severity.CRITICAL and again.evidence["cause"] == "killed"


def test_reboot(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    old = box.boot_id
    box.reboot()
    w.poll()
    cause, evidence = dead(w)
    assert cause == "reboot" and evidence["boot_id_before"] == old
    assert "host.rebooted" in w.codes()


def test_oom_cgroup_counter_is_authoritative(tmp_path: Path) -> None:
    box = box_at(tmp_path, memory_max=64 * 2**30)
    w = running(tmp_path, box)
    box.oom_kill(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "oom_cgroup" and evidence["oom_kill_now"] == 1
    assert evidence["killed_pid"] == 600
    assert "host.cgroup_oom" in w.codes()


def test_oom_kernel_from_real_dmesg_text(tmp_path: Path) -> None:
    """The real 'Out of memory: Kill process 456 (python) score 50 or sacrifice child'."""
    lines = capture("system", "dmesg", "gpud__dmesg-decode-iso-xid13-oom.log").read_text(
        errors="replace").splitlines()
    box = box_at(tmp_path)
    w = running(tmp_path, box, pid=456)
    box.append_dmesg(*[line for line in lines if "Xid" not in line])
    box.remove_process(456)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "oom_kernel" and evidence["pid"] == 456 and evidence["name"] == "python"


def test_xid_on_its_gpu(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(0, 79)
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "xid" and evidence["xid"] == 79 and evidence["gpu"] == 0
    assert w.one("gpu.xid").severity == Severity.CRITICAL
    # the death carries NVIDIA's catalog action, said in run.dead too
    assert (evidence["xid_name"], evidence["action"]) == ("the GPU has fallen off the bus",
                                                          "RESTART_BM")
    assert "catalog (Xids 1-162) says reboot the machine" in w.one("run.dead").message


def test_an_xid_the_catalog_lacks_says_so_in_the_death(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(0, 200)
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "xid" and evidence["xid"] == 200 and evidence["action"] is None
    assert "Xid 200: not in NVIDIA's Xid catalog" in w.one("run.dead").message


def test_xid_on_another_gpu_is_not_the_cause(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(1, 13)
    box.remove_process(600)
    w.poll()
    assert dead(w)[0] == "killed"


# ---------------------------------------------------------------- whose Xid (U22)

XID43 = ("kern  :warn  : 2025-01-21T02:21:33,502278+00:00 NVRM: Xid (PCI:0000:38:00): 43, "
         "pid=2815167, name=pt_main_thread, Ch 00000008")


def captured_xid43() -> str:
    """A real Xid line that names its process (gpud's capture of a dmesg with 43s)."""
    text = capture("system", "dmesg", "gpud__dmesg-decode-iso-xid13-large.log").read_text()
    assert XID43 in text.splitlines()
    return XID43


def on_bus_38(box: Box) -> None:
    """GPU 0 at the captured line's PCI address, 0000:38:00."""
    box.set_gpu(0, {"pci.bus_id": "00000000:38:00.0", "pci.bus": "0x38"})


def test_xid_31_naming_another_process_on_its_gpu_is_not_the_cause(tmp_path: Path) -> None:
    """An MMU fault in someone's browser on the run's (shared) GPU: that process's, not the
    run's, which died of something else."""
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(0, 31, pid=12083, name="chrome")
    box.remove_process(600)
    w.poll()
    assert dead(w)[0] == "killed"
    assert w.one("gpu.xid").evidence["xids"] == [31]  # the GPU's finding still says it


def test_captured_xid_naming_another_process_on_its_gpu_is_not_the_cause(tmp_path: Path
                                                                          ) -> None:
    box = box_at(tmp_path)
    on_bus_38(box)
    w = running(tmp_path, box)
    box.append_dmesg(captured_xid43())
    box.remove_process(600)
    w.poll()
    assert dead(w)[0] == "killed"


def test_captured_xid_naming_the_runs_pid_is_the_cause(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    on_bus_38(box)
    w = running(tmp_path, box, pid=2815167)
    box.append_dmesg(captured_xid43())
    box.remove_process(2815167)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "xid" and evidence["xid"] == 43
    assert (evidence["pid"], evidence["name"], evidence["gpu"]) == (2815167, "pt_main_thread", 0)
    assert "pid 2815167 (pt_main_thread)" in w.one("run.dead").message
    assert evidence["action"] == "IGNORE" and evidence["advice"].startswith(
        "Xid 43 (the GPU stopped processing (the application's channel was reset)): NVIDIA's")


def test_xid_31_naming_the_runs_pid_on_another_gpu_is_the_cause(tmp_path: Path) -> None:
    """The line's pid is the run's: its own fault, whichever GPU the run was thought to hold."""
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(1, 31, pid=600, name="python")
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "xid" and (evidence["xid"], evidence["pid"], evidence["name"],
                               evidence["gpu"]) == (31, 600, "python", 1)


def test_a_dead_gpu_kills_the_run_whichever_process_the_line_names(tmp_path: Path) -> None:
    """U22: Xid 79, the GPU fell off the bus: every process on it goes."""
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.xid(0, 79, pid=4242, name="nvidia-smi")
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "xid" and evidence["gpu"] == 0 and evidence["pid"] == 4242


# ---------------------------------------------------------------- whose cgroup (U9, U41)

OWN_CGROUP = "/user.slice/user-1000.slice/session-3.scope"
DOCKER = "/system.slice/docker-4f2a9c.scope"


def test_oom_counter_of_the_runs_own_cgroup_not_the_probes(tmp_path: Path) -> None:
    """A run in a Docker container: the probe (an SSH session's cgroup) is in another one,
    whose counter never moves; the container's does."""
    box = box_at(tmp_path, cgroup_path=OWN_CGROUP)
    box.add_cgroup(DOCKER, memory_max=32 << 30)
    w = running(tmp_path, box, cgroup=DOCKER)
    box.oom_kill(600)
    assert box.cgroup["events"]["oom_kill"] == 0  # the probe's own cgroup saw nothing
    w.poll()
    cause, evidence = dead(w)
    assert cause == "oom_cgroup" and evidence["cgroup"] == DOCKER
    assert (evidence["oom_kill_before"], evidence["oom_kill_now"]) == (0, 1)
    assert evidence["memory_max_bytes"] == 32 << 30 and evidence["killed_pid"] == 600
    assert "memory cgroup docker-4f2a9c.scope OOM-killed pid 600" in w.one("run.dead").message
    assert w.one("run.dead").evidence["diagnosis"]["evidence"]["cgroup"] == DOCKER


def test_once_reads_the_dead_runs_cgroup_named_by_the_store(tmp_path: Path) -> None:
    """Between two cron runs the run died in its container: the second --once has no process
    to tell it the cgroup; the store carried it from the first."""
    box = box_at(tmp_path, cgroup_path=OWN_CGROUP)
    box.add_cgroup(DOCKER, memory_max=32 << 30)
    work = tmp_path / "run"
    work.mkdir()
    (work / "train.log").write_text("step 1\n")
    box.add_process(replace(training_process(600, workdir=str(work), nohup=True), cgroup=DOCKER))
    config = (f'[hosts.local]\nssh = "local"\n[hosts.local.runs.llama]\nprocess = "train.py"\n'
              f'workdir = "{work}"\nlog = "train.log"\n')
    first = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    assert first.returncode == 0, first.stderr
    box.oom_kill(600)
    second = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    (run,) = json.loads(second.stdout)["hosts"][0]["runs"]
    assert run["diagnosis"]["cause"] == "oom_cgroup", second.stderr
    assert run["diagnosis"]["evidence"]["cgroup"] == DOCKER
    assert run["diagnosis"]["evidence"]["oom_kill_now"] == 1  # the counter's, not the line's


def test_a_memcg_oom_report_is_oom_cgroup_with_its_cgroup_and_limit(tmp_path: Path) -> None:
    """The 5.x+ report (kmsg.oom_kill, from mm/memcontrol.c's and mm/oom_kill.c's format
    strings) of a cgroup whose counter this box does not show: the report alone says it."""
    box = box_at(tmp_path, cgroup_path=OWN_CGROUP)
    w = running(tmp_path, box, cgroup=DOCKER)
    box.append_dmesg(*kmsg.oom_kill(box.uptime_s, 600, "python", cgroup=True, memcg=DOCKER,
                                    limit_kb=16 << 20))
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "oom_cgroup" and (evidence["cgroup"], evidence["memory_max_bytes"]) == (
        DOCKER, 16 << 30)
    assert (evidence["pid"], evidence["name"]) == (600, "python")
    assert "16.0 GiB limit" in w.one("run.dead").message


def test_an_old_kernels_memcg_oom_report_is_oom_cgroup(tmp_path: Path) -> None:
    """Before 4.19: 'Task in … killed as a result of limit of …', 'memory: usage …, limit …',
    'Memory cgroup out of memory: Kill process … or sacrifice child' (kmsg.memcg_oom_v4)."""
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.append_dmesg(*kmsg.memcg_oom_v4(box.uptime_s, 600, "python", memcg="/docker/4f2a9c",
                                        limit_kb=4 << 20))
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "oom_cgroup" and (evidence["cgroup"], evidence["memory_max_bytes"]) == (
        "/docker/4f2a9c", 4 << 30)


def test_exception_quotes_the_line_of_a_real_crash_log(tmp_path: Path) -> None:
    """DeepSpeed's real 16-GPU crash: the tail ends in launcher lines after the tracebacks."""
    text = capture("metrics", "train_stdout", "deepspeed-chat__llama7b_16gpu_crash.log").read_text(
        errors="replace")
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    (tmp_path / "run" / "train.log").write_text(text)
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "exception"
    assert evidence["line"].startswith("RuntimeError: Expected all tensors to be on the same "
                                       "device")
    assert "RuntimeError" in w.one("run.dead").message


@pytest.mark.parametrize(("tail", "kind", "quoted"), [
    ("step 9\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
     "cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:1182] [Rank 3] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600026 ms\n",
     "nccl_timeout", None),
    ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
     "    main()\nKeyError: 'lr'\n", "exception", "KeyError: 'lr'"),
    ("step 100 loss 0.1\nstep 200 loss 0.09\n", None, None),
])
def test_crash_line_kinds(tail: str, kind: str | None, quoted: str | None) -> None:
    found = crash_line(tail)
    assert (found[0] if found else None) == kind
    if quoted is not None:
        assert found is not None and found[1] == quoted


def test_sighup_when_its_terminal_session_is_gone(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    work = tmp_path / "run"
    work.mkdir()
    (work / "train.log").write_text("step 1\n")
    pts = (136 << 8) | 2
    box.add_process(SimProcess(300, ("sshd: bob@pts/2",), comm="sshd", ppid=1))
    box.add_process(SimProcess(310, ("-bash",), comm="bash", ppid=300, tty_nr=pts))
    box.add_process(replace(training_process(320, ppid=310, tty_nr=pts, workdir=str(work)),
                            session=310))
    w = Watched(box, host_config(f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\n'
                                 f'workdir = "{work}"\nlog = "train.log"\n'))
    w.poll()
    assert "run.sighup_risk" in w.codes()
    for pid in (320, 310, 300):  # the SSH session dropped
        box.remove_process(pid)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "sighup" and evidence["session"] == 310


def test_a_finished_run_is_not_dead(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box, done="DONE")
    touch(tmp_path / "run" / "DONE", time.time())
    box.remove_process(600)
    w.poll()
    assert w.history.runs["llama"].status == "finished"
    assert "run.dead" not in w.codes() and w.history.deaths == {}


def test_unknown_when_the_kernel_log_is_unreadable(tmp_path: Path) -> None:
    box = box_at(tmp_path)
    w = running(tmp_path, box)
    box.set_faults(dmesg_denied=True)
    box.remove_process(600)
    w.poll()
    cause, evidence = dead(w)
    assert cause == "unknown" and any("kernel log" in u for u in evidence["unchecked"])


def test_rank_dead_while_the_others_live(tmp_path: Path) -> None:
    box = box_at(tmp_path, 4)
    work = tmp_path / "run"
    work.mkdir()
    box.add_process(SimProcess(900, ("python", "-m", "torch.distributed.run", "train.py"),
                               comm="torchrun", ppid=1))
    for rank in range(4):
        box.add_process(replace(training_process(901 + rank, ppid=900, gpu=rank,
                                                 workdir=str(work)), session=900))
        box.add_compute_app(rank, 901 + rank, "python", 30_000)
    # a dataloader worker of rank 0: forked, same command line, no CUDA context of its own
    box.add_process(replace(training_process(950, ppid=901, workdir=str(work)), session=900,
                            threads=4))
    w = Watched(box, host_config(f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\n'
                                 f'workdir = "{work}"\n'))
    w.poll()
    box.remove_process(950)  # a worker ending is no news
    w.poll()
    assert "run.rank_dead" not in w.codes()
    box.oom_kill(903)
    w.poll()
    f = w.one("run.rank_dead")
    assert f.severity == Severity.CRITICAL and f.evidence["dead_pids"] == [903]
    assert f.evidence["cause"] == "oom_cgroup" and sorted(f.evidence["survivors"]) == [
        901, 902, 904]
    assert "will hang" in f.message and "run.dead" not in w.codes()
    w.poll()
    assert "run.rank_dead" in w.codes()  # while the survivors hang, it stays


def test_diagnosis_state_round_trip() -> None:
    d = Diagnosis("xid", {"xid": 79}, 12.5, (1, 2))
    assert Diagnosis.from_state(json.loads(json.dumps(d.state()))) == d
    assert Diagnosis.from_state({"cause": "bogus"}) is None


# ---------------------------------------------------------------- --once, the store, the JSON


def test_once_reports_a_death_once_with_its_diagnosis_and_stores_it(tmp_path: Path) -> None:
    import jsonschema
    from gpuwatch.remote.report import load_schema

    box = box_at(tmp_path)
    work = tmp_path / "run"
    work.mkdir()
    (work / "train.log").write_text("step 1\n")
    box.add_process(training_process(600, workdir=str(work), nohup=True))
    config = (f'[hosts.local]\nssh = "local"\n[hosts.local.runs.llama]\nprocess = "train.py"\n'
              f'workdir = "{work}"\nlog = "train.log"\n')
    first = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    assert first.returncode == 0, first.stderr
    box.xid(0, 79)
    box.remove_process(600)
    second = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    assert second.returncode == 1  # critical: a dead run, a dead GPU
    doc = json.loads(second.stdout)
    jsonschema.validate(doc, load_schema())
    (host,) = doc["hosts"]
    (run,) = host["runs"]
    assert run["status"] == "dead" and run["diagnosis"]["cause"] == "xid"
    codes = {f["code"]: f for f in host["findings"]}
    assert codes["run.dead"]["severity"] == "critical" and codes["gpu.xid"]["gpu"] == 0
    third = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    assert third.returncode == 1  # still dead: critical until relaunched, finished or acked
    (run,) = json.loads(third.stdout)["hosts"][0]["runs"]
    assert run["diagnosis"]["cause"] == "xid"  # kept by the store
    (dead_run,) = [f for f in json.loads(third.stdout)["hosts"][0]["findings"]
                   if f["code"] == "run.dead"]
    assert dead_run["severity"] == "critical"
    acked = gpuwatch_on_box(tmp_path, box, "ack", "local", "llama", config=config)
    assert acked.returncode == 0 and "acknowledged" in acked.stdout, acked.stderr
    fourth = gpuwatch_on_box(tmp_path, box, "--once", "--json", config=config)
    assert fourth.returncode == 0  # known to a person now; the Xid is old news
    (dead_run,) = [f for f in json.loads(fourth.stdout)["hosts"][0]["findings"]
                   if f["code"] == "run.dead"]
    assert dead_run["severity"] == "info" and "acknowledged" in dead_run["message"]
    fifth = gpuwatch_on_box(tmp_path, box, "--once", "--fail-on", "info", config=config)
    assert fifth.returncode == 1
    with Store.open(tmp_path / "st" / "gpuwatch" / "gpuwatch.sqlite3") as store:
        records = {r.code: r for r in store.findings("local")}
        assert records["gpu.xid"].cleared_at is not None  # seen once, then cleared
        assert records["run.dead"].active and records["run.dead"].first_seen < \
            records["run.dead"].last_seen
        assert store.deaths("local")["llama"]["cause"] == "xid"
