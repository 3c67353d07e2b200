"""`gpuwatch check`: poll each host once and say, in plain sentences, what works and what does not.

Each host gets one poll through the same machinery as `--once` (Collector, the per-sshd opening
bound), nothing stored. A failure is explained in one sentence that says what to do (the SSH
layer's messages already carry the fix: the key to add, the known_hosts line to remove, the bound
to raise). A host that works is described: poll and probe time, GPUs seen, the box's Python.

One more thing is measured, because it is the commonest reason a poll is slow: a bare `true` over
a second connection. The time from opening the session to `true`'s end is what the box's shell
startup files cost every SSH command (bash reads ~/.bashrc for sshd commands; a `pyenv init` or
`conda init` there costs 100+ ms each time). When that passes STARTUP_WARN_S the check says so,
beside the probe's own run time. No Textual; asyncssh is imported only when a host needs SSH.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.snapshot import HostSnapshot, ProbeError, load_document
from gpuwatch.remote.wire.collect import Collector, PollOutcome, ssh_files
from gpuwatch.remote.wire.poller import OpeningLimiter, poll_all_once

STARTUP_WARN_S = 0.05
"""A bare command that takes longer than this after the connection is up is worth a warning."""


@dataclass(frozen=True, slots=True)
class HostCheck:
    """What `check` learnt about one host: whether it could be polled, and what to print."""

    host: HostConfig
    ok: bool
    lines: Sequence[str]
    """Sentences about the host, most important first (a failure, or what works)."""
    warnings: Sequence[str] = field(default_factory=tuple)
    """Things that work but cost or hide something (slow shell startup, a section that failed)."""
    outcome: PollOutcome | None = None
    startup_s: float | None = None
    """Session open to the end of a bare `true` (None: local, or not measured)."""


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def _document(outcome: PollOutcome) -> dict[str, Any]:
    """The probe's raw document (for fields the snapshot does not keep, e.g. host.python)."""
    try:
        doc = load_document(outcome.doc or b"", outcome.host.name)  # the limits of every read
    except ProbeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def failed(outcome: PollOutcome) -> HostCheck:
    host = outcome.host
    message = _sentence(outcome.error_message or f"the poll failed ({outcome.error_kind})")
    return HostCheck(host, False, [f"{host.name}: {message}"], outcome=outcome)


def healthy(outcome: PollOutcome, startup_s: float | None = None,
            startup_error: str | None = None) -> HostCheck:
    """Describe a host that was polled: timings, GPUs, Python; warnings for what costs."""
    host, snap = outcome.host, outcome.snapshot
    assert snap is not None
    doc = _document(outcome)
    host_section = doc.get("host") if isinstance(doc.get("host"), dict) else {}
    version = host_section.get("python") if isinstance(host_section, dict) else None
    names = sorted({g.name for g in snap.gpus if g.name})
    gpus = (f"{len(snap.gpus)} GPU{'s' * (len(snap.gpus) != 1)}"
            + (f" ({', '.join(names)})" if names else "")) if snap.gpus else "no GPU"
    if snap.gpu_error is not None:  # never "no GPU" for GPUs that could not be read
        gpus = f"{gpus}, and {snap.gpu_error.summary}" if snap.gpus else snap.gpu_error.summary
    where, there = ("this machine", "here") if host.is_local else (f"ssh {host.ssh}", "on the box")
    python = f"Python {version} (`{host.python}`)" if version else f"`{host.python}`"
    lines = [f"{host.name}: ok via {where}: polled in {_ms(outcome.poll_s)}, the probe ran "
             f"{_ms(snap.probe_s)} {there}; {gpus} seen; {python}."]
    warnings = []
    for section, error in sorted(snap.section_errors.items()):
        what = "the GPUs" if section.startswith("gpus") else f"its {section} section"
        warnings.append(f"{host.name}: the probe could not read {what}: {_sentence(error)}")
    warnings += loose_runs(host, snap)
    if startup_s is not None and startup_s > STARTUP_WARN_S:
        warnings.append(
            f"{host.name}: every SSH command pays {_ms(startup_s)} before it starts (shell "
            f"startup files on the box: a `pyenv init` or `conda init` in ~/.bashrc?); the probe "
            f"itself takes {_ms(snap.probe_s)}. Make ~/.bashrc return early for non-interactive "
            f"shells (`case $- in *i*) ;; *) return;; esac` at its top).")
    if startup_error:
        warnings.append(f"{host.name}: a second connection (a bare `true`, to time the shell "
                        f"startup) failed: {_sentence(startup_error)}")
    return HostCheck(host, True, lines, warnings, outcome, startup_s)


def loose_runs(host: HostConfig, snap: HostSnapshot) -> list[str]:
    """A run with a `process` and no `workdir` is matched loosely (probe.match_runs): any
    process whose command line holds that word, in any folder, of any user, is counted as the
    run, so another `train.py` ending reads as this run's rank dying. Say so, with the
    folders and users it matches now when they are more than one, and the fix."""
    out = []
    for run in host.runs:
        if not run.process or run.workdir:
            continue
        procs = [p for p in snap.processes if p.run == run.name and not p.zombie]
        cwds = sorted({p.cwd or "?" for p in procs})
        users = sorted({p.user for p in procs})
        now = ""
        if len(cwds) > 1 or len(users) > 1:
            now = (f" It matches {len(procs)} processes now, in {len(cwds)} folder"
                   f"{'s' * (len(cwds) != 1)} ({', '.join(cwds[:4])}"
                   f"{', ...' if len(cwds) > 4 else ''}) of {', '.join(users[:4])}.")
        out.append(
            f"{host.name}: run {run.name} has `process = \"{run.process}\"` but no "
            "`workdir`, so its matching is loose: any process whose command line holds that "
            "word counts as the run, another folder's or another user's too (one of them "
            f"ending would read as a rank of this run dying).{now} Set `workdir` to the run's "
            "folder: then only processes working there, and their children, are the run.")
    return out


async def check_hosts(hosts: Sequence[HostConfig], *,
                      accept_new_host_keys: bool = False) -> list[HostCheck]:
    """Poll every host once (concurrently, openings bounded per sshd) and judge each."""
    from gpuwatch.remote.watch import opening

    limiter = OpeningLimiter()
    needs_ssh = any(not h.is_local for h in hosts)
    collector = Collector(
        accept_new_host_keys=accept_new_host_keys,
        opening=(lambda h: opening(limiter, h)) if needs_ssh else None)

    async def one(host: HostConfig) -> HostCheck:
        outcome = await collector.poll(host)
        if not outcome.ok:
            return failed(outcome)
        if host.is_local:
            return healthy(outcome)
        from gpuwatch.remote.wire import ssh

        try:
            files = ssh_files(host)
            bare = await ssh.run_once(
                host.ssh, "true", bounds=host.settings, config_file=files["config_file"],
                known_hosts=files["known_hosts"], identity_file=files["identity_file"],
                accept_new_host_keys=accept_new_host_keys,
                opening=opening(limiter, host))
        except ssh.SshError as exc:
            return healthy(outcome, startup_error=exc.message)
        return healthy(outcome, startup_s=bare.exec_s)

    return await poll_all_once(hosts, one)


def summary(checks: Sequence[HostCheck]) -> str:
    bad = sum(not c.ok for c in checks)
    warned = sum(bool(c.warnings) for c in checks if c.ok)
    n = len(checks)
    return (f"{n} host{'s' * (n != 1)} checked: {n - bad} ok"
            f"{f' ({warned} with warnings)' if warned else ''}, {bad} failed")
