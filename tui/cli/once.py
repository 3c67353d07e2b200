"""`gpuwatch --once [--json|--prometheus]`: one round of the pipeline (remote/watch/fleet.py,
role "once": polled, judged, remembered, not acted on), reported, and the health code.

The store carries state between runs, so a cron job is stateful: the previous run's snapshot is
the history a rule compares against (a boot id that changed, a run that was alive and is gone).
Nothing here imports Textual, and asyncssh only loads when a host needs SSH.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatch.remote.config.schema import Config, HostConfig
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.slurm_job import JobsReport
from gpuwatch.remote.report import (
    HostReport,
    document,
    exit_code,
    prometheus_text,
    text_report,
    to_json_text,
)
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch

from .common import load, started, warn_store


def run_verb(args: argparse.Namespace) -> int:
    """Poll, print the report (text, --json or --prometheus), return the health code."""
    config = load(args, sources=True)
    if any(not h.is_local and h.source == "ssh" for h in config.hosts):
        import gpuwatch.remote.wire.ssh  # noqa: F401  asyncssh (~0.2 s), imported with gc off too
    started()
    with Store.open() as store:
        warn_store(store)
        result = run_once(config, store, accept_new_host_keys=args.accept_new_host_keys)
    if result.store_warning:  # the report still goes out: the store is a convenience
        print(f"gpuwatch: {result.store_warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(to_json_text(document(result.reports, jobs=result.jobs)))
    elif args.prometheus:
        sys.stdout.write(prometheus_text(result.reports, jobs=result.jobs))
    else:
        sys.stdout.write(text_report(result.reports, jobs=result.jobs))
    return exit_code(result.reports, Severity.parse(args.fail_on))


@dataclass(frozen=True, slots=True)
class OnceResult:
    reports: list[HostReport]
    store_warning: str | None
    """What could not be saved (a locked or failing store), for stderr: the report stands."""
    jobs: JobsReport | None = None
    """[slurm]'s jobs (None: no [slurm] in the config)."""


def run_once(config: Config, store: Store, *, accept_new_host_keys: bool = False,
             hosts: Sequence[HostConfig] | None = None) -> OnceResult:
    """One poll of every host through the pipeline (remote/watch/fleet.py), landed and
    remembered. One `local` host alone is polled without an event loop."""
    fleet = FleetWatch(config, store, role="once", hosts=hosts,
                       accept_new_host_keys=accept_new_host_keys)
    reports = fleet.round_sync()
    # `--once` exits once it has printed this: out of the collector's sight with what it built,
    # the interpreter's last collections at exit skip them (12 ms of a ~100 ms cron run here).
    gc.freeze()
    return OnceResult(reports, fleet.store_warning(), fleet.jobs.report if fleet.jobs else None)


async def poll_once(config: Config, store: Store, *, accept_new_host_keys: bool = False,
                    hosts: Sequence[HostConfig] | None = None) -> OnceResult:
    """run_once() inside a running event loop (the demo fleet's own loop, tests)."""
    fleet = FleetWatch(config, store, role="once", hosts=hosts,
                       accept_new_host_keys=accept_new_host_keys)
    reports = await fleet.round()
    return OnceResult(reports, fleet.store_warning(), fleet.jobs.report if fleet.jobs else None)
