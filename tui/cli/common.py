"""What the verbs share: exit codes, the end of start-up, the internal-error line, the config
with the command line applied. No Textual, nothing heavy imported at module level."""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatch.remote.config.schema import Config
    from gpuwatch.remote.store import Store

EXIT_OK, EXIT_FINDING, EXIT_UNPOLLED = 0, 1, 2
EXIT_SOFTWARE = 70  # sysexits EX_SOFTWARE: an internal error (a bug), never a finding
EXIT_CANTCREAT = 73
EXIT_USAGE, EXIT_CONFIG = 64, 78
EXIT_CLOSED_PIPE = 128 + 13
"""What a shell reports for a filter that SIGPIPE ended (`gpuwatch scalars --json | head`):
its reader closed the pipe early; nothing went wrong in gpuwatch."""


def started() -> None:
    """Start-up is over: what it built stays out of every later collection (gc.freeze), and
    the collector runs again. Nothing to do where main() did not turn it off (tests)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


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


def closed_pipe() -> int:
    """stdout's reader went away (`| head`): end quietly, as a Unix filter that SIGPIPE
    ended, never as an internal error. Python ignores SIGPIPE, so the write raised
    BrokenPipeError instead; what is still buffered would raise it again when the interpreter
    flushes stdout at exit, so stdout now points at /dev/null."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to silence
        pass
    return EXIT_CLOSED_PIPE


def config_path(text: str) -> str:
    """--config: a path; an empty one is a usage error (64), never the default config in
    disguise (`--config "$UNSET_VARIABLE"`)."""
    if not text:
        raise argparse.ArgumentTypeError(
            "an empty path names no config file (leave --config out for the default: "
            "$GPUWATCH_CONFIG, else $XDG_CONFIG_HOME/gpuwatch/config.toml)")
    return text


def load(args: argparse.Namespace, *, sources: bool = False) -> Config:
    """The config with the command line applied: hosts named, --interval, --readonly;
    `sources`: with the hosts of [sources.prometheus] (the TUI and --once list them)."""
    from gpuwatch.remote.config.load import load_config
    from gpuwatch.remote.config.schema import select_hosts

    config = load_config(args.config)
    if sources and config.sources.prometheus is not None:
        from gpuwatch.remote.sources.prometheus import with_source_hosts

        config = with_source_hosts(config)
    config = select_hosts(config, list(args.hosts))
    if args.interval:
        config = replace(config, interval=args.interval)
    if args.readonly:
        config = replace(config, readonly=True)
    return config


def warn_store(store: Store) -> None:
    """What the store could not do on opening (it still works, read-only or in memory)."""
    if store.warning:
        print(f"gpuwatch: {store.warning}", file=sys.stderr)
