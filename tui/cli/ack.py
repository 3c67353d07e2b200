"""`gpuwatch ack HOST RUN`: a person knows a run is dead; it stops being critical.

An unexpected death stays critical in every output (the fleet, `--once` and its exit code,
Prometheus, notifications) until the run is relaunched, seen finished, or acknowledged here or
with `a` in the TUI. The ack covers this death only (its pids): a new death is critical again.
It is recorded in the store and the audit log (who, when). Exit 0 acknowledged; 1 nothing to
acknowledge (no such run, or it is not dead). No Textual, no SSH: it acts on what the last poll
saw (the store's), which is what the person was looking at.
"""

from __future__ import annotations

import argparse
import sys

from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.config.schema import select_hosts
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch.fleet import FleetWatch

EXIT_OK, EXIT_FAILED = 0, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Acknowledge a dead run's death: it stops being critical (a new death "
                          "is). Recorded in the store and the audit log.")
    parser.add_argument("host", metavar="HOST")
    parser.add_argument("run", metavar="RUN")


def run_verb(args: argparse.Namespace, store_path: str | None = None) -> int:
    config = select_hosts(load_config(args.config), [args.host])
    with Store.open(store_path) as store:
        if store.warning:
            print(f"gpuwatch: {store.warning}", file=sys.stderr)
        fleet = FleetWatch(config, store, role="action")
        try:
            said = fleet.acknowledge(config.hosts[0].name, args.run)
        except ValueError as exc:
            print(f"gpuwatch: {visible(str(exc))}", file=sys.stderr)
            return EXIT_FAILED
    print(visible(said))
    return EXIT_OK
