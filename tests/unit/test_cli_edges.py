"""The command line's rough edges (item 9), each pinned: `init` with a path for a
HOST, a starter whose example run is TOML when uncommented, `scalars --tag` that matches
nothing, a lone run named by its folder, a refusal said once, `check` on each run's files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.starter import starter_text
from gpuwatch.tui.cli.command import EXIT_OK, EXIT_USAGE, run
from gpuwatch.tui.cli.scalars import EXIT_NOINPUT, run_scalars
from tensorboardX import SummaryWriter


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GPUWATCH_CONFIG", raising=False)


# ---------------------------------------------------------------- init


@pytest.mark.parametrize("host", ["/tmp/x.toml", "x.toml", "./gpu.conf", "~/gpuwatch.toml"])
def test_init_refuses_a_host_that_looks_like_a_path(tmp_path: Path, host: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["init", host, "gpu1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "looks like a file path" in err
    assert f"gpuwatch init --config {host} gpu1" in err.replace("'", "")
    assert not (tmp_path / "xdg" / "gpuwatch" / "config.toml").exists()
    assert not Path(host).exists() or host.startswith("/tmp")  # nothing written for it


def test_init_still_takes_every_kind_of_ssh_target(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    assert run(["init", "--config", str(path), "gpu1", "me@gpu2:2222", "gpu3.lab", "local"]) == 0
    hosts = tomllib.loads(path.read_text())["hosts"]
    assert [h["ssh"] for h in hosts.values()] == ["gpu1", "me@gpu2:2222", "gpu3.lab", "local"]


@pytest.mark.parametrize("host", ["gpu1", "gpu1.lab.example", "me@10.0.0.7:2222", "[::1]:22"])
def test_the_starter_is_toml_with_its_examples_uncommented(host: str) -> None:
    """Every commented key (the ssh alternatives and the example run) uncommented: still a
    config, and the example run is the first host's (a dotted name is quoted, not nested)."""
    lines = starter_text([host]).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# A training run on"))
    uncommented = [line.removeprefix("# ") if i > start else line
                   for i, line in enumerate(lines)]
    uncommented = [line.removeprefix("# ") if line.startswith(("# known_hosts = ",
                                                               "# identity_file = "))
                   else line for line in uncommented]
    config = parse_config("\n".join(uncommented) + "\n")
    (only,) = config.hosts
    assert only.ssh == host and [r.name for r in only.runs] == ["llama"]
    assert only.settings.known_hosts == "~/.ssh/known_hosts"


# ---------------------------------------------------------------- scalars


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    w = SummaryWriter(str(tmp_path / "exp1"))
    for step in range(3):
        w.add_scalar("loss", 1.0 / (step + 1), step, walltime=1000.0 + step)
        w.add_scalar("lr", 0.1, step, walltime=1000.0 + step)
    w.close()
    return tmp_path / "exp1"


def scalars(paths: list[str], tags: list[str] | None = None, as_json: bool = False
            ) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_scalars(paths, tags, as_json, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("as_json", [False, True])
def test_a_tag_that_matches_nothing_lists_the_tags_and_fails(logdir: Path,
                                                             as_json: bool) -> None:
    code, out, err = scalars([str(logdir)], ["nosuch"], as_json)
    assert code == EXIT_NOINPUT
    assert err == "gpuwatch scalars: no tag matches nosuch; the tags there: loss, lr\n"
    assert as_json or out == ""  # not a table saying "(no scalars)" as well
    code, out, err = scalars([str(logdir)], ["loss", "acc/*"], as_json)
    assert code == EXIT_NOINPUT and "no tag matches acc/*;" in err and "loss" in out
    assert scalars([str(logdir)], ["l*"], as_json)[0] == EXIT_OK


def test_a_lone_folder_is_named_by_the_folder_not_dot(logdir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = scalars([str(logdir)])
    assert code == EXIT_OK and out.splitlines()[0] == str(logdir)
    (event_file,) = logdir.iterdir()
    assert scalars([str(event_file)])[1].splitlines()[0] == str(logdir)
    monkeypatch.chdir(logdir)
    assert scalars(["."])[1].splitlines()[0] == str(logdir)
    assert scalars([event_file.name])[1].splitlines()[0] == str(logdir)


# ---------------------------------------------------------------- actions and check


def local_config(tmp_path: Path, runs: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[hosts.local]\nssh = "local"\npython = "{sys.executable}"\n{runs}')
    return path


def test_a_refusal_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = local_config(tmp_path)
    assert run(["kill", "local", "999999999", "--yes", "--config", str(config)]) == 1
    out = capsys.readouterr()
    said = out.out + out.err
    assert said.count("999999999") == 1, said
    assert "no process to signal" not in said and "refused" not in said
    assert said.startswith("cannot kill on local: pid 999999999"), said


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    work = tmp_path / "work"
    (work / "ckpt-100").mkdir(parents=True)
    (work / "train.log").write_text("step 100\n")
    script = work / "edgetrain_xq.py"
    script.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=work)
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def test_check_says_whether_each_runs_process_and_files_were_found(
        tmp_path: Path, trainer: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    config = local_config(tmp_path, f"""
[hosts.local.runs.up]
process = "edgetrain_xq.py"
workdir = "{work}"
log = "train.log"
events = "runs"
metrics = ["trainer_state.json"]
checkpoints = "ckpt-*"

[hosts.local.runs.gone]
process = "edgetrain_nosuch.py"
workdir = "{work}"
log = "missing.log"
""")
    assert run(["check", "--config", str(config)]) == EXIT_OK
    lines = {line.split(":")[1].strip(): line for line in capsys.readouterr().out.splitlines()
             if line.startswith("local: run ")}
    up, gone = lines["run up"], lines["run gone"]
    assert f"process running (1 pid: {trainer.pid})" in up
    assert f"log found ({work}/train.log)" in up
    assert "event files not found" in up and f"{work}/runs" in up
    assert "metrics not found" in up and f"{work}/trainer_state.json" in up
    assert f"checkpoints: 1 (newest {work}/ckpt-100)" in up
    assert f"no process matches `edgetrain_nosuch.py` in {work}" in gone
    assert "log not found" in gone and f"{work}/missing.log" in gone
    assert os.path.basename(str(work)) in gone


# ---------------------------------------------------------------- one module per verb


def test_no_verb_module_but_launch_imports_textual() -> None:
    """Each verb's module imported alone (as its verb imports it) leaves Textual out."""
    code = ("import sys\n"
            "from gpuwatch.tui.cli import actions, check, command, common, init, once, scalars\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('textual', 'plotext', "
            "'textual_plotext')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_verbs_help_offers_only_the_common_options_that_act_there(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwatch.tui.cli.command import build_parser

    def help_of(verb: str) -> str:
        return " ".join(build_parser(verb).format_help().split())

    assert "--theme" not in help_of("scalars") and "--config" not in help_of("scalars")
    assert "--interval" not in help_of("init") and "--config" in help_of("init")
    kill = help_of("kill")
    assert "--readonly" in kill and "--theme" not in kill and "KILL ends it" in kill
    assert "--interval" in help_of("watch") and "--theme" not in help_of("watch")
    main = build_parser(None).format_help()
    assert all(f"--{o}" in main for o in ("config", "interval", "theme", "readonly"))
    # Still accepted where not offered: a script that passes them everywhere keeps working.
    args = build_parser("scalars").parse_args(["runs/", "--theme", "x", "--interval", "5"])
    assert args.theme == "x" and args.interval == 5.0


# ---------------------------------------------------------------- a closed pipe


def test_every_verb_ends_quietly_when_its_reader_closes_the_pipe(tmp_path: Path) -> None:
    """`gpuwatch scalars DIR --json | head -c 100`, twenty times: it ended 3 times in 8 with
    "internal error ... BrokenPipeError", exit 70. An event file whose JSON is far more than a
    pipe holds (64 KiB) makes the writer meet the closed pipe every time: it must end as a
    filter SIGPIPE ended (141) or cleanly (0), silently. `--help | head -c 10` too."""
    w = SummaryWriter(str(tmp_path / "run"))
    for step in range(6000):
        w.add_scalar("train/loss", 1.0 / (step + 1), step, walltime=1000.0 + step)
    w.close()
    script = (
        'for i in $(seq 20); do '
        '"$PY" -m gpuwatch.tui.cli scalars "$DIR" --json 2>>"$ERR" | head -c 100 >/dev/null; '
        'echo "${PIPESTATUS[0]}"; done; '
        '"$PY" -m gpuwatch.tui.cli scalars --help 2>>"$ERR" | head -c 10 >/dev/null; '
        'echo "${PIPESTATUS[0]}"')
    err = tmp_path / "stderr.txt"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PY": sys.executable, "DIR": str(tmp_path / "run"),
                               "ERR": str(err)})
    codes = [int(c) for c in done.stdout.split()]
    assert len(codes) == 21, done
    assert set(codes) <= {0, 141}, codes
    assert 141 in codes[:20]  # the pipe was really closed under it (the test tests something)
    assert err.read_text() == ""  # no "internal error", no "Exception ignored"
