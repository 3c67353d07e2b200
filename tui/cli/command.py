"""The `gpuwatch` command: parse the command line, then hand over to the right part.

This module stays light: `--once`, `check`, `init` and the action verbs must not import Textual
(a cron job pays for every import), so the TUI is imported only when it is about to run.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from gpuwatch.remote.config.schema import Config

EXIT_OK, EXIT_FINDING, EXIT_UNPOLLED = 0, 1, 2
EXIT_SOFTWARE = 70  # sysexits EX_SOFTWARE: an internal error (a bug), never a finding
EXIT_CANTCREAT = 73
EXIT_USAGE, EXIT_CONFIG = 64, 78

VERBS = ("init", "check", "kill", "reap", "relaunch", "scalars")
# Common options that take a value, so the verb scan does not mistake the value for a verb.
_VALUED = {"--config", "--interval", "--theme", "--fail-on"}

SURFACE = """\
gpuwatch [HOST ...]                   full-screen TUI (HOST: an ssh alias, user@host, host:port,
                                      or `local`; none: the config's hosts, else `local`)
gpuwatch --demo                       the TUI on a simulated fleet served over SSH on loopback
gpuwatch --once [--json|--prometheus] [HOST ...]
                                      poll every host once, print, exit with the health code
gpuwatch init [HOST ...]              write a starter config (never overwrites without --force)
gpuwatch check [HOST ...]             validate the config, poll each host, explain each failure
gpuwatch kill HOST PID [--signal TERM|KILL] [--yes]
                                      signal one process after re-checking its identity
gpuwatch reap HOST [--yes]            end the processes that hold VRAM as zombies
gpuwatch relaunch HOST RUN [--yes]    start a dead run again from its latest checkpoint
gpuwatch scalars PATH ... [--tag T] [--json]
                                      print the scalars of TensorBoard event files

exit codes of --once: 0 healthy; 1 a finding at or above --fail-on; 2 a host could not be
polled; 64 usage error; 70 internal error (traceback in the error log); 78 config error"""


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # 20-40 ms: only when asked

    try:
        return version("gpuwatch")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


class _VersionAction(argparse.Action):
    """--version, computing the version only when it is asked for (start-up time)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> NoReturn:
        print(f"gpuwatch {package_version()}")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """argparse with the sysexits usage code (64) instead of its default 2, which is ours for
    'a host could not be polled'."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n"
                              f"Try `{self.prog} --help`.\n")


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--config", metavar="PATH",
                       help="config file (default: $GPUWATCH_CONFIG, else "
                            "$XDG_CONFIG_HOME/gpuwatch/config.toml)")
    group.add_argument("--interval", metavar="S", type=_interval,
                       help="seconds between two polls of one host (default 10)")
    group.add_argument("--theme", metavar="NAME", help="TUI theme")
    group.add_argument("--readonly", action="store_true",
                       help="turn every action (kill, reap, relaunch) off")
    group.add_argument("--accept-new-host-keys", action="store_true",
                       help="accept and record unknown host keys, like OpenSSH's accept-new "
                            "(a changed key is always refused)")
    group.add_argument("--version", action=_VersionAction)


def _interval(text: str) -> float:
    """--interval: the config's own range for `interval` (nan, inf and 1e-9 are no interval)."""
    from gpuwatch.remote.config.schema import TOP_RANGES

    allowed = TOP_RANGES["interval"]
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not allowed.holds(value):
        raise argparse.ArgumentTypeError(f"expected {allowed} (seconds), got {text!r}")
    return value


def build_parser(verb: str | None) -> argparse.ArgumentParser:
    """The parser for the main command (verb None) or one verb."""
    if verb is None:
        parser = _Parser(prog="gpuwatch", usage=SURFACE, add_help=True,
                         description="Watch training runs on remote GPU boxes over short, bounded "
                                     "SSH polls.",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("hosts", nargs="*", metavar="HOST", help=argparse.SUPPRESS)
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--demo", action="store_true", help="run the TUI on a simulated fleet")
        mode.add_argument("--once", action="store_true",
                          help="poll every host once, print a report, exit with the health code")
        fmt = parser.add_mutually_exclusive_group()
        fmt.add_argument("--json", action="store_true",
                         help="with --once: JSON (schema gpuwatch/1)")
        fmt.add_argument("--prometheus", action="store_true",
                         help="with --once: Prometheus text exposition format")
        parser.add_argument("--fail-on", choices=("info", "warning", "critical"),
                            default="critical",
                            help="with --once: the lowest finding severity that exits 1 "
                                 "(default critical)")
        _common(parser)
        return parser

    parser = _Parser(prog=f"gpuwatch {verb}")
    if verb == "init":
        parser.description = "Write a starter config with a [hosts.X] table per HOST."
        parser.add_argument("hosts", nargs="*", metavar="HOST")
        parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    elif verb == "check":
        parser.description = "Validate the config, poll each host once, explain each failure."
        parser.add_argument("hosts", nargs="*", metavar="HOST")
    elif verb == "kill":
        parser.description = "Signal one process on HOST after re-checking its identity."
        parser.add_argument("host", metavar="HOST")
        parser.add_argument("pid", metavar="PID", type=int)
        parser.add_argument("--signal", choices=("TERM", "KILL"), default="TERM")
        parser.add_argument("--yes", action="store_true", help="do not ask")
    elif verb == "reap":
        parser.description = "End the processes that hold VRAM as zombies on HOST."
        parser.add_argument("host", metavar="HOST")
        parser.add_argument("--yes", action="store_true", help="do not ask")
    elif verb == "relaunch":
        parser.description = "Start a dead run again from its latest checkpoint."
        parser.add_argument("host", metavar="HOST")
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("--yes", action="store_true", help="do not ask")
    elif verb == "scalars":
        parser.description = ("Print the scalars of TensorBoard event files (a file, or a folder "
                              "searched recursively); no TensorBoard needed.")
        parser.add_argument("paths", nargs="+", metavar="PATH")
        parser.add_argument("--tag", action="append", metavar="T",
                            help="only this tag (repeatable)")
        parser.add_argument("--json", action="store_true", help="one JSON object")
    _common(parser)
    return parser


def split_verb(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Find the verb (the first bare word that is one) and return it with the other arguments."""
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--":
            break
        if arg.startswith("-"):
            skip = arg in _VALUED
            continue
        if arg in VERBS:
            return arg, [*argv[:i], *argv[i + 1:]]
        break
    return None, list(argv)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    # The command's imports build tens of thousands of objects and no garbage; the cyclic
    # collector's passes over them took ~20 ms of a `--once` here (issue 3). Each command turns
    # it back on where its real work starts (_started).
    gc.disable()
    sys.exit(run(sys.argv[1:] if argv is None else argv))


def _started() -> None:
    """Start-up is over: what it built stays out of every later collection (gc.freeze), and
    the collector runs again. Nothing to do where main() did not turn it off (tests)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def run(argv: Sequence[str]) -> int:
    verb, rest = split_verb(argv)
    args = build_parser(verb).parse_args(rest)
    if verb is not None:  # the TUI and `--once` turn the collector on after their imports
        _started()
    from gpuwatch.remote.config.schema import ConfigError

    try:
        if verb == "init":
            return _init(args)
        if verb == "check":
            return _check(args)
        if verb == "scalars":
            from gpuwatch.tui.cli.scalars import run_scalars

            return run_scalars(list(args.paths), args.tag, args.json)
        if verb == "kill":
            return _kill(args)
        if verb == "reap":
            return _reap(args)
        if verb == "relaunch":
            return _relaunch(args)
        if verb is None and (args.json or args.prometheus) and not args.once:
            build_parser(None).error("--json and --prometheus go with --once")
        if verb is None and args.once:
            return _once(args)
        if verb is None and args.demo:
            return _demo(args)
        if verb is None:
            return _tui(args)
        raise AssertionError(f"the verb {verb!r} has no handler")  # a bug: exit 70, logged
    except ConfigError as exc:
        for line in exc.lines:  # every error of the file, one line each
            print(f"gpuwatch: config error: {line}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # a bug of ours: never exit 1, which cron reads as a finding
        return internal_error(exc, verb or ("--once" if getattr(args, "once", False) else
                                            "the TUI"))


def internal_error(exc: BaseException, doing: str) -> int:
    """One line on stderr naming where the traceback went, and EX_SOFTWARE (70)."""
    from gpuwatch.remote import errorlog
    from gpuwatch.remote.textsafe import visible

    where = errorlog.record(exc, f"gpuwatch {doing}")
    told = (f"the traceback is in {where}" if where is not None
            else "the error log could not be written")
    print(f"gpuwatch: internal error in {doing}: {visible(errorlog.summary(exc))}; {told}; please "
          f"report it", file=sys.stderr)
    return EXIT_SOFTWARE


def _kill(args: argparse.Namespace) -> int:
    return _act("kill", args, pid=args.pid, signal=args.signal)


def _reap(args: argparse.Namespace) -> int:
    return _act("reap", args)


def _relaunch(args: argparse.Namespace) -> int:
    return _act("relaunch", args, run=args.run)


def _act(kind: str, args: argparse.Namespace, **what: object) -> int:
    """kill / reap / relaunch: poll, plan, confirm, execute, verify (tui/cli/actions.py)."""
    from gpuwatch.tui.cli.actions import run_action

    return run_action(kind, host_name=args.host, config_path=args.config, yes=args.yes,
                      readonly=args.readonly, accept_new_host_keys=args.accept_new_host_keys,
                      **what)


def _init(args: argparse.Namespace) -> int:
    from gpuwatch.remote.config.schema import find_config, load_file
    from gpuwatch.remote.config.starter import write_starter

    path, _ = find_config(args.config)
    try:
        write_starter(path, list(args.hosts), force=args.force)
    except FileExistsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return EXIT_CANTCREAT
    except OSError as exc:
        print(f"gpuwatch: cannot write {path}: {exc}", file=sys.stderr)
        return EXIT_CANTCREAT
    config = load_file(path)  # what we wrote must load back: fail loudly here if not
    print(f"wrote {path} ({len(config.hosts)} host{'s' * (len(config.hosts) != 1)}); "
          f"edit it, then run `gpuwatch check`")
    return EXIT_OK


def _load(args: argparse.Namespace) -> Config:
    """The config with the command line applied: hosts named, --interval, --readonly."""
    from gpuwatch.remote.config.schema import load_config, select_hosts

    config = select_hosts(load_config(args.config), list(args.hosts))
    if args.interval:
        config = replace(config, interval=args.interval)
    if args.readonly:
        config = replace(config, readonly=True)
    return config


def _once(args: argparse.Namespace) -> int:
    from gpuwatch.remote.findings.rules import Severity
    from gpuwatch.remote.report import (
        document,
        exit_code,
        prometheus_text,
        text_report,
        to_json_text,
    )
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.cli.once import run_once

    config = _load(args)
    if not all(h.is_local for h in config.hosts):
        import gpuwatch.remote.wire.ssh  # noqa: F401  asyncssh (~0.2 s), imported with gc off too
    _started()
    with Store.open() as store:
        if store.warning:
            print(f"gpuwatch: {store.warning}", file=sys.stderr)
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


def _tui(args: argparse.Namespace) -> int:
    """The full-screen TUI on the config's (or the command line's) hosts."""
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.app import build_app

    config = _load(args)
    _started()
    with Store.open() as store:
        if store.warning:
            print(f"gpuwatch: {store.warning}", file=sys.stderr)
        app = build_app(config, store=store, readonly=args.readonly, theme=args.theme,
                        accept_new_host_keys=args.accept_new_host_keys)
        app.run()
    return _app_exit(app)


def _app_exit(app: object) -> int:
    """The TUI's exit status: 0, or 70 where Textual ended it on an exception of ours (Textual
    has printed it; the error log keeps it too)."""
    if not getattr(app, "return_code", 0):
        return EXIT_OK
    error = getattr(app, "_exception", None)  # Textual keeps the first unhandled exception
    return internal_error(error if error is not None else RuntimeError("the TUI failed"),
                          "the TUI")


def _demo(args: argparse.Namespace) -> int:
    """The TUI on the demo fleet: simulated boxes behind real SSH servers on loopback, reached
    through exactly the pipeline real hosts go through (host-key checking included). Its store
    lives with the fleet's files, so a demo never mixes into the person's own history."""
    import asyncio

    from gpuwatch.remote.config.schema import load_file
    from gpuwatch.remote.sim.fleet import DemoFleet
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.app import build_app

    _started()

    async def main() -> object:
        async with DemoFleet.start() as fleet:
            config = load_file(fleet.config_path)
            if args.interval:
                config = replace(config, interval=args.interval)
            with Store.open(fleet.root / "gpuwatch-demo.sqlite3") as store:
                app = build_app(config, store=store, readonly=args.readonly, theme=args.theme,
                                accept_new_host_keys=args.accept_new_host_keys)
                await app.run_async()
                return app

    return _app_exit(asyncio.run(main()))


def _check(args: argparse.Namespace) -> int:
    """Validate the config, poll each host once, explain each failure (exit 0 / 2 / 78)."""
    import asyncio

    from gpuwatch.remote.config.schema import load_config, select_hosts
    from gpuwatch.remote.textsafe import visible
    from gpuwatch.tui.cli.check import check_hosts, summary

    config = select_hosts(load_config(args.config), list(args.hosts))
    where = str(config.path) if config.path else "no config file (defaults)"
    print(f"config OK: {where}")
    for host in config.hosts:
        runs = ", ".join(r.name for r in host.runs) or "no runs"
        print(f"  {host.name}: ssh {host.ssh}, python {host.python}, disks "
              f"{' '.join(host.disks)}; {runs}")
    sys.stdout.flush()  # the polls take a while: show what is being checked first
    checks = asyncio.run(check_hosts(config.hosts,
                                     accept_new_host_keys=args.accept_new_host_keys))
    for check in checks:
        for line in [*check.lines, *check.warnings]:
            print(visible(line, multiline=True))  # a poll's error may quote the box
    print(summary(checks))
    return EXIT_OK if all(c.ok for c in checks) else EXIT_UNPOLLED


if __name__ == "__main__":
    main()
