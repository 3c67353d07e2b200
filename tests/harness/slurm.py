"""A real Slurm on this machine: munge, MariaDB, slurmdbd, slurmctld and one slurmd.

``SlurmCluster(folder).start()`` brings up, each in the foreground (``-F``/``-D``) as a child of
the test process, each with its files in ``folder`` (kept short: unix socket paths are limited
to 108 bytes, so the folder is made under /tmp by ``SlurmCluster.make``):

1. ``munged -F`` with its own key and socket (the folder searchable by all, the key 0400);
2. MariaDB, initialised into the folder (``mariadb-install-db``) and served by ``mariadbd`` on a
   loopback port, with a ``slurm`` user for slurmdbd;
3. ``slurmdbd -D`` with ``accounting_storage/mysql`` on it: Slurm 22.05 has no file-based
   accounting, and without slurmdbd ``sacct`` answers "accounting storage is disabled";
4. ``slurmctld -D`` and ``slurmd -D``, with a ``slurm.conf`` that declares this machine as one
   node (``NodeAddr=127.0.0.1``, CPUs and RealMemory from ``slurmd -C``), ``proctrack/linuxproc``,
   ``task/none``, ``select/cons_tres``, and a partition that oversubscribes (so the tests' jobs
   run side by side on two cores). One gotcha: slurmctld's connection to slurmdbd needs
   ``AccountingStoragePass=<the munge socket>``, or slurmctld dies with "no TRES".

Memory limits: with ``task/none`` there is no cgroup to enforce ``--mem``; what enforces it here is
``JobAcctGatherParams=OverMemoryKill`` (the accounting poller kills a step whose RSS is past its
request, every ``JobAcctGatherFrequency`` seconds), and the job ends as ``OUT_OF_MEMORY``.

Every daemon is stopped by its pid on ``stop()`` (TERM, then KILL), in the reverse order. The
client commands find the cluster through ``SLURM_CONF`` (``env()``), nothing under /etc is
touched, and several clusters can run side by side (every port is a free one).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.captures import missing
from harness.sshd import free_port

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")
PACKAGES = "slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
START_TIMEOUT_S = 60.0
CLUSTER = "gwtest"
PARTITION = "debug"
DB_PASSWORD = "gpuwatch-test"  # the test MariaDB's own user, on loopback, for this folder only


def find_tool(name: str) -> str | None:
    for folder in SBIN:
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def require_slurm() -> dict[str, str]:
    """Paths of every daemon and client this harness runs; skip (fail under CI=true) if one is
    missing, naming the packages."""
    found = {name: find_tool(name) for name in DAEMONS + CLIENTS + ("mariadb",)}
    absent = sorted(name for name, path in found.items() if path is None)
    if absent:
        missing(f"Slurm is not installed here (missing {', '.join(absent)}); the Slurm tests need "
                f"a real one: apt-get install --no-install-recommends {PACKAGES} "
                "(scripts/setup.sh's setup_slurm)")
    if os.geteuid() != 0:
        missing("the Slurm tests run slurmd, which must start as root")
    return {name: path for name, path in found.items() if path is not None}


def node_resources(slurmd: str) -> tuple[str, int, int]:
    """(node name, CPUs, RealMemory MiB) as ``slurmd -C`` reads this machine."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=30, check=True)
    fields = dict(re.findall(r"(\w+)=(\S+)", out.stdout))
    return fields["NodeName"], int(fields["CPUs"]), int(fields["RealMemory"])


class SlurmError(RuntimeError):
    """A daemon did not come up; the message holds the end of its log."""


class SlurmCluster:
    """One machine's Slurm, in its own folder. ``start()``; ``stop()``; ``run([...])``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tools = require_slurm()
        self.node, self.cpus, self.memory_mib = node_resources(self.tools["slurmd"])
        self.munge_socket = folder / "munge" / "munge.sock"
        self.mysql_socket = folder / "db.sock"
        self.conf = folder / "etc" / "slurm.conf"
        self.ports: dict[str, int] = {}
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.timings: dict[str, float] = {}

    @classmethod
    def make(cls) -> SlurmCluster:
        """A cluster in a new short folder under /tmp (unix socket paths are short)."""
        folder = Path(tempfile.mkdtemp(prefix="gw-slurm-", dir="/tmp"))
        os.chmod(folder, 0o755)  # munge's socket folder must be searchable by all
        return cls(folder)

    # ------------------------------------------------------------------------------------------
    # Client side

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, argv: Sequence[str], *, timeout: float = 30,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              check=check, env=self.env())

    def sbatch(self, script: Path, *options: str, cwd: Path | None = None) -> str:
        """Submit a batch script; return the job id."""
        out = subprocess.run(["sbatch", "--parsable", *options, str(script)], capture_output=True,
                             text=True, timeout=30, check=True, env=self.env(),
                             cwd=str(cwd or script.parent))
        return out.stdout.strip().split(";")[0]

    def job_field(self, job: str, field: str) -> str:
        """One field of ``scontrol show job`` (live jobs only)."""
        out = self.run(["scontrol", "-o", "show", "job", job], check=False).stdout
        match = re.search(rf"\b{field}=(\S*)", out)
        return match.group(1) if match else ""

    def sacct_state(self, job: str) -> str:
        """The job's state as accounting has it ('' until accounting knows the job)."""
        out = self.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"], check=False).stdout
        return out.strip().splitlines()[0].split()[0] if out.strip() else ""

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 180.0,
                 step: float = 1.0) -> None:
        """Poll ``ready`` until it holds; raise naming ``what`` (and the logs) if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(step)
        raise SlurmError(f"{what} did not happen within {timeout:.0f} s\n{self.logs_tail()}")

    # ------------------------------------------------------------------------------------------
    # Daemons

    def start(self) -> None:
        begun = time.monotonic()
        try:
            self._start_munge()
            self._start_mariadb()
            self._write_slurm_conf()
            self._start_slurmdbd()
            self._start_slurmctld()
            self._start_slurmd()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - begun

    def cancel_all(self) -> None:
        """Cancel every job of this cluster and wait (bounded) until none runs: a job's
        slurmstepd outlives slurmd, so jobs are ended before the daemons are."""
        names = [name for name, proc in self._procs if proc.poll() is None]
        if "slurmctld" not in names or "slurmd" not in names:
            return
        jobs = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if not jobs:
            return
        self.run(["scancel", *jobs], check=False)
        try:
            self.wait_for("every job ended", lambda: not self.run(
                ["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i"],
                check=False).stdout.strip(), timeout=30)
        except SlurmError:
            pass  # stopping goes on; slurmd's end takes what is left

    def stop(self) -> None:
        """Stop every daemon this cluster started, by pid, the last started first."""
        self.cancel_all()
        while self._procs:
            _name, proc = self._procs.pop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        log = open(self.folder / f"{name}.out", "ab")  # noqa: SIM115 (the child holds it)
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=dict(env or self.env()), start_new_session=True)
        log.close()
        self._procs.append((name, proc))

    def _alive(self, name: str) -> None:
        for each, proc in self._procs:
            if each == name and proc.poll() is not None:
                raise SlurmError(f"{name} exited with {proc.returncode}\n{self.logs_tail()}")

    def _until(self, name: str, ready: Callable[[], bool],
               timeout: float = START_TIMEOUT_S) -> None:
        begun = time.monotonic()
        deadline = begun + timeout
        while time.monotonic() < deadline:
            self._alive(name)
            if ready():
                self.timings[name] = time.monotonic() - begun
                return
            time.sleep(0.2)
        raise SlurmError(f"{name} did not come up within {timeout:.0f} s\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.folder.glob("*.out")) + sorted(self.folder.glob("log/*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _start_munge(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o755)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn("munged", [self.tools["munged"], "-F", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={folder / 'munged.pid'}",
                               f"--seed-file={folder / 'munged.seed'}",
                               f"--log-file={folder / 'munged.log'}"])
        self._until("munged", self.munge_socket.exists)

    def _start_mariadb(self) -> None:
        data = self.folder / "db"
        began = time.monotonic()
        subprocess.run([self.tools["mariadb-install-db"], "--no-defaults", f"--datadir={data}",
                        "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db"], capture_output=True, check=True, timeout=120)
        self.timings["mariadb-install-db"] = time.monotonic() - began
        self.ports["mariadb"] = free_port()
        self._spawn("mariadbd", [self.tools["mariadbd"], "--no-defaults", f"--datadir={data}",
                                 "--user=root", "--bind-address=127.0.0.1",
                                 f"--port={self.ports['mariadb']}",
                                 f"--socket={self.mysql_socket}",
                                 f"--pid-file={self.folder / 'mariadbd.pid'}",
                                 "--skip-log-bin", "--innodb-buffer-pool-size=32M",
                                 "--innodb-log-file-size=16M"])
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
               "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';")

        def user_made() -> bool:
            if not self.mysql_socket.exists():
                return False
            done = subprocess.run([self.tools["mariadb"], "--no-defaults",
                                   f"--socket={self.mysql_socket}", "-uroot", "-e", sql],
                                  capture_output=True, timeout=30, check=False)
            return done.returncode == 0

        self._until("mariadbd", user_made)

    def _write_slurm_conf(self) -> None:
        etc = self.conf.parent
        etc.mkdir()
        for name in ("state", "spool", "log"):
            (self.folder / name).mkdir()
        for name in ("slurmctld", "slurmd", "slurmdbd"):
            self.ports[name] = free_port()
        auth = f"socket={self.munge_socket}"
        log = self.folder / "log"
        self.conf.write_text("\n".join([
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo={auth}",
            "CredType=cred/munge",
            f"StateSaveLocation={self.folder / 'state'}",
            f"SlurmdSpoolDir={self.folder / 'spool'}",
            f"SlurmctldPidFile={self.folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}",
            f"SlurmdLogFile={log / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerNode=256",
            "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=1",
            # task/none has no cgroup to hold --mem: the accounting poller enforces it.
            "JobAcctGatherParams=OverMemoryKill",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['slurmdbd']}",
            # Without this slurmctld's connection to slurmdbd fails and it dies with "no TRES".
            f"AccountingStoragePass={self.munge_socket}",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "KillWait=5",
            "OverTimeLimit=0",
            "MinJobAge=300",
            "MessageTimeout=20",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} "
            f"RealMemory={self.memory_mib} State=UNKNOWN",
            # OverSubscribe: the tests' jobs share this machine's few cores, side by side.
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=FORCE:8",
            "",
        ]))
        dbd = etc / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "AuthType=auth/munge",
            f"AuthInfo={auth}",
            "DbdAddr=127.0.0.1",
            "DbdHost=localhost",
            f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadb']}",
            "StorageUser=slurm",
            f"StoragePass={DB_PASSWORD}",
            "StorageLoc=slurm_acct_db",
            f"PidFile={self.folder / 'slurmdbd.pid'}",
            f"LogFile={log / 'slurmdbd.log'}",
            "",
        ]))
        os.chmod(dbd, 0o600)  # slurmdbd refuses a config others can read

    def _listening(self, port: int) -> Callable[[], bool]:
        import socket

        def ready() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        return ready

    def _start_slurmdbd(self) -> None:
        self._spawn("slurmdbd", [self.tools["slurmdbd"], "-D"])
        self._until("slurmdbd", self._listening(self.ports["slurmdbd"]))

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", [self.tools["slurmctld"], "-D", "-i"])

        def answers() -> bool:
            out = self.run(["scontrol", "ping"], check=False, timeout=15)
            return "UP" in out.stdout

        self._until("slurmctld", answers)

    def _start_slurmd(self) -> None:
        self._spawn("slurmd", [self.tools["slurmd"], "-D", "-N", self.node])

        def idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=15)
            return out.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

        self._until("slurmd", idle)
