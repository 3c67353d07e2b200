"""The `gpuwatch` command: parse the command line, then hand over to the verb's module.

This module stays light: `--once`, `check`, `init` and the action verbs must not import Textual
(a cron job pays for every import), so the TUI is imported only when it is about to run.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from typing import NoReturn

from .common import (  # re-exported: the exit codes are the command's contract
    EXIT_CANTCREAT,
    EXIT_CLOSED_PIPE,
    EXIT_CONFIG,
    EXIT_FINDING,
    EXIT_OK,
    EXIT_SOFTWARE,
    EXIT_UNPOLLED,
    EXIT_USAGE,
    closed_pipe,
    config_path,
    internal_error,
    started,
)

__all__ = ["EXIT_CANTCREAT", "EXIT_CLOSED_PIPE", "EXIT_CONFIG", "EXIT_FINDING", "EXIT_OK",
           "EXIT_SOFTWARE", "EXIT_UNPOLLED", "EXIT_USAGE", "VERBS", "build_parser",
           "internal_error", "main", "run", "split_verb"]

VERBS = ("init", "check", "kill", "reap", "relaunch", "ack", "scalars", "watch", "notify",
         "events", "report", "job")
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
gpuwatch ack HOST RUN                 acknowledge a dead run: it stops being critical
gpuwatch job requeue|cancel JOB [--yes]
                                      a Slurm job through the scheduler ([slurm])
gpuwatch scalars PATH ... [--tag T] [--json]
                                      print the scalars of TensorBoard event files
gpuwatch watch [--once] [--install-service]
                                      headless watcher: restart policies, notifications
gpuwatch notify --test                send a test message to each [notify] target
gpuwatch events [--since D] [HOST] [--json]
                                      what happened: findings, deaths, restarts, reboots
gpuwatch report HOST RUN [--since D] [--json]
                                      a run's time alive and dead, restarts, GPU-hours, kWh, cost

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


COMMON_SHOWN: dict[str | None, frozenset[str]] = {
    "init": frozenset({"config"}), "notify": frozenset({"config"}), "scalars": frozenset(),
    "ack": frozenset({"config"}), "events": frozenset({"config"}), "report": frozenset({"config"}),
    "check": frozenset({"config", "accept_new_host_keys"}),
    "job": frozenset({"config", "readonly", "accept_new_host_keys"}),
    **dict.fromkeys(("kill", "reap", "relaunch"),
                    frozenset({"config", "readonly", "accept_new_host_keys"})),
    "watch": frozenset({"config", "interval", "readonly", "accept_new_host_keys"}),
}
"""The common options each verb's --help lists (the main command lists them all): the others
are still accepted, so a script that passes them everywhere keeps working, but a verb's help
does not offer what does nothing there."""


def _common(parser: argparse.ArgumentParser, verb: str | None = None) -> None:
    group = parser.add_argument_group("common options")
    shown = COMMON_SHOWN.get(verb) if verb is not None else None

    def say(dest: str, text: str) -> str:
        return text if shown is None or dest in shown else argparse.SUPPRESS

    group.add_argument("--config", metavar="PATH", type=config_path,
                       help=say("config", "config file (default: $GPUWATCH_CONFIG, else "
                                          "$XDG_CONFIG_HOME/gpuwatch/config.toml)"))
    group.add_argument("--interval", metavar="S", type=_interval,
                       help=say("interval", "seconds between two polls of one host "
                                            "(default 10)"))
    group.add_argument("--theme", metavar="NAME", help=say("theme", "TUI theme"))
    group.add_argument("--readonly", action="store_true",
                       help=say("readonly", "turn every action (kill, reap, relaunch) off"))
    group.add_argument("--accept-new-host-keys", action="store_true",
                       help=say("accept_new_host_keys",
                                "accept and record unknown host keys, like OpenSSH's "
                                "accept-new (a changed key is always refused)"))
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
        parser.add_argument("--signal", choices=("TERM", "KILL"), default="TERM",
                            help="TERM (the default) asks the process to end; KILL ends it "
                                 "at once, with no chance to save")
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
    elif verb == "ack":
        from gpuwatch.tui.cli.ack import add_arguments as add_ack

        add_ack(parser)
    elif verb == "job":
        from gpuwatch.tui.cli.job import add_arguments as add_job

        add_job(parser)
    elif verb == "events":
        from gpuwatch.tui.cli.events import add_arguments as add_events

        add_events(parser)
    elif verb == "report":
        from gpuwatch.tui.cli.report_verb import add_arguments as add_report

        add_report(parser)
    elif verb in ("watch", "notify"):
        from gpuwatch.tui.cli.watch import add_arguments

        add_arguments(parser, verb)
    _common(parser, verb)
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
    # collector's passes over them took ~20 ms of a `--once` here. Each command turns
    # it back on where its real work starts (common.started).
    gc.disable()
    try:
        try:
            code = run(sys.argv[1:] if argv is None else argv)
        finally:  # argparse's --help exits from inside run: its text is flushed here too
            sys.stdout.flush()
    except BrokenPipeError:
        code = closed_pipe()
    sys.exit(code)


def run(argv: Sequence[str]) -> int:
    """Parse, then hand over to the verb's module (each imports what it needs, when run)."""
    verb, rest = split_verb(argv)
    args = build_parser(verb).parse_args(rest)
    if verb is not None:  # the TUI and `--once` turn the collector on after their imports
        started()
    elif (args.json or args.prometheus) and not args.once:
        build_parser(None).error("--json and --prometheus go with --once")
    from gpuwatch.remote.config.schema import ConfigError

    try:
        code = _dispatch(verb, args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:  # `| head` closed the pipe early: quiet, as any filter
        return closed_pipe()
    except ConfigError as exc:
        for line in exc.lines:  # every error of the file, one line each
            print(f"gpuwatch: config error: {line}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # a bug of ours: never exit 1, which cron reads as a finding
        return internal_error(exc, verb or ("--once" if getattr(args, "once", False) else
                                            "the TUI"))


def _dispatch(verb: str | None, args: argparse.Namespace) -> int:
    if verb == "init":
        from . import init

        return init.run_verb(args)
    if verb == "check":
        from . import check

        return check.run_verb(args)
    if verb == "scalars":
        from . import scalars

        return scalars.run_verb(args)
    if verb in ("kill", "reap", "relaunch"):
        from . import actions

        return actions.run_verb(verb, args)
    if verb == "ack":
        from . import ack

        return ack.run_verb(args)
    if verb == "job":
        from . import job

        return job.run_verb(args)
    if verb == "events":
        from . import events

        return events.run_verb(args)
    if verb == "report":
        from . import report_verb

        return report_verb.run_verb(args)
    if verb in ("watch", "notify"):
        from . import watch
        from .common import load

        return watch.run_verb(verb, args, load)
    if verb is None and args.once:
        from . import once

        return once.run_verb(args)
    if verb is None:
        from . import launch

        return launch.run_demo(args) if args.demo else launch.run_tui(args)
    raise AssertionError(f"the verb {verb!r} has no handler")  # a bug: exit 70, logged


if __name__ == "__main__":
    main()
