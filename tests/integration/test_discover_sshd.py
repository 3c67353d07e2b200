"""Zero-config runs end to end: a real sshd on loopback, real training processes
started with `setsid nohup` from their own folders, `gpuwatch --once --json` run as a user runs
it with a config that names only the host. Only the GPUs are stood in for (Box(real_proc=True):
the stand-in nvidia-smi lists the real pids as VRAM holders and drops them when they exit).

Event files are written by tensorboardX's SummaryWriter; checkpoints are HF-Trainer-like
`outputs/checkpoint-N/` folders with a trainer_state.json.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomli_w
from gpuwatch.remote.model.launches import recorded_launch
from gpuwatch.remote.model.resume import relaunch_command
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.store import Store
from gpuwatch.remote.wire.document import parse_probe_output
from harness.sshd import STD_PATH, SshdBox
from harness.waiting import wait_for

PY = sys.executable
SECRET = "sk-gwt-discover-9f3a1c"
"""A WANDB_API_KEY value that must appear nowhere: not in JSON, not in the store (U34)."""
BOUNDS = {"connect_timeout": 5, "server_alive_interval": 2, "server_alive_count_max": 3,
          "command_timeout": 20}

# An HF-Trainer-like script: tensorboardX events under runs/, checkpoint-N/ folders (written
# aside, renamed whole) with trainer_state.json, one line per step on stdout, and a record of
# how it was started (argv, the variables a relaunch must keep or drop) in launches.jsonl.
TRAIN = r'''
import json, os, sys, time
from tensorboardX import SummaryWriter
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
resume = args[args.index("--resume_from_checkpoint") + 1] \
    if "--resume_from_checkpoint" in args else None
rank = int(os.environ.get("RANK", "0"))
with open("launches.jsonl", "a") as fh:
    fh.write(json.dumps({"argv": sys.argv, "pid": os.getpid(), "rank": rank, "resume": resume,
                         "env": {k: os.environ.get(k) for k in ("FOO", "WANDB_API_KEY",
                                                                 "SSH_CONNECTION")}}) + "\n")
step = int(resume.rsplit("-", 1)[-1]) if resume else 0
writer = SummaryWriter(os.path.join("runs", "exp1")) if rank == 0 else None
history = []
while True:
    step += 1
    loss = 1.0 / step
    print("rank %d step %d loss %.4f" % (rank, step, loss))
    history.append({"step": step, "loss": loss})
    if writer is not None:
        writer.add_scalar("train/loss", loss, step)
        writer.flush()
    if rank == 0 and step % 3 == 0:
        final = os.path.join(out, "checkpoint-%d" % step)
        os.makedirs(final + ".tmp")
        with open(os.path.join(final + ".tmp", "model.safetensors"), "wb") as fh:
            fh.write(b"w" * 64)
        with open(os.path.join(final + ".tmp", "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step, "log_history": history}, fh)
        os.rename(final + ".tmp", final)
    time.sleep(0.1)
'''

# A stand-in for torchrun (a python console script named `torchrun`): it starts N ranks of the
# script, each in its own session as torch's elastic agent does, and waits for them.
TORCHRUN = f'''#!{PY}
import os, subprocess, sys
args = sys.argv[1:]
n = int(args[args.index("--nproc_per_node") + 1])
at = next(i for i, a in enumerate(args) if a.endswith(".py"))
ranks = [subprocess.Popen([sys.executable, "-u"] + args[at:],
                          env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r)),
                          start_new_session=True) for r in range(n)]
print("ranks", " ".join(str(p.pid) for p in ranks), flush=True)
for p in ranks:
    p.wait()
'''


@dataclass
class Rig:
    root: Path
    box: Box
    sshd: SshdBox
    home: Path

    def config(self) -> dict[str, Any]:
        """A config that names only the host: no run at all."""
        return {"ssh": {**BOUNDS, "config_file": str(self.sshd.ssh_config),
                        "known_hosts": str(self.sshd.known_hosts)},
                "hosts": {"gpu1": {"ssh": "box1", "python": PY}}}

    def once(self) -> dict[str, Any]:
        """`gpuwatch --once --json` as a user runs it; the store persists between calls."""
        path = self.home / "config.toml"
        path.write_text(tomli_w.dumps(self.config()))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home),
               "XDG_STATE_HOME": str(self.home / "state"),
               "XDG_CONFIG_HOME": str(self.home / "xdg")}
        result = subprocess.run([PY, "-m", "gpuwatch.tui.cli", "--once", "--json", "--config",
                                 str(path)], env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode in (0, 1), result.stderr  # 1: a finding (run.dead) is fine
        assert SECRET not in result.stdout + result.stderr
        doc: dict[str, Any] = json.loads(result.stdout)
        jsonschema.validate(doc, load_schema())  # discovered runs are schema run objects
        (host,) = doc["hosts"]
        assert host["ok"], host["error"]
        return host

    def relaunch(self, run: str) -> str:
        """`gpuwatch relaunch gpu1 RUN --yes` as a user runs it → its output (exit 0: started
        and verified running by a fresh poll)."""
        path = self.home / "config.toml"
        path.write_text(tomli_w.dumps(self.config()))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home),
               "XDG_STATE_HOME": str(self.home / "state"),
               "XDG_CONFIG_HOME": str(self.home / "xdg")}
        result = subprocess.run([PY, "-m", "gpuwatch.tui.cli", "relaunch", "gpu1", run, "--yes",
                                 "--config", str(path)], env=env, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stdout + result.stderr
        assert SECRET not in result.stdout + result.stderr
        return result.stdout

    @property
    def store_path(self) -> Path:
        return self.home / "state" / "gpuwatch" / "gpuwatch.sqlite3"

    def store_bytes(self) -> bytes:
        return b"".join(Path(f"{self.store_path}{s}").read_bytes()
                        for s in ("", "-wal", "-shm") if Path(f"{self.store_path}{s}").exists())

    def launch(self, folder: Path, command: str, env: dict[str, str] | None = None) -> None:
        """Start `command` in `folder` as a person does from an SSH login: `setsid nohup`,
        output to train.log, the shell gone at once (the run is re-parented)."""
        login = {"PATH": f"{Path(PY).parent}:/usr/bin:/bin", "HOME": str(self.home),
                 "FOO": "bar", "WANDB_API_KEY": SECRET, "SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22",
                 "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
        subprocess.run(["sh", "-c", f"setsid nohup {command} > train.log 2>&1 < /dev/null &"],
                       cwd=folder, env=env or login, check=True, timeout=10)


def project(root: Path, name: str = "proj") -> Path:
    folder = root / name
    (folder / "outputs").mkdir(parents=True)
    (folder / "train.py").write_text(TRAIN)
    return folder


def pids_in(folder: Path) -> list[int]:
    """Live processes whose cwd is folder, oldest first (by pid order of start)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/cwd") != str(folder):
                continue
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] not in ("Z", "X"):
            found.append((int(rest[19]), int(name)))
    return [pid for _, pid in sorted(found)]


def pythons_in(folder: Path) -> list[int]:
    """pids_in(folder) less shells (the relaunch's detached /bin/sh keeps the folder too)."""
    found = []
    for pid in pids_in(folder):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if os.path.basename(argv0).startswith(b"python"):
            found.append(pid)
    return found


def kill_all(folder: Path) -> None:
    for pid in pids_in(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def rig(tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> Iterator[Rig]:
    box = Box(tmp_path / "box", h100_sxm(2), real_proc=True)
    sshd = sshd_factory(env=box.env(base_path=STD_PATH), bin_dir=box.bin)
    rig = Rig(tmp_path, box, sshd, tmp_path / "me")
    rig.home.mkdir()
    try:
        yield rig
    finally:
        for folder in tmp_path.iterdir():
            if folder.is_dir():
                kill_all(folder)


def checkpoints_of(folder: Path) -> list[Path]:
    return sorted((folder / "outputs").glob("checkpoint-*[0-9]"))


def test_a_training_script_shows_up_with_no_run_configured(rig: Rig) -> None:
    folder = project(rig.root)
    rig.launch(folder, "python train.py --output_dir outputs")
    (pid,) = wait_for(lambda: pids_in(folder), what="the trainer")
    wait_for(lambda: len(checkpoints_of(folder)) >= 2, what="two checkpoints")
    rig.box.add_compute_app(0, pid, "python", 20_000, follows_pid=True)

    host = rig.once()
    runs = {r["name"]: r for r in host["runs"]}
    assert list(runs) == ["train"], runs
    run = runs["train"]
    assert run["status"] == "running" and run["pids"] == [pid]
    assert run["series"]["train/loss"]["points"] >= 3  # tensorboardX events under runs/
    assert run["series"]["train/loss"]["last_value"] == pytest.approx(
        1.0 / run["series"]["train/loss"]["last_step"])
    assert run["series"]["loss"]["points"] >= 3  # the checkpoints' trainer_state.json
    paths = [c["path"] for c in run["checkpoints"]]
    assert len(paths) >= 2 and all(p.startswith(str(folder / "outputs" / "checkpoint-"))
                                   for p in paths)
    assert run["latest_checkpoint"] == max(run["checkpoints"], key=lambda c: c["mtime"])["path"]
    assert run["log_age_s"] is not None and run["log_age_s"] < 30
    procs = {p["pid"]: p for p in host["processes"]}
    assert procs[pid]["run"] == "train"

    # what was found and where: in the model (the store keeps the probe's document)
    with Store.open(rig.store_path) as store:
        state = store.host_state("gpu1")
    assert state is not None and state.doc is not None
    snap = parse_probe_output(state.doc, "gpu1")
    (sample,) = snap.runs
    d = sample.discovered
    assert d is not None and d.alive and d.kind == "python" and d.script == "train.py"
    assert d.cwd == str(folder) and d.log == str(folder / "train.log")
    assert d.log_from == "stdout" and d.events == str(folder / "runs")
    assert d.checkpoints == str(folder / "outputs" / "checkpoint-*")
    assert d.framework == "hf" and d.detach == "setsid"
    assert sample.log is not None and sample.log.path == str(folder / "train.log")

    # a second poll reads only what is new, under the same name
    again = {r["name"]: r for r in rig.once()["runs"]}["train"]
    assert again["series"]["train/loss"]["points"] >= run["series"]["train/loss"]["points"]


def test_a_launcher_and_its_ranks_are_one_run_and_it_relaunches_as_it_was_started(
        rig: Rig) -> None:
    folder = project(rig.root)
    tools = rig.root / "tools"
    tools.mkdir()
    torchrun = tools / "torchrun"
    torchrun.write_text(TORCHRUN)
    torchrun.chmod(0o755)
    rig.launch(folder, f"{torchrun} --nproc_per_node 2 train.py --output_dir outputs")
    launcher, rank0, rank1 = wait_for(lambda: len(pids_in(folder)) == 3 and pids_in(folder),
                                      what="the launcher and two ranks")
    wait_for(lambda: checkpoints_of(folder), what="a checkpoint")
    for gpu, rank in enumerate((rank0, rank1)):
        rig.box.add_compute_app(gpu, rank, "python", 30_000, follows_pid=True)

    # Open question (seen once in CI under load, never alone): one poll listed the launcher and
    # rank 1 but not rank 0. Up to three polls, and every miss is shown if all three miss.
    seen = []
    for _ in range(3):
        host = rig.once()
        runs = {r["name"]: r for r in host["runs"]}
        seen.append((runs, host["processes"], host["gpus"]))
        if list(runs) == ["train"] and runs["train"]["pids"] == sorted([launcher, rank0, rank1]):
            break
        time.sleep(1)
    assert list(runs) == ["train"], seen  # named after the launcher's script
    assert runs["train"]["pids"] == sorted([launcher, rank0, rank1]), seen
    assert runs["train"]["status"] == "running"

    # SIGKILL the whole run; the next --once remembers it and says it is dead
    for pid in (launcher, rank0, rank1):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pids_in(folder), what="the run to die")
    host = rig.once()
    dead = {r["name"]: r for r in host["runs"]}["train"]
    assert dead["status"] == "dead" and dead["pids"] == []
    latest = dead["latest_checkpoint"]
    assert latest is not None and latest.startswith(str(folder / "outputs" / "checkpoint-"))

    # how it was started is in the store: cwd, argv, environment (login and secrets out)
    with Store.open(rig.store_path) as store:
        record = recorded_launch(store, "gpu1", "train")
    assert record is not None
    assert record.cwd == str(folder) and record.pid == launcher
    assert record.argv == (PY, str(torchrun), "--nproc_per_node", "2", "train.py",
                           "--output_dir", "outputs")
    env = record.env_dict
    assert env["FOO"] == "bar" and env["PATH"].startswith(str(Path(PY).parent))
    assert "WANDB_API_KEY" not in env and "SSH_CONNECTION" not in env and "TERM" not in env
    assert record.dropped_secret == ("WANDB_API_KEY",)
    assert {"SSH_CONNECTION", "TERM"} <= set(record.dropped_session)
    assert record.kind == "torchrun" and record.framework == "hf" and record.detach == "setsid"
    assert record.log == str(folder / "train.log")
    assert SECRET.encode() not in rig.store_bytes()  # neither stored ...

    command, dropped, notes = relaunch_command(record, latest)
    assert command == shlex.join([*record.argv, "--resume_from_checkpoint", latest])
    assert dropped == ("WANDB_API_KEY",)
    assert any("WANDB_API_KEY" in note for note in notes)

    # another folder's train.py is another run: it does not block this one's relaunch
    other = rig.root / "other"
    other.mkdir()
    (other / "train.py").write_text("import time\ntime.sleep(600)\n")
    subprocess.Popen([PY, "train.py"], cwd=other, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    wait_for(lambda: pids_in(other), what="the other folder's train.py")

    # ... nor passed: `gpuwatch relaunch gpu1 train --yes` starts it again in the recorded cwd
    # with the recorded environment, shows the exact command first and names what it dropped
    out = rig.relaunch("train")
    assert f"  cd {folder}" in out and f"  {command}" in out, out
    assert "not passed: WANDB_API_KEY" in out, out
    assert SECRET not in out
    # the relaunch's detached shell waits in the same folder: the run is the python processes
    pids = wait_for(lambda: len(pythons_in(folder)) == 3 and pythons_in(folder),
                    what="the relaunched run")
    for gpu, rank in enumerate(pids[1:]):
        rig.box.add_compute_app(gpu, rank, "python", 30_000, follows_pid=True)

    def relaunched_ranks() -> list[dict[str, Any]]:
        lines = (folder / "launches.jsonl").read_text().splitlines()
        return [s for s in map(json.loads, lines) if s["pid"] in pids]

    relaunched = wait_for(lambda: len(relaunched_ranks()) == 2 and relaunched_ranks(),
                          what="both ranks to start")
    for s in relaunched:
        assert s["resume"] == latest
        assert s["env"] == {"FOO": "bar", "WANDB_API_KEY": None, "SSH_CONNECTION": None}
    back = {r["name"]: r for r in rig.once()["runs"]}
    assert list(back) == ["train"]  # the same run again, not a new one
    assert back["train"]["status"] == "running" and back["train"]["pids"] == sorted(pids)
    assert SECRET.encode() not in rig.store_bytes()
