"""The real `gpuwatch` in a real terminal: a tmux session on a tmux server of the test's own
(its socket in the test's folder), read with capture-pane and driven with send-keys; its waits
go through harness/waiting.py's wait_for. Shared by the tmux tests (tests/tui/test_tui_tmux.py,
tests/tui/test_tui_jobs_tmux.py)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .captures import missing
from .waiting import wait_for

GPUWATCH = Path(sys.executable).parent / "gpuwatch"
TASK_DUMP = """\
# tests/test_tui_tmux.py: on SIGUSR1, write every asyncio task's stack to {out} (a test aid;
# it lives in the test's temporary folder, put on PYTHONPATH for the one gpuwatch it starts)
import signal

def _dump_tasks(signum, frame):
    import asyncio
    loop = asyncio.events._get_running_loop()
    tasks = asyncio.all_tasks(loop) if loop is not None else ()
    with open({out!r}, "a") as out:
        print(f"asyncio tasks ({{len(tasks)}}):", file=out)
        for task in tasks:
            print(f"--- {{task!r}}", file=out)
            task.print_stack(file=out)

signal.signal(signal.SIGUSR1, _dump_tasks)
"""


def tmux_cmd(socket: Path, *args: str, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tmux ARGS` on the test's own tmux server (its socket in the test's folder): another
    tmux user of this machine (another test run, its kill-server) cannot end it."""
    return subprocess.run(["tmux", "-S", str(socket), *args], capture_output=True, text=True,
                          check=check, env=env)


class Tmux:
    def __init__(self, name: str, socket: Path, tasks: Path | None = None) -> None:
        self.name = name
        self.socket = socket
        self.tasks = tasks  # where the gpuwatch in it writes its asyncio tasks (TASK_DUMP)

    def capture(self) -> str:
        return tmux_cmd(self.socket, "capture-pane", "-p", "-t", self.name, check=False).stdout

    def type(self, text: str) -> None:
        """Type text literally (no key names)."""
        tmux_cmd(self.socket, "send-keys", "-t", self.name, "-l", text)
        time.sleep(0.3)

    def keys(self, *keys: str, pause: float = 0.3) -> None:
        for key in keys:
            tmux_cmd(self.socket, "send-keys", "-t", self.name, key)
            time.sleep(pause)

    def wait(self, test: Callable[[str], bool], what: str, limit_s: float = 60.0) -> str:
        screen = ""

        def shown() -> str:
            nonlocal screen
            screen = self.capture()
            return screen if test(screen) else ""

        try:
            return wait_for(shown, limit_s, what)
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; the screen:\n{screen}") from None

    def wait_for(self, text: str, limit_s: float = 60.0) -> str:
        return self.wait(lambda s: text in s, repr(text), limit_s)

    def stacks(self) -> str:
        """Where a gpuwatch that does not exit is stuck: SIGUSR1 makes it write every asyncio
        task's stack (TASK_DUMP: what threads cannot show, an idle event loop awaiting one),
        then SIGABRT makes its faulthandler (PYTHONFAULTHANDLER=1) print every thread's into
        the pane; both are returned."""
        shell = tmux_cmd(self.socket, "list-panes", "-t", self.name, "-F", "#{pane_pid}",
                     check=False).stdout.split()
        for pid in Path("/proc").iterdir():
            try:
                stat = (pid / "stat").read_text()
                if stat[stat.rindex(")") + 2:].split()[1] in shell and b"gpuwatch" in (
                        pid / "cmdline").read_bytes():
                    os.kill(int(pid.name), signal.SIGUSR1)  # its asyncio tasks (TASK_DUMP)
                    time.sleep(1)
                    os.kill(int(pid.name), signal.SIGABRT)
            except (OSError, ValueError):
                continue
        time.sleep(2)
        pane = tmux_cmd(self.socket, "capture-pane", "-p", "-S", "-400", "-t", self.name,
                    check=False).stdout
        if self.tasks is not None and self.tasks.exists():
            pane += "\n" + self.tasks.read_text()
        return pane


@contextlib.contextmanager
def gpuwatch_in_tmux(folder: Path, args: list[str], env: dict[str, str] | None = None,
                     label: str = "test", raw: Path | None = None,
                     size: tuple[int, int] = (200, 50)) -> Iterator[Tmux]:
    """The real `gpuwatch ARGS` in a new tmux session of `size`, 200×50 unless said (its
    config and state under folder, `env` added to its environment); on exit it prints
    GPUWATCH-EXITED-<code>. With
    `raw`, every byte it writes to the terminal is copied there too (tmux pipe-pane), escape
    sequences and all. The session has a tmux server of its own, so that no other tmux user of
    this machine can end it; killed at the end."""
    if shutil.which("tmux") is None:
        missing("tmux is not installed (apt-get install tmux)")
    name = f"gpuwatch-{label}-{uuid.uuid4().hex[:8]}"
    socket = folder / "tmux.sock"
    aid = folder / "task-dump"
    aid.mkdir(parents=True, exist_ok=True)
    (aid / "sitecustomize.py").write_text(TASK_DUMP.format(out=str(folder / "tasks.txt")))
    env = {"XDG_CONFIG_HOME": str(folder / "config"), "XDG_STATE_HOME": str(folder / "state"),
           "TERM": "xterm-256color", "PYTHONPATH": str(aid), **(env or {})}
    exports = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    go = " ".join(shlex.quote(a) for a in args)
    # With `raw`, the command waits for the pipe to be in place before gpuwatch starts.
    ready = f"while [ ! -e {shlex.quote(str(raw))} ]; do sleep 0.05; done; " if raw else ""
    command = (f"{ready}env PYTHONFAULTHANDLER=1 {exports} {GPUWATCH} {go}; "
               "echo GPUWATCH-EXITED-$?; sleep 600")
    tmux_cmd(socket, "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]),
             command, env={**os.environ, **env})
    if raw is not None:
        tmux_cmd(socket, "pipe-pane", "-o", "-t", name, f"cat >> {shlex.quote(str(raw))}")
        wait_for(raw.exists, what="tmux piping the pane to a file")
    try:
        yield Tmux(name, socket, folder / "tasks.txt")
    finally:
        tmux_cmd(socket, "kill-server", check=False)


