"""gpuwatch --demo's fleet: simulated boxes over real SSH on loopback (remote/sim/fleet.py).

Each test starts its own fleet (a fraction of a second) with only the boxes it needs and a short
timeline, talks to it with asyncssh and with OpenSSH's ssh exactly as gpuwatch and a person would,
and checks at teardown that no process the fleet started is left.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.sim import trainer
from gpuwatch.remote.sim.fleet import BOX_NAMES, DemoFleet, Timeline, fleet_pids, scan_processes
from gpuwatch.remote.sim.sshserver import HANGUP_GRACE_S, SERVER_VERSION
from gpuwatch.remote.wire import bundle as probe_bundle
from harness.sshd import require_ssh
from harness.waiting import wait_for_async

FAST = Timeline(step_s=0.1, capped_step_s=0.2, save_every=5, capped_interval_s=0.3,
                oom_after_s=2.0, oom_save_every=5, disk_save_every=5,
                disk_fill_bytes_s=2e9, disk_checkpoint_bytes=5_000_000_000)
TICK_S = 0.2

StartFleet = Callable[..., Awaitable[DemoFleet]]


@pytest.fixture
async def start_fleet(tmp_path: Path) -> AsyncIterator[StartFleet]:
    """``await start_fleet("demo-oom", ...)``: a started fleet, stopped at teardown, after
    which none of its processes may be left (trainers, zombies, commands run over SSH)."""
    fleets: list[DemoFleet] = []
    async with contextlib.AsyncExitStack() as stack:
        async def start(*boxes: str, timeline: Timeline = FAST, tick_s: float = TICK_S,
                        ) -> DemoFleet:
            fleet = await stack.enter_async_context(DemoFleet.start(
                tmp_path / f"fleet{len(fleets)}", boxes=boxes or BOX_NAMES, tick_s=tick_s,
                timeline=timeline))
            fleets.append(fleet)
            return fleet

        yield start
    for fleet in fleets:
        assert fleet_pids(fleet.id) == [], "a process of the fleet outlived it"
        alive = [p for p in fleet.started_pids if _alive(p)]
        assert alive == [], f"processes the fleet started are still alive: {alive}"
        leftovers = [p.pid for p in scan_processes().values()
                     if any(str(fleet.root) in a for a in p.argv)]
        assert leftovers == [], f"processes still running from the fleet's folder: {leftovers}"


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:][:1] not in ("Z", "X")


def connect(fleet: DemoFleet, host: str, **kwargs: Any) -> Any:
    """asyncssh to a box through the fleet's ssh config (HostName, Port, User, IdentityFile,
    UserKnownHostsFile): the same files gpuwatch's config points at."""
    return asyncssh.connect(host, config=[str(fleet.ssh_config)], connect_timeout=10, **kwargs)


async def ssh(fleet: DemoFleet, *args: str, stdin: bytes = b"",
              limit_s: float = 30) -> tuple[int, bytes, bytes]:
    """OpenSSH's client with the fleet's ssh config, without blocking the fleet's loop."""
    proc = await asyncio.create_subprocess_exec(
        require_ssh(), "-F", str(fleet.ssh_config), *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), limit_s)
    assert proc.returncode is not None
    return proc.returncode, out, err


async def compute_apps(fleet: DemoFleet, host: str) -> dict[int, int]:
    """pid -> MiB, as the box's nvidia-smi answers over SSH."""
    async with connect(fleet, host) as conn:
        result = await conn.run("nvidia-smi --query-compute-apps=pid,used_memory "
                                "--format=csv,noheader,nounits", check=True)
    apps = {}
    for line in str(result.stdout).splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        apps[int(pid)] = int(mib)
    return apps


# --------------------------------------------------------------------------------------------
# The files gpuwatch and ssh read


async def test_writes_config_ssh_config_and_known_hosts(start_fleet: StartFleet) -> None:
    fleet = await start_fleet()
    assert fleet.hosts == list(BOX_NAMES)
    check_files(fleet)


def check_files(fleet: DemoFleet) -> None:
    config = parse_config(fleet.config_path.read_text(), fleet.config_path)
    assert [h.name for h in config.hosts] == list(BOX_NAMES)
    assert config.ssh.config_file == str(fleet.ssh_config)
    assert config.ssh.known_hosts == str(fleet.known_hosts)
    for host in config.hosts:
        assert host.ssh == host.name and host.disks == ("/", "/data")
        if host.name == "demo-driver":  # a wedged driver, no run: nothing could start there
            assert host.runs == ()
            continue
        assert len(host.runs) == 1
        run = host.runs[0]
        assert run.workdir and Path(run.workdir).is_dir()
        if host.name == "demo-zombie":
            assert run.process == "torchrun" and run.relaunch is None
        else:
            assert run.process and Path(run.process).is_file()
            assert run.relaunch and run.relaunch.endswith("--resume {latest_checkpoint}")
            assert run.detach == "setsid"
    for path in (fleet.ssh_config, fleet.known_hosts, fleet.client_key, fleet.config_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(fleet.ssh_config.parent.stat().st_mode) == 0o700
    known = fleet.known_hosts.read_text().splitlines()
    ports = {fleet.demo_box(name).port for name in fleet.hosts}
    assert len(known) == len(ports) == len(BOX_NAMES)
    assert {int(line.split()[0].split(":")[1]) for line in known} == ports
    assert all(line.startswith("[127.0.0.1]:") and " ssh-ed25519 " in line for line in known)
    text = fleet.ssh_config.read_text()
    for name in fleet.hosts:
        assert f"Host {name}\n" in text
        assert f"Port {fleet.demo_box(name).port}\n" in text
    assert text.count("StrictHostKeyChecking yes") == len(BOX_NAMES)
    assert text.count("IdentitiesOnly yes") == len(BOX_NAMES)


# --------------------------------------------------------------------------------------------
# The SSH server, with asyncssh as the client


async def test_exec_runs_in_the_box_environment(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-healthy")
    demo = fleet.demo_box("demo-healthy")
    async with connect(fleet, "demo-healthy") as conn:
        assert SERVER_VERSION in conn.get_extra_info("server_version")
        result = await conn.run('echo "$PATH"; pwd; echo "$GPUWATCH_SIM_DIR"; '
                                'echo "${GPUWATCH_PROCFS-unset}"; echo "$GPUWATCH_SYSFS"; '
                                'command -v nvidia-smi; exit 3')
    assert result.exit_status == 3
    path, cwd, sim, procfs, sysfs, smi = str(result.stdout).splitlines()
    assert path.split(":")[0] == str(demo.box.bin)
    assert cwd == str(demo.home)
    assert sim == str(demo.box.sim) and sysfs == str(demo.box.sys)
    assert procfs == str(demo.view.root)  # the box's own /proc: its real processes only
    assert smi == str(demo.box.bin / "nvidia-smi")


async def test_stdin_round_trips_binary_and_exit_signal(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-healthy")
    data = os.urandom(1 << 20)
    async with connect(fleet, "demo-healthy") as conn:
        result = await conn.run("cat", input=data, encoding=None)
        assert result.exit_status == 0
        assert result.stdout == data
        result = await conn.run("cat >&2; echo out", input=b"\x00err\xff", encoding=None)
        assert result.stderr == b"\x00err\xff" and result.stdout == b"out\n"
        result = await conn.run("kill -TERM $$")
        assert result.exit_signal is not None and result.exit_signal[0] == "TERM"


async def test_the_probe_runs_through_the_bootstrap(start_fleet: StartFleet) -> None:
    """The real probe, sent as gpuwatch sends it (compressed source on stdin), sees the box:
    its GPUs from the stand-in, the simulated /data from statvfs.json, the trainer's pid."""
    fleet = await start_fleet("demo-healthy")
    demo = fleet.demo_box("demo-healthy")
    run = demo.runs[0]
    await wait_for_async(lambda: demo.live.get(run.name), what="the trainer")
    request = {"v": 1, "disks": ["/", "/data"],
               "runs": [{"name": run.name, "process": str(run.script),
                         "checkpoints": str(run.workdir / "outputs/checkpoint-*")}]}
    async with connect(fleet, "demo-healthy") as conn:
        result = await conn.run(probe_bundle.build_command("python3"),
                                input=probe_bundle.build_stdin(request), encoding=None)
    assert result.exit_status == 0, result.stderr
    doc = json.loads(result.stdout)
    gpus = doc["gpus"]
    assert not gpus.get("error"), gpus
    disks = {d["path"]: d for d in doc["disks"]}
    assert disks["/data"]["bytes_total"] == demo.disks["/data"]["bytes_total"]
    assert disks["/data"]["inodes_free"] == demo.disks["/data"]["inodes_free"]
    assert doc["runs"][0]["pids"] == demo.live[run.name]


async def test_a_box_shows_its_own_proc_never_this_machines(start_fleet: StartFleet) -> None:
    """The simulated boxes showed THIS machine's hostname, load, CPU count and processes (a
    defunct [sshd] of someone's session as the box's zombie). The box's /proc is its own:
    its name, its load and CPUs, its real processes (and their reaper) only."""
    from gpuwatch.remote.wire.document import parse_probe_output

    fleet = await start_fleet("demo-healthy")
    demo = fleet.demo_box("demo-healthy")
    await wait_for_async(lambda: all(demo.live.get(r.name) for r in demo.runs), what="the trainers")
    # Popen, not asyncio's: asyncio's child watcher would reap `true` at once, and the test
    # needs it defunct (this machine's zombie) until it waits for it below.
    stranger = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220 (this machine's, not the box's)
    defunct = subprocess.Popen(["true"])  # noqa: ASYNC220
    await wait_for_async(lambda: Path(f"/proc/{defunct.pid}/stat").read_text().split(") ")[1][0]
                   == "Z", what="a defunct process on this machine")
    try:
        request = {"v": 1, "disks": ["/"], "runs": []}
        async with connect(fleet, "demo-healthy") as conn:
            result = await conn.run(probe_bundle.build_command("python3"),
                                    input=probe_bundle.build_stdin(request), encoding=None)
        snap = parse_probe_output(result.stdout, "demo-healthy")
    finally:
        stranger.kill()
        stranger.wait()
        defunct.wait()
    assert snap.hostname == "demo-healthy" != os.uname().nodename
    assert snap.ncpu == 52 and snap.loadavg is not None
    assert snap.loadavg[0] > 6  # two trainers, not this machine's load
    pids = {p.pid for p in snap.processes}
    assert stranger.pid not in pids and defunct.pid not in pids
    ours = set(fleet.processes())
    trainers = {pid for r in demo.runs for pid in demo.live[r.name]}
    assert trainers <= pids
    reapers = {p.ppid for p in snap.processes if p.pid in ours} - ours
    assert pids <= ours | reapers, pids - ours - reapers
    assert not [p for p in snap.processes if p.zombie or p.state == "Z"]
    assert snap.disks[0].bytes_total == demo.disks["/"]["bytes_total"]  # not this machine's /


async def test_the_capped_gpu_is_capped_from_the_first_poll(start_fleet: StartFleet,
                                                            tmp_path: Path) -> None:
    """demo-capped read `ok`, SM clock 100%, for its first ~10 s: now its first poll shows
    100% util at ~37% of max clock under sw_power_cap, and its second the finding (sustained
    over two polls, U21: never judged on one)."""
    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import poll_once

    fleet = await start_fleet("demo-capped", timeline=Timeline(), tick_s=1.0)
    demo = fleet.demo_box("demo-capped")
    # its GPU is loaded by its trainer: the first poll after the trainer is up (on a busy
    # machine the trainer's start can lag the fleet's; the poll then read an idle GPU)
    await wait_for_async(lambda: all(demo.live.get(r.name) for r in demo.runs),
                         what="demo-capped's trainer")
    config = load_file(fleet.config_path)
    with Store.open(tmp_path / "capped.sqlite3") as store:
        first = (await poll_once(config, store)).reports[0]
        second = (await poll_once(config, store)).reports[0]
    assert first.outcome.snapshot is not None
    (gpu,) = first.outcome.snapshot.gpus
    assert gpu.util_pct == 100 and gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz
    assert 0.34 <= gpu.sm_clock_mhz / gpu.sm_clock_max_mhz <= 0.40
    assert gpu.throttle_reasons is not None and "sw_power_cap" in gpu.throttle_reasons
    assert "gpu.util_without_clock" in {f.code for f in second.findings}


async def test_demo_mig_shows_its_instances_and_a_gpu_nothing_should_start_on(
        start_fleet: StartFleet, tmp_path: Path) -> None:
    """demo-mig polled as `--once` polls it, over SSH: the first poll says GPU 0 has MIG on
    (its reader comes with the next), the second reads its four instances with the
    fine-tune's pid in the 3g.40gb; GPU 1's lost data is its findings, and a relaunch plan
    keeps off it."""
    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.findings.gpu_health import unusable_gpus
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import poll_once

    fleet = await start_fleet("demo-mig")
    config = load_file(fleet.config_path)
    with Store.open(tmp_path / "mig.sqlite3") as store:
        await wait_for_run(fleet, config, store, "qwen-lora")
        report = (await poll_once(config, store)).reports[0]
    snap = report.outcome.snapshot
    assert snap is not None
    mig, broken = snap.gpus
    assert mig.mig is True and mig.util_pct is None
    assert [m.profile for m in mig.mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    (run,) = [r for r in snap.runs if r.name == "qwen-lora"]
    assert mig.mig_instances[0].pids == run.pids and run.pids
    assert all(m.pids == () for m in mig.mig_instances[1:])
    assert broken.remap is not None and broken.remap.pending is True
    codes = {f.code for f in report.findings}
    assert {"gpu.remap_pending", "gpu.ecc_uncorrected"} <= codes
    from gpuwatch.remote.model.history import HostHistory

    history = HostHistory("demo-mig")
    history.record(snap, time.time())
    assert set(unusable_gpus(history)) == {1}


async def wait_for_run(fleet: DemoFleet, config: Any, store: Any, name: str) -> None:
    """Poll until the run is seen alive (its trainer started) and the MIG reader has come."""
    from gpuwatch.tui.cli.once import poll_once

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report = (await poll_once(config, store)).reports[0]
        snap = report.outcome.snapshot
        if snap is not None and any(r.name == name and r.pids for r in snap.runs) and \
                snap.gpus and snap.gpus[0].mig_instances:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{name} never seen running with its MIG instances")


async def test_bounded_concurrency_queues_commands(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-healthy")

    async def one(i: int) -> str:
        async with connect(fleet, "demo-healthy") as conn:
            result = await conn.run(f"sleep 0.2; echo {i}", check=True)
            return str(result.stdout).strip()

    t0 = time.monotonic()
    answers = await asyncio.gather(*(one(i) for i in range(12)))
    assert answers == [str(i) for i in range(12)]
    assert time.monotonic() - t0 >= 0.4  # 8 at a time: two rounds of 0.2 s at least


async def test_shell_is_refused_politely(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-healthy")
    async with connect(fleet, "demo-healthy") as conn:
        result = await conn.run()  # a shell session, no command
        assert result.exit_status == 1
        assert "no interactive shell" in str(result.stderr)
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.start_sftp_client()


async def test_wrong_key_wrong_user_and_unknown_host_key_are_refused(
        start_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = await start_fleet("demo-healthy", "demo-capped")
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        async with connect(fleet, "demo-healthy", client_keys=[stranger]):
            pass
    with pytest.raises(asyncssh.PermissionDenied):
        async with connect(fleet, "demo-healthy", username="someone-else"):
            pass
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with connect(fleet, "demo-healthy", known_hosts=str(empty)):
            pass
    # demo-capped's key recorded for demo-healthy's port: a changed host key.
    lines = fleet.known_hosts.read_text().splitlines()
    healthy_port = fleet.demo_box("demo-healthy").port
    capped_port = fleet.demo_box("demo-capped").port
    capped_key = next(line for line in lines if f":{capped_port} " in line).split(" ", 1)[1]
    swapped = tmp_path / "swapped_known_hosts"
    swapped.write_text(f"[127.0.0.1]:{healthy_port} {capped_key}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with connect(fleet, "demo-healthy", known_hosts=str(swapped)):
            pass


async def _sleepers(fleet: DemoFleet, seconds: str) -> list[int]:
    return [pid for pid in fleet_pids(fleet.id)
            if (p := scan_processes().get(pid)) and p.argv[-2:] == ("sleep", seconds)]


@pytest.mark.parametrize("how", ["close_channel", "drop_connection"])
async def test_a_closed_channel_takes_its_command_along(start_fleet: StartFleet,
                                                        how: str) -> None:
    fleet = await start_fleet("demo-healthy")
    seconds = "311" if how == "close_channel" else "312"
    conn = await connect(fleet, "demo-healthy")
    try:
        # The shell stays (two commands), so both it and its child must go.
        proc = await conn.create_process(f"sleep {seconds}; echo never")
        found = await wait_for_async(lambda: [pid for pid in fleet_pids(fleet.id)
                                              if scan_processes().get(pid, None) is not None
                                              and scan_processes()[pid].argv
                                              == ("sleep", seconds)],
                                     what="the remote sleep")
        shell = scan_processes()[found[0]].ppid
        if how == "close_channel":
            proc.close()
        else:
            conn.abort()
        await wait_for_async(lambda: not _alive(found[0]) and not _alive(shell),
                             what="the command to end")
    finally:
        conn.close()


@pytest.mark.parametrize("detach", ["setsid nohup", "nohup", ""])
async def test_what_a_finished_command_started_lives_on(start_fleet: StartFleet,
                                                         detach: str) -> None:
    """As with OpenSSH without a pty: the command finished, so nothing is hung up."""
    fleet = await start_fleet("demo-healthy")
    async with connect(fleet, "demo-healthy") as conn:
        result = await conn.run(f"{detach} sleep 313 > /dev/null 2>&1 < /dev/null & echo $!",
                                check=True)
    pid = int(str(result.stdout).split()[0])
    await asyncio.sleep(HANGUP_GRACE_S + 0.5)
    assert _alive(pid)  # the fleet ends it at exit (checked by the fixture)


# --------------------------------------------------------------------------------------------
# The same with OpenSSH's client


async def test_openssh_client(start_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = await start_fleet("demo-healthy")
    rc, out, err = await ssh(fleet, "demo-healthy",
                             "echo hi; nvidia-smi --query-gpu=index,utilization.gpu --format=csv")
    assert rc == 0, err
    lines = out.decode().splitlines()
    assert lines[:2] == ["hi", "index, utilization.gpu [%]"]
    assert lines[2].startswith("0, ") and lines[2].endswith(" %")
    assert b"SIMULATED GPU box" in err  # the login banner says what it is

    data = os.urandom(1 << 20)
    rc, out, _ = await ssh(fleet, "demo-healthy", "cat", stdin=data)
    assert rc == 0 and out == data
    rc, _, _ = await ssh(fleet, "demo-healthy", "exit 7")
    assert rc == 7

    rc, _, err = await ssh(fleet, "demo-healthy")  # no command: a shell, refused politely
    assert rc == 1 and b"no interactive shell" in err

    other = tmp_path / "other_key"
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    stranger.write_private_key(other)
    other.chmod(0o600)
    # `ssh -i` would only add a key to the config's own: a config naming the stranger's key.
    lines = [line for line in fleet.ssh_config.read_text().splitlines()
             if "IdentityFile" not in line]
    no_key = tmp_path / "ssh_config_wrong_key"
    no_key.write_text("\n".join(lines).replace("IdentitiesOnly yes",
                                               f"IdentitiesOnly yes\n    IdentityFile {other}"))
    proc = await asyncio.create_subprocess_exec(
        require_ssh(), "-F", str(no_key), "demo-healthy", "true",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 255 and b"Permission denied (publickey)" in err

    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    rc, _, err = await ssh(fleet, "-o", f"UserKnownHostsFile={empty}", "demo-healthy", "true")
    assert rc == 255 and b"Host key verification failed" in err


# --------------------------------------------------------------------------------------------
# The scenarios


def fleet_config_runs(fleet: DemoFleet, host: str) -> list[str]:
    """The runs the fleet's gpuwatch config names for host."""
    data = tomllib.loads(fleet.config_path.read_text())
    return list(data["hosts"][host].get("runs", {}))


async def test_healthy_trainer_writes_events_tensorboard_reads(start_fleet: StartFleet) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    fleet = await start_fleet("demo-healthy")
    demo = fleet.demo_box("demo-healthy")
    run = demo.runs[0]
    outputs = run.workdir / "outputs"
    await wait_for_async(lambda: (outputs / "checkpoint-10").is_dir(), what="checkpoint-10")
    pid = demo.live[run.name][0]
    sft = demo.runs[1]  # the run the config leaves out, for discovery, on GPU 1
    assert not sft.configured and sft.name not in fleet_config_runs(fleet, "demo-healthy")
    await wait_for_async(lambda: demo.live.get(sft.name), what="the sft trainer")
    apps = await compute_apps(fleet, "demo-healthy")
    assert apps.keys() == {pid, demo.live[sft.name][0]}
    gpu = demo.box.gpus[0]
    assert gpu["utilization.gpu"] >= 90 and gpu["clocks.current.sm"] >= 1900

    files = sorted((run.workdir / "runs").glob("events.out.tfevents.*"))
    assert len(files) == 1
    points: dict[int, float] = {}
    versions = []
    for event in EventFileLoader(str(files[0])).Load():
        if event.file_version:
            versions.append(event.file_version)
        for value in event.summary.value:
            if value.tag == "train/loss":
                number = (value.simple_value if value.HasField("simple_value")
                          else value.tensor.float_val[0])
                points[event.step] = number
    assert versions == ["brain.Event:2"]
    assert len(points) >= 10 and min(points) == 1
    for step, value in points.items():  # float32 of the trainer's own curve, step by step
        assert value == pytest.approx(trainer.loss_at(step, 1234), rel=1e-6)
    assert trainer.loss_at(2000, 1234) < trainer.loss_at(10, 1234) - 1.5  # it learns
    state = json.loads((outputs / "checkpoint-10" / "trainer_state.json").read_text())
    assert state["global_step"] == 10
    assert not list(outputs.glob("*.tmp"))
    log = run.log.read_text()
    assert "starting a new run" in log and "saved checkpoint" in log


async def test_capped_gpu_is_busy_at_a_third_of_its_clock(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-capped")
    demo = fleet.demo_box("demo-capped")
    await wait_for_async(lambda: demo.box.gpus[0].get("clocks_event_reasons.active") == 0x4,
                         what="sw_power_cap")
    async with connect(fleet, "demo-capped") as conn:
        result = await conn.run(
            "nvidia-smi --query-gpu=utilization.gpu,clocks.sm,clocks.max.sm,power.draw,"
            "power.limit,clocks_event_reasons.sw_power_cap --format=csv,noheader,nounits",
            check=True)
    util, sm, sm_max, power, limit, cap = (x.strip() for x in str(result.stdout).split(","))
    assert float(util) == 100
    assert 0.34 <= int(sm) / int(sm_max) <= 0.40
    assert float(limit) == 250.0 and float(power) >= 0.98 * float(limit)
    assert cap == "Active"


async def test_reaping_the_zombie_frees_its_vram(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-zombie")
    demo = fleet.demo_box("demo-zombie")
    zombie = demo.zombie_pid
    assert zombie is not None and _alive(zombie)
    # Its pid exists from the fork; its /proc cmdline only once it has exec'd (seen empty
    # once under load: a KeyError here).
    await wait_for_async(lambda: zombie in scan_processes(), what="the zombie to exec")
    proc = scan_processes()[zombie]
    assert proc.ppid != os.getpid()  # its launcher is gone: an orphan
    assert "--local_rank=3" in proc.argv
    for _ in range(20):  # the stand-in driver lists it from the fleet's next tick
        apps = await compute_apps(fleet, "demo-zombie")
        if zombie in apps:
            break
        await asyncio.sleep(TICK_S)
    assert list(apps) == [zombie] and apps[zombie] > 30_000
    assert demo.box.gpus[3]["memory.used"] == 38_912
    assert demo.live["bert-ddp"] == []  # no live run owns it

    async with connect(fleet, "demo-zombie") as conn:
        result = await conn.run(f"kill -TERM {zombie}")
    assert result.exit_status == 0
    await wait_for_async(lambda: not _alive(zombie), what="the zombie to die")
    await asyncio.sleep(2 * TICK_S + 0.1)
    assert await compute_apps(fleet, "demo-zombie") == {}
    assert demo.box.gpus[3]["memory.used"] == 0


async def test_oom_kill_then_relaunch_over_ssh(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-oom")
    demo = fleet.demo_box("demo-oom")
    run = demo.runs[0]
    first = demo.first_pid
    assert first is not None
    await wait_for_async(lambda: demo.box.cgroup["events"]["oom_kill"] == 1,
                         what="the OOM kill")
    await wait_for_async(lambda: not _alive(first), what="the victim to die")
    assert any(f"Memory cgroup out of memory: Killed process {first} (python3)" in line
               for line in demo.box.dmesg_lines)
    events = (demo.box.sys / "fs/cgroup/memory.events").read_text()
    assert "oom_kill 1\n" in events
    await asyncio.sleep(2 * TICK_S + 0.1)
    assert await compute_apps(fleet, "demo-oom") == {}
    assert demo.box.gpus[0]["utilization.gpu"] == 0

    # The probe sees the kill where gpuwatch looks: the cgroup counter and the kernel log.
    request = {"v": 1, "disks": ["/"], "runs": []}
    async with connect(fleet, "demo-oom") as conn:
        result = await conn.run(probe_bundle.build_command("python3"),
                                input=probe_bundle.build_stdin(request), encoding=None)
    doc = json.loads(result.stdout)
    assert doc["cgroup"]["memory_events"]["oom_kill"] == 1, doc["cgroup"]
    assert str(first) in json.dumps(doc["kernel"])

    # Relaunch as gpuwatch does: the configured command, {latest_checkpoint} filled in,
    # detached with setsid nohup, its output appended to the log, in a call of its own.
    config = parse_config(fleet.config_path.read_text())
    run_config = config.hosts[0].runs[0]
    assert run_config.relaunch is not None
    latest = max((run.workdir / "outputs").glob("checkpoint-*[0-9]"),
                 key=lambda p: int(p.name.rsplit("-", 1)[1]))
    command = run_config.relaunch.replace("{latest_checkpoint}", shlex.quote(str(latest)))
    line = (f"cd {shlex.quote(str(run.workdir))} && PYTHONUNBUFFERED=1 setsid nohup {command} "
            f">> {shlex.quote(str(run.log))} 2>&1 < /dev/null & echo $!")
    async with connect(fleet, "demo-oom") as conn:
        result = await conn.run(line, check=True)
    new = int(str(result.stdout).split()[0])
    await asyncio.sleep(HANGUP_GRACE_S + 0.5)  # past the hangup of the channel's group
    assert _alive(new), run.log.read_text()[-1500:]
    assert new != first
    assert fleet.run_pids("demo-oom", run.name) == [new]
    await wait_for_async(lambda: demo.live.get(run.name) == [new], what="the controller")
    await asyncio.sleep(TICK_S + 0.1)
    assert (await compute_apps(fleet, "demo-oom")).keys() == {new}
    step = int(latest.name.rsplit("-", 1)[1])
    assert f"resuming from {latest} at step {step}" in run.log.read_text()
    # Past the first run's OOM time: it does not happen again.
    await asyncio.sleep(FAST.oom_after_s + 0.5)
    assert _alive(new) and demo.box.cgroup["events"]["oom_kill"] == 1


async def test_disk_fills_toward_full(start_fleet: StartFleet) -> None:
    fleet = await start_fleet("demo-disk", "demo-healthy")
    demo = fleet.demo_box("demo-disk")
    path = demo.box.sim / "statvfs.json"
    first = json.loads(path.read_text())["/"]  # the run lives on /, and / fills
    assert set(first) == {"bytes_total", "bytes_free", "inodes_total", "inodes_free"}
    assert all(isinstance(v, int) for v in first.values())
    await wait_for_async(lambda: (demo.runs[0].workdir / "outputs/checkpoint-10").is_dir(),
                         what="two checkpoints")
    await asyncio.sleep(TICK_S + 0.1)
    later = json.loads(path.read_text())["/"]
    assert later["bytes_total"] == first["bytes_total"]
    assert later["bytes_free"] <= first["bytes_free"] - 2 * FAST.disk_checkpoint_bytes
    assert later["inodes_free"] < first["inodes_free"]
    steady = json.loads((fleet.box("demo-healthy").sim / "statvfs.json").read_text())
    assert steady["/data"]["bytes_free"] / steady["/data"]["bytes_total"] > 0.3


async def test_the_low_disk_sizes_the_next_checkpoint_from_the_runs_own(
        start_fleet: StartFleet, tmp_path: Path) -> None:
    """The disk evidence said "next checkpoint 0 B" beside 132 KiB checkpoints: demo-disk's
    run keeps them on the / that fills, and disk.low sizes the next save from them."""
    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import poll_once

    fleet = await start_fleet("demo-disk")
    run = fleet.demo_box("demo-disk").runs[0]
    await wait_for_async(lambda: (run.workdir / "outputs/checkpoint-10").is_dir(),
                   what="two checkpoints")
    with Store.open(tmp_path / "disk.sqlite3") as store:
        report = (await poll_once(load_file(fleet.config_path), store)).reports[0]
    low = next(f for f in report.findings if f.code == "disk.low")
    sizes = [sum(f.stat().st_size for f in c.rglob("*") if f.is_file())
             for c in (run.workdir / "outputs").glob("checkpoint-*")]
    assert low.subject == "/" and low.evidence["next_checkpoint_bytes"] >= 128 << 10
    assert low.evidence["next_checkpoint_bytes"] <= max(sizes)


async def test_a_root_is_reused_only_if_it_was_a_demo_root(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    async with DemoFleet.start(root, boxes=["demo-healthy"], tick_s=TICK_S,
                               timeline=FAST) as fleet:
        await wait_for_async(lambda: (fleet.demo_box("demo-healthy").runs[0].workdir
                                      / "outputs/checkpoint-5").is_dir(), what="a checkpoint")
    async with DemoFleet.start(root, boxes=["demo-healthy"], tick_s=TICK_S,
                               timeline=FAST) as again:  # afresh: no old checkpoints
        outputs = again.demo_box("demo-healthy").runs[0].workdir / "outputs"
        assert not list(outputs.glob("checkpoint-*"))
    assert fleet_pids(again.id) == []
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    with pytest.raises(ValueError, match="not empty"):
        async with DemoFleet.start(foreign, boxes=["demo-healthy"]):
            pass
    assert (foreign / "thesis.tex").read_text() == "do not delete"


async def test_everything_stops_on_cancellation(tmp_path: Path) -> None:
    """A task serving the fleet that is cancelled (Ctrl-C) still ends every process."""
    started: list[DemoFleet] = []
    ready = asyncio.Event()

    async def serve() -> None:
        async with DemoFleet.start(tmp_path / "f", boxes=["demo-zombie", "demo-healthy"],
                                   tick_s=TICK_S, timeline=FAST) as fleet:
            started.append(fleet)
            ready.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(serve())
    await asyncio.wait_for(ready.wait(), 10)
    fleet = started[0]
    pids = fleet_pids(fleet.id)
    assert len(pids) == 3  # demo-healthy's two trainers and the zombie
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fleet_pids(fleet.id) == []
    assert not any(_alive(p) for p in pids)


# --------------------------------------------------------------------------------------------
# The trainer runs on any box: stdlib only, Python 3.6+


def test_trainer_is_stdlib_only_and_python36() -> None:
    source = Path(trainer.__file__).read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top == "crc32c", name
            assert top != "__future__"
    vermin = shutil.which("vermin") or str(Path(sys.executable).with_name("vermin"))
    if not Path(vermin).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("vermin is not installed (pip install -e .[test])")
        pytest.skip("vermin is not installed")
    result = subprocess.run([vermin, "-t=3.6-", "--no-tips", "--violations", trainer.__file__],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_trainer_crc32c_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer, "_crc32c_module", None)
    assert trainer.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    data = os.urandom(4096)
    pure = trainer.masked_crc32c(data)
    monkeypatch.undo()
    assert trainer.masked_crc32c(data) == pure


DEMO_FINDINGS = {  # what each box of the demo is there to show (README), and must within a minute
    "demo-capped": "gpu.util_without_clock",
    "demo-zombie": "gpu.vram_zombie",
    "demo-oom": "run.dead",
    "demo-disk": "disk.low",
    "demo-driver": "gpu.driver_mismatch",
    "demo-mig": "gpu.remap_pending",
}


async def test_every_demo_scenario_raises_its_finding_within_a_minute(
        start_fleet: StartFleet, tmp_path: Path) -> None:
    """The demo's disk box said "nothing wrong" beside a disk at 99% (its simulated
    /data was deduplicated with the real / by mount). Polled as `--once` polls (the same
    collector, judge and store), each scenario's finding must show, and the healthy box must
    raise nothing critical."""
    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import poll_once

    # The demo's own pace but for the OOM (its trainer must be seen alive before it dies)
    fleet = await start_fleet(timeline=replace(FAST, oom_after_s=12.0), tick_s=0.5)
    config = load_file(fleet.config_path)
    assert set(DEMO_FINDINGS) < {h.name for h in config.hosts}
    seen: dict[str, set[str]] = {h.name: set() for h in config.hosts}
    started = time.monotonic()
    with Store.open(tmp_path / "demo-check.sqlite3") as store:
        while time.monotonic() - started < 60:
            result = await poll_once(config, store)
            for report in result.reports:
                assert report.outcome.ok, (report.name, report.outcome.error_message)
                seen[report.name] |= {f.code for f in report.findings}
                if report.name == "demo-healthy":
                    assert not [f for f in report.findings if f.severity.label == "critical"]
            if all(code in seen[host] for host, code in DEMO_FINDINGS.items()):
                break
            await asyncio.sleep(1.0)
    missing = {h: c for h, c in DEMO_FINDINGS.items() if c not in seen[h]}
    assert not missing, (missing, seen)
    # the real demo's OOM, too, comes within its first 30 s, after polls that saw it alive
    assert 3 * 2 < Timeline().oom_after_s <= 20
