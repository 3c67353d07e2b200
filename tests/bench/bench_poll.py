"""Poll figures against a real sshd: `.venv/bin/python -m pytest tests/bench/bench_poll.py -s`.

Prints, from one run against one sshd on loopback serving a simulated 8-GPU box, each figure
beside its target (pass/MISS), and returns DESIGN §6's rows for tests/bench/table.py. Nothing
here asserts a time. Every figure that has a baseline is a ratio to it, taken pair by pair in the
same minute (figures.py says why):

- a poll's wall time against the floor: plain asyncssh connect + run('true') + close, plus the
  probe's own run time (the document's probe_s);
- the client's CPU per poll (time.process_time around a block of polls, as the pipeline polls:
  the opening limiter included) against plain asyncssh connecting, running the very same
  command with the very same stdin, and closing (the same bytes over the same wire, the
  same wait for the probe: what is left is what gpuwatch adds); against run('true') too;
- the probe's whole process on the box (interpreter start-up, inflate, compile, run; its
  children, the stand-in nvidia-smi and dmesg, excluded) against a bare `python3 -c pass`,
  both from the scheduler's own count, on the idle box and on a busy one;
- bytes sent and received per poll in steady state (the second poll on: hints learnt, the
  last discovery sent back instead of the discover module);
- `--once` start-up: from exec to its first TCP connection to a box (a port that accepts and
  never speaks), its CPU until then (every thread's schedstat at that moment) against the
  whole of `python -c "import asyncssh"` in the same venv; and for a local-only config its
  CPU until its probe (its first child) exists against the whole of `python -c pass`. gpuwatch runs
  as a user's install has it: a wheel of this tree in a venv of its own (smoke mode: this
  tree's editable .venv).

GPUWATCH_BENCH_SMOKE=1: a few samples of each, no verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
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
import tomli_w
from figures import SMOKE, Row, own_cpu, pairwise, print_rows, remember, size, spread, task_cpu_s
from gpuwatch.remote.config.schema import Config, HostConfig, RunConfig, SshSettings
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch, opening_keys
from gpuwatch.remote.wire import bundle as probe_bundle
from gpuwatch.remote.wire import collect
from gpuwatch.remote.wire import ssh_config as ssh
from gpuwatch.remote.wire.collect import Collector, PollOutcome, build_request
from harness.sshd import SshdBox

POLLS = size(30, 3)
"""Polls of each kind in the wall-time and bytes figures."""
BLOCKS, BLOCK = size(8, 2), size(10, 2)
"""The client CPU figure: blocks of BLOCK polls and BLOCK floor calls, in turn."""
SAMPLES = size(30, 3)
"""Processes of each kind (the probe and a bare python) in the probe's CPU figures."""
RUNS = size(15, 2)
"""`--once` runs of each kind in the start-up figures."""
BOX_PATH = "/usr/bin:/bin"
ROOT = Path(__file__).resolve().parents[2]

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


@contextmanager
def unkept() -> Iterator[None]:
    """The client as it was before it kept readings for its polls: every poll resolved its
    target and the limiter's keys in a thread, and parsed the known_hosts files again."""
    from gpuwatch.remote.wire import ssh as ssh_call
    from gpuwatch.remote.wire import ssh_hosts

    resolve, keys, load = ssh_call.resolve, ssh_call.kept_endpoint_keys, ssh_call.load_known_hosts
    ssh_call.resolve = lambda *a, kept_only=False, **k: (  # type: ignore[assignment]
        None if kept_only else resolve(*a, **k))
    ssh_call.kept_endpoint_keys = lambda *a, **k: None  # type: ignore[assignment]
    ssh_call.load_known_hosts = ssh_hosts._parse_known_hosts  # type: ignore[assignment]
    try:
        yield
    finally:
        ssh_call.resolve, ssh_call.kept_endpoint_keys = resolve, keys  # type: ignore[assignment]
        ssh_call.load_known_hosts = load  # type: ignore[assignment]


def pipeline_collector(host: HostConfig) -> Collector:
    """The collector as the pipeline polls with it: a FleetWatch's (remote/watch/fleet.py), its
    opening limiter included; its store in memory, for nothing here lands a poll."""
    return FleetWatch(Config(hosts=(host,)), Store.open(":memory:"), role="once").collector


async def floor_call(options: dict[str, object], command: str = "true",
                     stdin: bytes | None = None) -> float:
    """Plain asyncssh: connect + run(command, feeding stdin) + close; its wall time."""
    t0 = time.monotonic()
    async with asyncssh.connect(**options) as conn:
        await conn.run(command, input=stdin, encoding=None, check=True)
    return time.monotonic() - t0


COMPILE = """
import sys, time, zlib
stream = sys.stdin.buffer
payload = zlib.decompress(stream.read(int(stream.readline())))
found = {}
exec(payload.split(b"\\n", 1)[0], found)  # its first line: SOURCES = [(name, source), ...]
t = time.process_time()
for name, source in found["SOURCES"]:
    compile(source, name, "exec")
print(time.process_time() - t, sum(len(source) for _, source in found["SOURCES"]))
"""


def compile_cost(stdin: bytes, env: dict[str, str]) -> tuple[float, int]:
    """CPU seconds the box's python3 takes to compile the modules a poll's stdin carries (the
    median of a few), and their characters."""
    samples = []
    for _ in range(max(SAMPLES // 5, 1)):
        out = subprocess.run(["python3", "-S", "-c", COMPILE], input=stdin, env=env,
                             capture_output=True, check=True).stdout.split()
        samples.append(float(out[0]))
    return statistics.median(samples), int(out[1])


def probe_pairs(argv: list[str], stdin: bytes, env: dict[str, str]
                ) -> tuple[list[float], list[float]]:
    """The own CPU of a bare `python3 -c pass` and of the probe's process, SAMPLES of each in
    turn (each of the probe's own start-up, inflate, compile and run; its children not)."""
    bare: list[float] = []
    probe: list[float] = []
    for _ in range(SAMPLES):
        bare.append(own_cpu(["python3", "-c", "pass"], env=env)[0])
        probe.append(own_cpu(argv, stdin, env)[0])
    return bare, probe


@contextmanager
def recorded_requests(sent: list[bytes] | None = None) -> Iterator[list[dict[str, Any]]]:
    """The requests the Collector builds while in the block, in order (each poll's, and a
    poll's second exec where the probe asked for discovery's module); their stdin into
    `sent`."""
    requests: list[dict[str, Any]] = []

    def spy(request: dict[str, Any], *, trim: bool = False) -> bytes:
        requests.append(request)
        stdin = probe_bundle.build_stdin(request, trim=trim)
        if sent is not None:
            sent.append(stdin)
        return stdin

    collect.build_stdin = spy  # type: ignore[assignment]
    try:
        yield requests
    finally:
        collect.build_stdin = probe_bundle.build_stdin


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


def busy_box_figures(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> list[Row]:
    """Real polls of the busy box through its own sshd, as `gpuwatch` polls it (the host's
    history carried from poll to poll); then the probe's CPU on the last poll's input."""
    from gpuwatch.remote.model.history import HostHistory

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
    bare, probe = probe_pairs(["/bin/sh", "-c", probe_bundle.build_command("python3")], stdin,
                              env)
    ratio = pairwise(probe, bare)
    row(f"a busy box: torchrun, {BUSY_RANKS} ranks, {BUSY_RANKS * BUSY_WORKERS} dataloader "
        "workers", "discovered run")
    row("  probe process CPU, steady", spread(probe).ms())
    row("  ratio to bare python (pair by pair)", ratio.ratio(), "<= 3x (busy)",
        ratio.median <= 3)
    sent = median([float(o.bytes_sent) for o in outcomes])
    received = median([float(o.bytes_received) for o in outcomes])
    row("  bytes sent per poll, steady", f"{sent / 1024:.1f} KB", UP_TARGET, sent <= UP_BYTES)
    nvml = len(probe_bundle.build_command("python3")) + len(probe_bundle.build_stdin(
        {**steady, "pynvml": True, "gpu_source": "nvml", "want": {}}, trim=True))
    row("    the same where the box reads its GPUs through NVML (its reader goes instead)",
        f"{nvml / 1024:.1f} KB", UP_TARGET, nvml <= UP_BYTES)
    row("  bytes received per poll, steady", f"{received / 1024:.1f} KB", "<= 8 KB",
        received <= 8 * 1024)
    return [Row("the probe's own CPU vs a bare `python3 -c pass`, on a busy box (8 ranks, "
                "workers, a discovered run)", "<= 3x", ratio.ratio(),
                f"bare python {spread(bare).ms()} CPU; the probe {spread(probe).ms()}",
                ratio.median <= 3)]


# --------------------------------------------------------------------------------------------


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




# --------------------------------------------------------------------------------------------
# A poll: wall time, client CPU


def wall_and_client(host: HostConfig, sshd: SshdBox) -> tuple[list[Row], list[PollOutcome],
                                                                list[dict[str, Any]]]:
    """The poll's wall time against the floor, and the client's CPU per poll against plain
    asyncssh; the outcomes of the wall-time polls and every request the collector built."""
    options = sshd.asyncssh_options()
    collector = pipeline_collector(host)

    async def run() -> tuple[list[float], list[PollOutcome], dict[str, list[float]]]:
        await floor_call(options)  # warm: imports, first-time setup
        await collector.poll(host)
        await collector.poll(host)  # steady from here: hints learnt, discovery reused
        floors, outcomes = [], []
        for _ in range(POLLS):
            floors.append(await floor_call(options))
            outcome = await collector.poll(host)
            assert outcome.ok, outcome.error_message
            outcomes.append(outcome)
        command, stdin = probe_bundle.build_command(host.python), sent[-1]
        cpu: dict[str, list[float]] = {"poll": [], "same": [], "true": [], "unkept": []}
        for _ in range(BLOCKS):  # blocks in turn: a bad minute hits all four alike
            for kind, call in (("poll", lambda: collector.poll(host)),
                               ("same", lambda: floor_call(options, command, stdin)),
                               ("true", lambda: floor_call(options)),
                               ("unkept", lambda: collector.poll(host))):
                with unkept() if kind == "unkept" else contextlib.nullcontext():
                    t0 = time.process_time()
                    for _ in range(BLOCK):
                        await call()
                    cpu[kind].append((time.process_time() - t0) / BLOCK)
        return floors, outcomes, cpu

    sent: list[bytes] = []
    with recorded_requests(sent) as requests:
        floors, outcomes, cpu = asyncio.run(run())
    snaps = [o.snapshot for o in outcomes if o.snapshot is not None]
    walls = [o.poll_s for o in outcomes]
    bases = [f + (s.probe_s or 0.0) for f, s in zip(floors, snaps, strict=True)]
    wall = pairwise(walls, bases)
    client, client_true = pairwise(cpu["poll"], cpu["same"]), pairwise(cpu["poll"], cpu["true"])
    row("floor: asyncssh connect+run('true')+close", spread(floors).ms())
    row("floor + the probe's own run time (probe_s)", spread(bases).ms())
    row("poll wall time (Collector.poll)", spread(walls).ms())
    row("  ratio poll / floor, pair by pair", wall.ratio(), "<= 1.2x", wall.median <= 1.2)
    row("client CPU per poll (process_time, blocks of polls)", spread(cpu["poll"]).ms())
    row("  plain asyncssh, the same command and stdin", spread(cpu["same"]).ms())
    row("  plain asyncssh, run('true')", spread(cpu["true"]).ms())
    row("  ratio to the same command and stdin, block by block", client.ratio(), "<= 1.2x",
        client.median <= 1.2)
    row("  ratio to run('true')", client_true.ratio())
    unkept_ratio = pairwise(cpu["unkept"], cpu["poll"])
    row("  before: the ssh config's reading and the limiter's keys in a thread, known_hosts "
        "parsed, every poll", spread(cpu["unkept"]).ms())
    row("    ratio to now, block by block", unkept_ratio.ratio())
    return [
        Row("a poll's wall time vs asyncssh connect + run('true') + close + the probe's own "
            "run time", "<= 1.2x", wall.ratio(),
            f"asyncssh {spread(floors).ms()} + probe_s, a poll {spread(walls).ms()}",
            wall.median <= 1.2),
        Row("client CPU per poll vs a plain asyncssh connect + run + close in the same run",
            "<= 1.2x", client.ratio(),
            f"plain asyncssh running the poll's command and stdin {spread(cpu['same']).ms()} "
            f"CPU, a poll {spread(cpu['poll']).ms()}; against run('true') "
            f"({spread(cpu['true']).ms()}): {client_true.ratio()}", client.median <= 1.2),
    ], outcomes, requests


# --------------------------------------------------------------------------------------------
# --once start-up


@contextmanager
def listening() -> Iterator[socket.socket]:
    """A port on 127.0.0.1 that accepts TCP and never speaks."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(60)
        yield listener


def startup_figures(tmp_path: Path, box_env: dict[str, str]) -> list[Row]:
    """`--once` to its first connection against importing asyncssh; `--once` of a local-only
    config against `python -c pass`. Pairs in turn; gpuwatch as a user's install has it."""
    if SMOKE:
        exe: Path | str = Path(sys.executable).with_name("gpuwatch")
    else:
        exe = installed(tmp_path)
    if isinstance(exe, str):
        return [Row('`--once` start-up vs `python -c "import asyncssh"`', "<= 1.1x",
                    f"not measured here: {exe}"),
                Row("`--once` start-up, local-only config vs `python -c pass`", "<= 4x",
                    f"not measured here: {exe}")]
    python = str(exe.with_name("python"))
    home = tmp_path / "me"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
           "XDG_CACHE_HOME": str(home / "cache")}
    held: list[socket.socket] = []

    def asyncssh_import() -> tuple[float, float]:
        cpu, wall, _ = own_cpu([python, "-c", "import asyncssh"], env=env)
        return cpu, wall

    with listening() as listener:
        port = listener.getsockname()[1]
        silent = home / "silent.toml"
        silent.write_text(tomli_w.dumps({"ssh": {"connect_timeout": 0.5},
                                         "hosts": {"q": {"ssh": f"127.0.0.1:{port}"}}}))

        def first_connection() -> tuple[float, float]:
            t0 = time.monotonic()
            proc = subprocess.Popen([str(exe), "--config", str(silent), "--once", "--json"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env)
            conn, _ = listener.accept()
            wall = time.monotonic() - t0
            cpu = task_cpu_s(proc.pid)  # it waits for the box's greeting: its CPU is all in
            held.append(conn)
            proc.wait(timeout=60)
            return cpu, wall

        first_connection()  # builds the probe's payload cache and the store
        first_connection()
        asyncssh_import()
        imports, firsts = [], []
        for _ in range(RUNS):
            imports.append(asyncssh_import())
            firsts.append(first_connection())
        for conn in held:
            conn.close()
    local = home / "local.toml"
    local.write_text(tomli_w.dumps({"hosts": {"box": {"ssh": "local"}}}))

    def first_spawn() -> tuple[float, float]:
        """A local-only `--once`'s CPU until its probe exists (its first child: what the
        first TCP connection is to an ssh host), and its wall time until then."""
        t0 = time.monotonic()
        proc = subprocess.Popen([str(exe), "--config", str(local), "--once", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**env, **box_env})
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        while not children.read_text().strip() and proc.poll() is None:
            time.sleep(0.0005)  # it then waits for the probe: its CPU stays put meanwhile
        wall = time.monotonic() - t0
        cpu = task_cpu_s(proc.pid)
        out, _ = proc.communicate(timeout=60)
        assert json.loads(out)["hosts"][0]["ok"], out[:300]
        return cpu, wall

    first_spawn()
    passes, locals_ = [], []
    for _ in range(RUNS):
        passes.append(own_cpu([python, "-c", "pass"], env=env)[:2])
        locals_.append(first_spawn())
    cpu = pairwise([f[0] for f in firsts], [i[0] for i in imports])
    wall = pairwise([f[1] for f in firsts], [i[1] for i in imports])
    local_cpu = pairwise([c for c, _ in locals_], [c for c, _ in passes])
    local_parts = import_parts(python, env, ssh=False)
    ssh_parts = import_parts(python, env, ssh=True)
    where = "this tree's .venv (smoke)" if SMOKE else "a wheel of this tree in a venv of its own"
    row(f"gpuwatch: {where}", str(exe))
    row('`python -c "import asyncssh"`, CPU; wall', f"{spread([i[0] for i in imports]).ms()}; "
        f"{spread([i[1] for i in imports]).ms()}")
    row("--once (ssh host) to its first TCP connection, CPU; wall",
        f"{spread([f[0] for f in firsts]).ms()}; {spread([f[1] for f in firsts]).ms()}")
    row("  ratio to importing asyncssh, CPU", cpu.ratio(), "<= 1.1x", cpu.median <= 1.1)
    row("  the same, wall time", wall.ratio())
    row("`python -c pass`, CPU", spread([c for c, _ in passes]).ms())
    row("--once, local-only config: its CPU until its probe starts",
        spread([c for c, _ in locals_]).ms())
    row("  ratio to `python -c pass`", local_cpu.ratio(), "<= 4x", local_cpu.median <= 4)
    row("  of which gpuwatch's imports (local; with asyncssh loaded first, for ssh)",
        f"{local_parts[0] * 1e3:.1f}; {ssh_parts[0] * 1e3:.1f} ms")
    row("    building their dataclasses", f"{local_parts[1] * 1e3:.1f}; "
        f"{ssh_parts[1] * 1e3:.1f} ms ({local_parts[2]} classes)")
    return [
        Row('`--once` start-up vs `python -c "import asyncssh"` (exec to the first TCP '
            "connection, CPU)", "<= 1.1x", cpu.ratio(),
            f"importing asyncssh {spread([i[0] for i in imports]).ms()} CPU, --once "
            f"{spread([f[0] for f in firsts]).ms()}, of which gpuwatch's own imports "
            f"{ssh_parts[0] * 1e3:.0f} ms ({ssh_parts[1] * 1e3:.0f} ms building "
            f"{ssh_parts[2]} dataclasses); wall time: {wall.ratio()}",
            cpu.median <= 1.1),
        Row("`--once` start-up, local-only config vs `python -c pass` (exec to the probe's "
            "start, CPU)",
            "<= 4x", local_cpu.ratio(),
            f"`python -c pass` {spread([c for c, _ in passes]).ms()} CPU, --once "
            f"{spread([c for c, _ in locals_]).ms()}, of which importing gpuwatch's modules "
            f"{local_parts[0] * 1e3:.0f} ms ({local_parts[1] * 1e3:.0f} ms building "
            f"{local_parts[2]} dataclasses)", local_cpu.median <= 4),
    ]


IMPORT_PARTS = """
import gc, sys, time, dataclasses
gc.disable()  # as the command's main() imports
if SSH:
    import asyncssh, asyncio  # the baseline's own imports, out of this figure
spent, classes, make = [0.0], [0], dataclasses._process_class

def timed(*args, **kwargs):
    t = time.process_time()
    try:
        return make(*args, **kwargs)
    finally:
        spent[0] += time.process_time() - t
        classes[0] += 1

dataclasses._process_class = timed
t = time.process_time()
import gpuwatch.tui.cli.command, gpuwatch.tui.cli.once
if SSH:
    import gpuwatch.remote.wire.ssh, gpuwatch.remote.wire.poller
print(time.process_time() - t, spent[0], classes[0])
"""
"""What importing gpuwatch's modules costs a `--once` before its poll, and how much of it is
building dataclasses (each one's methods generated as source and compiled)."""


def import_parts(python: str, env: dict[str, str], *, ssh: bool) -> tuple[float, float, int]:
    """(CPU of gpuwatch's imports, of building their dataclasses, how many): medians."""
    samples = []
    for _ in range(max(RUNS // 3, 1)):
        out = subprocess.run([python, "-c", f"SSH = {ssh}\n" + IMPORT_PARTS], env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        samples.append((float(out[0]), float(out[1]), int(out[2])))
    return (statistics.median(x[0] for x in samples), statistics.median(x[1] for x in samples),
            samples[-1][2])


# --------------------------------------------------------------------------------------------


def figures(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> list[Row]:
    """Every figure of this bench, printed; DESIGN §6's rows among them, returned."""
    sim = Box(tmp_path / "box", h100_sxm(8))
    for gpu in range(8):
        sim.set_gpu(gpu, util_pct=97, sm_clock_mhz=1980, power_w=650.5, mem_used_mib=70000)
    sshd = sshd_factory(env=sim.env(base_path=BOX_PATH))
    host = HostConfig("gpu1", "box1", settings=SshSettings(
        config_file=str(sshd.ssh_config), known_hosts=str(sshd.known_hosts)))
    print(f"\nbench_poll{' (smoke)' if SMOKE else ''}: one sshd on loopback, a simulated 8-GPU "
          f"box; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at start")
    print(f"  {'figure':<58} {'measured':>22}  {'target':<26}")
    rows, outcomes, requests = wall_and_client(host, sshd)
    first_request, steady_request = requests[0], requests[-1]
    assert "gpuwatch_discover" not in probe_bundle.modules_for(steady_request)

    # -- the probe's CPU on the box ---------------------------------------------------------
    env = sim.env(base_path=BOX_PATH)
    command = probe_bundle.build_command("python3")
    trimmed = probe_bundle.build_stdin(steady_request, trim=True)  # what a steady poll sends
    bare, probe = probe_pairs(["/bin/sh", "-c", command], trimmed, env)
    ratio = pairwise(probe, bare)
    cpu_s = statistics.mean(o.snapshot.probe_cpu_s or 0.0 for o in outcomes if o.snapshot)
    row("bare `python3 -c pass` CPU (schedstat)", spread(bare).ms())
    row("probe CPU, the document's cpu_s (its main() only)", ms(cpu_s))
    row("probe process CPU, start-up+inflate+compile+run", spread(probe).ms())
    row("  ratio to bare python, pair by pair", ratio.ratio(), "<= 2x (idle)", ratio.median <= 2)
    compiling, chars = compile_cost(trimmed, env)
    row("  of which compiling the source it is sent", f"{compiling * 1e3:.1f} ms "
        f"({chars / 1024:.0f} KB)")
    rows.append(Row("the probe's own CPU vs a bare `python3 -c pass`, on an idle 8-GPU box",
                    "<= 2x", ratio.ratio(),
                    f"bare python {spread(bare).ms()} CPU; the probe {spread(probe).ms()}, of "
                    f"which compiling the {chars / 1024:.0f} KB of source it is sent "
                    f"{compiling * 1e3:.1f} ms", ratio.median <= 2))
    rows += busy_box_figures(tmp_path, sshd_factory)

    # -- bytes per poll, steady state --------------------------------------------------------
    sent = median([float(o.bytes_sent) for o in outcomes])
    received = median([float(o.bytes_received) for o in outcomes])
    row("bytes sent per poll (command + stdin)", f"{sent / 1024:.1f} KB", UP_TARGET,
        sent <= UP_BYTES)
    row("bytes received per poll (8 GPUs)", f"{received / 1024:.1f} KB", "<= 8 KB",
        received <= 8 * 1024)

    def up(request: dict[str, Any]) -> int:
        return len(command) + len(probe_bundle.build_stdin(request, trim=True))

    nvml = up({**steady_request, "pynvml": True, "want": {}})
    row("  the same where the box's python imports pynvml (the NVML reader goes)",
        f"{nvml / 1024:.1f} KB", UP_TARGET, nvml <= UP_BYTES)
    row("  a host's first poll (discovery, the event decoder)",
        f"{up(first_request) / 1024:.1f} KB")
    rows.append(Row("bytes up / down per steady poll of an 8-GPU box (NVML reader included)",
                    "<= 20 KB / <= 8 KB",
                    f"{nvml / 1024:.1f} KB / {received / 1024:.1f} KB",
                    f"without the NVML reader (a python without pynvml): {sent / 1024:.1f} KB up",
                    nvml <= UP_BYTES and received <= 8 * 1024))
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
            request["runs"][0]["raw"] = True
            nvml["runs"] = request["runs"]
        n, with_nvml = up(request), up(nvml)
        row(f"  {what}", f"{n / 1024:.1f} KB", UP_TARGET, n <= UP_BYTES)
        row("    the same where the box reads its GPUs through NVML (its reader goes instead)",
            f"{with_nvml / 1024:.1f} KB", UP_TARGET, with_nvml <= UP_BYTES)
    event_run_polls(tmp_path, host)
    ssh_config_figures(sshd, host)

    # -- --once start-up ---------------------------------------------------------------------
    rows += startup_figures(tmp_path, env)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return rows


def ssh_config_figures(sshd: SshdBox, host: HostConfig) -> None:
    """The client's CPU per poll where the ssh config holds 51 hosts: one reading of it kept
    (ssh_config._parsed) against reading it on every connection."""
    fleet = sshd.fleet(50)
    far = HostConfig(fleet[-1], fleet[-1], settings=host.settings)

    async def client_cpu_with(ttl: float) -> float:
        ssh.PARSED_TTL_S = ttl
        collector = pipeline_collector(far)
        await collector.poll(far)
        cpu0 = time.process_time()
        for _ in range(max(POLLS // 2, 2)):
            assert (await collector.poll(far)).ok
        return (time.process_time() - cpu0) / max(POLLS // 2, 2)

    default_ttl = ssh.PARSED_TTL_S
    try:
        before = asyncio.run(client_cpu_with(0.0))
        after = asyncio.run(client_cpu_with(default_ttl))
    finally:
        ssh.PARSED_TTL_S = default_ttl
    row("client CPU per poll, 51-host ssh config, one reading kept", ms(after))
    row("  the config read on every connection", ms(before))
    assert opening_keys(far)  # the limiter's keys come from the same reading


def test_poll_figures(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> None:
    print_rows(remember("poll", figures(tmp_path, sshd_factory)), "DESIGN §6 rows:")
