"""Config: loading, validation errors that name file/line/key, per-host overrides, init."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from gpuwatch.remote.config.schema import (
    ConfigError,
    SshSettings,
    find_config,
    load_config,
    parse_config,
    select_hosts,
)
from gpuwatch.remote.config.starter import starter_data, starter_text, write_starter

FULL = """\
interval = 7

[ssh]
connect_timeout = 4
server_alive_interval = 2
server_alive_count_max = 5
command_timeout = 20
known_hosts = "/tmp/kh"

[hosts.gpu1]
ssh = "gpu1"
python = "/usr/bin/python3"
disks = ["/", "/data"]
connect_timeout = 2.5

[hosts.gpu1.runs.llama]
process = "train.py"
workdir = "/data/llama"
log = "train.log"
events = "runs"
metrics = ["outputs/trainer_state.json"]
checkpoints = "outputs/checkpoint-*"
done = "outputs/DONE"
relaunch = "python train.py --resume {latest_checkpoint}"
detach = "setsid"
env = { CUDA_VISIBLE_DEVICES = "0,1" }

[hosts.gpu2]
ssh = "me@gpu2:2222"
"""


def test_full_config_loads_with_defaults_and_per_host_overrides() -> None:
    config = parse_config(FULL, Path("c.toml"))
    assert config.interval == 7
    gpu1, gpu2 = config.hosts
    assert gpu1.settings.connect_timeout == 2.5  # per-host override
    assert gpu1.settings.server_alive_count_max == 5  # inherited from [ssh]
    assert gpu2.settings.connect_timeout == 4
    assert gpu2.settings.config_file == SshSettings().config_file  # the default
    assert gpu2.python == "python3" and gpu2.disks == ("/",)
    (run,) = gpu1.runs
    assert run.name == "llama" and run.detach == "setsid" and run.metrics == (
        "outputs/trainer_state.json",)
    assert run.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert run.resolve(run.log) == "/data/llama/train.log"
    assert run.resolve("/abs/x") == "/abs/x"


@pytest.mark.parametrize(
    ("text", "line", "key", "expect"),
    [
        ("interval = 5\n[hosts.a]\nssh = 'a'\n[hosts.a.runs.x]\nproces = 't'\n", 5,
         "hosts.a.runs.x.proces", "unknown key"),
        ('interval = "5"\n', 1, "interval", "expected a number"),
        ("interval = -1\n", 1, "interval", "from 1 to 86400"),
        ("[ssh]\n\nserver_alive_count_max = 1.5\n", 3, "ssh.server_alive_count_max",
         "expected an integer"),
        ("[hosts.a]\nssh = 'a'\ndisks = ['data']\n", 3, "hosts.a.disks", "absolute"),
        ("[hosts.a]\nssh = 'a'\n[hosts.a.runs.r]\ndetach = 'nohup'\n", 4,
         "hosts.a.runs.r.detach", "tmux, setsid"),
        ("[hosts.a]\nssh = 'a'\n[hosts.a.runs.r]\nenv = { 'BAD-NAME' = 'x' }\n", 4,
         "hosts.a.runs.r.env.BAD-NAME", "environment variable name"),
        ('[hosts.a]\nssh = "a\\nb"\n', 2, "hosts.a.ssh", "control characters"),
        ("colour = 'red'\n", 1, "colour", "unknown key"),
        ("[hosts]\na = 3\n", 2, "hosts.a", "expected a table"),
        ("readonly = 'yes'\n", 1, "readonly", "true or false"),
    ],
)
def test_bad_config_names_file_line_and_key(text: str, line: int, key: str, expect: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, Path("/etc/c.toml"))
    err = info.value
    assert (err.line, err.key) == (line, key)
    assert str(err).startswith(f"/etc/c.toml:{line}: {key}: ")
    assert expect in str(err)


def test_toml_syntax_error_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("interval = 5\n[hosts.a\n", Path("c.toml"))
    assert info.value.line == 2 and "not valid TOML" in str(info.value)


def test_config_path_resolution(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert find_config(None, env) == (tmp_path / "xdg/gpuwatch/config.toml", False)
    assert find_config(None, {**env, "GPUWATCH_CONFIG": "/x.toml"}) == (Path("/x.toml"), True)
    assert find_config("/y.toml", {**env, "GPUWATCH_CONFIG": "/x.toml"}) == (Path("/y.toml"), True)
    # the XDG default may be missing; a config the person named may not
    assert load_config(None, env).hosts == ()
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "missing.toml"), env)


def test_host_selection() -> None:
    config = parse_config(FULL)
    assert [h.name for h in select_hosts(config, []).hosts] == ["gpu1", "gpu2"]
    assert [h.ssh for h in select_hosts(parse_config(""), []).hosts] == ["local"]
    picked = select_hosts(config, ["gpu1", "root@10.0.0.5:2200", "[::1]:22"]).hosts
    assert [h.name for h in picked] == ["gpu1", "10.0.0.5", "::1"]
    assert picked[0].runs  # a config host named on the command line keeps its runs
    assert picked[1].settings.connect_timeout == 4  # ad-hoc hosts get the [ssh] defaults
    twins = select_hosts(config, ["a@box", "b@box"]).hosts
    assert [h.name for h in twins] == ["a@box", "b@box"]
    with pytest.raises(ConfigError):
        select_hosts(config, ["bad\nhost"])


def test_starter_loads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    write_starter(path, ["gpu1", "gpu2"])
    text = path.read_text()
    assert tomllib.loads(text) == starter_data(["gpu1", "gpu2"])
    config = load_config(str(path))
    assert [h.name for h in config.hosts] == ["gpu1", "gpu2"]
    assert config.ssh == SshSettings()  # the starter writes exactly the defaults
    assert text.count("#") > 10  # it is a commented starter
    with pytest.raises(FileExistsError):
        write_starter(path, ["other"])
    write_starter(path, ["other"], force=True)
    assert [h.name for h in load_config(str(path)).hosts] == ["other"]


def test_starter_example_run_is_valid_when_uncommented() -> None:
    head, example = starter_text(["gpu1"]).split("# A training run on gpu1 (uncomment and edit):")
    uncommented = head + "\n".join(line.removeprefix("# ") for line in example.splitlines())
    (host,) = parse_config(uncommented).hosts
    assert host.runs[0].name == "llama" and host.runs[0].env == {"CUDA_VISIBLE_DEVICES": "0,1"}
