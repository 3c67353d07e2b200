"""`gpuwatch watch --once` and `--install-service` from the command line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

CODE = """import sys
from gpuwatch.tui.cli.command import run
code = run(sys.argv[1:])
assert not any(m == "textual" or m.startswith("textual.") for m in sys.modules), "textual"
sys.exit(code)
"""


def gpuwatch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CONFIG_HOME": str(tmp_path / "conf")}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    return subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_watch_once_polls_without_textual_and_exits_like_once(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[hosts.me]\nssh = "local"\n[hosts.me.runs.r]\nprocess = "nothing.py"\n'
                    'workdir = "/nonexistent"\nrestart = "on-failure"\n'
                    'relaunch = "python3 nothing.py"\n')
    out = gpuwatch(tmp_path, "watch", "--once", "--config", str(conf))
    assert out.returncode == 0, out.stderr
    conf.write_text('[hosts.me]\nssh = "local"\n[hosts.me.runs.r]\nrestart = "sometimes"\n')
    bad = gpuwatch(tmp_path, "watch", "--once", "--config", str(conf))
    assert bad.returncode == 78 and f"{conf}:4: hosts.me.runs.r.restart" in bad.stderr


def test_install_service_writes_a_unit_enables_nothing_and_never_overwrites(
        tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[hosts.me]\nssh = "local"\n')
    out = gpuwatch(tmp_path, "watch", "--install-service", "--config", str(conf))
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "conf" / "systemd" / "user" / "gpuwatch-watch.service"
    text = unit.read_text()
    assert f" watch --config {conf}" in text and "Restart=on-failure" in text
    assert "WantedBy=default.target" in text
    assert "systemctl --user enable --now gpuwatch-watch.service" in out.stdout
    assert "nothing was enabled" in out.stdout
    assert "*/5 * * * * " in out.stdout and f"watch --once --config {conf}" in out.stdout
    unit.write_text("mine")
    again = gpuwatch(tmp_path, "watch", "--install-service", "--config", str(conf))
    assert again.returncode == 73 and "--force" in again.stderr and unit.read_text() == "mine"
    forced = gpuwatch(tmp_path, "watch", "--install-service", "--force", "--config", str(conf))
    assert forced.returncode == 0 and unit.read_text() == text


def test_the_cron_line_and_the_unit_keep_the_shells_state_folder(tmp_path: Path) -> None:
    """cron and systemd's user manager do not have the shell's XDG_STATE_HOME: without it in
    the line they would use another store than the TUI, and the store's lease (one actor per
    run) would not see them."""
    conf = tmp_path / "c.toml"
    conf.write_text('[hosts.me]\nssh = "local"\n')
    out = gpuwatch(tmp_path, "watch", "--install-service", "--config", str(conf))
    assert out.returncode == 0, out.stderr
    state = tmp_path / "state"
    cron = next(line for line in out.stdout.splitlines() if "*/5 * * * *" in line)
    assert cron.split("*/5 * * * * ")[1].startswith(f"XDG_STATE_HOME={state} ")
    assert cron.endswith(f">> {state / 'gpuwatch' / 'watch.log'} 2>&1")
    assert (state / "gpuwatch").is_dir()  # cron's `>>` cannot make the folder
    unit = (tmp_path / "conf" / "systemd" / "user" / "gpuwatch-watch.service").read_text()
    assert f"Environment=XDG_STATE_HOME={state}\n" in unit


def test_watch_once_by_hand_says_what_the_round_saw_and_under_cron_says_nothing(
        tmp_path: Path) -> None:
    import pty

    conf = tmp_path / "c.toml"
    conf.write_text('[hosts.me]\nssh = "local"\n')
    quiet = gpuwatch(tmp_path, "watch", "--once", "--config", str(conf))  # stderr is a pipe
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    leader, follower = pty.openpty()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CONFIG_HOME": str(tmp_path / "conf")}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    done = subprocess.run([sys.executable, "-c", CODE, "watch", "--once", "--config", str(conf)],
                          stdout=subprocess.PIPE, stderr=follower, timeout=120, env=env)
    os.close(follower)
    said = b""
    with contextlib.suppress(OSError):  # EIO once the child has closed its end
        while chunk := os.read(leader, 4096):
            said += chunk
    os.close(leader)
    assert done.returncode == 0, said
    assert b"one round of 1 host: 0 not reached" in said and b"exit 0" in said, said
