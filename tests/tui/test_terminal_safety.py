"""No byte from a box reaches the terminal raw: the CLI's kill confirmation and `--once`'s text,
JSON and Prometheus output, run as real processes against a box whose hostname, command line,
run name, checkpoint name and log line carry OSC, CSI, BEL and markup (tests/hostile_box.py).
The TUI's side is tests/test_tui_tmux.py's and tests/test_tui.py's."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import hostile_box as hb
import pytest
from gpuwatch.remote.textsafe import visible

GPUWATCH = [sys.executable, "-m", "gpuwatch.tui.cli"]
RAW = (b"\x1b", b"\x07", hb.TITLE.encode())


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[hb.HostileBox, Path, dict[str, str]]:
    box = hb.make(tmp_path / "hostile")
    config = tmp_path / "config.toml"
    config.write_text(box.config())
    env = {**os.environ, **box.env(), "HOME": str(tmp_path), "XDG_STATE_HOME":
           str(tmp_path / "state"), "GPUWATCH_CONFIG": str(config), "TERM": "dumb"}
    return box, config, env


def _leaks(out: bytes) -> list[bytes]:
    """The raw control bytes (and an OSC's title, unescaped) found in what was printed."""
    return [b for b in RAW if b in out and (b != hb.TITLE.encode() or b"\x1b]2;" + b in out)]


@pytest.mark.parametrize("fmt", ["text", "json", "prometheus"])
def test_once_output_never_carries_the_boxs_control_bytes(
        hostile: tuple[hb.HostileBox, Path, dict[str, str]], fmt: str) -> None:
    _box, _config, env = hostile
    flags = {"text": [], "json": ["--json"], "prometheus": ["--prometheus"]}[fmt]
    done = subprocess.run([*GPUWATCH, "--once", *flags], env=env, capture_output=True,
                          timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr.decode(errors="replace")
    assert _leaks(done.stdout + done.stderr) == []
    out = done.stdout.decode()
    if fmt == "json":  # JSON escapes it: the exact name comes back out
        doc = json.loads(out)
        assert hb.RUN in [r["name"] for h in doc["hosts"] for r in h["runs"]]
    else:
        assert visible(hb.RUN).replace("\\", "\\\\" if fmt == "prometheus" else "\\") in out


def _in_a_terminal(argv: list[str], env: dict[str, str], answer: bytes,
                   prompt: bytes = b"Proceed? [y/N] ", limit_s: float = 120.0
                   ) -> tuple[int, bytes]:
    """Run argv with a pseudo-terminal as its stdin, stdout and stderr, type `answer` once
    `prompt` shows, and return its exit code and every byte it wrote to the terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    seen, answered = b"", False
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process closed the terminal (it exited)
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and prompt in seen:
                os.write(master, answer)
                answered = True
            if proc.poll() is not None and not ready:
                break
        return proc.wait(timeout=10), seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_kill_confirmation_shows_the_command_line_escaped(
        hostile: tuple[hb.HostileBox, Path, dict[str, str]]) -> None:
    """`gpuwatch kill` asks on the terminal with the box's command line in the question: its
    escape sequences must show as text, never move the cursor or retitle the window, so what
    the person reads is what will be hit."""
    _box, _config, env = hostile
    code, seen = _in_a_terminal([*GPUWATCH, "kill", "evil", str(hb.PID)], env, b"n\n")
    text = seen.decode(errors="replace")
    assert b"Proceed? [y/N] " in seen, text
    assert code == 1 and "cancelled; nothing was sent" in text, text
    assert _leaks(seen) == [], text
    assert f"pid {hb.PID}" in text and f"--tag={hb.SHOWN}" in text, text
