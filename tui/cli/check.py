"""`gpuwatch check`: poll each host once and say, in plain sentences, what works and what does not.

Each host gets one poll through the pipeline as `--once` polls it (remote/watch/fleet.py, role
"check": the store's history, the same rules and verdict), nothing stored. A failure is explained
in one sentence that says what to do (the SSH layer's messages already carry the fix: the key to
add, the known_hosts line to remove, the bound to raise). A host that works is described: poll and
probe time, GPUs seen, the box's Python.

One more thing is measured, because it is the commonest reason a poll is slow: a bare `true` over
a second connection. The time from opening the session to `true`'s end is what the box's shell
startup files cost every SSH command (bash reads ~/.bashrc for sshd commands; a `pyenv init` or
`conda init` there costs 100+ ms each time). When that passes STARTUP_WARN_S the check says so,
beside the probe's own run time. No Textual; asyncssh is imported only when a host needs SSH.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.config.schema import Config, HostConfig, select_hosts
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.snapshot import HostSnapshot, ProbeError
from gpuwatch.remote.report import HostReport
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome, ssh_files
from gpuwatch.remote.wire.document import load_document

from .common import EXIT_OK, EXIT_UNPOLLED

STARTUP_WARN_S = 0.05
"""A bare command that takes longer than this after the connection is up is worth a warning."""


def run_verb(args: argparse.Namespace) -> int:
    """Validate the config, poll each host once, explain each failure (exit 0 / 2 / 78)."""
    config = select_hosts(load_config(args.config), list(args.hosts))
    where = str(config.path) if config.path else "no config file (defaults)"
    print(f"config OK: {where}")
    for host in config.hosts:
        runs = ", ".join(r.name for r in host.runs) or "no runs"
        print(f"  {host.name}: ssh {host.ssh}, python {host.python}, disks "
              f"{' '.join(host.disks)}; {runs}")
    sys.stdout.flush()  # the polls take a while: show what is being checked first
    with Store.open() as store:  # read, never written: `check` only looks
        checks = asyncio.run(check_hosts(config, store,
                                         accept_new_host_keys=args.accept_new_host_keys))
    for check in checks:
        for line in [*check.lines, *check.warnings, *found_lines(check)]:
            print(visible(line, multiline=True))  # a poll's error may quote the box
    print(summary(checks))
    return EXIT_OK if all(c.ok for c in checks) else EXIT_UNPOLLED


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
    report: HostReport | None = None
    """What the pipeline made of this poll (role "check": the store's history, the config's
    `[thresholds]`, the one verdict; nothing written to the store)."""


def found_lines(check: HostCheck) -> list[str]:
    """The host's verdict where it is not ok, then one line per warning or critical finding
    of its poll."""
    if check.report is None or not check.ok:
        return []
    verdict = check.report.verdict
    lines = [] if verdict.severity is None or verdict.headline == "ok" else [
        f"{check.host.name}: verdict: {verdict.label}: {verdict.headline}"]
    return lines + [f"{check.host.name}: {f.severity.name.lower()}: {f.message}"
                    for f in check.report.findings if f.severity >= Severity.WARNING]


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
    lines += run_lines(host, snap)
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


def _not_found(errors: Mapping[str, str], what: str, key: str, path: str | None) -> str:
    """What the probe said about a run's file that was not read, else where it looked."""
    why = errors.get(key)
    return f"{what} not found ({why})" if why else f"{what} not found at {path}"


def run_lines(host: HostConfig, snap: HostSnapshot) -> list[str]:
    """For each configured run, one sentence: whether its process and each of its files (log,
    event files, metrics, checkpoints) were found, and where it looked when not."""
    samples = {r.name: r for r in snap.runs if r.discovered is None}
    out = []
    for run in host.runs:
        sample = samples.get(run.name)
        if sample is None:
            out.append(f"{host.name}: run {run.name}: the probe did not report it.")
            continue
        where = f" in {run.workdir}" if run.workdir else ""
        n = len(sample.pids)
        parts = [f"process running ({n} pid{'s' * (n != 1)}: "
                 f"{', '.join(map(str, sample.pids[:4]))}{', ...' if n > 4 else ''})" if n
                 else f"no process matches `{run.process}`{where}" if run.process
                 else "no `process` configured"]
        missing = partial(_not_found, sample.errors)
        if run.log:
            parts.append(f"log found ({sample.log.path})" if sample.log is not None
                         else missing("log", "log", run.resolve(run.log)))
        if run.events:
            files = len(sample.event_files)
            parts.append(f"events: {files} file{'s' * (files != 1)}" if files
                         else missing("event files", "events", run.resolve(run.events)))
        for i, path in enumerate(run.metrics):
            read = [m for m in sample.metrics if m.path in (path, run.resolve(path)) and m.file]
            parts.append(f"metrics found ({read[0].file})" if read
                         else missing("metrics", f"metrics[{i}]", run.resolve(path)))
        if run.checkpoints:
            total = sample.checkpoints_total
            newest = sample.latest_checkpoint
            parts.append(f"checkpoints: {total}" + (f" (newest {newest.path})" if newest else "")
                         if total else missing("checkpoints", "checkpoints",
                                               run.resolve(run.checkpoints)))
        out.append(f"{host.name}: run {run.name}: {'; '.join(parts)}.")
    return out


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


async def check_hosts(config: Config, store: Store, *,
                      accept_new_host_keys: bool = False) -> list[HostCheck]:
    """Poll every host once through the pipeline (role "check": concurrently, openings
    bounded per sshd, judged on the store's history as `--once` and the TUI judge it, nothing
    written), and say what works."""
    fleet = FleetWatch(config, store, role="check", accept_new_host_keys=accept_new_host_keys)

    async def one(host: HostConfig) -> HostCheck:
        report = await fleet.poll(host.name)
        outcome = report.outcome
        if not outcome.ok:
            return replace(failed(outcome), report=report)
        if host.is_local:
            return replace(healthy(outcome), report=report)
        from gpuwatch.remote.wire import ssh

        try:
            files = ssh_files(host)
            bare = await ssh.run_once(
                host.ssh, "true", bounds=host.settings, config_file=files["config_file"],
                known_hosts=files["known_hosts"], identity_file=files["identity_file"],
                accept_new_host_keys=accept_new_host_keys, opening=fleet.opening(host))
        except ssh.SshError as exc:
            return replace(healthy(outcome, startup_error=exc.message), report=report)
        return replace(healthy(outcome, startup_s=bare.exec_s), report=report)

    return list(await asyncio.gather(*(one(h) for h in config.hosts)))


def summary(checks: Sequence[HostCheck]) -> str:
    bad = sum(not c.ok for c in checks)
    warned = sum(bool(c.warnings) for c in checks if c.ok)
    n = len(checks)
    return (f"{n} host{'s' * (n != 1)} checked: {n - bad} ok"
            f"{f' ({warned} with warnings)' if warned else ''}, {bad} failed")
