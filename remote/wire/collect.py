"""One poll of one host: the probe goes out over one bounded exec, a snapshot comes back.

`local` runs the very same command as a subprocess of this machine (one code path, DESIGN §2); a
remote host gets it over a fresh SSH connection. Either way the poll cannot hang: SSH has its
connect, keepalive and command deadlines, the subprocess has the command deadline, and output is
read under a byte cap.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..config.schema import HostConfig, SshSettings
from ..model.discovered import discovered_requests
from ..model.series import RunSeries, run_request
from ..model.snapshot import HostSnapshot, ProbeError
from ..wire.document import parse_probe_output
from .bundle import PYTHON_MISSING_EXIT, build_command, build_stdin

if TYPE_CHECKING:
    from .local import LocalResult

MAX_STDOUT = 4 * 1024 * 1024
"""A probe document is a few KB; a box that prints megabytes is not running our probe."""
MAX_STDERR = 64 * 1024
DEFAULT_SSH_CONFIG = SshSettings().config_file
CARRIED_HINTS = ("gpu_hints", "pynvml", "pynvml_dir", "spawn", "cgroup",
                 "kernel_lines", "run_cgroups", "gpu_source")
"""What a box says of itself that the next poll's request carries back (Collector.memory)."""
RUN_CGROUPS = 8
"""The runs' cgroups a request names at most (the probe reads as many, probe.RUN_CGROUPS)."""
NVML_RECHECK_S = 300.0
"""A box whose python did not import pynvml is asked again this often: pynvml
installed mid-run is read within five minutes, and the polls between skip site-packages."""


@dataclass(frozen=True, slots=True)
class PollOutcome:
    """What one poll of one host gave: a snapshot, or an error of one of the schema's kinds."""

    host: HostConfig
    started_at: float
    """Epoch seconds on this machine when the poll began."""
    poll_s: float
    snapshot: HostSnapshot | None
    doc: bytes | None
    """The probe's document as it came off the wire (what the store keeps)."""
    error_kind: str | None = None
    error_message: str | None = None
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def ok(self) -> bool:
        return self.snapshot is not None

    @property
    def ended_at(self) -> float:
        return self.started_at + self.poll_s

    def error_json(self) -> dict[str, str] | None:
        if self.error_kind is None:
            return None
        return {"kind": self.error_kind, "message": self.error_message or ""}


@dataclass(frozen=True, slots=True)
class _Exec:
    exit_status: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    bytes_sent: int
    bytes_received: int


class _Failed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def build_request(host: HostConfig, hints: dict[str, Any] | None = None,
                  runs: Mapping[str, RunSeries] | None = None) -> dict[str, Any]:
    """The JSON request the probe reads after its source on stdin; `runs` carry what the last
    answers said (event-file offsets, cursors) so that only what is new comes back."""
    settings = host.settings
    request: dict[str, Any] = {
        "v": 1,
        "disks": list(host.disks),
        # nvidia-smi gets at most a third of the command's deadline, so a hung driver leaves
        # time for the rest of the document (the GPU section reports the timeout).
        "nvidia_smi_timeout_s": max(1.0, min(10.0, settings.command_timeout / 3)),
        # The probe stops itself this long after it starts (probe.arm_deadline), a little
        # before the command_timeout that also covers opening the session, the upload (a
        # few round trips) and the document's way back: what it read by then still arrives,
        # and nothing it ran stays on the box.
        "deadline_s": max(settings.command_timeout / 2,
                          settings.command_timeout - max(1.0, settings.command_timeout / 10)),
        "compress": True,
        "runs": [run_request(r, (runs or {}).get(r.name)) for r in host.runs],
        "discovered_runs": discovered_requests(host, runs),
    }
    if hints:
        request.update(hints)
    return request


def run_cgroups(snapshot: HostSnapshot) -> list[str]:
    """The memory cgroups the runs' processes live in, besides the probe's own (the next
    request's "run_cgroups", at most RUN_CGROUPS)."""
    own = snapshot.cgroup.path if snapshot.cgroup is not None else None
    paths: list[str] = []
    for proc in snapshot.processes:
        if proc.run is not None and proc.cgroup and proc.cgroup != own \
                and proc.cgroup not in paths:
            paths.append(proc.cgroup)
    return paths[:RUN_CGROUPS]


def _paths(value: object) -> bool:
    """A list of a few strings (a carried hint's list of paths)."""
    return (isinstance(value, list) and len(value) <= RUN_CGROUPS
            and all(isinstance(v, str) for v in value))


def _words(value: object) -> bool:
    """A few named strings (the GPU source's hints, box/gpus/section.py)."""
    return (isinstance(value, Mapping) and len(value) <= 8
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()))


class Collector:
    """Polls hosts. Holds what one poll tells the next (e.g. which throttle field names the
    box's driver accepts, what discovery found), never a connection."""

    def __init__(self, *, accept_new_host_keys: bool = False,
                 opening: Callable[[HostConfig], AbstractAsyncContextManager[Any]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.accept_new_host_keys = accept_new_host_keys
        self._opening = opening
        self._clock = clock
        self._hints: dict[str, dict[str, Any]] = {}
        self._nvml_check_due: dict[str, float] = {}
        """Per host whose python did not import pynvml: when to ask again (the probe
        then loads site-packages, which it otherwise skips)."""
        self._discovery: dict[str, dict[str, Any]] = {}
        """Per host, the last discovery, which the next poll sends back instead of the discover
        module (U15: with the event decoder it took, half of every poll's bytes up);
        the probe checks that it still holds."""

    def memory(self, host: HostConfig) -> dict[str, Any]:
        """What this collector carries from one poll of `host` to the next (what the box said
        of itself, its last discovery, when to ask about pynvml again), as plain JSON: the
        store keeps it, so that a cron `--once` sends what a steady poll sends, not a first
        poll's everything (27.9 KB up, 11.7 KB steady)."""
        name = host.name
        out: dict[str, Any] = {"of": [host.ssh, host.python]}
        hints = {k: v for k, v in self._hints.get(name, {}).items() if k in CARRIED_HINTS}
        if hints:
            out["hints"] = hints
        if name in self._discovery:
            out["discovery"] = self._discovery[name]
        if name in self._nvml_check_due:
            out["nvml_check_due"] = self._nvml_check_due[name]
        return out

    def restore(self, host: HostConfig, memory: object) -> None:
        """Take back what memory() gave, unless the host is now another box or interpreter
        (its `ssh` or `python` changed in the config). Anything malformed is left out: the
        next poll learns it afresh, and every hint is checked on the box (a wrong one costs a
        poll at most)."""
        if not isinstance(memory, Mapping) or memory.get("of") != [host.ssh, host.python]:
            return
        name = host.name
        hints = memory.get("hints")
        if isinstance(hints, Mapping):
            kept = {k: v for k, v in hints.items()
                    if k in CARRIED_HINTS and (isinstance(v, (str, int, float, bool))
                                               or _paths(v) or _words(v))}
            self._hints.setdefault(name, {}).update(kept)
        if isinstance(memory.get("discovery"), Mapping):
            self._discovery[name] = dict(memory["discovery"])
        due = memory.get("nvml_check_due")
        if isinstance(due, (int, float)) and not isinstance(due, bool):
            self._nvml_check_due[name] = float(due)

    async def poll(self, host: HostConfig,
                   runs: Mapping[str, RunSeries] | None = None) -> PollOutcome:
        """One poll; `runs` is the host's run state (history.runs) for incremental reads.
        Never raises: whatever goes wrong is this host's error, never its neighbours'."""
        started_at = self._clock()
        try:
            steps = self._steps(host, runs)
            step: dict[str, Any] | PollOutcome = next(steps)
            while not isinstance(step, PollOutcome):
                try:
                    result: _Exec | _Failed = await self._exec(host, step)
                except _Failed as exc:
                    result = exc
                step = _resume(steps, result)
        except Exception as exc:  # a bug of ours, not the box's: said, logged, polled again
            return internal_failure(host, started_at, exc, "polling")
        return step

    def poll_local(self, host: HostConfig,
                   runs: Mapping[str, RunSeries] | None = None) -> PollOutcome:
        """poll() of a `local` host without an event loop: `--once` with one local host never
        imports asyncio (~40 ms of its start-up)."""
        assert host.is_local, host
        started_at = self._clock()
        try:
            steps = self._steps(host, runs)
            step: dict[str, Any] | PollOutcome = next(steps)
            while not isinstance(step, PollOutcome):
                try:
                    result: _Exec | _Failed = _local_exec(*_wire(host, step), host)
                except _Failed as exc:
                    result = exc
                step = _resume(steps, result)
        except Exception as exc:
            return internal_failure(host, started_at, exc, "polling")
        return step

    def _steps(self, host: HostConfig, runs: Mapping[str, RunSeries] | None
               ) -> Generator[dict[str, Any], _Exec | _Failed, PollOutcome]:
        """The poll without its transport: yields each request to run on the box, is sent
        what running it gave (or the failure), returns the outcome. Usually one exec; with a
        reused discovery that the probe finds stale (it says "now"), at once a second one
        with the discover module: the one poll that takes two execs (DESIGN §2 has one),
        rare (a run started or ended), so that a new run shows the poll it appears."""
        started_at, t0 = self._clock(), time.monotonic()
        request = build_request(host, self._hints.get(host.name), runs)
        if (request.get("pynvml") is False
                and started_at < self._nvml_check_due.get(host.name, 0.0)):
            request["want"] = {**request.get("want", {}), "nvml": False}
        reuse = self._discovery.pop(host.name, None)
        try:
            result = _done((yield {**request, "discovery_reuse": reuse} if reuse else request))
            snapshot = _snapshot(host, result)
            if reuse is not None and snapshot.discovery_need == "now":
                again = _done((yield request))
                snapshot = _snapshot(host, again)
                result = replace(again, bytes_sent=result.bytes_sent + again.bytes_sent,
                                 bytes_received=result.bytes_received + again.bytes_received)
        except _Failed as exc:
            if reuse is not None:  # kept: the probe checks it again on the next poll
                self._discovery[host.name] = reuse
            return PollOutcome(host, started_at, time.monotonic() - t0, None, None,
                               exc.kind, exc.message)
        poll_s = time.monotonic() - t0
        self._learn(host, started_at, snapshot, reuse)
        return PollOutcome(host, started_at, poll_s, replace(snapshot, poll_s=poll_s),
                           result.stdout, bytes_sent=result.bytes_sent,
                           bytes_received=result.bytes_received)

    def _learn(self, host: HostConfig, started_at: float, snapshot: HostSnapshot,
               reuse: dict[str, Any] | None) -> None:
        """Keep what the box said of itself for the next poll's request."""
        if snapshot.gpu_hints:  # the GPU source's lessons (the fields its driver lacks)
            self._hints.setdefault(host.name, {})["gpu_hints"] = dict(snapshot.gpu_hints)
        # the nvidia-smi reader stays home while NVML reads the GPUs (bundle.SMI)
        if snapshot.gpu_source == "nvml":
            self._hints.setdefault(host.name, {})["gpu_source"] = "nvml"
        else:
            self._hints.get(host.name, {}).pop("gpu_source", None)
        if snapshot.pynvml is not None:  # the NVML reader goes only where it imports
            hints = self._hints.setdefault(host.name, {})
            hints["pynvml"] = snapshot.pynvml
            self._nvml_check_due[host.name] = started_at + NVML_RECHECK_S
            if snapshot.pynvml_dir:  # found there without site-packages next time
                hints["pynvml_dir"] = snapshot.pynvml_dir
            else:
                hints.pop("pynvml_dir", None)
        if snapshot.spawn is not None:  # the subprocess part goes where posix_spawnp is not
            self._hints.setdefault(host.name, {})["spawn"] = snapshot.spawn
        if snapshot.kernel_lines is not None:  # the kernel log parser goes where it has work
            self._hints.setdefault(host.name, {})["kernel_lines"] = snapshot.kernel_lines
        if snapshot.cgroup is not None:  # the cgroup v1 reader goes only to v1 boxes
            self._hints.setdefault(host.name, {})["cgroup"] = snapshot.cgroup.version
        elif "cgroup" in snapshot.section_errors:  # perhaps for want of that reader
            self._hints.get(host.name, {}).pop("cgroup", None)
        # U41: the cgroups the runs live in, read again next poll even if a run has died by
        # then: its cgroup's oom_kill counter says whether it was OOM-killed
        paths = run_cgroups(snapshot)
        if paths:
            self._hints.setdefault(host.name, {})["run_cgroups"] = paths
        else:
            self._hints.get(host.name, {}).pop("run_cgroups", None)
        if snapshot.discovery_reuse is not None:
            self._discovery[host.name] = dict(snapshot.discovery_reuse)
        elif reuse is not None and snapshot.discovery_need is None:
            self._discovery[host.name] = reuse  # it held: again next poll

    async def _exec(self, host: HostConfig, request: dict[str, Any]) -> _Exec:
        command, stdin = _wire(host, request)
        if host.is_local:
            from . import local

            with _local_failures(host):
                result = await local.run_async(command, stdin, host.settings.command_timeout,
                                               max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR)
            return _local_result(result, stdin)
        return await self._ssh(command, stdin, host)

    async def _ssh(self, command: str, stdin: bytes, host: HostConfig) -> _Exec:
        from . import ssh  # asyncssh costs ~0.2 s to import: only when a host needs SSH

        settings = host.settings
        try:
            opening = self._opening(host) if self._opening else contextlib.nullcontext()
            result = await ssh.run_once(
                host.ssh, command, stdin, bounds=settings, **ssh_files(host),
                accept_new_host_keys=self.accept_new_host_keys,
                max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR, opening=opening)
        except ssh.SshError as exc:
            raise _Failed(exc.kind, exc.message) from None
        return _Exec(result.exit_status, result.stdout, result.stderr, result.stdout_truncated,
                     result.bytes_sent, result.bytes_received)


def internal_failure(host: HostConfig, started_at: float, exc: Exception, doing: str,
                     poll_s: float = 0.0) -> PollOutcome:
    """An exception of ours while `doing` something with one host's poll, as that host's
    `probe` error: its one-line summary for the person, its traceback in the error log."""
    from .. import errorlog

    where = errorlog.record(exc, f"{doing} {host.name}")
    told = f"; traceback in {where}" if where is not None else ""
    return PollOutcome(host, started_at, poll_s, None, None, "probe",
                       f"gpuwatch failed while {doing} this host ({errorlog.summary(exc)})"
                       f"{told}")


def _wire(host: HostConfig, request: dict[str, Any]) -> tuple[str, bytes]:
    """The command line and the stdin of one exec of the probe."""
    return build_command(host.python), build_stdin(request, trim=True)


def _local_exec(command: str, stdin: bytes, host: HostConfig) -> _Exec:
    from . import local

    with _local_failures(host):
        result = local.run(command, stdin, host.settings.command_timeout,
                           max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR)
    return _local_result(result, stdin)


@contextlib.contextmanager
def _local_failures(host: HostConfig) -> Iterator[None]:
    """A local exec's failures as a poll's: past its deadline a timeout; unable to start (out
    of processes or file descriptors, no /bin/sh) a probe error."""
    from . import local

    try:
        yield
    except local.LocalTimeout:
        raise _Failed("timeout", f"the probe did not finish within command_timeout "
                                 f"({host.settings.command_timeout:g} s) on this machine") \
            from None
    except OSError as exc:
        raise _Failed("probe", f"the probe could not be started on this machine ({exc}); "
                               f"check free memory, processes and file descriptors") from None


def _local_result(result: LocalResult, stdin: bytes) -> _Exec:
    return _Exec(result.exit_status, result.stdout, result.stderr, result.stdout_truncated,
                 len(stdin), result.bytes_received)


def _done(result: _Exec | _Failed) -> _Exec:
    """What an exec sent back into _steps: its result, or its failure raised there."""
    if isinstance(result, _Failed):
        raise result
    return result


def _resume(steps: Generator[dict[str, Any], _Exec | _Failed, PollOutcome],
            result: _Exec | _Failed) -> dict[str, Any] | PollOutcome:
    """Send an exec's result into a poll's steps: the next request, or the outcome."""
    try:
        return steps.send(result)
    except StopIteration as stop:
        return stop.value


def ssh_config_file(host: HostConfig) -> str | None:
    """The host's ssh config file, ~ expanded; None for the default ~/.ssh/config when it does
    not exist, which OpenSSH reads as empty (a fresh machine has none: every poll failed on it
    with "No such file"). A config_file set elsewhere must exist; the SSH layer says so."""
    path = os.path.expanduser(host.settings.config_file)
    if path == os.path.expanduser(DEFAULT_SSH_CONFIG) and not os.path.exists(path):
        return None
    return path


def ssh_files(host: HostConfig) -> dict[str, str | None]:
    """The ssh config, known_hosts and identity file of a host, with ~ expanded."""
    settings = host.settings
    return {"config_file": ssh_config_file(host),
            "known_hosts": (os.path.expanduser(settings.known_hosts)
                            if settings.known_hosts else None),
            "identity_file": (os.path.expanduser(settings.identity_file)
                              if settings.identity_file else None)}


def _snapshot(host: HostConfig, result: _Exec) -> HostSnapshot:
    """Turn a finished exec into a snapshot, or a `probe` error that says what to do."""
    where = "this machine" if host.is_local else host.ssh
    stderr = result.stderr.decode("utf-8", "replace").strip().splitlines()
    last = stderr[-1][:200] if stderr else ""
    if result.truncated:
        raise _Failed("probe", f"{where} printed more than {MAX_STDOUT // 1048576} MiB instead "
                               f"of a probe document; is `{host.python}` a Python 3 interpreter?")
    if result.exit_status == PYTHON_MISSING_EXIT:
        raise _Failed("probe", f"`{host.python}` was not found on {where} (exit 127: {last}); "
                               f"install Python 3 there or set `python = \"/path/to/python3\"` "
                               f"for this host")
    if result.exit_status != 0:
        raise _Failed("probe", f"the probe failed on {where} (exit {result.exit_status}"
                               f"{': ' + last if last else ''}); is `{host.python}` Python 3.6+?")
    try:
        return parse_probe_output(result.stdout, host.name)
    except ProbeError as exc:
        raise _Failed("probe", f"{exc}{' (stderr: ' + last + ')' if last else ''}") from None
    except (RecursionError, MemoryError, ValueError, TypeError, ArithmeticError) as exc:
        # The parser's limits should have said ProbeError; whatever slips past them is still
        # this document's fault, so this host's error (its traceback kept for a bug report).
        from .. import errorlog

        logged = errorlog.record(exc, f"parsing {host.name}'s document")
        raise _Failed("probe", f"{where} sent a document gpuwatch cannot read "
                               f"({errorlog.summary(exc)})"
                               f"{'; traceback in ' + str(logged) if logged else ''}") from None
