"""`gpuwatch watch [--once] [--install-service]` and `gpuwatch notify --test` (DESIGN §3).

`watch` is the TUI's pipeline without a screen (remote/watch/fleet.py, role "watch"): it
restarts dead runs within their policy and sends notifications, one line per event on stderr
(plain text, no colour, so journald and a cron log keep it as it is). It runs until SIGINT or
SIGTERM; `--once` does one round of every host and exits with the code of `--once`. `--install-
service` writes a systemd user unit and says how to enable it (it never enables anything
itself), and prints the cron line that does the same with `--once`. No Textual here. """

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

UNIT_NAME = "gpuwatch-watch.service"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANTCREAT = 0, 1, 64, 73
_print_lock = threading.Lock()


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    if verb == "watch":
        parser.description = ("Watch the config's hosts without a screen: restart dead runs "
                              "within their restart policy, send notifications, log one line "
                              "per event on stderr.")
        parser.add_argument("hosts", nargs="*", metavar="HOST")
        parser.add_argument("--once", action="store_true",
                            help="one round of every host (for cron), exit with the code of "
                                 "--once")
        parser.add_argument("--fail-on", choices=("info", "warning", "critical"),
                            default="critical", help="with --once: the lowest severity that "
                                                     "exits 1 (default critical)")
        parser.add_argument("--install-service", action="store_true",
                            help="write a systemd user unit running `gpuwatch watch` (enables "
                                 "nothing) and print the cron alternative")
        parser.add_argument("--force", action="store_true",
                            help="with --install-service: overwrite an existing unit")
        parser.add_argument("--listen", metavar="ADDR:PORT", type=_listen,
                            help="serve /metrics (Prometheus) and /ready on ADDR:PORT, e.g. "
                                 "127.0.0.1:9464 (port 0: any free port, logged)")
        parser.add_argument("--shard", metavar="K/N", type=_shard,
                            help="watch only shard K of N: the hosts whose name hashes to it "
                                 "(so N watchers share a fleet, each host in one)")
    else:
        parser.description = "Send a test message to each [notify] target, report each result."
        parser.set_defaults(hosts=[])
        parser.add_argument("--test", action="store_true", required=True,
                            help="send a test message to each target")


def _listen(text: str) -> tuple[str, int]:
    from .listen import listen_address

    try:
        return listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_SHARDS = 1024


def _shard(text: str) -> tuple[int, int]:
    """K/N: shard K (1..N) of N."""
    k_text, sep, n_text = text.partition("/")
    if not sep or not k_text.isdigit() or not n_text.isdigit() or len(text) > 12:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 1/4), got {text!r}")
    k, n = int(k_text), int(n_text)
    if not 1 <= n <= MAX_SHARDS or not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"expected 1 <= K <= N <= {MAX_SHARDS}, got {text!r}")
    return k, n


def shard_of(name: str, shards: int) -> int:
    """The shard (0..shards-1) that owns a host: a stable hash of its name (sha1, the same on
    every machine and Python, unlike hash()), so N watchers with one config split it."""
    import hashlib

    return int.from_bytes(hashlib.sha1(name.encode()).digest()[:8], "big") % shards


def log_line(text: str) -> None:
    """One event, one line on stderr; a time stamp unless journald adds its own."""
    from gpuwatch.remote.textsafe import visible

    stamp = "" if os.environ.get("JOURNAL_STREAM") else (
        datetime.now().astimezone().isoformat(timespec="seconds") + " ")
    with _print_lock:
        print(f"{stamp}{visible(text)}", file=sys.stderr, flush=True)


def run_verb(verb: str, args: argparse.Namespace, config_loader) -> int:  # type: ignore[no-untyped-def]
    if verb == "notify":
        return notify_test(config_loader(args))
    if args.install_service:
        return install_service(args)
    if args.once and args.listen:
        print("gpuwatch watch: --listen serves while watching; --once exits after one round",
              file=sys.stderr)
        return EXIT_USAGE
    config = config_loader(args)
    sourced = [h.name for h in config.hosts if h.source != "ssh"]
    if sourced:  # a watcher polls boxes; what Prometheus has, Prometheus already has
        log_line(f"not watched (read from Prometheus, not polled): {', '.join(sourced)}")
        from dataclasses import replace

        config = replace(config, hosts=tuple(h for h in config.hosts if h.source == "ssh"))
    if args.shard:
        from dataclasses import replace

        k, n = args.shard
        config = replace(config, hosts=tuple(h for h in config.hosts
                                             if shard_of(h.name, n) == k - 1))
    return watch(config, args)


def watch(config, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    import asyncio
    import signal

    from gpuwatch.remote.model.finding import Severity
    from gpuwatch.remote.report import exit_code
    from gpuwatch.remote.store import Store
    from gpuwatch.remote.watch.fleet import FleetWatch
    from gpuwatch.remote.watch.hooks import policies_line

    if not all(h.is_local for h in config.hosts):
        import gpuwatch.remote.wire.ssh  # noqa: F401
    with Store.open() as store:
        if store.warning:
            log_line(f"gpuwatch: {store.warning}")
        fleet = FleetWatch(config, store, role="cron" if args.once else "watch", log=log_line,
                           accept_new_host_keys=args.accept_new_host_keys)
        targets = len(fleet.notifier.targets) if fleet.notifier else 0
        try:
            if args.once:
                reports = fleet.round_sync()
                code = exit_code(reports, Severity.parse(args.fail_on))
                if sys.stderr.isatty():  # by hand: say it ran; under cron, silence when all is well
                    log_line(once_summary(reports, code))
                return code
            n = len(config.hosts)
            shard = f" (shard {args.shard[0]}/{args.shard[1]})" if args.shard else ""
            log_line(f"watching {n} host{'s' * (n != 1)}{shard} every "
                     f"{config.interval:g} s (a host that does not answer is polled less often, "
                     f"up to every 5 min, until it does); {policies_line(config)}; {targets} "
                     f"notification target{'s' * (targets != 1)}")
            server = None
            if args.listen:
                from .listen import MetricsServer

                server = MetricsServer(fleet, *args.listen)

            async def main() -> int:
                if server is not None:
                    try:
                        host, port = await server.start()
                    except OSError as exc:
                        log_line(f"cannot listen on {args.listen[0]}:{args.listen[1]}: "
                                 f"{exc.strerror or exc}")
                        return EXIT_USAGE
                    shown = f"[{host}]" if ":" in host else host
                    log_line(f"serving http://{shown}:{port}/metrics and /ready")
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
                try:
                    await fleet.run(stop)
                finally:
                    if server is not None:
                        await server.close()
                return EXIT_OK

            code = asyncio.run(main())
            log_line("stopped" if code == EXIT_OK else "not started")
            return code
        finally:
            fleet.close(flush_s=15.0)


def once_summary(reports, code: int) -> str:  # type: ignore[no-untyped-def]
    """`watch --once` by hand: one line of what the round saw (events were logged as they
    happened; cron gets no line when nothing happened, so that it mails nothing)."""
    from collections import Counter

    failed = sum(1 for r in reports if not r.outcome.ok)
    counts = Counter(f.severity for r in reports for f in r.findings)
    seen = ", ".join(f"{counts[sev]} {sev.label}" for sev in sorted(counts, reverse=True))
    n = len(reports)
    return (f"one round of {n} host{'s' * (n != 1)}: {failed} not reached, "
            f"{seen or 'no findings'}; exit {code}")


def notify_test(config) -> int:  # type: ignore[no-untyped-def]
    from gpuwatch.remote.model.finding import Severity
    from gpuwatch.remote.notify import mask, send_one, target_urls

    urls = target_urls(config.notify)
    if not urls:
        print(f"gpuwatch: no notification target: set [notify] urls in the config, or "
              f"${config.notify.urls_env}", file=sys.stderr)
        return EXIT_FAILED
    failed = 0
    for url in urls:
        started = time.monotonic()
        error = send_one(url, "gpuwatch: test message",
                         "gpuwatch notify --test: if you read this, this target works.",
                         Severity.INFO, config.notify.timeout_s)
        took = time.monotonic() - started
        if error is None:
            print(f"ok      {mask(url)} ({took:.1f} s)")
        else:
            failed += 1
            print(f"FAILED  {mask(url)} ({took:.1f} s): {error}")
    return EXIT_FAILED if failed else EXIT_OK


def _gpuwatch_command() -> str:
    argv0 = Path(sys.argv[0])
    if argv0.name == "gpuwatch" and argv0.exists():
        return shlex.quote(str(argv0.resolve()))
    found = shutil.which("gpuwatch")
    if found:
        return found
    return f"{shlex.quote(sys.executable)} -c 'from gpuwatch.tui.cli import main; main()'"


def _state_env() -> tuple[str, Path]:
    """(`XDG_STATE_HOME=...` to set, or "", and the log file for cron). Neither systemd's user
    manager nor cron has the shell's XDG_STATE_HOME: without it they would keep another store
    than the TUI, and two actors could restart one run (the store's lease is the one actor)."""
    from gpuwatch.remote.store import default_store_path

    state = os.environ.get("XDG_STATE_HOME")
    return (f"XDG_STATE_HOME={state}" if state else "",
            default_store_path().parent / "watch.log")


def served_args(args: argparse.Namespace) -> str:
    """--listen and --shard as the unit and the cron line repeat them."""
    out = ""
    if getattr(args, "listen", None):
        host, port = args.listen
        out += f" --listen {shlex.quote(f'[{host}]' if ':' in host else host)}:{port}"
    if getattr(args, "shard", None):
        out += f" --shard {args.shard[0]}/{args.shard[1]}"
    return out


def unit_text(command: str, config_path: Path | None, extra: str = "") -> str:
    conf = f" --config {shlex.quote(str(config_path))}" if config_path else ""
    conf += extra
    state, _ = _state_env()
    state_line = f"Environment={shlex.quote(state)}\n" if state else ""
    return f"""[Unit]
Description=gpuwatch watch: restart dead training runs within their policy, send notifications
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart={command} watch{conf}
# Tokens of notification URLs: GPUWATCH_NOTIFY_URLS=... in this file, kept out of the config
EnvironmentFile=-%h/.config/gpuwatch/notify.env
Environment=PYTHONUNBUFFERED=1
{state_line}Restart=on-failure
RestartSec=30

[Install]
WantedBy=default.target
"""


def install_service(args: argparse.Namespace) -> int:
    from gpuwatch.remote.config.load import find_config

    config_path, _ = find_config(args.config)
    from gpuwatch.remote.paths import config_home

    unit = config_home() / "systemd" / "user" / UNIT_NAME
    command = _gpuwatch_command()
    if unit.exists() and not args.force:
        print(f"gpuwatch: {unit} exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_CANTCREAT
    try:
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(unit_text(command, config_path.resolve(), served_args(args)))
    except OSError as exc:
        print(f"gpuwatch: cannot write {unit}: {exc}", file=sys.stderr)
        return EXIT_CANTCREAT
    conf = f" --config {shlex.quote(str(config_path.resolve()))}"
    shard = f" --shard {args.shard[0]}/{args.shard[1]}" if args.shard else ""
    state, log = _state_env()
    with contextlib.suppress(OSError):  # cron's `>>` needs the folder
        log.parent.mkdir(parents=True, exist_ok=True)
    cron_env = f"{shlex.quote(state)} " if state else ""
    print(f"""wrote {unit} (nothing was enabled). To start it now and at every boot:
  systemctl --user daemon-reload
  systemctl --user enable --now {UNIT_NAME}
  loginctl enable-linger "$USER"     # keep it running while you are logged out
Its log:  journalctl --user -u {UNIT_NAME} -f

Or, without systemd, one round every 5 minutes from cron (crontab -e):
  */5 * * * * {cron_env}{command} watch --once{conf}{shard} >> {shlex.quote(str(log))} 2>&1""")
    return EXIT_OK
