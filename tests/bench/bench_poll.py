"""Poll figures against a real sshd: `.venv/bin/python -m pytest tests/bench/bench_poll.py -s`.

Prints, from one run against one sshd on loopback serving a simulated 8-GPU box, each figure
beside its target (pass/miss). Nothing here asserts a wall time.

- a poll's wall time against the floor: asyncssh connect + run('true') + close (plain asyncssh,
  no gpuwatch code), plus the probe's own run time (the document's probe_s);
- the client's CPU per poll (time.process_time around sequential polls in this process);
- the probe's CPU on the box: the document's cpu_s (its main(), start-up excluded), and the
  whole probe process (interpreter start-up, inflate, compile, run; its children, the stand-in
  nvidia-smi and dmesg, excluded) against a bare `python3 -c pass`;
- bytes sent and received per poll in steady state (the second poll on: hints learnt, the
  last discovery sent back instead of the discover module), and what other hosts would send;
- `--once` start-up: time from exec to the first TCP connection to a box (a port that accepts
  and never speaks records when it arrives) against `python -c "import asyncssh"`, and for a
  local-only config the run's wall time minus its poll. The first run builds the probe's
  payload (probe_bundle's cache, under the run's fresh HOME); the median is of warm runs.

Samples are interleaved (floor, poll, floor, ...) so that load from elsewhere on the machine hits
both sides alike; figures are medians unless they say otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import tomli_w
from gpuwatch.remote.config.schema import HostConfig, RunConfig, SshSettings
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.watch.fleet import opening_keys
from gpuwatch.remote.wire import bundle as probe_bundle
from gpuwatch.remote.wire import collect
from gpuwatch.remote.wire import ssh_config as ssh
from gpuwatch.remote.wire.collect import Collector, PollOutcome, build_request
from gpuwatch.remote.wire.poller import OpeningLimiter
from harness.faults import silent_port
from harness.sshd import SshdBox

POLLS = 30
RUNS = 7
BOX_PATH = "/usr/bin:/bin"
ROOT = Path(__file__).resolve().parents[2]
TCK = os.sysconf("SC_CLK_TCK")

rows: list[tuple[str, str, str, str]] = []

UP_BYTES = 20_000
UP_TARGET = "<= 20 KB"
"""DESIGN §6: bytes up per steady poll of an 8-GPU box, the NVML reader included."""


def row(what: str, figure: str, target: str = "", ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("pass" if ok else "MISS")
    rows.append((what, figure, target, verdict))
    print(f"  {what:<58} {figure:>22}  {target:<26} {verdict}", flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def median(values: list[float]) -> float:
    return statistics.median(values)


# --------------------------------------------------------------------------------------------
# Helpers


async def floor_call(options: dict[str, object]) -> float:
    """Plain asyncssh: connect + run('true') + close."""
    t0 = time.monotonic()
    async with asyncssh.connect(**options) as conn:
        await conn.run("true", check=True)
    return time.monotonic() - t0


def self_cpu(argv: list[str], stdin: bytes, env: dict[str, str], n: int) -> tuple[float, float]:
    """Mean CPU seconds of a process itself and of its children, read from /proc/PID while it is
    a zombie (waitid WNOWAIT), so that its own start-up counts and its children do not. Its own
    from schedstat (the scheduler's nanoseconds; the probe runs one thread where it does not
    read NVML); its children's from stat, in clock ticks (stat's own utime+stime, ticks too,
    read a bare python's 11 ms as 2)."""
    own = children = 0.0
    for _ in range(n):
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(stdin)
        proc.stdin.close()
        proc.stdout.read()
        proc.stderr.read()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        with open(f"/proc/{proc.pid}/schedstat") as fh:
            own += int(fh.read().split()[0]) / 1e9
        with open(f"/proc/{proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        children += (int(fields[13]) + int(fields[14])) / TCK
        proc.wait()
    return own / n, children / n


def rusage_cpu(argv: list[str], env: dict[str, str], n: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        subprocess.run(argv, env=env, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) / n


@contextmanager
def recorded_requests() -> Iterator[list[dict[str, Any]]]:
    """The requests the Collector builds while in the block, in order (each poll's, and a
    poll's second exec where the probe asked for discovery's module)."""
    requests: list[dict[str, Any]] = []

    def spy(request: dict[str, Any], *, trim: bool = False) -> bytes:
        requests.append(request)
        return probe_bundle.build_stdin(request, trim=trim)

    collect.build_stdin = spy  # type: ignore[assignment]
    try:
        yield requests
    finally:
        collect.build_stdin = probe_bundle.build_stdin


@contextmanager
def first_connection_clock() -> Iterator[tuple[int, list[float]]]:
    """A port that accepts TCP and never speaks; yields (port, arrival times, monotonic)."""
    arrivals: list[float] = []
    with silent_port(arrivals) as port:
        yield port, arrivals


def cli(home: Path, *args: str, config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        exe: Path | None = None) -> tuple[float, subprocess.Popen[bytes], bytes]:
    """Run `python -m gpuwatch.tui.cli ARGS` (this tree), or the console script `exe`;
    (start time, process, stdout)."""
    full_env = {"PATH": "/usr/bin:/bin", "HOME": str(home),
                "XDG_STATE_HOME": str(home / "state"), **(env or {})}
    if config is not None:
        (home / "c.toml").write_text(tomli_w.dumps(config))
        args = ("--config", str(home / "c.toml"), *args)
    t0 = time.monotonic()
    argv = [str(exe)] if exe else [sys.executable, "-m", "gpuwatch.tui.cli"]
    proc = subprocess.Popen([*argv, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=full_env)
    out, _ = proc.communicate(timeout=60)
    return t0, proc, out


def installed(tmp_path: Path) -> Path | str:
    """`gpuwatch` as a user's install has it: a wheel built from this tree in a venv of its own
    (its modules byte-compiled by pip, no editable-install finder: ~20 ms of this tree's
    `.venv` start-up goes to that finder, which resolves every import of the package through
    pathlib), its dependencies read from this venv. The console script's path, or why not."""
    wheels, venv = tmp_path / "wheels", tmp_path / "installed"
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                        str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        py = venv / "bin" / "python"
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", *map(str, wheels.glob("gpuwatch-*.whl"))],
                       check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"could not build and install the wheel: {exc}"
    finally:
        shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' leftovers
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    purelib = sysconfig.get_path("purelib")
    (Path(site) / "bench_deps.pth").write_text(purelib + "\n")  # a path, not a site dir
    return venv / "bin" / "gpuwatch"


def python_wall(code: str, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True)
        samples.append(time.monotonic() - t0)
    return median(samples)


BUSY_RANKS, BUSY_WORKERS = 8, 2


def busy_box(root: Path) -> Box:
    """The 8-GPU box as it is while a run trains on it: a torchrun launcher and its 8 ranks
    (one GPU each, in the launcher's session and process group, as torch before 2.11 starts
    them), each with 2 dataloader workers forked from it (the NVIDIA fds inherited), in an HF
    style folder with a log, TensorBoard event files (tensorboardX) and checkpoints. Nobody
    configured the run: discovery finds it, and from the third poll on reuses what
    it found."""
    from gpuwatch.remote.sim.box import SimProcess, training_process
    from tensorboardX import SummaryWriter

    sim = Box(root / "box", h100_sxm(8))
    work = root / "work"
    (work / "outputs" / "checkpoint-500").mkdir(parents=True)
    (work / "outputs" / "checkpoint-500" / "model.safetensors").write_bytes(b"\0" * 4096)
    (work / "train.py").write_text("pass\n")
    (work / "train.log").write_text("".join(f"step {i} loss 1.0\n" for i in range(200)))
    writer = SummaryWriter(str(work / "runs" / "exp1"))
    for step in range(100):
        for tag in range(EVENT_TAGS):
            writer.add_scalar(f"train/t{tag}", 1.0 / (step + 1), step)
    writer.close()
    sim.add_process(SimProcess(
        pid=5000, cmdline=("/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc_per_node",
                           str(BUSY_RANKS), "train.py", "--output_dir", "outputs"),
        comm="torchrun", cwd=str(work), start_s=590.0, session=5000, pgrp=5000,
        fds={0: "/dev/null", 1: str(work / "train.log"), 2: str(work / "train.log")}))
    pid = 5001
    for gpu in range(BUSY_RANKS):
        sim.set_gpu(gpu, util_pct=97, sm_clock_mhz=1980, power_w=650.5, mem_used_mib=70000)
        rank = dataclasses.replace(training_process(pid, gpu=gpu, ppid=5000, workdir=str(work)),
                                   session=5000, pgrp=5000)
        sim.add_process(rank)
        sim.add_compute_app(gpu, pid, "python", 69000)
        for worker in range(BUSY_WORKERS):
            sim.add_process(dataclasses.replace(
                rank, pid=pid + 1 + worker, ppid=pid, threads=4, start_s=rank.start_s + 5))
        pid += 1 + BUSY_WORKERS
    return sim


def busy_box_figures(tmp_path: Path, sshd_factory: Callable[..., SshdBox],
                     bare_own: float) -> None:
    """Real polls of the busy box through its own sshd, as `gpuwatch` polls it (the host's
    history carried from poll to poll); then the probe's CPU on the last poll's input."""
    from gpuwatch.remote.findings.rules import HostHistory

    sim = busy_box(tmp_path / "busy")
    sshd = sshd_factory(env=sim.env(base_path=BOX_PATH))
    host = HostConfig("busy", "box1", settings=SshSettings(
        config_file=str(sshd.ssh_config), known_hosts=str(sshd.known_hosts)))
    history = HostHistory(host.name)

    async def polls() -> list[PollOutcome]:
        collector, outcomes = Collector(), []
        for _ in range(POLLS // 3 + 2):
            outcome = await collector.poll(host, history.runs)
            assert outcome.ok and outcome.snapshot is not None, outcome.error_message
            history.record(outcome.snapshot, outcome.ended_at)
            outcomes.append(outcome)
        return outcomes[2:]  # the first poll and the one after (discovery's module) left out

    with recorded_requests() as requests:
        outcomes = asyncio.run(polls())
    steady = requests[-1]
    assert probe_bundle.modules_for(steady)[:1] == ("gpuwatch_probe",), "discovery not reused"
    (run,) = outcomes[-1].snapshot.runs if outcomes[-1].snapshot else ()
    assert run.name == "train" and len(run.pids) == 1 + BUSY_RANKS * (1 + BUSY_WORKERS), run
    env = sim.env(base_path=BOX_PATH)
    stdin = probe_bundle.build_stdin(steady, trim=True)
    own, _ = self_cpu(["/bin/sh", "-c", probe_bundle.build_command("python3")], stdin, env, 30)
    row(f"a busy box: torchrun, {BUSY_RANKS} ranks, {BUSY_RANKS * BUSY_WORKERS} dataloader "
        "workers", "discovered run")
    row("  probe process CPU, steady", ms(own), "<= 3x bare python (busy)", own <= 3 * bare_own)
    row("  ratio to bare python (both schedstat)", f"{own / bare_own:.2f}x")
    sent = median([float(o.bytes_sent) for o in outcomes])
    received = median([float(o.bytes_received) for o in outcomes])
    row("  bytes sent per poll, steady", f"{sent / 1024:.1f} KB", UP_TARGET, sent <= UP_BYTES)
    nvml = len(probe_bundle.build_command("python3")) + len(probe_bundle.build_stdin(
        {**steady, "pynvml": True, "gpu_source": "nvml", "want": {}}, trim=True))
    row("    the same where the box reads its GPUs through NVML (its reader goes instead)",
        f"{nvml / 1024:.1f} KB", UP_TARGET, nvml <= UP_BYTES)
    row("  bytes received per poll, steady", f"{received / 1024:.1f} KB", "<= 8 KB",
        received <= 8 * 1024)


# --------------------------------------------------------------------------------------------


@pytest.fixture
def box8(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> tuple[Box, SshdBox]:
    sim = Box(tmp_path / "box", h100_sxm(8))
    for gpu in range(8):
        sim.set_gpu(gpu, util_pct=97, sm_clock_mhz=1980, power_w=650.5, mem_used_mib=70000)
    return sim, sshd_factory(env=sim.env(base_path=BOX_PATH))


EVENT_TAGS, EVENT_STEPS = 8, 5
"""The steady state of a run whose event file grows: 8 scalar tags written at 5 steps between
two polls (40 records, ~2 KB a poll), read from the offset the last poll left."""


def event_run_polls(tmp_path: Path, host: HostConfig) -> None:
    """Real polls of the box with a run whose event file grows between them. The
    decoder goes with the run's first poll only; after it, the new records go raw (the client
    decodes them) and the poll sends no decoder."""
    from gpuwatch.remote.model.series import RunSeries
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2
    from tensorboardX.summary import scalar

    folder = tmp_path / "events"
    folder.mkdir()
    writer = EventsWriter(str(folder / "events"), "")
    step = 0

    def grow() -> int:
        nonlocal step
        before = sum(p.stat().st_size for p in folder.iterdir())
        for _ in range(EVENT_STEPS):
            for tag in range(EVENT_TAGS):
                writer.write_event(event_pb2.Event(
                    wall_time=time.time(), step=step,
                    summary=scalar(f"train/t{tag}", 1.0 / (step + 1))))
            step += 1
        writer.flush()
        return sum(p.stat().st_size for p in folder.iterdir()) - before

    run_host = HostConfig(host.name, host.ssh, settings=host.settings,
                          runs=(RunConfig("r", process="train.py", events=str(folder)),))
    series = {"r": RunSeries("r")}

    async def polls() -> tuple[list[PollOutcome], list[int]]:
        collector, outcomes, growth = Collector(), [], []
        for i in range(POLLS // 2 + 2):
            growth.append(grow())
            outcome = await collector.poll(run_host, series)
            assert outcome.ok and outcome.snapshot is not None, outcome.error_message
            (sample,) = outcome.snapshot.runs
            series["r"].update(sample, outcome.snapshot.taken_at)
            if i >= 2:  # the first poll and the one after (discovery's module) left out
                outcomes.append(outcome)
        return outcomes, growth[2:]

    with recorded_requests() as requests:
        outcomes, growth = asyncio.run(polls())
    shipped = ["gpuwatch_tfevents" in probe_bundle.modules_for(r) for r in requests]
    sent = median([float(o.bytes_sent) for o in outcomes])
    received = median([float(o.bytes_received) for o in outcomes])
    steady = shipped[2:]
    row(f"a run's event file growing {median([float(g) for g in growth]) / 1024:.1f} KB/poll",
        f"{EVENT_TAGS * EVENT_STEPS} records")
    row("  bytes sent per poll, steady (records go raw)", f"{sent / 1024:.1f} KB", UP_TARGET,
        sent <= UP_BYTES)
    row("  bytes received per poll, steady", f"{received / 1024:.1f} KB", "<= 8 KB",
        received <= 8 * 1024)
    row("  polls that shipped the decoder (first two left out)",
        f"{sum(steady)} of {len(steady)}", "0", not any(steady))
    row("  points read", str(len(series["r"].series["train/t0"])), str(step),
        len(series["r"].series["train/t0"]) == step)


def test_poll_figures(tmp_path: Path, box8: tuple[Box, SshdBox],
                      sshd_factory: Callable[..., SshdBox]) -> None:
    sim, sshd = box8
    host = HostConfig("gpu1", "box1", settings=SshSettings(
        config_file=str(sshd.ssh_config), known_hosts=str(sshd.known_hosts)))
    print(f"\nbench_poll: one sshd on loopback, a simulated 8-GPU box; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at start")
    print(f"  {'figure':<58} {'measured':>22}  {'target':<26}")

    # -- 1. wall: a poll against the floor; 2. client CPU -------------------------------------
    async def polls() -> tuple[list[float], list[float], list[PollOutcome], float]:
        collector = Collector()
        options = sshd.asyncssh_options()
        await floor_call(options)  # warm: imports, first-time setup
        await collector.poll(host)
        floors, walls, outcomes = [], [], []
        for _ in range(POLLS):
            floors.append(await floor_call(options))
            outcome = await collector.poll(host)
            assert outcome.ok, outcome.error_message
            walls.append(outcome.poll_s)
            outcomes.append(outcome)
        cpu0 = time.process_time()
        for _ in range(POLLS):
            await collector.poll(host)
        client = (time.process_time() - cpu0) / POLLS
        cpu0 = time.process_time()
        for _ in range(POLLS):
            await floor_call(options)
        return floors, walls, outcomes, (client, (time.process_time() - cpu0) / POLLS)

    with recorded_requests() as requests:  # what the polls send, as the Collector builds it
        floors, walls, outcomes, (client_cpu, floor_cpu) = asyncio.run(polls())
    first_request, steady_request = requests[0], requests[-1]
    assert "gpuwatch_discover" not in probe_bundle.modules_for(steady_request)
    snaps = [o.snapshot for o in outcomes if o.snapshot is not None]
    probe_s = median([s.probe_s or 0.0 for s in snaps])
    floor = median(floors) + probe_s
    wall = median(walls)
    row("floor: asyncssh connect+run('true')+close", ms(median(floors)))
    row("floor + the probe's own run time (probe_s)", ms(floor))
    row("poll wall time (Collector.poll)", ms(wall), "<= 1.2x floor", wall <= 1.2 * floor)
    row("  ratio poll / floor", f"{wall / floor:.2f}x")
    row("client CPU per poll (process_time)", ms(client_cpu), "<= 10 ms", client_cpu <= 0.010)
    row("  plain asyncssh connect+run('true')+close CPU", ms(floor_cpu))

    # -- 3. the probe's CPU on the box --------------------------------------------------------
    env = {**sim.env(base_path=BOX_PATH)}
    bare_own, _ = self_cpu(["python3", "-c", "pass"], b"", env, 30)
    bare_rusage = rusage_cpu(["python3", "-c", "pass"], env, 20)
    cpu_s = statistics.mean(s.probe_cpu_s or 0.0 for s in snaps)
    command = probe_bundle.build_command("python3")
    request = build_request(host)
    # before: the event decoder and discovery went with every poll
    full_stdin = probe_bundle.build_stdin(request)
    trimmed = probe_bundle.build_stdin(steady_request, trim=True)  # what a steady poll sends
    full_own, _ = self_cpu(["/bin/sh", "-c", command], full_stdin, env, 30)
    probe_own, probe_children = self_cpu(["/bin/sh", "-c", command], trimmed, env, 30)
    row("bare `python3 -c pass` CPU (own, schedstat; rusage)",
        f"{ms(bare_own)}; {ms(bare_rusage)}")
    row("probe CPU, document's cpu_s (mean; main() only)", ms(cpu_s),
        "<= 2x bare python", cpu_s <= 2 * bare_rusage)
    row("probe process CPU, start-up+inflate+compile+run", ms(probe_own),
        "<= 2x bare python", probe_own <= 2 * bare_own)
    row("  ratio to bare python (both schedstat)", f"{probe_own / bare_own:.2f}x")
    row("  before: with discovery and the event decoder shipped", ms(full_own))
    row("  its children (stand-in nvidia-smi, dmesg)", ms(probe_children))
    busy_box_figures(tmp_path, sshd_factory, bare_own)

    # -- 4. bytes per poll, steady state ------------------------------------------------------
    sent = median([float(o.bytes_sent) for o in outcomes])
    received = median([float(o.bytes_received) for o in outcomes])
    row("bytes sent per poll (command + stdin)", f"{sent / 1024:.1f} KB", UP_TARGET,
        sent <= UP_BYTES)
    row("bytes received per poll (8 GPUs)", f"{received / 1024:.1f} KB", "<= 8 KB",
        received <= 8 * 1024)

    def up(request: dict[str, Any]) -> int:
        return len(command) + len(probe_bundle.build_stdin(request, trim=True))

    row("  a host's first poll (discovery, the event decoder)",
        f"{up(first_request) / 1024:.1f} KB")
    row("  before: discovery and the event decoder on every poll",
        f"{(len(command) + len(full_stdin)) / 1024:.1f} KB")
    reuse = steady_request["discovery_reuse"]
    # what the box told the collector (its python, its cgroup version, nvidia-smi's reason
    # field, the Xid and OOM lines in its kernel log: none), as a steady poll sends back
    told = {k: steady_request[k] for k in ("spawn", "cgroup", "gpu_hints",
                                           "kernel_lines") if k in steady_request}
    # gpu_hints only where the driver lacks a field the probe asks for (none here)
    assert {"spawn", "cgroup", "kernel_lines"} <= set(told) and told["kernel_lines"] == 0, told
    for what, run in (("a host with a run (no event files), steady",
                       RunConfig("r", process="train.py", log="/data/r/train.log",
                                 checkpoints="/data/r/ckpt/*.pt")),
                      ("a host whose run reads event files, steady",
                       RunConfig("r", process="train.py", events="/data/runs"))):
        # steady: the box said its python3 has no pynvml (this one's and most boxes' system
        # python3), so no NVML reader goes; the figure with it is printed too
        request = {**build_request(HostConfig("gpu1", "box1", runs=(run,))), **told,
                   "discovery_reuse": reuse, "pynvml": False, "want": {"nvml": False}}
        nvml = {**request, "pynvml": True, "gpu_source": "nvml", "want": {}}
        if run.events:  # steady, the run's state says its new records may go raw
            before = up(nvml)
            request["runs"][0]["raw"] = True
        n, with_nvml = up(request), up(nvml)
        row(f"  {what}", f"{n / 1024:.1f} KB", UP_TARGET, n <= UP_BYTES)
        row("    the same where the box reads its GPUs through NVML (its reader goes instead)",
            f"{with_nvml / 1024:.1f} KB", UP_TARGET, with_nvml <= UP_BYTES)
    row("    before: the event decoder shipped on every poll", f"{before / 1024:.1f} KB")
    event_run_polls(tmp_path, host)

    # -- before/after: the ssh config read per poll (ssh._parsed), a 51-host ssh config -------
    fleet = sshd.fleet(50)
    far = HostConfig(fleet[-1], fleet[-1], settings=host.settings)

    async def client_cpu_with(ttl: float) -> float:
        ssh.PARSED_TTL_S = ttl
        limiter = OpeningLimiter()
        collector = Collector(opening=lambda h: limiter.opening(opening_keys(h)))
        await collector.poll(far)
        cpu0 = time.process_time()
        for _ in range(POLLS // 2):
            assert (await collector.poll(far)).ok
        return (time.process_time() - cpu0) / (POLLS // 2)

    default_ttl = ssh.PARSED_TTL_S
    try:
        before = asyncio.run(client_cpu_with(0.0))
        after = asyncio.run(client_cpu_with(default_ttl))
    finally:
        ssh.PARSED_TTL_S = default_ttl
    row("client CPU per poll, 51-host ssh config, cache warm", ms(after), "<= 10 ms",
        after <= 0.010)
    row("  before: the config read 3 times per poll, not 1", ms(before))

    # -- 5. --once start-up -------------------------------------------------------------------
    home = tmp_path / "me"
    home.mkdir()
    first_bytes = []
    pass_wall = python_wall("pass", RUNS)
    asyncssh_wall = python_wall("import asyncssh", RUNS)
    with first_connection_clock() as (port, arrivals):
        silent = {"ssh": {"connect_timeout": 0.5}, "hosts": {"q": {"ssh": f"127.0.0.1:{port}"}}}
        for _ in range(RUNS):
            count = len(arrivals)
            t0, _proc, _out = cli(home, "--once", "--json", config=silent)
            assert len(arrivals) == count + 1
            first_bytes.append(arrivals[-1] - t0)
    # A local-only config, as cron would have it: the installed wheel, and this tree's venv.
    exe = installed(tmp_path)
    local_only = {"hosts": {"box": {"ssh": "local"}}}
    local_startups: dict[str, list[float]] = {"installed": [], "tree": []}
    for _ in range(RUNS + 1):  # interleaved; the first of each (pyc, payload cache) dropped
        for kind in local_startups:
            if kind == "installed" and isinstance(exe, str):
                continue
            t0, _proc, out = cli(home, "--once", "--json", config=local_only, env=env,
                                 exe=None if kind == "tree" else exe)
            local_startups[kind].append(
                time.monotonic() - t0 - json.loads(out)["hosts"][0]["poll_s"])
    row("`python -c pass`", ms(pass_wall))
    row('`python -c "import asyncssh"`', ms(asyncssh_wall))
    first = median(first_bytes)
    row("--once (ssh host): exec to its first TCP connection", ms(first),
        "<= 1.1x import asyncssh", first <= 1.1 * asyncssh_wall)
    row("  ratio to importing asyncssh", f"{first / asyncssh_wall:.2f}x")
    row("  the first of them: the probe's payload not cached yet", ms(first_bytes[0]))
    if isinstance(exe, str):
        row(f"--once local (installed wheel): {exe}", "-")
    else:
        local = median(local_startups["installed"][1:])
        row("--once, local-only config, installed: wall minus the poll", ms(local),
            "<= 100 ms", local <= 0.100)
    row("  the same from this tree's editable .venv", ms(median(local_startups["tree"][1:])))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
