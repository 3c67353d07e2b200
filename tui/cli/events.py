"""`gpuwatch events [--since D] [HOST] [--json]`: what happened while you were away.

The store's timeline (remote/timeline.py) since D ago (24 h by default; 30m, 8h, 2d, 1h30m):
every finding that appeared, changed or cleared, deaths with their cause, restarts and
actions (who, what, the outcome), reboots, hosts that stopped answering and for how long. Of
every host the store knows, or of HOST. No Textual, no SSH: it reads the store, which every
gpuwatch that polls fills (the TUI, `watch`, cron `--once`). Exit 0; 1 HOST is in neither the
store nor the config; 64 a bad duration.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.timeline import text, timeline, to_json

from .common import warn_store
from .durations import HELP, duration_arg

EXIT_OK, EXIT_UNKNOWN = 0, 1
DEFAULT_SINCE_S = 86_400.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Print what happened on the fleet (or HOST): findings that appeared "
                          "or cleared, deaths and their cause, restarts and actions, reboots, "
                          "hosts that stopped answering. From the store; nothing is polled.")
    parser.add_argument("host", nargs="?", metavar="HOST")
    parser.add_argument("--since", metavar="D", type=duration_arg, default=DEFAULT_SINCE_S,
                        help=f"how far back: {HELP} (default 24h)")
    parser.add_argument("--json", action="store_true", help="one JSON object (docs/json.md)")


def host_name(config_path: str | None, host: str) -> str:
    """HOST as the store names it: a config host's name, else what an ad-hoc target is
    shown as (`user@gpu1:2222` -> `gpu1`), as every verb names it."""
    from gpuwatch.remote.config.load import load_config
    from gpuwatch.remote.config.schema import select_hosts

    return select_hosts(load_config(config_path), [host]).hosts[0].name


def run_verb(args: argparse.Namespace, store_path: str | None = None,
             now: float | None = None) -> int:
    now = time.time() if now is None else now
    since = now - args.since
    name = host_name(args.config, args.host) if args.host else None
    with Store.open(store_path) as store:
        warn_store(store)
        if name is not None and name not in store.hosts():
            known = ", ".join(store.hosts()) or "none yet"
            print(f"gpuwatch: the store knows no host {visible(name)!r} (hosts: "
                  f"{visible(known)})", file=sys.stderr)
            return EXIT_UNKNOWN
        entries = timeline(store, since=since, host=name)
    if args.json:
        print(json.dumps(to_json(entries, since=since, host=name, generated_at=now), indent=2,
                         allow_nan=False))
    else:
        sys.stdout.write(text(entries, since=since, host=name))
    return EXIT_OK
