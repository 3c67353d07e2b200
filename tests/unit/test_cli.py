"""The command line: the whole surface in --help, exit codes, init and check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpuwatch.tui.cli.command import EXIT_CANTCREAT, EXIT_CONFIG, EXIT_USAGE, VERBS, run, split_verb


def gpuwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_help_shows_the_whole_surface() -> None:
    out = gpuwatch("--help")
    assert out.returncode == 0
    for piece in ("--demo", "--once", "--json", "--prometheus", "--fail-on", "--config",
                  "--interval", "--theme", "--readonly", "--accept-new-host-keys", "--version",
                  *(f"gpuwatch {verb}" for verb in VERBS)):
        assert piece in out.stdout, piece


def test_version() -> None:
    out = gpuwatch("--version")
    assert out.returncode == 0 and out.stdout.startswith("gpuwatch ")


@pytest.mark.parametrize("argv", [["--bogus"], ["kill", "h", "notapid"], ["--json"],
                                  ["--once", "--json", "--prometheus"], ["scalars"]])
def test_usage_errors_exit_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == EXIT_USAGE
    assert "--help" in capsys.readouterr().err


def test_verb_split_skips_option_values() -> None:
    assert split_verb(["--config", "check", "init", "x"]) == ("init", ["--config", "check", "x"])
    assert split_verb(["gpu1", "check"]) == (None, ["gpu1", "check"])  # hosts come after no verb
    assert split_verb(["--once", "kill"]) == ("kill", ["--once"])


def test_init_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "c.toml"
    assert run(["init", "--config", str(path), "local"]) == 0
    assert run(["init", "--config", str(path), "gpu3"]) == EXIT_CANTCREAT
    assert run(["check", "--config", str(path)]) == 0  # `check` polls: `local` answers
    out = capsys.readouterr()
    assert "local" in out.out and "--force" in out.err


def test_bad_config_exits_78_naming_file_line_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[hosts.a]\nssh = 'a'\nconect_timeout = 3\n")
    out = gpuwatch("check", "--config", str(path))
    assert out.returncode == EXIT_CONFIG
    assert f"{path}:3: hosts.a.conect_timeout: unknown key" in out.stderr
    assert out.stderr.count("\n") == 1  # one line


def test_config_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "env.toml"
    path.write_text("interval = 'soon'\n")
    env = {"PATH": "/usr/bin:/bin", "GPUWATCH_CONFIG": str(path), "HOME": str(tmp_path)}
    out = gpuwatch("check", env=env)
    assert out.returncode == EXIT_CONFIG and str(path) in out.stderr


@pytest.mark.parametrize("value", ["inf", "nan", "0", "1e-9", "-5", "1e400"])
def test_interval_on_the_command_line_has_the_configs_range(value: str,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """--interval overrides the config's interval; it gets the same range."""
    from gpuwatch.tui.cli import command as cli

    with pytest.raises(SystemExit) as exit_info:
        cli.run(["--once", "--interval", value, "local"])
    assert exit_info.value.code == 64
    assert "from 1 to 86400" in capsys.readouterr().err
