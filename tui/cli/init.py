"""`gpuwatch init [HOST ...]`: write a commented starter config (remote/config/starter.py makes
the text), never over an existing file without --force."""

from __future__ import annotations

import argparse
import sys

from .common import EXIT_CANTCREAT, EXIT_OK


def run_verb(args: argparse.Namespace) -> int:
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
