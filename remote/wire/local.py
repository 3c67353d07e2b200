"""A command on this machine, bounded like an SSH exec: stdin written, stdout and stderr read
under byte caps, the whole under a deadline, its process group killed when it overruns.

`local` hosts poll through here (the probe's very command, DESIGN §2) and so do actions on them.
It is blocking on purpose: `gpuwatch --once` with one `local` host never imports asyncio
(~40 ms of a cron run's start-up here, with the ssl and logging it pulls in), and the
event loop's callers take `run_async`, which runs it in a thread and kills the process group
when the awaiting task is cancelled, so no cancelled poll leaves a probe behind.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from typing import NamedTuple

CHUNK = 65536
KILL_WAIT_S = 2.0
"""How long a killed command may take to die. A process in uninterruptible sleep (a driver
call on a GPU that fell off the bus, Xid 79) outlives SIGKILL: it is left to be reaped later
rather than hang the poll, the worker thread and, through it, the TUI's exit."""


class LocalResult(NamedTuple):
    exit_status: int | None
    """None when stdout went over its cap (the process was killed, not waited for)."""
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    bytes_received: int
    """Everything read, the part over the caps included."""


class LocalTimeout(Exception):
    """The command did not finish within its deadline; its process group was killed."""


class _Handle:
    """Lets another thread kill a command that this thread started (run_async's cancel)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        if self.cancelled:  # cancelled before the process existed
            kill_group(proc)

    def cancel(self) -> None:
        self.cancelled = True
        if self.proc is not None:
            kill_group(self.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def run(command: str, stdin: bytes, deadline_s: float, *, max_stdout: int, max_stderr: int,
        handle: _Handle | None = None) -> LocalResult:
    """Run `/bin/sh -c command` in a session of its own (a kill reaches what it started: the
    probe's nvidia-smi too), feed it `stdin`, read at most the caps. LocalTimeout past the
    deadline; OSError when it cannot be started (no /bin/sh, out of processes or fds)."""
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    if handle is not None:
        handle.started(proc)
    try:
        return _talk(proc, stdin, time.monotonic() + deadline_s, max_stdout, max_stderr)
    finally:
        kill_group(proc)  # over its cap, past its deadline or cancelled: nothing stays behind
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_WAIT_S)  # subprocess reaps it later if it outlives this
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _talk(proc: subprocess.Popen[bytes], stdin: bytes, end: float, max_stdout: int,
          max_stderr: int) -> LocalResult:
    assert proc.stdin and proc.stdout and proc.stderr
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    caps = {out_fd: max_stdout, err_fd: max_stderr}
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    seen = {out_fd: 0, err_fd: 0}
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as selector:
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(in_fd, False)
            selector.register(in_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while selector.get_map():
            left = end - time.monotonic()
            if left <= 0:
                raise LocalTimeout
            for key, _ in selector.select(left):
                fd = key.fd
                if fd == in_fd:
                    try:
                        pending = pending[os.write(fd, pending[:CHUNK]):]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        pending = pending[:0]  # it stopped reading: what it says tells why
                    if not pending:
                        selector.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    selector.unregister(fd)
                    continue
                seen[fd] += len(chunk)
                room = caps[fd] - len(kept[fd])
                if room > 0:
                    kept[fd] += chunk[:room]
                if fd == out_fd and seen[fd] > caps[fd]:  # not our probe: stop reading it
                    return LocalResult(None, bytes(kept[out_fd]), bytes(kept[err_fd]), True,
                                       seen[out_fd] + seen[err_fd])
    try:
        status = proc.wait(timeout=max(0.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:  # it closed its output but goes on
        raise LocalTimeout from None
    return LocalResult(status, bytes(kept[out_fd]), bytes(kept[err_fd]), False,
                       seen[out_fd] + seen[err_fd])


async def run_async(command: str, stdin: bytes, deadline_s: float, *, max_stdout: int,
                    max_stderr: int) -> LocalResult:
    """run() for the event loop, in a worker thread; cancelling the awaiting task kills the
    command's process group, so the thread ends at once rather than at the deadline."""
    import asyncio

    handle = _Handle()
    try:
        return await asyncio.to_thread(run, command, stdin, deadline_s, max_stdout=max_stdout,
                                       max_stderr=max_stderr, handle=handle)
    except asyncio.CancelledError:
        handle.cancel()
        raise
