"""A real OpenSSH ``sshd`` on loopback: the box of the integration tests.

``SshdBox`` starts ``sshd -D -e -f CFG`` on 127.0.0.1 on a free port, inside a temporary folder
that holds everything it needs: a generated ed25519 host key and client key, an
``authorized_keys``, a ``known_hosts`` with the ``[127.0.0.1]:PORT`` entry and an ``ssh_config``
whose ``Host`` aliases (``box1`` first) point at it. It runs as root and as an ordinary user (no
PAM, ``StrictModes no``, absolute ``AuthorizedKeysFile``, pid file in the folder) and always
cleans up: the listener and every per-connection child are killed on ``stop()``.

The box's environment (every session, ``ssh HOST cmd`` included) is set with ``SetEnv`` in
``sshd_config`` (OpenSSH >= 8.7). sshd applies ``SetEnv`` after its own defaults, so it overrides
``PATH``. But the login shell runs ``bash -c CMD``, and Debian's bash reads ``~/.bashrc`` when run
by sshd (SSH_SOURCE_BASHRC); a ``.bashrc`` that prepends to PATH (root's here: pyenv) would push
the box's ``bin/`` off the front. So ``SetEnv`` also sets ``HOME`` to an empty folder of the box:
bash finds no ``~/.bashrc`` there, and every session sees exactly the environment the test asked
for, like a fresh box. Nothing is written into any shell startup file.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import asyncssh

from harness.captures import missing

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
SSH_CANDIDATES = ("/usr/bin/ssh", "/usr/local/bin/ssh", "/bin/ssh")
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# OpenSSH's own default, so tests see the real behaviour (10 unauthenticated at a time, then
# 30 % of new ones dropped, rising to 100 % at 100).
DEFAULT_MAX_STARTUPS = "10:30:100"
DEFAULT_ALIAS = "box1"
START_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------------------------
# Finding OpenSSH


def _find(name: str, candidates: Sequence[str]) -> str | None:
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def _missing(what: str) -> None:
    """Under CI=true a missing real component fails the test; elsewhere it skips, visibly."""
    missing(f"{what} is not installed; the integration tests need a real OpenSSH "
            "(apt-get install openssh-server openssh-client)")


def require_sshd() -> str:
    """Absolute path of OpenSSH's sshd (sshd re-exec needs one); skip or fail when missing."""
    path = _find("sshd", SSHD_CANDIDATES)
    if path is None:
        _missing("OpenSSH's sshd")
    assert path is not None
    return path


def require_ssh() -> str:
    """Path of OpenSSH's ssh client; skip or fail when missing."""
    path = _find("ssh", SSH_CANDIDATES)
    if path is None:
        _missing("OpenSSH's ssh client")
    assert path is not None
    return path


def openssh_version(sshd: str) -> tuple[int, int]:
    """(major, minor) of an sshd binary. Old ones have no -V but print the version in usage."""
    out = subprocess.run([sshd, "-V"], capture_output=True, text=True, timeout=10, check=False)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    if not match:
        raise RuntimeError(f"cannot tell the OpenSSH version of {sshd}: {out.stderr.strip()}")
    return int(match.group(1)), int(match.group(2))


# --------------------------------------------------------------------------------------------
# Small helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def generate_key(path: Path, comment: str) -> str:
    """Write a new ed25519 private key (OpenSSH format, 0600) and its .pub; return the .pub line."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    path.unlink(missing_ok=True)
    key.write_private_key(path)
    os.chmod(path, 0o600)
    public = key.export_public_key().decode().strip()
    Path(f"{path}.pub").write_text(public + "\n")
    return public


def key_fingerprint(path: Path) -> str:
    """SHA256:... fingerprint of the key stored at path (private or .pub)."""
    return str(asyncssh.read_private_key(path).get_fingerprint("sha256"))


def box_env(box_root: Path, *, base_path: str = STD_PATH) -> dict[str, str]:
    """The environment of a simulated box root (tests/harness/README.md, part 1)."""
    return {
        "PATH": f"{box_root / 'bin'}:{base_path}",
        "GPUWATCH_PROCFS": str(box_root / "proc"),
        "GPUWATCH_SYSFS": str(box_root / "sys"),
        "GPUWATCH_SIM_DIR": str(box_root / "sim"),
    }


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, state) of every process this user can see in /proc."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                raw = fh.read().decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        # comm may hold spaces and parentheses: it runs to the last ')'.
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), comm, fields[0])
    return table


def descendants(pid: int, table: Mapping[int, tuple[int, str, str]] | None = None) -> list[int]:
    """Every process below pid (children first, then theirs), from one /proc snapshot (taken
    now, or the ``table`` given, so a caller can look its answer up in the same snapshot)."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (ppid, _comm, _state) in table.items():
        children.setdefault(ppid, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _quote_setenv(name: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"bad environment variable name for SetEnv: {name!r}")
    if "\n" in value or '"' in value or "\\" in value:
        raise ValueError(f"SetEnv value for {name} may not hold a newline, quote or backslash")
    return f'"{name}={value}"'


# --------------------------------------------------------------------------------------------
# The box


class SshdBox:
    """One OpenSSH sshd on 127.0.0.1 with its keys, known_hosts and client ssh_config.

    Use as a context manager (or call ``start()``/``stop()``). ``root`` is an empty folder the
    box owns; ``env`` is merged over the default box environment (``PATH`` with ``bin_dir``
    first) and set in every session.
    """

    def __init__(
        self,
        root: Path,
        *,
        env: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
        max_startups: str = DEFAULT_MAX_STARTUPS,
        extra_sshd_config: Sequence[str] = (),
        alias: str = DEFAULT_ALIAS,
    ) -> None:
        self.sshd = require_sshd()
        self.version = openssh_version(self.sshd)
        if self.version < (8, 7):
            raise RuntimeError(
                f"OpenSSH {self.version} has no sshd_config SetEnv (8.7+); the box env needs it"
            )
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.bin_dir = Path(bin_dir) if bin_dir else self.root / "bin"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        # HOME of every session: empty, so no ~/.bashrc of this machine's user edits PATH.
        self.home = self.root / "home"
        self.home.mkdir(exist_ok=True)
        self.env: dict[str, str] = {"PATH": f"{self.bin_dir}:{STD_PATH}"}
        self.env.update(env or {})
        self.max_startups = max_startups
        self.extra_sshd_config = list(extra_sshd_config)
        self.alias = alias

        self.host_key = self.root / "ssh_host_ed25519_key"
        self.client_key = self.root / "client_ed25519"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.sshd_config = self.root / "sshd_config"
        self.pid_file = self.root / "sshd.pid"
        self.log_path = self.root / "sshd.log"

        generate_key(self.host_key, "gpuwatch-test-host")
        client_public = generate_key(self.client_key, "gpuwatch-test-client")
        self.authorized_keys.write_text(client_public + "\n")
        self.port = 0
        self._known_hosts_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._aliases: dict[str, dict[str, str]] = {}

    # -- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> SshdBox:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """Pid of the listening sshd."""
        if self._proc is None:
            raise RuntimeError("sshd is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, port: int | None = None) -> None:
        """Start sshd (on ``port`` if given, else a free one) and wait until it listens."""
        if self.running:
            raise RuntimeError("sshd is already running")
        if os.geteuid() == 0:
            # As root sshd insists on its privilege-separation chroot dir; distros make it
            # when the service starts, which a test machine may never have done.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        attempts = 1 if port else 5
        last_error = ""
        for _ in range(attempts):
            self.port = port or free_port()
            self._write_configs()
            try:
                self._launch()
                return
            except _PortTaken as exc:  # lost the race for a free port: try another
                last_error = str(exc)
        raise RuntimeError(f"sshd could not bind a port: {last_error}")

    def stop(self) -> None:
        """Kill the listener and every process below it (sessions live in their own sessions,
        so a process-group kill alone would leave them behind)."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        below = descendants(proc.pid)
        for pid in [proc.pid, *below]:
            _signal(pid, signal.SIGKILL)  # SIGKILL also ends a SIGSTOPped process
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)
        # Reap what is left of the per-connection children (they are not our children once
        # the listener is gone; init reaps them) and wait until they are gone from /proc.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in below):
            if all(_is_zombie(p) for p in below if Path(f"/proc/{p}").exists()):
                break
            time.sleep(0.01)
        self.pid_file.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again on the same port (e.g. with a new host key)."""
        port = self.port
        self.stop()
        self.start(port=port)

    def _launch(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        offset = self.log_path.stat().st_size
        try:
            self._proc = subprocess.Popen(
                [self.sshd, "-D", "-e", "-f", str(self.sshd_config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: killable as one
            )
        finally:
            log.close()
        ready = f"Server listening on 127.0.0.1 port {self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self._log_since(offset)
            if self._proc.poll() is not None:
                self._proc = None
                if "Address already in use" in text or "Cannot bind" in text:
                    raise _PortTaken(text.strip())
                raise RuntimeError(f"sshd exited at start:\n{text}")
            if ready in text and _port_accepts(self.port):
                return
            time.sleep(0.01)
        text = self._log_since(offset)
        self.stop()
        raise RuntimeError(f"sshd did not listen within {START_TIMEOUT_S} s:\n{text}")

    def _log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def log_text(self) -> str:
        """Everything sshd logged so far (LogLevel VERBOSE)."""
        return self._log_since(0)

    # -- configuration -----------------------------------------------------------------------

    def _write_configs(self) -> None:
        setenv = " ".join(
            _quote_setenv(k, v) for k, v in {"HOME": str(self.home), **self.env}.items()
        )
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            "AddressFamily inet",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            f"MaxStartups {self.max_startups}",
            "LogLevel VERBOSE",
            # Only the first SetEnv line counts in sshd_config: all variables go on one line.
            f"SetEnv {setenv}",
        ]
        if self.version >= (9, 8):
            # 9.8+ penalises sources for failed logins and dropped connections; the fault tests
            # make those on purpose, and must not lock later tests out of loopback.
            lines.append("PerSourcePenalties no")
        lines.extend(self.extra_sshd_config)
        self.sshd_config.write_text("\n".join(lines) + "\n")
        if self._known_hosts_port != self.port:
            # Not on a restart on the same port: a changed host key must stay unknown to it.
            self.write_known_hosts()
        if self.alias not in self._aliases:
            self._aliases[self.alias] = {}
        self._write_ssh_config()

    def write_known_hosts(self) -> None:
        """(Re)write known_hosts with the current host key as ``[127.0.0.1]:PORT``."""
        public = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n")
        self._known_hosts_port = self.port

    def _write_ssh_config(self) -> None:
        blocks = []
        for alias, overrides in self._aliases.items():
            options = {
                "HostName": "127.0.0.1",
                "Port": str(self.port),
                "User": self.user,
                "IdentityFile": str(self.client_key),
                "IdentitiesOnly": "yes",
                "UserKnownHostsFile": str(self.known_hosts),
                "GlobalKnownHostsFile": "/dev/null",
                "StrictHostKeyChecking": "yes",
                "UpdateHostKeys": "no",
                "BatchMode": "yes",
                "LogLevel": "ERROR",
                **overrides,
            }
            body = "\n".join(f"    {k} {v}" for k, v in options.items())
            blocks.append(f"Host {alias}\n{body}\n")
        self.ssh_config.write_text("\n".join(blocks))

    def add_host(self, alias: str, **options: str) -> str:
        """Add a ``Host alias`` to the ssh_config pointing at this sshd; ``options`` override
        ssh_config keywords (e.g. ``IdentityFile=...``). Returns the alias."""
        self._aliases[alias] = dict(options)
        self._write_ssh_config()
        return alias

    def fleet(self, count: int, prefix: str = "gpu") -> list[str]:
        """``count`` aliases (gpu1..gpuN) that all reach this one sshd: a fleet for fan-out."""
        return [self.add_host(f"{prefix}{i}") for i in range(1, count + 1)]

    # -- clients -----------------------------------------------------------------------------

    def ssh(
        self,
        command: str,
        *,
        alias: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 30.0,
        options: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``ssh -F ssh_config ALIAS COMMAND`` with OpenSSH's client (a cross-check)."""
        args = [require_ssh(), "-F", str(self.ssh_config)]
        for option in options:
            args += ["-o", option]
        args += [alias or self.alias, command]
        return subprocess.run(
            args,
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def asyncssh_options(self, **overrides: object) -> dict[str, object]:
        """Keyword arguments for ``asyncssh.connect`` that reach this box directly (no config)."""
        options: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "username": self.user,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(self.known_hosts),
            "config": [],
            "agent_path": None,
            "connect_timeout": 5,
        }
        options.update(overrides)
        return options

    # -- sessions ----------------------------------------------------------------------------

    def session_pids(self) -> list[int]:
        """The sshd processes below the listener (per-connection children, privileged and not).

        Matched by name: OpenSSH 9.8+ runs connections as ``sshd-session``/``sshd-auth``.
        """
        table = proc_table()
        return [pid for pid in descendants(self.pid, table) if table[pid][1].startswith("sshd")]


class _PortTaken(RuntimeError):
    pass


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return True
    return raw[raw.rindex(")") + 2 :].split()[0] == "Z"


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def sshd_box(root: Path | None = None, **kwargs: object) -> Iterator[SshdBox]:
    """``with sshd_box() as box:``: a started box in a temporary folder, always cleaned up."""
    with tempfile.TemporaryDirectory(prefix="gpuwatch-sshd-") as tmp:
        box = SshdBox(root or Path(tmp), **kwargs)  # type: ignore[arg-type]
        try:
            box.start()
            yield box
        finally:
            box.stop()
