"""An in-process SSH server for one simulated box: gpuwatch's demo box, over real SSH on loopback.

``BoxSshServer`` listens on 127.0.0.1 (a free port of its own) with a generated ed25519 host key
and accepts public-key logins from one client key for one user: no passwords, no keyboard
prompts. Every ``exec`` request runs the requested command for real, as ``/bin/sh -c COMMAND``
in a subprocess with the box's environment (``Box.env()`` plus HOME, USER, ...), in the box's
home folder, with stdin, stdout and stderr piped both ways as raw bytes and the exit status (or
the signal) sent back. Shells, pseudo-terminals and subsystems (sftp) are refused politely.

What a session leaves behind: each command runs in its own process group (a new session, as
sshd gives each login). When the channel closes while the command still runs (the client gave up
or went away), that group gets SIGHUP, what a terminal hangup sends, and after a short grace
SIGKILL: a poll that timed out leaves nothing running. A command that finished is left alone, as
OpenSSH without a pty leaves it: what it started in the background lives on (gpuwatch's relaunch,
``setsid nohup CMD >> LOG 2>&1 < /dev/null &``, depends on that) until the demo fleet ends it.

Bounded: at most ``max_connections`` connections and ``max_commands`` commands running at once
(more wait their turn, as they would behind a busy sshd). The server says what it is: its
version string and login banner name gpuwatch's demo box, never OpenSSH.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import asyncssh

__all__ = ["SERVER_VERSION", "BoxSshServer", "kill_group", "write_key_pair"]

SERVER_VERSION = "gpuwatch_demo_box gpuwatch --demo: a simulated GPU box, not OpenSSH"
"""The identification string after 'SSH-2.0-' (RFC 4253: softwareversion SP comments)."""

HANGUP_GRACE_S = 1.0
"""Between SIGHUP and SIGKILL to a closed session's process group."""
STDIN_HIGH = 1 << 20
STDIN_LOW = 1 << 18
"""Client bytes buffered for a command's stdin: pause the channel above HIGH, resume below LOW."""
READ_CHUNK = 1 << 16
OUTPUT_AFTER_EXIT_S = 2.0
"""How long output may still arrive after the shell exited (from a child it left behind)."""

_log = logging.getLogger("gpuwatch.demo.ssh")


def write_key_pair(path: Path, comment: str) -> asyncssh.SSHKey:
    """A new ed25519 key: private key at path (OpenSSH format, 0600), public at path.pub."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.export_private_key())
    Path(f"{path}.pub").write_bytes(key.export_public_key())
    return key


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False once the group is empty."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process that changed its uid: not ours to signal
        return False
    return True


class _Session(asyncssh.SSHServerSession[bytes]):
    """One channel: an exec runs /bin/sh -c COMMAND; anything else is turned away."""

    def __init__(self, server: BoxSshServer, peer: tuple[str, int]) -> None:
        self._server = server
        self._peer = peer
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._command: str | None = None
        self._stdin = bytearray()
        self._stdin_eof = False
        self._stdin_ready = asyncio.Event()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._reading_paused = False
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._closed = False

    # -- requests ----------------------------------------------------------------------------
    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def pty_requested(self, term_type: str, term_size: Any, term_modes: Any) -> bool:
        return False  # commands only: no terminal to hang up, no line discipline

    def shell_requested(self) -> bool:
        return True  # accepted only to say politely, in session_started, that there is none

    def exec_requested(self, command: str) -> bool:
        self._command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return False  # no sftp: the demo box only runs commands

    def session_started(self) -> None:
        chan = self._chan
        assert chan is not None
        if self._command is None:
            name = self._server.name
            chan.write_stderr(
                f"{name} is a simulated GPU box served by `gpuwatch --demo`: it runs commands "
                f"but offers no interactive shell. Try: ssh {name} nvidia-smi\n".encode())
            chan.exit(1)
            return
        self._task = asyncio.create_task(self._run(self._command))
        self._server._tasks.add(self._task)
        self._task.add_done_callback(self._server._tasks.discard)

    # -- data in -----------------------------------------------------------------------------
    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if datatype is not None:  # extended data from a client means nothing to a command
            return
        self._stdin += data
        self._stdin_ready.set()
        if len(self._stdin) > STDIN_HIGH and not self._reading_paused and self._chan:
            self._reading_paused = True
            self._chan.pause_reading()

    def eof_received(self) -> bool:
        self._stdin_eof = True
        self._stdin_ready.set()
        return True  # half-close: the command's output still flows back

    # -- data out ----------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._can_write.set()
        self._stdin_ready.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:  # gone before the command finished
            self._server._hang_up(proc.pid)  # its end (EOF, exit) then ends the task

    # -- the command -------------------------------------------------------------------------
    async def _run(self, command: str) -> None:
        chan = self._chan
        assert chan is not None
        async with self._server._commands:
            if self._closed:
                return
            env = dict(self._server.env)
            host, port = self._peer
            env["SSH_CONNECTION"] = f"{host} {port} 127.0.0.1 {self._server.port}"
            env["SSH_CLIENT"] = f"{host} {port} {self._server.port}"
            if self._server.before_command is not None:
                try:
                    self._server.before_command()
                except Exception:  # the box's bookkeeping must never cost the command
                    _log.exception("%s: before_command failed", self._server.name)
            try:
                proc = await asyncio.create_subprocess_exec(
                    "/bin/sh", "-c", command, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    cwd=self._server.home, env=env, start_new_session=True,
                    pass_fds=self._server.pass_fds)
            except OSError as exc:
                chan.write_stderr(f"sh: cannot start: {exc}\n".encode())
                chan.exit(127)
                return
            self._proc = proc  # start_new_session: the shell leads its own group
            self._server._groups.add(proc.pid)
            _log.debug("%s: pid %d runs %r", self._server.name, proc.pid, command)
            if self._closed:  # the client left while the command was starting
                self._server._hang_up(proc.pid)
            assert proc.stdin and proc.stdout and proc.stderr
            feeder = asyncio.create_task(self._feed(proc.stdin))
            pumps = asyncio.gather(self._pump(proc.stdout, chan.write),
                                   self._pump(proc.stderr, chan.write_stderr))
            try:
                status = await proc.wait()
                # A background child may hold stdout open after the shell exits; OpenSSH would
                # wait for it forever, the demo box for a moment.
                try:
                    await asyncio.wait_for(asyncio.shield(pumps), OUTPUT_AFTER_EXIT_S)
                except TimeoutError:
                    pumps.cancel()
                await self._finish(chan, status)
            finally:
                feeder.cancel()
                if proc.returncode is None:  # the server is closing under us
                    kill_group(proc.pid, signal.SIGKILL)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                pumps.cancel()
                transport = getattr(proc, "_transport", None)
                if transport is not None:  # our pipe ends, so a straggler gets EPIPE
                    transport.close()
                if not self._closed:  # finished: what it left in the background stays
                    self._server._groups.discard(proc.pid)

    async def _feed(self, stdin: asyncio.StreamWriter) -> None:
        """Client bytes to the command's stdin, in order, with back-pressure both ways."""
        try:
            while True:
                await self._stdin_ready.wait()
                self._stdin_ready.clear()
                while self._stdin:
                    chunk = bytes(self._stdin[:READ_CHUNK])
                    del self._stdin[:READ_CHUNK]
                    stdin.write(chunk)
                    await stdin.drain()
                    if self._reading_paused and len(self._stdin) < STDIN_LOW and self._chan:
                        self._reading_paused = False
                        self._chan.resume_reading()
                if self._stdin_eof or self._closed:
                    break
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            # The command stopped reading (exited, or closed stdin): drop the rest, as sshd does.
            self._stdin.clear()
            if self._reading_paused and self._chan:
                self._reading_paused = False
                self._chan.resume_reading()

    async def _pump(self, stream: asyncio.StreamReader, write: Any) -> None:
        while True:
            data = await stream.read(READ_CHUNK)
            if not data:
                return
            if self._closed:
                continue  # nobody to send to: drain so the command does not block on a pipe
            await self._can_write.wait()
            if not self._closed:
                write(data)

    async def _finish(self, chan: asyncssh.SSHServerChannel[bytes], status: int) -> None:
        if self._closed:
            return
        await self._can_write.wait()  # EOF and close go out after the buffered output
        if self._closed:
            return
        with contextlib.suppress(OSError):
            chan.write_eof()
            if status >= 0:
                chan.exit(status)
            else:
                try:
                    name = signal.Signals(-status).name.removeprefix("SIG")
                except ValueError:
                    name = str(-status)
                chan.exit_with_signal(name, False, f"killed by signal {-status}")


class _Server(asyncssh.SSHServer):
    """Per connection: public-key auth for one user and one key, sessions for execs only."""

    def __init__(self, box: BoxSshServer) -> None:
        self._box = box
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        if len(self._box._conns) >= self._box.max_connections:
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS,
                            f"too many connections to {self._box.name}")
            return
        self._box._conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._box._conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        if self._conn is not None:
            with contextlib.suppress(OSError, asyncssh.Error):
                self._conn.send_auth_banner(self._box.banner)
        return True  # every login authenticates; there is no anonymous access

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self._box.user and key.public_data in self._box._authorized

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def session_requested(self) -> _Session:
        assert self._conn is not None
        peer = self._conn.get_extra_info("peername") or ("127.0.0.1", 0)
        return _Session(self._box, (str(peer[0]), int(peer[1])))


class BoxSshServer:
    """The SSH face of one simulated box. ``await start()`` listens; ``await close()`` stops the
    listener, drops every connection and kills every command's process group it started."""

    def __init__(self, name: str, *, host_key: asyncssh.SSHKey,
                 authorized_keys: list[asyncssh.SSHKey], user: str, home: Path,
                 env: Mapping[str, str], host: str = "127.0.0.1", port: int = 0,
                 max_connections: int = 32, max_commands: int = 8,
                 pass_fds: tuple[int, ...] = (),
                 before_command: Callable[[], None] | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.user = user
        self.home = home
        self.env = dict(env)
        self.max_connections = max_connections
        self.pass_fds = pass_fds
        """File descriptors every command inherits (the demo fleet's lifeline)."""
        self.before_command = before_command
        """Called before each command starts (the demo box brings its /proc view up to date:
        what the previous command started is in it)."""
        self.banner = (f"gpuwatch --demo: {name} is a SIMULATED GPU box served by gpuwatch's "
                       "in-process SSH server on loopback; its GPUs are stand-ins, not "
                       "hardware.\n")
        self._host_key = host_key
        self._authorized = {k.public_data for k in authorized_keys}
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._conns: set[asyncssh.SSHServerConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._groups: set[int] = set()
        self._reapers: set[asyncio.Task[None]] = set()
        self._commands = asyncio.Semaphore(max_commands)

    async def start(self) -> int:
        self._acceptor = await asyncssh.listen(
            self.host, self.port, server_factory=lambda: _Server(self),
            server_host_keys=[self._host_key], server_version=SERVER_VERSION,
            encoding=None, allow_pty=False, agent_forwarding=False, x11_forwarding=False,
            gss_host=None, login_timeout=30, keepalive_interval=15, keepalive_count_max=4)
        self.port = self._acceptor.get_port()
        return self.port

    def _hang_up(self, pgid: int) -> None:
        """SIGHUP the group now, SIGKILL what is left of it after the grace."""
        if not kill_group(pgid, signal.SIGHUP):
            self._groups.discard(pgid)
            return

        async def finish() -> None:
            await asyncio.sleep(HANGUP_GRACE_S)
            kill_group(pgid, signal.SIGKILL)
            self._groups.discard(pgid)

        task = asyncio.get_running_loop().create_task(finish())
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._acceptor.wait_closed(), 5)
            self._acceptor = None
        for conn in list(self._conns):
            conn.abort()
        for pgid in list(self._groups):
            kill_group(pgid, signal.SIGKILL)
        for task in list(self._tasks):
            task.cancel()
        pending = [*self._tasks, *self._reapers]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for task in list(self._reapers):
            task.cancel()
        for pgid in list(self._groups):
            kill_group(pgid, signal.SIGKILL)
        self._groups.clear()
