"""`gpuwatch init [HOST ...]`: write a commented starter config (remote/config/starter.py makes
the text), never over an existing file without --force. A HOST that looks like a file path is
refused: `gpuwatch init /tmp/x.toml` means `--config /tmp/x.toml`, not a host named so."""

from __future__ import annotations

import argparse
import shlex
import sys

from .common import EXIT_CANTCREAT, EXIT_OK, EXIT_USAGE


def looks_like_a_path(target: str) -> bool:
    """No ssh target holds a slash, starts with `~` or ends in `.toml`; a file path may."""
    return "/" in target or "\\" in target or target.startswith("~") or \
        target.lower().endswith((".toml", ".tml"))


def run_verb(args: argparse.Namespace) -> int:
    paths = [t for t in args.hosts if looks_like_a_path(t)]
    if paths:
        others = " ".join(shlex.quote(t) for t in args.hosts if t not in paths)
        print(f"gpuwatch init: {paths[0]!r} looks like a file path, not a host (an ssh alias, "
              f"user@host, host:port or `local`); to write the config there: gpuwatch init "
              f"--config {shlex.quote(paths[0])}{' ' + others if others else ''}",
              file=sys.stderr)
        return EXIT_USAGE
    from gpuwatch.remote.config.load import find_config, load_file
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
