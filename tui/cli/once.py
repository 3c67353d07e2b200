"""`gpuwatch --once [--json|--prometheus]`: poll every host once, judge, remember, report (the
pipeline of remote/watch.py, once), and exit with the health code.

The store carries state between runs, so a cron job is stateful: the previous run's snapshot is
the history a rule compares against (a boot id that changed, a run that was alive and is gone).
Nothing here imports Textual, and asyncssh only loads when a host needs SSH.
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatch.remote.config.schema import Config, HostConfig
from gpuwatch.remote.findings.rules import HostHistory, Severity
from gpuwatch.remote.report import (
    HostReport,
    document,
    exit_code,
    prometheus_text,
    text_report,
    to_json_text,
)
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch import history_from_store, judge, opening, remember, resume
from gpuwatch.remote.wire.collect import Collector, PollOutcome

from .common import load, started, warn_store


def run_verb(args: argparse.Namespace) -> int:
    """Poll, print the report (text, --json or --prometheus), return the health code."""
    config = load(args)
    if not all(h.is_local for h in config.hosts):
        import gpuwatch.remote.wire.ssh  # noqa: F401  asyncssh (~0.2 s), imported with gc off too
    started()
    with Store.open() as store:
        warn_store(store)
        result = run_once(config, store, accept_new_host_keys=args.accept_new_host_keys)
    if result.store_warning:  # the report still goes out: the store is a convenience
        print(f"gpuwatch: {result.store_warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(to_json_text(document(result.reports)))
    elif args.prometheus:
        sys.stdout.write(prometheus_text(result.reports))
    else:
        sys.stdout.write(text_report(result.reports))
    return exit_code(result.reports, Severity.parse(args.fail_on))


@dataclass(frozen=True, slots=True)
class OnceResult:
    reports: list[HostReport]
    store_warning: str | None
    """What could not be saved (a locked or failing store), for stderr: the report stands."""


def run_once(config: Config, store: Store, *, accept_new_host_keys: bool = False,
             hosts: Sequence[HostConfig] | None = None) -> OnceResult:
    """One poll of every host, judged, remembered. One `local` host alone is polled without
    an event loop (a cron run's start-up does without asyncio); otherwise all at
    once on one (several local hosts too: each waits in a thread, so the run takes the
    longest of their deadlines, not their sum)."""
    hosts = list(config.hosts if hosts is None else hosts)
    if len(hosts) != 1 or not hosts[0].is_local:
        import asyncio

        return asyncio.run(poll_once(config, store, accept_new_host_keys=accept_new_host_keys,
                                     hosts=hosts))
    collector = Collector()
    histories = _histories(config, store, collector, hosts)
    return _conclude(store, collector, histories,
                     [collector.poll_local(h, histories[h.name].runs) for h in hosts])


async def poll_once(config: Config, store: Store, *, accept_new_host_keys: bool = False,
                    hosts: Sequence[HostConfig] | None = None) -> OnceResult:
    from gpuwatch.remote.wire.poller import OpeningLimiter, poll_all_once

    hosts = list(config.hosts if hosts is None else hosts)
    limiter = OpeningLimiter()
    needs_ssh = any(not h.is_local for h in hosts)
    collector = Collector(
        accept_new_host_keys=accept_new_host_keys,
        opening=(lambda h: opening(limiter, h)) if needs_ssh else None)
    histories = _histories(config, store, collector, hosts)
    return _conclude(store, collector, histories, await poll_all_once(
        hosts, lambda h: collector.poll(h, histories[h.name].runs)))


def _histories(config: Config, store: Store, collector: Collector,
               hosts: Sequence[HostConfig]) -> dict[str, HostHistory]:
    """Each host's history from the store, and what the last run's collector carried."""
    histories = {h.name: history_from_store(store, h, config.thresholds) for h in hosts}
    for h in hosts:
        resume(collector, store, h)
    return histories


def _conclude(store: Store, collector: Collector, histories: dict[str, HostHistory],
              outcomes: Sequence[PollOutcome]) -> OnceResult:
    reports = []
    unsaved: dict[str, str] = {}
    """Host → why its poll was not saved. The report stands either way (a store
    locked by another process took the whole report down)."""
    locked: str | None = None
    for outcome in outcomes:
        name = outcome.host.name
        history = histories[name]
        report = judge(history, outcome)
        reports.append(report)
        outcome = report.outcome  # a document that broke a rule is not kept as the last good
        if locked is not None:  # each write would wait out the busy timeout again
            unsaved[name] = locked
            continue
        try:
            remember(store, outcome, history, collector)
        except sqlite3.OperationalError as exc:  # locked, busy, disk full, read-only
            locked = unsaved[name] = (f"{exc} (another gpuwatch or an sqlite3 shell may "
                                      f"hold its write lock)" if "lock" in str(exc)
                                      else str(exc))
        except Exception as exc:  # this host's data; the others are still saved
            from gpuwatch.remote import errorlog

            where = errorlog.record(exc, f"saving {name}")
            unsaved[name] = f"{errorlog.summary(exc)}; traceback in {where}"
    # `--once` exits once it has printed this: out of the collector's sight with what it built,
    # the interpreter's last collections at exit skip them (12 ms of a ~100 ms cron run here).
    gc.freeze()
    warning = None
    if unsaved:
        why = "; ".join(dict.fromkeys(unsaved.values()))
        warning = (f"{store.path or 'the store'}: this poll of {', '.join(unsaved)} was not "
                   f"saved ({why}); the next run compares with the last saved one")
    return OnceResult(reports, warning)
