"""The discover module goes up only when a poll needs it (bytes up per poll, U15).

A host's first poll sends it; the answer carries what discovery found, and the following polls
send that back instead of the module: the probe checks that discovery would find the same
(probe.reuse_discovery) and reads each run from the paths the client remembers. When it cannot
tell (a run started or ended, a process that could be a remembered run, a reboot) it says so
and the Collector polls again at once with the module; a run's folder due for a search is
searched by the next poll, which sends the module.

Every poll here goes through the real Collector to a `local` host whose interpreter is a
wrapper pointing the probe at tests/harness/probe_box.py's fixture 8-GPU box, and each answer
given without the module is compared with the module's answer to the same request on the same
box: the runs, their pids and status, the process table's run column and the client's merged
view of how each run was found must be the same.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.series import RunSeries
from gpuwatch.remote.model.snapshot import HostSnapshot
from gpuwatch.remote.wire import collect
from gpuwatch.remote.wire.bundle import (
    CGROUP_V1,
    KERNEL,
    METRICS,
    MIG,
    NVML,
    POPEN,
    RUN_FILES,
    SMI,
    build_command,
    build_stdin,
    modules_for,
)
from gpuwatch.remote.wire.collect import Collector, PollOutcome
from gpuwatch.remote.wire.document import parse_probe_output
from harness.probe_box import Box, build_box

DISCOVER = "gpuwatch_discover"


class Rig:
    """The fixture box, a Collector polling it as a `local` host, and the host's history."""

    def __init__(self, box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.box = box
        wrapper = tmp_path / "python-on-the-box"
        wrapper.write_text("#!/bin/sh\n" + "".join(
            f"export {k}={shlex.quote(v)}\n" for k, v in box.env().items())
            + f'exec {shlex.quote(sys.executable)} "$@"\n')
        wrapper.chmod(0o755)
        self.python = str(wrapper)
        self.host = HostConfig("box", "local", python=self.python, disks=())
        self.collector = Collector()
        # a machine with a real driver must still read the stand-in nvidia-smi
        self.collector._hints["box"] = {"want": {"nvml": False}}
        self.history = HostHistory("box")
        self.sent: list[dict[str, Any]] = []  # the requests of each exec of the last poll

        def spy(request: dict[str, Any], *, trim: bool = False) -> bytes:
            self.sent.append(request)
            return build_stdin(request, trim=trim)

        monkeypatch.setattr(collect, "build_stdin", spy)

    def poll(self) -> PollOutcome:
        self.sent = []
        before = {name: s.state() for name, s in self.history.runs.items()}
        outcome = asyncio.run(self.collector.poll(self.host, self.history.runs))
        assert outcome.ok, outcome.error_message
        assert outcome.snapshot is not None
        assert "discovered" not in outcome.snapshot.section_errors
        self.history.record(outcome.snapshot, outcome.ended_at)
        self.check_against_the_module(before, outcome.snapshot)
        return outcome

    @property
    def shipped(self) -> list[tuple[str, ...]]:
        """What each exec of the last poll sent up with the probe."""
        return [modules_for(request) for request in self.sent]

    def module_answer(self, request: dict[str, Any]) -> HostSnapshot:
        """The discover module's answer to the same request (without the reuse) on the box as
        it is now."""
        import subprocess

        request = {k: v for k, v in request.items() if k != "discovery_reuse"}
        assert DISCOVER in modules_for(request)
        out = subprocess.run(["/bin/sh", "-c", build_command(self.python)],
                             input=build_stdin(request, trim=True), capture_output=True,
                             check=True, timeout=60).stdout
        return parse_probe_output(out, "box")

    def check_against_the_module(self, before: dict[str, Any], got: HostSnapshot) -> None:
        """What the person sees from this poll equals what the module's answer gives (but for
        a search that was due: the next poll does it)."""
        truth = self.module_answer(self.sent[-1])
        assert _runs(got) == _runs(truth)
        assert _table(got) == _table(truth)
        if got.discovery_need == "next":
            return
        mine, theirs = HostHistory("box"), HostHistory("box")  # the runs as they were
        for history in (mine, theirs):
            history.runs.update((n, RunSeries.from_state(n, s)) for n, s in before.items())
        mine.record(got, 1.0)
        theirs.record(truth, 1.0)
        assert _view(mine) == _view(theirs)


def _runs(snapshot: HostSnapshot) -> dict[str, Any]:
    return {r.name: (r.pids, r.discovered is not None and r.discovered.alive)
            for r in snapshot.runs}


def _table(snapshot: HostSnapshot) -> dict[int, str | None]:
    return {p.pid: p.run for p in snapshot.processes}


def _view(history: HostHistory) -> dict[str, Any]:
    """Each run as the client keeps it (when a search ran: not its clock and its duration)."""
    return {name: (s.status, s.pids, s.discovery and replace(s.discovery, searched_at=None,
                                                              search_s=None))
            for name, s in history.runs.items()}


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    return Rig(build_box(tmp_path / "box"), tmp_path, monkeypatch)


def doc_of(outcome: PollOutcome) -> dict[str, Any]:
    assert outcome.doc is not None
    return json.loads(zlib.decompress(outcome.doc))


def test_the_second_poll_of_an_unchanged_box_sends_no_discover_module(rig: Rig) -> None:
    first = rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [True]
    assert sorted(r.name for r in first.snapshot.runs) == ["evil-name-x", "pretrain", "train"]
    for _ in range(2):
        steady = rig.poll()
        # one exec, without the module (and without the event decoder: no run reads events)
        # ... its GPU 2 has MIG on (its reader goes), its dmesg has Xids
        assert rig.shipped == [("gpuwatch_probe", SMI, RUN_FILES, MIG, KERNEL)]
        assert "discovery_reuse" in rig.sent[0]
        assert steady.snapshot.discovery_need is None
        # ... and still the same runs, alive, with their processes
        assert _runs(steady.snapshot) == _runs(first.snapshot)
        assert list(rig.history.runs["pretrain"].pids) == [920, 921, 922, 923, 924, 925, 926,
                                                           927, 930]
        assert rig.history.runs["pretrain"].discovery.kind == "torchrun"  # kept from poll 1
        assert steady.bytes_sent < first.bytes_sent - 8 * 1024


def test_a_box_without_runs_gets_the_probe_without_its_run_files_part(rig: Rig) -> None:
    for pid in (830, 920, 1100):  # the three runs' launchers, and their trees with them
        shutil.rmtree(rig.box.proc / str(pid))
    for pid in (921, 922, 923, 924, 925, 926, 927, 930, 1000):
        shutil.rmtree(rig.box.proc / str(pid))
    rig.collector = Collector()
    rig.collector._hints["box"] = {"want": {"nvml": False}}
    rig.poll()  # the first: the box's python version not known yet, the part for < 3.8 goes
    assert rig.shipped == [("gpuwatch_tfevents", DISCOVER, "gpuwatch_probe", SMI, RUN_FILES,
                            METRICS, POPEN, CGROUP_V1, KERNEL)]
    outcome = rig.poll()
    assert rig.shipped == [("gpuwatch_probe", SMI, MIG, KERNEL)]  # MIG on GPU 2, Xid lines
    # 16 KB, and the MIG reader (1.7 KB) this box's GPU 2 calls for
    assert outcome.snapshot.runs == () and outcome.bytes_sent < 18 * 1024


def test_new_dataloader_workers_need_no_module(rig: Rig) -> None:
    rig.poll()
    # a worker forked by rank 2 inherits its GPU file descriptors: a new holder, in the run
    rig.box.process(931, "pt_data_worker", 922, uid=1000, session=910,
                    cmd=["/usr/bin/python3.10", "-u", "pretrain.py", "--resume"],
                    fds=("/dev/nvidiactl", "/dev/nvidia2"))
    outcome = rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False]
    assert 931 in outcome.snapshot.runs[[r.name for r in outcome.snapshot.runs].index(
        "pretrain")].pids


def test_a_new_run_is_found_in_the_same_poll(rig: Rig) -> None:
    rig.poll()
    rig.poll()
    rig.box.process(1400, "python3", 1, uid=1000, cmd=["python3", "finetune.py"],
                    fds=("/dev/nvidia4",), start=900_000)
    outcome = rig.poll()
    # the probe could not vouch for the last discovery: polled again at once with the module
    assert [DISCOVER in parts for parts in rig.shipped] == [False, True]
    assert "finetune" in _runs(outcome.snapshot)
    assert outcome.snapshot.discovery_reuse is not None  # the next poll goes without again
    rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False]


def test_an_ended_run_is_dead_and_its_relaunch_is_found_before_it_holds_a_gpu(
        rig: Rig) -> None:
    rig.poll()
    for pid in (920, 921, 922, 923, 924, 925, 926, 927, 930, 1000):
        shutil.rmtree(rig.box.proc / str(pid))
    rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False, True]
    assert rig.history.runs["pretrain"].status == "dead"
    rig.poll()  # a steady box with a dead run remembered
    assert [DISCOVER in parts for parts in rig.shipped] == [False]
    # relaunched: a launcher with the remembered (cwd, script), no GPU opened yet; a look-alike
    # the probe cannot judge without the module (discover.group's search by key)
    rig.box.process(1500, "torchrun", 910, uid=1000, session=910, start=950_000,
                    cmd=["/usr/bin/python3.10", "/usr/local/bin/torchrun", "--nproc_per_node",
                         "7", "pretrain.py", "--resume"])
    outcome = rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False, True]
    assert _runs(outcome.snapshot)["pretrain"] == ((1500,), True)


def test_a_folder_due_for_a_search_is_searched_by_the_next_poll(rig: Rig) -> None:
    rig.collector._hints["box"]["limits"] = {"discover_every_s": 0.001}
    rig.poll()
    outcome = rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False]  # not polled again at once
    assert outcome.snapshot.discovery_need == "next"
    rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [True]


def test_a_reboot_needs_the_module(rig: Rig) -> None:
    rig.poll()
    rig.box.write("proc/sys/kernel/random/boot_id", "0c6f4f4e-9d51-4a5b-8a43-3b0f1e5d7c21\n")
    rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False, True]


def test_a_failed_poll_keeps_the_last_discovery(rig: Rig) -> None:
    rig.poll()
    reuse = rig.collector._discovery["box"]
    good = rig.host
    rig.host = HostConfig("box", "local", python="python3-not-installed", disks=())
    rig.sent = []
    outcome = asyncio.run(rig.collector.poll(rig.host, rig.history.runs))
    assert not outcome.ok and rig.collector._discovery["box"] == reuse
    rig.host = good
    rig.poll()
    assert [DISCOVER in parts for parts in rig.shipped] == [False]


def test_a_module_left_out_is_never_looked_for_on_the_box(rig: Rig, tmp_path: Path) -> None:
    """The probe loads a shipped module from what the loader installed, never from the box's
    disk: a `discover.py` in the working folder of the login is not run."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "discover.py").write_text("raise SystemExit('imported from disk')\n")
    (tmp_path / "home" / "gpuwatch_discover.py").write_text("raise SystemExit('from disk')\n")
    request = {"v": 1, "disks": [], "want": {"nvml": False}, "discovery_reuse": {"boot": 0}}
    import subprocess

    out = subprocess.run(["/bin/sh", "-c", build_command(rig.python)], cwd=tmp_path / "home",
                         input=build_stdin(request, trim=True), capture_output=True,
                         check=True, timeout=60).stdout
    doc = json.loads(out)
    assert doc["discovery"]["need"] == "now"
    assert "no discover module sent" in doc["errors"]["discovered"]


def test_what_the_box_said_keeps_parts_it_does_not_need_off_the_wire(rig: Rig) -> None:
    """The first poll sends every part the box might need; from the second on, what
    it said (python 3.8+, cgroup v2, no Xid or OOM line in its kernel log) leaves the part for
    older Pythons, the cgroup v1 reader and the kernel log's parser behind. The first Xid
    after that comes raw and is read all the same, and brings the parser back."""
    rig.box.tool("dmesg", "echo '[    0.045121] Memory: 2029476K/2096632K available'\n")
    rig.poll()
    assert {POPEN, CGROUP_V1, KERNEL} <= set(rig.shipped[0])
    rig.poll()
    assert rig.shipped == [("gpuwatch_probe", SMI, RUN_FILES, MIG)]
    xid = "[ 9999.000001] NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen"
    rig.box.tool("dmesg", f"echo '{xid} off the bus'\n")
    outcome = rig.poll()
    assert rig.shipped == [("gpuwatch_probe", SMI, RUN_FILES, MIG)]  # the parser stayed home
    assert outcome.snapshot is not None and outcome.snapshot.kernel_lines == 1
    (event,) = outcome.snapshot.kernel_events
    assert event.kind == "xid" and event.xid == 79 and outcome.snapshot.xid_counts == {79: 1}
    rig.poll()
    assert rig.shipped == [("gpuwatch_probe", SMI, RUN_FILES, MIG, KERNEL)]


def test_a_cron_once_resumes_what_the_last_run_learnt_from_the_store(
        rig: Rig, tmp_path: Path) -> None:
    """Each `--once` is a new process with a new Collector; what the last one learnt
    of the box (its discovery, python, cgroups, kernel log, pynvml) comes from the store, so
    the second run sends a steady poll's bytes, not a first poll's (and reads the same)."""
    from gpuwatch.remote.config.schema import Config
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import poll_once

    rig.box.tool("dmesg", "echo '[    0.045121] Memory: 2029476K/2096632K available'\n")
    config = Config(hosts=(rig.host,))
    store = Store.open(tmp_path / "state.sqlite")
    first = asyncio.run(poll_once(config, store))
    assert DISCOVER in rig.shipped[0] and {POPEN, CGROUP_V1, KERNEL} <= set(rig.shipped[0])
    rig.sent = []
    second = asyncio.run(poll_once(config, store))
    # NVML goes on: this python imports pynvml (nvidia-ml-py, a dependency), as a box's may
    # (and fails here, no driver: nvidia-smi read the GPUs, so its reader goes too)
    assert rig.shipped == [("gpuwatch_probe", SMI, RUN_FILES, NVML, MIG)], rig.shipped
    names = [sorted(r["name"] for r in result.reports[0].runs) for result in (first, second)]
    assert names[0] == names[1] == ["evil-name-x", "pretrain", "train"]
    carried = store.host_state("box").counters["collector"]
    assert carried["hints"]["kernel_lines"] == 0 and "discovery" in carried
    # a damaged memory is dropped, not fatal: that run polls like a first one again
    store.record_poll("box", taken_at=time.time(), ok=True, doc=None,
                      counters={"collector": {"hints": ["not", "a", "dict"], "discovery": 7}})
    rig.sent = []
    third = asyncio.run(poll_once(config, store))
    assert DISCOVER in rig.shipped[0] and third.reports[0].outcome.ok
    store.close()


def test_what_a_collector_carries_is_dropped_when_the_host_is_another_box() -> None:
    """The store keeps what a poll learnt of a host under its name; when the config points that
    name at another box or interpreter, none of it is taken back (a wrong hint would cost a
    poll: a cron interval for `--once`)."""
    first = Collector()
    host = HostConfig("gpu1", "alice@box1", python="python3")
    first._hints["gpu1"] = {"spawn": True, "cgroup": 2, "kernel_lines": 0, "want": {"x": 1}}
    first._discovery["gpu1"] = {"runs": []}
    memory = first.memory(host)
    assert memory["hints"] == {"spawn": True, "cgroup": 2, "kernel_lines": 0}  # no "want"
    same = Collector()
    same.restore(host, memory)
    assert same.memory(host) == memory
    for other in (HostConfig("gpu1", "alice@box2", python="python3"),
                  HostConfig("gpu1", "alice@box1", python="/opt/py3.7/bin/python")):
        fresh = Collector()
        fresh.restore(other, memory)
        assert fresh.memory(other) == {"of": [other.ssh, other.python]}

