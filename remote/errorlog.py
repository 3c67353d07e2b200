"""Where gpuwatch's own failures go: one bounded log file of full tracebacks.

A user sees one line (what failed, and where its traceback was written); the traceback itself
goes to `$XDG_STATE_HOME/gpuwatch/errors.log`, next to the store. The file is capped: past
MAX_BYTES it is moved to `errors.log.1` (the one before is dropped), so a box that breaks every
poll for a month fills at most twice the cap. Writing it never raises: a log that cannot be
written must not turn one host's error into a crash.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from .paths import state_dir

MAX_BYTES = 1024 * 1024


def default_log_path(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/gpuwatch/errors.log (XDG's default ~/.local/state when unset)."""
    return state_dir(env) / "errors.log"


def summary(exc: BaseException) -> str:
    """The exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    first = text[0][:200] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def record(exc: BaseException, context: str, path: Path | None = None) -> Path | None:
    """Append `exc`'s traceback, headed by the time and `context` (e.g. "judging gpu1"), to the
    log; return the log's path, or None where it could not be written."""
    path = default_log_path() if path is None else path
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    entry = f"--- {stamp} {context}\n{text}\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if path.stat().st_size + len(entry) > MAX_BYTES:
                os.replace(path, path.with_name(path.name + ".1"))
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(entry[-MAX_BYTES:])
    except OSError:
        return None
    return path
