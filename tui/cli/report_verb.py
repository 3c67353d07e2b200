"""`gpuwatch report HOST RUN [--since D] [--json]`: what one run did and cost.

From the store (remote/runreport.py): wall time, and of it the time alive, dead and stalled;
each death with its cause and the work lost since its checkpoint; each restart and who made it;
steps per second over the span; the loss at its start and end; GPU-hours, energy (with the
time it could not be measured said) and cost at the host's `price_per_gpu_hour` /
`price_per_kwh`. Over the run's whole life in the store, or the last D (`--since 8h`). No
Textual, no SSH. Exit 0; 1 the store has no such run; 64 a bad duration; 78 a config error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.config.schema import select_hosts
from gpuwatch.remote.runreport import NoSuchRun, report_of, text
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible

from .common import warn_store
from .durations import HELP, duration_arg

EXIT_OK, EXIT_UNKNOWN = 0, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("What one run did and cost: time alive, dead and stalled, deaths and "
                          "restarts, work lost, steps/s, loss, GPU-hours, energy, cost. From the "
                          "store; nothing is polled.")
    parser.add_argument("host", metavar="HOST")
    parser.add_argument("run", metavar="RUN")
    parser.add_argument("--since", metavar="D", type=duration_arg,
                        help=f"only the last D: {HELP} (default: the run's whole life in the "
                             "store)")
    parser.add_argument("--json", action="store_true", help="one JSON object (docs/json.md)")


def run_verb(args: argparse.Namespace, store_path: str | None = None,
             now: float | None = None) -> int:
    now = time.time() if now is None else now
    host = select_hosts(load_config(args.config), [args.host]).hosts[0]
    with Store.open(store_path) as store:
        warn_store(store)
        try:
            report = report_of(store, host, args.run, now=now,
                               since=now - args.since if args.since is not None else None)
        except NoSuchRun as exc:
            print(f"gpuwatch: {visible(str(exc))}", file=sys.stderr)
            return EXIT_UNKNOWN
    if args.json:
        print(json.dumps(report.to_json(), indent=2, allow_nan=False))
    else:
        sys.stdout.write(text(report))
    return EXIT_OK
