"""`gpuwatch scalars PATH ... [--tag T] [--json]`: the scalars of TensorBoard event files.

No TensorBoard needed. A PATH is an event file or a folder searched recursively for files
whose name contains ``tfevents`` (as TensorBoard does). Output (DESIGN §3):

- text: per folder and tag, the count, first and last step, last value, min and max (like
  ``tensorboard --inspect``); corrupt records are listed on stderr;
- ``--json``: ``{"runs": {DIR: {TAG: [[step, value, wall_time], ...]}}, "errors": [{"file",
  "offset", "message"}]}``, points in write order (files by name, records by offset),
  non-finite values as the strings "nan", "inf", "-inf".

DIR is the event file's folder relative to PATH, ``.`` for PATH itself; for a file PATH it is
``.`` (the file's own folder). With several PATHs, DIR is prefixed with the PATH as typed (for
a file PATH, its folder) so that runs from different PATHs never share a key; the same folder
reached twice is one run, its files read once. In text, a lone run ``.`` is named by its
folder (the PATH as typed; its absolute path for ``.``).

``--tag`` takes an exact tag or a shell-style pattern (``train/*``); it may be repeated.

Exit status: 0 everything read; 1 some record was corrupt (all good data is still printed);
66 (EX_NOINPUT) a PATH does not exist, cannot be read, or holds no event file (the other
PATHs are still printed), or a --tag matches no tag (the tags that exist are listed on stderr).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import math
import os
import sys
from collections.abc import Sequence
from itertools import filterfalse
from typing import Any, TextIO

from gpuwatch.remote.wire import tfevents_fast
from gpuwatch.remote.wire.tfevents_fast import Series

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_NOINPUT = 66
CHUNK_BYTES = 64 * 1024 * 1024  # memory bound per read: a 2 GB file is read in pieces
MAX_TAGS_SHOWN = 40  # of the tags that exist, when a --tag matches none


def is_event_file(name: str) -> bool:
    return "tfevents" in os.path.basename(name)


def find_event_files(path: str) -> list[tuple[str, str]]:
    """[(folder relative to path, file path)] for the event files under path, sorted."""
    if os.path.isfile(path):
        return [(".", path)]
    found: list[tuple[str, str]] = []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        rel = os.path.relpath(folder, path)
        found.extend((rel, os.path.join(folder, name)) for name in sorted(files)
                     if is_event_file(name))
    return found


def _append(into: dict[str, Series], tag: str, series: Series) -> None:
    """Add `series`' points after what `into` holds of `tag` (write order)."""
    kept = into.get(tag)
    if kept is None:
        into[tag] = series
        return
    kept.steps.extend(series.steps)
    kept.values.extend(series.values)
    kept.wall_times.extend(series.wall_times)


def read_file(path: str, tags: set[str] | None) -> tuple[dict[str, Series], list[dict[str, Any]]]:
    """All scalars of one file, read in CHUNK_BYTES pieces with the fast path."""
    merged: dict[str, Series] = {}
    errors: list[dict[str, Any]] = []
    offset = 0
    while True:
        series, offset, errs, info = tfevents_fast.read_columns(path, offset, CHUNK_BYTES,
                                                                tags=tags)
        errors.extend(errs)
        for tag, s in series.items():
            _append(merged, tag, s)
        if info["stopped"] != "bytes":
            return merged, errors


def _tag_filter(tags: list[str] | None) -> tuple[set[str] | None, list[str] | None]:
    """(exact set for the reader, patterns to apply afterwards)."""
    if not tags:
        return None, None
    if any(ch in t for t in tags for ch in "*?["):
        return None, tags
    return set(tags), None


def collect(paths: list[str], tags: list[str] | None, err: TextIO
            ) -> tuple[dict[str, dict[str, Series]], list[dict[str, Any]], bool]:
    """({DIR: {TAG: Series}}, errors, every PATH had event files)."""
    exact, patterns = _tag_filter(tags)
    runs: dict[str, dict[str, Series]] = {}
    files_of: dict[str, dict[str, str]] = {}  # DIR -> {realpath: path}
    ok = True
    for path in paths:
        if not os.path.exists(path):
            err.write(f"gpuwatch scalars: {path}: no such file or folder\n")
            ok = False
            continue
        found = find_event_files(path)
        if not found:
            err.write(f"gpuwatch scalars: {path}: no TensorBoard event file (*tfevents*)\n")
            ok = False
            continue
        root = (os.path.dirname(path) or ".") if os.path.isfile(path) else path
        for rel, file in found:
            key = rel if len(paths) == 1 else os.path.normpath(os.path.join(root, rel))
            files_of.setdefault(key, {}).setdefault(os.path.realpath(file), file)
    errors: list[dict[str, Any]] = []
    for key, files in files_of.items():
        run = runs.setdefault(key, {})
        for file in sorted(files.values(), key=os.path.basename):
            try:
                series, errs = read_file(file, exact)
            except OSError as exc:
                err.write(f"gpuwatch scalars: {file}: {exc.strerror or exc}\n")
                ok = False
                continue
            errors.extend(errs)
            for tag, s in series.items():
                if patterns and not any(tag == p or fnmatch.fnmatchcase(tag, p)
                                        for p in patterns):
                    continue
                _append(run, tag, s)
    return runs, errors, ok


def run_verb(args: argparse.Namespace) -> int:
    return run_scalars(list(args.paths), args.tag, args.json)


def run_scalars(paths: list[str], tags: list[str] | None, as_json: bool,
                out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print the scalars under ``paths`` (text or JSON); return the exit status."""
    runs, errors, ok = collect(paths, tags, err)
    if as_json:
        write_json(runs, errors, out)
    elif not tags or any(runs.values()):  # a --tag that matched nothing: stderr says it
        write_text(runs, out, dot=folder_name(paths[0]) if len(paths) == 1 else ".")
        for e in errors:
            err.write(f"gpuwatch scalars: {e['file']}: offset {e['offset']}: {e['message']}\n")
    missing = unmatched(runs, tags) if ok else []
    if missing:
        found = all_tags(paths)
        shown = ", ".join(found[:MAX_TAGS_SHOWN]) + (
            f", ... ({len(found) - MAX_TAGS_SHOWN} more)" if len(found) > MAX_TAGS_SHOWN else "")
        err.write(f"gpuwatch scalars: no tag matches {', '.join(missing)}; the tags there: "
                  f"{shown or 'none'}\n")
    if not ok or missing:
        return EXIT_NOINPUT
    return EXIT_CORRUPT if errors else EXIT_OK


def folder_name(path: str) -> str:
    """What the run `.` (the PATH's own folder; a file PATH's folder) is called in text."""
    folder = (os.path.dirname(path) or ".") if os.path.isfile(path) else path
    folder = os.path.normpath(folder)
    return os.path.abspath(folder) if folder in (".", "..") else folder


def unmatched(runs: dict[str, dict[str, Series]], tags: list[str] | None) -> list[str]:
    """The --tag values that match no tag of any run."""
    seen = {tag for run in runs.values() for tag in run}
    return [t for t in tags or () if not any(tag == t or fnmatch.fnmatchcase(tag, t)
                                             for tag in seen)]


def all_tags(paths: list[str]) -> list[str]:
    """Every tag under the PATHs, sorted: read again without a filter, only when a --tag
    matched nothing (the filtered read skips the other tags' values)."""
    runs, _, _ = collect(paths, None, io.StringIO())
    return sorted({tag for run in runs.values() for tag in run})


# ---------------------------------------------------------------------------------------------
# Output


def _json_number(v: float) -> str:
    if math.isnan(v):
        return '"nan"'
    if math.isinf(v):
        return '"inf"' if v > 0 else '"-inf"'
    return repr(v)


def _points_json(s: Series) -> str:
    if all(map(math.isfinite, s.values)) and all(map(math.isfinite, s.wall_times)):
        # float repr is what json.dumps writes for a finite float
        return ",".join(map("[{},{!r},{!r}]".format, s.steps, s.values, s.wall_times))
    return ",".join(f"[{st},{_json_number(v)},{_json_number(w)}]"
                    for st, v, w in zip(s.steps, s.values, s.wall_times, strict=True))


def write_json(runs: dict[str, dict[str, Series]], errors: list[dict[str, Any]],
               out: TextIO) -> None:
    out.write('{"runs":{')
    for i, (key, run) in enumerate(runs.items()):
        out.write(("," if i else "") + json.dumps(key) + ":{")
        for j, (tag, s) in enumerate(run.items()):
            out.write(("," if j else "") + json.dumps(tag) + ":[")
            out.write(_points_json(s))
            out.write("]")
        out.write("}")
    out.write('},"errors":')
    out.write(json.dumps([{"file": e["file"], "offset": e["offset"], "message": e["message"]}
                          for e in errors]))
    out.write("}\n")


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}"


def write_text(runs: dict[str, dict[str, Series]], out: TextIO, dot: str = ".") -> None:
    """One table per run; `dot` names the run `.` when it is the only one (its folder)."""
    header = ("tag", "count", "first_step", "last_step", "last_value", "min", "max")
    for key, run in runs.items():
        out.write(f"{dot if key == '.' and len(runs) == 1 else key}\n")
        rows = []
        for tag, s in run.items():
            if math.isfinite(sum(s.values)):  # no nan (nor inf) among them: no filter
                finite: Sequence[float] = s.values
            else:
                finite = list(filterfalse(math.isnan, s.values))
            nan_count = len(s.values) - len(finite)
            rows.append((tag, str(len(s)), str(s.steps[0]) if len(s) else "-",
                         str(s.steps[-1]) if len(s) else "-",
                         _fmt(s.values[-1]) if len(s) else "-",
                         _fmt(min(finite)) if finite else "-",
                         _fmt(max(finite)) if finite else "-"
                         ) + ((f"({nan_count} nan)",) if nan_count else ()))
        if not rows:
            out.write("  (no scalars)\n")
            continue
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:7], widths[1:],
                                                                          strict=True)]
            out.write("  " + "  ".join(cells) + ("  " + r[7] if len(r) > 7 else "") + "\n")
