"""Zero-config runs, box side and client side, on fixture boxes and real files.

The probe runs as the SSH path runs it (the bundle on stdin); fixture /proc trees give it
process trees (tests/harness/probe_box.py's 8-GPU box: a tty-bound `python train.py`, a
torchrun under tmux with seven ranks and a dataloader worker, a nohup'd orphan holding a GPU).
The end-to-end
tests over a real sshd with real processes are in test_discover_sshd.py.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import pytest
from gpuwatch.remote.actions.pin import pin_run
from gpuwatch.remote.box import discover
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import HostConfig, RunConfig
from gpuwatch.remote.model.discovered import discovered_requests
from gpuwatch.remote.model.discovery import Discovery, describe, parse_discovery
from gpuwatch.remote.model.launches import (
    LaunchRecord,
    RelaunchError,
    launch_record,
    record_launches,
    recorded_launch,
)
from gpuwatch.remote.model.resume import relaunch_command
from gpuwatch.remote.model.series import RunSeries
from gpuwatch.remote.store import Store
from gpuwatch.remote.wire.document import parse_probe_output
from harness.probe_box import Box, build_box, probe_doc, python36, rows
from tensorboardX import SummaryWriter

QUIET = {"gpus": False, "kernel": False, "cgroup": False, "logind": False, "nvml": False}


# ---------------------------------------------------------------- what a command line runs

@pytest.mark.parametrize(("argv", "kind", "name"), [
    (["python", "train.py", "--lr", "3e-4"], "python", "train"),
    (["/usr/bin/python3.10", "-u", "-W", "ignore", "scripts/train.py"], "python", "train"),
    (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc_per_node", "8", "train.py",
      "--output_dir", "out"], "torchrun", "train"),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "finetune.py"],
     "torchrun", "finetune"),
    (["python", "-m", "torch.distributed.launch", "--use-env", "pretrain.py"], "torchrun",
     "pretrain"),
    (["/opt/venv/bin/python", "/opt/venv/bin/accelerate", "launch", "--num_processes", "2",
      "sft.py"], "accelerate", "sft"),
    (["python", "/usr/bin/deepspeed", "--num_gpus", "4", "ds_train.py"], "deepspeed",
     "ds_train"),
    (["mpirun", "-np", "2", "python", "horovod_train.py"], "mpirun", "horovod_train"),
    (["torchrun", "--nproc_per_node", "2", "-m", "myproj.train"], "torchrun", "train"),
    (["python", "-m", "myproj.train", "--x"], "python", "train"),
    (["python", "-mmyproj.trainer.__main__"], "python", "trainer"),
    (["python", "-c", "import torch"], "python", "python"),
    (["./cuda_app", "--size", "8"], "program", "cuda_app"),
    (["python3", "evil ) (name x.py"], "python", "evil-name-x"),
])
def test_launcher_and_name_from_argv(argv: list[str], kind: str, name: str) -> None:
    got_kind, script, module = discover.parse_command(argv)
    assert got_kind == kind
    assert discover.run_name(got_kind, script, module) == name


def test_environment_drops_login_and_secrets_on_the_box() -> None:
    raw = b"\0".join([
        b"PATH=/opt/conda/bin:/usr/bin", b"HOME=/home/ada", b"FOO=bar", b"CUDA_VISIBLE_DEVICES=0,1",
        b"WANDB_API_KEY=sekrit1", b"HF_TOKEN=hf_sekrit2", b"AWS_SECRET_ACCESS_KEY=sekrit3",
        b"DB_PASSWORD=sekrit4", b"XAUTHORITY=/x", b"DATABASE_URL=postgres://u:sekrit5@db/x",
        b"SSH_CONNECTION=1.2.3.4 5 6.7.8.9 22", b"SSH_AUTH_SOCK=/tmp/a", b"TERM=xterm",
        b"TMUX=/tmp/tmux,1,0", b"TMUX_PANE=%1", b"STY=1.pts", b"DISPLAY=:0",
        b"XDG_SESSION_ID=3", b"SHLVL=2", b"PWD=/home/ada", b"OLDPWD=/", b"_=/usr/bin/python",
        b"WANDB_MODE=offline", b""])
    env, secret, session = discover.split_environ(raw)
    assert env == {"PATH": "/opt/conda/bin:/usr/bin", "HOME": "/home/ada", "FOO": "bar",
                   "CUDA_VISIBLE_DEVICES": "0,1", "WANDB_MODE": "offline"}
    assert secret == ["AWS_SECRET_ACCESS_KEY", "DATABASE_URL", "DB_PASSWORD", "HF_TOKEN",
                      "WANDB_API_KEY", "XAUTHORITY"]
    assert session == ["DISPLAY", "OLDPWD", "PWD", "SHLVL", "SSH_AUTH_SOCK", "SSH_CONNECTION",
                       "STY", "TERM", "TMUX", "TMUX_PANE", "XDG_SESSION_ID", "_"]
    assert "sekrit" not in json.dumps([env, secret, session])


# ---------------------------------------------------------------- grouping on a fixture box

def discovered(doc: dict) -> dict[str, dict]:
    return {r["name"]: r for r in doc.get("discovered") or []}


def zero_config(**changes) -> dict:
    return {"v": 1, "disks": [], "runs": [], "limits": {"fds_per_proc": 16},
            "nvidia_smi_timeout_s": 5, "want": {"nvml": False}, **changes}


def test_process_trees_become_runs_named_after_the_launchers_script(box: Box) -> None:
    doc = probe_doc(zero_config(), box.env())
    assert doc["errors"] == {}
    runs = discovered(doc)
    assert sorted(runs) == ["evil-name-x", "pretrain", "train"]
    # torchrun (under tmux), its seven ranks and a rank's dataloader worker: one run; the
    # defunct worker is not alive
    pre = runs["pretrain"]
    assert pre["pids"] == [920, 921, 922, 923, 924, 925, 926, 927, 930]
    d = pre["discovered"]
    assert d["kind"] == "torchrun" and d["script"] == "pretrain.py" and "alive" not in d
    assert d["launcher"]["pid"] == 920 and d["launcher"]["detach"] == "tmux"
    assert d["launcher"]["argv"][:2] == ["/usr/bin/python3.10", "/usr/local/bin/torchrun"]
    assert d["key"] == ["/data/llama", "/data/llama/pretrain.py"]
    # the tty-bound run stops at its shell; its launcher is itself
    assert runs["train"]["pids"] == [830]
    assert runs["train"]["discovered"]["launcher"]["detach"] == "terminal"
    # the process table names each process's run
    procs = {p["pid"]: p for p in rows(doc["processes"]["procs"])}
    assert procs[920]["run"] == procs[930]["run"] == "pretrain"
    assert procs[830]["run"] == "train" and procs[810]["run"] is None  # sshd is no run
    snap = parse_probe_output(json.dumps(doc).encode(), "box")
    by_name = {r.name: r for r in snap.runs}
    assert by_name["pretrain"].discovered is not None
    assert by_name["pretrain"].discovered.kind == "torchrun"


def test_a_discovered_run_that_matches_a_configured_one_is_the_configured_one(box: Box) -> None:
    request = zero_config(runs=[{"name": "llama", "process": "train.py"},
                                {"name": "big", "process": "pretrain.py"}])
    doc = probe_doc(request, box.env())
    assert [r["name"] for r in doc["runs"]] == ["llama", "big"]
    assert sorted(discovered(doc)) == ["evil-name-x"]  # nothing twice
    # a configured run's name is never taken by a discovered one
    doc = probe_doc(zero_config(runs=[{"name": "train", "process": "nomatch.py"}]), box.env())
    assert "train" not in discovered(doc) and "train-llama" in discovered(doc)


def test_discovery_off_by_request(box: Box) -> None:
    doc = probe_doc(zero_config(want={"nvml": False, "discover": False}), box.env())
    assert "discovered" not in doc
    assert all(p["run"] is None for p in rows(doc["processes"]["procs"]))


def test_a_remembered_run_keeps_its_name_and_a_dead_one_is_still_read(box: Box,
                                                                       tmp_path: Path) -> None:
    ckpt = tmp_path / "old" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "step-100.pt").write_bytes(b"w" * 10)
    remembered = [
        {"name": "mine", "key": ["/data/llama", "/data/llama/train.py"], "searched_at": 0},
        {"name": "gone", "key": [str(tmp_path / "old"), str(tmp_path / "old/x.py")],
         "checkpoints": str(ckpt / "*.pt"), "searched_at": 0},
    ]
    doc = probe_doc(zero_config(discovered_runs=remembered), box.env())
    runs = discovered(doc)
    assert sorted(runs) == ["evil-name-x", "gone", "mine", "pretrain"]
    assert runs["mine"]["pids"] == [830]
    gone = runs["gone"]
    assert gone["pids"] == [] and gone["discovered"] == {"key": remembered[1]["key"],
                                                         "alive": False}
    assert [row[0] for row in gone["checkpoints"]["items"]["rows"]] == [str(ckpt /
                                                                          "step-100.pt")]


def test_same_script_in_two_folders_gets_two_names(tmp_path: Path) -> None:
    box = Box(tmp_path / "box")
    box.process(1, "systemd", 0, cmd=["/sbin/init"], start=1)
    for pid, start in ((500, 900), (400, 1000)):
        box.process(pid, "python", 1, cmd=["python", "train.py"], start=start,
                    fds=("/dev/nvidia0",))
    (box.proc / "400" / "cwd").unlink()
    (box.proc / "400" / "cwd").symlink_to("/data/gpt")
    doc = probe_doc(zero_config(want={"nvml": False, "gpus": False}), box.env())
    runs = discovered(doc)
    # deterministic: the earlier start keeps the plain name
    assert runs["train"]["pids"] == [500] and runs["train-gpt"]["pids"] == [400]


def test_a_rank_behind_a_shell_stays_in_its_launchers_run(tmp_path: Path) -> None:
    """launch.py (holding a GPU) → sh -c → python rank.py (holding one): the climb from the
    rank stops at the shell, but the rank lies in the launcher's tree: one run."""
    box = Box(tmp_path / "box")
    box.process(1, "systemd", 0, cmd=["/sbin/init"], start=1)
    box.process(600, "python", 1, cmd=["python", "launch.py"], start=900,
                fds=("/dev/nvidia0",))
    box.process(601, "sh", 600, cmd=["sh", "-c", "python rank.py"], start=901, session=600)
    box.process(602, "python", 601, cmd=["python", "rank.py"], start=902, session=600,
                fds=("/dev/nvidia1",))
    doc = probe_doc(zero_config(want={"nvml": False, "gpus": False}), box.env())
    runs = discovered(doc)
    assert list(runs) == ["launch"] and runs["launch"]["pids"] == [600, 601, 602]


def test_a_remembered_run_is_running_before_its_ranks_hold_a_gpu(tmp_path: Path) -> None:
    """A relaunched run starting up (CUDA init takes seconds to minutes): no process holds a
    GPU yet, but its launcher has the remembered (cwd, script): it is that run, alive. A run
    nobody remembers needs a GPU to be found; a remembered one already alive costs no scan."""
    box = Box(tmp_path / "box")
    box.process(1, "systemd", 0, cmd=["/sbin/init"], start=1)
    box.process(700, "sh", 1, cmd=["/bin/sh", "/tmp/gpuwatch-launch-x.sh"], start=899)
    box.process(701, "python", 700, cmd=["python", "/usr/bin/torchrun", "--nproc_per_node", "2",
                                         "train.py"], start=900)
    for rank in (702, 703):
        box.process(rank, "pt_main_thread", 701, cmd=["python", "-u", "train.py"], start=901)
    box.process(800, "python", 1, cmd=["python", "other.py"], start=950)
    for pid in (700, 701, 702, 703, 800):
        (box.proc / str(pid) / "cwd").unlink()
        (box.proc / str(pid) / "cwd").symlink_to("/data/gpt")
    request = zero_config(want={"nvml": False, "gpus": False})
    assert discovered(probe_doc(request, box.env())) == {}  # nothing holds a GPU
    remembered = [{"name": "train", "key": ["/data/gpt", "/data/gpt/train.py"],
                   "searched_at": 0}]
    doc = probe_doc({**request, "discovered_runs": remembered}, box.env())
    runs = discovered(doc)
    assert list(runs) == ["train"] and runs["train"]["pids"] == [701, 702, 703]
    assert "alive" not in runs["train"]["discovered"]  # running, the shell not part of it
    procs = {p["pid"]: p for p in rows(doc["processes"]["procs"])}
    assert procs[702]["run"] == "train" and procs.get(800, {}).get("run") is None


def test_the_relaunch_script_strips_the_same_login_variables_as_discovery() -> None:
    """actions_box.py and discover.py are each sent to the box alone, so each has its copy of
    the login's variable names (U34): they must not drift apart."""
    from gpuwatch.remote.box import act as actions_box

    assert actions_box.SESSION_NAMES == discover.SESSION_NAMES
    assert actions_box.SESSION_PREFIXES == discover.SESSION_PREFIXES


# ---------------------------------------------------------------- artifacts by convention

def hf_project(root: Path, steps: int = 3) -> Path:
    """A HuggingFace-Trainer-like output: events under runs/, checkpoint-N/ folders with their
    trainer_state.json, a big data/ folder, and a log."""
    with SummaryWriter(str(root / "outputs" / "runs" / "Jan01_box")) as writer:
        for step in range(1, steps + 1):
            writer.add_scalar("train/loss", 1.0 / step, step)
    for step in range(1, steps + 1):
        folder = root / "outputs" / f"checkpoint-{step * 10}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * 100)
        (folder / "optimizer.pt").write_bytes(b"o" * 10)
        history = [{"step": s * 10, "loss": 1.0 / s} for s in range(1, step + 1)]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        os.utime(folder / "model.safetensors", (1000 + step, 1000 + step))
    (root / "pretrained.pt").write_bytes(b"p")
    os.utime(root / "pretrained.pt", (10, 10))
    return root


def test_search_finds_hf_artifacts_first_and_stays_in_bound(tmp_path: Path) -> None:
    root = hf_project(tmp_path / "proj")
    data = root / "data"  # a big dataset folder, searched after the conventional ones
    data.mkdir()
    for i in range(10_000):
        (data / f"shard-{i:05d}.txt").touch()
    group = {"root": os.getpid(), "cwd": str(root)}
    t0 = time.monotonic()
    found, stats = discover.artifacts(group, {"limits": {}}, time.monotonic() + 5)
    elapsed = time.monotonic() - t0
    assert stats["capped"] == "entries" and stats["entries"] == 5000
    assert elapsed < 1.0
    assert found["events"] == str(root / "outputs" / "runs")
    assert found["checkpoints"] == str(root / "outputs" / "checkpoint-*")
    assert found["metrics"] == [str(root / "outputs" / "checkpoint-*" / "trainer_state.json")]
    assert found["framework"] == "hf"
    # the time bound holds as well
    _, stats = discover.artifacts(group, {"limits": {}}, time.monotonic())
    assert stats["capped"] == "time"


def test_search_finds_lightning_artifacts(tmp_path: Path) -> None:
    root = tmp_path / "pl"
    version = root / "lightning_logs" / "version_1"
    (version / "checkpoints").mkdir(parents=True)
    with SummaryWriter(str(version)) as writer:
        writer.add_scalar("val_loss", 0.5, 1)
    (version / "checkpoints" / "epoch=0-step=100.ckpt").write_bytes(b"c")
    (version / "metrics.csv").write_text("epoch,step,val_loss\n0,100,0.5\n")
    (root / "nohup.out").write_text("hi\n")
    found, stats = discover.artifacts({"root": 0, "cwd": str(root)}, {"limits": {}},
                                      time.monotonic() + 5)
    assert stats["capped"] is None
    assert found["events"] == str(root / "lightning_logs")
    assert found["checkpoints"] == str(root / "lightning_logs/version_*/checkpoints/*.ckpt")
    assert found["metrics"] == [str(root / "lightning_logs/version_*/metrics.csv")]
    assert found["framework"] == "lightning"
    assert found["log"] == str(root / "nohup.out") and found["log_from"] == "nohup.out"


def test_depth_bound_is_reported(tmp_path: Path) -> None:
    deep = tmp_path / "p" / "a" / "b" / "c" / "d" / "e" / "f"
    deep.mkdir(parents=True)
    (deep / "model.pt").write_bytes(b"x")
    found, stats = discover.artifacts({"root": 0, "cwd": str(tmp_path / "p")},
                                      {"limits": {"discover_depth": 3}}, time.monotonic() + 5)
    assert stats["capped"] == "depth" and found["checkpoints"] is None


# ---------------------------------------------------------------- the client's memory

def discovery(**changes) -> Discovery:
    base = dict(name="train", key=("/w", "/w/train.py"), alive=True, kind="torchrun",
                script="train.py", process="train.py", cwd="/w", launcher_pid=42,
                launcher_start_ticks=7,
                argv=("torchrun", "--nproc_per_node", "2", "train.py", "--output_dir", "out"),
                detach="setsid", env=(("FOO", "bar"), ("PATH", "/usr/bin")),
                env_secret=("WANDB_API_KEY",), env_session=("SSH_CONNECTION",),
                log="/w/train.log", events="/w/out/runs", checkpoints="/w/out/checkpoint-*",
                metrics=("/w/out/checkpoint-*/trainer_state.json",), framework="hf",
                searched_at=100.0)
    base.update(changes)
    return Discovery(**base)  # type: ignore[arg-type]


def test_merging_keeps_the_launch_while_the_box_says_it_is_the_same() -> None:
    first = discovery()
    again = discovery(same=True, argv=None, env=None, env_secret=(), env_session=())
    merged = again.merged(first)
    assert merged.argv == first.argv and merged.env == first.env
    assert merged.env_secret == ("WANDB_API_KEY",)
    dead = Discovery(name="train", key=first.key, alive=False, log="/w/train.log")
    assert dead.merged(first).argv == first.argv and not dead.merged(first).alive
    assert Discovery.from_state("train", first.to_state()) == replace_env(first)


def replace_env(d: Discovery) -> Discovery:
    from dataclasses import replace
    return replace(d, env=None)


def test_remembered_runs_go_back_in_the_request_and_configured_or_pinned_ones_do_not() -> None:
    host = HostConfig(name="gpu1", ssh="gpu1", runs=(RunConfig(name="llama", process="x.py"),))
    runs = {}
    for name, last in (("train", 50.0), ("old", 10.0), ("llama", 60.0)):
        series = RunSeries(name)
        series.discovery = discovery(name=name, key=("/w", f"/w/{name}.py"))
        series.last_seen_running_at = last
        series.offsets = {"/w/out/runs/ev": 12}
        runs[name] = series
    entries = discovered_requests(host, runs)
    assert [e["name"] for e in entries] == ["train", "old"]
    assert entries[0]["launch_seen"] == [42, 7] and entries[0]["offsets"] == {"/w/out/runs/ev": 12}
    assert "env" not in json.dumps(entries)
    pinned = HostConfig(name="gpu1", ssh="gpu1",
                        runs=(RunConfig(name="mine", process="train.py", workdir="/w"),))
    assert discovered_requests(pinned, {"train": runs["train"]}) == []


def test_state_round_trip_through_the_store_keeps_no_environment(tmp_path: Path) -> None:
    series = RunSeries("train")
    series.discovery = discovery()
    with Store.open(tmp_path / "s.sqlite3") as store:
        store.save_runs("gpu1", {"train": (series.state(), None)})
        state, _ = store.runs("gpu1")["train"]
    assert "bar" not in json.dumps(state)
    back = RunSeries.from_state("train", state)
    assert back.discovery is not None and back.discovery.argv == series.discovery.argv


# ---------------------------------------------------------------- launches and relaunch

def record(**changes) -> LaunchRecord:
    rec = launch_record("gpu1", discovery(**changes), at=1000.0, boot_id="b")
    assert rec is not None
    return rec


def test_launch_recorded_and_read_back(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.sqlite3") as store:
        assert recorded_launch(store, "gpu1", "train") is None
        store.save_launch("gpu1", "train", record().to_json(), 1000.0)
        back = recorded_launch(store, "gpu1", "train")
    assert back == record()
    assert back.env_dict == {"FOO": "bar", "PATH": "/usr/bin"}
    assert back.dropped_secret == ("WANDB_API_KEY",) and back.detach == "setsid"
    assert oct((tmp_path / "s.sqlite3").stat().st_mode & 0o777) == "0o600"


def test_a_launch_the_box_did_not_resend_is_not_recorded_again() -> None:
    assert launch_record("gpu1", discovery(same=True), 1.0) is None
    assert launch_record("gpu1", discovery(alive=False), 1.0) is None


def test_relaunch_hf_convention_appends_the_resume_argument() -> None:
    command, dropped, notes = relaunch_command(record(), "/w/out/checkpoint-30")
    assert command == ("torchrun --nproc_per_node 2 train.py --output_dir out "
                       "--resume_from_checkpoint /w/out/checkpoint-30")
    assert dropped == ("WANDB_API_KEY",)
    assert any("WANDB_API_KEY" in n and "never read, stored or sent its value" in n for n in notes)
    # an existing resume argument is replaced, not doubled
    again = record(argv=("python", "train.py", "--output_dir", "out",
                         "--resume_from_checkpoint=/w/out/checkpoint-10"))
    command, _, _ = relaunch_command(again, "/w/out/checkpoint-30")
    assert command == ("python train.py --output_dir out "
                       "--resume_from_checkpoint=/w/out/checkpoint-30")


def test_relaunch_lightning_cli_and_unknown_conventions() -> None:
    pl = record(argv=("python", "main.py", "fit", "--config", "c.yaml"), framework="lightning")
    command, _, _ = relaunch_command(pl, "/w/lightning_logs/version_0/checkpoints/e.ckpt")
    assert command.endswith("fit --config c.yaml --ckpt_path "
                            "/w/lightning_logs/version_0/checkpoints/e.ckpt")
    plain = record(argv=("python", "train.py"), framework=None)
    command, _, notes = relaunch_command(plain, "/w/ckpt/last.pt")
    assert command == "python train.py"
    assert any("starts from scratch" in n and "{latest_checkpoint}" in n for n in notes)
    command, _, notes = relaunch_command(plain, None)
    assert command == "python train.py" and "no checkpoint" in notes[0]


def test_relaunch_template_is_filled_and_quoted() -> None:
    rec = record(argv=("python", "my train.py"))
    command, _, _ = relaunch_command(rec, "/w/ck pt/step-3",
                                     template="{command} --resume {latest_checkpoint}")
    assert command == "python 'my train.py' --resume '/w/ck pt/step-3'"
    with pytest.raises(RelaunchError, match=r"needs \{latest_checkpoint\}"):
        relaunch_command(rec, None, template="{command} --resume {latest_checkpoint}")


def test_record_launches_from_a_snapshot(tmp_path: Path, box: Box) -> None:
    doc = probe_doc(zero_config(), box.env())
    snap = parse_probe_output(json.dumps(doc).encode(), "gpu1")
    with Store.open(tmp_path / "s.sqlite3") as store:
        assert record_launches(store, "gpu1", snap, 5.0) == 3
        rec = recorded_launch(store, "gpu1", "pretrain")
    assert rec is not None and rec.cwd == "/data/llama" and rec.process == "pretrain.py"
    assert rec.env == () and rec.env_error  # the fixture has no environ file
    assert rec.detach == "tmux"
    sample = next(r for r in snap.runs if r.name == "pretrain")
    assert sample.discovered is not None
    assert "discovered run pretrain" in describe(sample.discovered)[0]


def test_parse_discovery_rejects_a_bad_key() -> None:
    with pytest.raises(ValueError, match="key"):
        parse_discovery("x", {"key": "nope"})


# ---------------------------------------------------------------- pinning into the config

CONFIG = """\
# my fleet
interval = 10  # seconds

[hosts.gpu1]
ssh = "gpu1"  # the big box
"""


def test_pin_appends_the_table_and_keeps_comments(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    message = pin_run(path, "gpu1", discovery())
    text = path.read_text()
    assert text.startswith(CONFIG) and "# the big box" in text
    assert "[hosts.gpu1.runs.train]" in message or "hosts.gpu1.runs.train" in message
    config = parse_config(text, path)
    run = config.hosts[0].runs[0]
    assert run.name == "train" and run.workdir == "/w" and run.process == "train.py"
    assert run.log == "train.log" and run.events == "out/runs"
    assert run.checkpoints == "out/checkpoint-*"
    assert run.metrics == ("out/checkpoint-*/trainer_state.json",)
    assert run.relaunch == ("torchrun --nproc_per_node 2 train.py --output_dir out "
                            "--resume_from_checkpoint {latest_checkpoint}")
    assert run.detach == "setsid"
    assert "WANDB_API_KEY" not in json.dumps(dict(run.env))
    with pytest.raises(ValueError, match="already"):
        pin_run(path, "gpu1", discovery())


def test_pin_to_a_new_file_and_a_new_host(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.toml"
    pin_run(path, "gpu9", discovery(name="train-2"))
    data = tomllib.loads(path.read_text())
    assert data["hosts"]["gpu9"]["ssh"] == "gpu9"
    assert data["hosts"]["gpu9"]["runs"]["train-2"]["process"] == "train.py"


def test_pin_into_an_inline_host_table_rewrites_and_says_comments_go(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('# fleet\nhosts = { gpu1 = { ssh = "gpu1" } }\n')
    message = pin_run(path, "gpu1", discovery())
    assert "comments" in message
    data = tomllib.loads(path.read_text())
    assert data["hosts"]["gpu1"]["runs"]["train"]["workdir"] == "/w"


# ---------------------------------------------------------------- 3.6

def test_discovery_runs_under_python_36(box: Box) -> None:
    doc = probe_doc(zero_config(), box.env(), python=python36())
    assert doc["errors"] == {} and doc["host"]["python"].startswith("3.6.")
    assert sorted(discovered(doc)) == ["evil-name-x", "pretrain", "train"]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return build_box(tmp_path / "box")

