"""The readers of trainer_state.json, metrics CSV and JSONL files: sent only to a poll where
a run names some or discovery may find them (bundle.METRICS).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import zlib

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
runs = base.load_module("runs")


# -------------------------------- metrics files: trainer_state.json, metrics.csv, *.jsonl


def metrics_kind(path):
    name = path.lower()
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".json"):
        return "trainer_state"
    return None


METRICS_FILES = 64
"""Files of one CSV or JSONL glob read, in order (the newest ones when more match)."""
METRICS_TAG_CHARS = 200
"""A longer key is not a metric name (hostile or broken input): skipped, not sent."""
NEST_DEPTH = 4
"""JSONL dicts nested deeper than this are not flattened further ({"train": {"loss": x}})."""
STEP_KEYS = ("step", "global_step", "iteration", "epoch")
"""The step of a JSONL line: the first of these it has (the rest stay metrics)."""


def name_numbers(path):
    """The digit runs of a path as comparable numbers, in order: checkpoint-9000 before
    checkpoint-10000, version_9 before version_10. A run compares by its length without
    leading zeros, then its digits (no int() of a 4000-digit name)."""
    runs = "".join(c if "0" <= c <= "9" else " " for c in path).split()
    return [(len(run.lstrip("0")), run.lstrip("0")) for run in runs]


def ordered_matches(path, limits):
    """A metrics path's matches in the order they were written: the numbers in their names
    first (equal mtimes, from a copy or a fast save, put checkpoint-9000 after
    checkpoint-10000), then mtime, then the name. Files gone since the glob are left out."""
    matches, _ = runs.expand_glob(path, limits["walk_entries"])
    keyed = []
    for match in matches:
        try:
            st = os.stat(match)
        except OSError:
            continue
        keyed.append((name_numbers(match), st.st_mtime, match))
    keyed.sort()
    return [match for _, _, match in keyed]


def newest_match(path, limits):
    """A metrics path, or with glob characters its newest match (HuggingFace writes
    trainer_state.json into each checkpoint-N/, each holding the whole history so far)."""
    if not runs.has_glob(path):
        return path
    matches = ordered_matches(path, limits)
    if not matches:
        raise base.ProbeFailure("no file matches %s" % path)
    return matches[-1]


def metric_number(value):
    """A metric's value as a float; None for what is not a number (or an integer too big for
    a float: JSON allows 400 digits)."""
    if isinstance(value, str):
        return None  # a JSON string is text, not a metric ("note": "warmup")
    try:
        return runs.as_number(value)
    except (OverflowError, ValueError):
        return None


def flat_metrics(entry, skip, prefix="", depth=0):
    """[(tag, value), ...] of a JSON object's numbers; nested objects flattened as
    "train/loss", NEST_DEPTH deep; keys longer than METRICS_TAG_CHARS left out."""
    out = []
    for key, value in entry.items():
        name = prefix + key
        if len(name) > METRICS_TAG_CHARS or (not prefix and key == skip):
            continue
        if isinstance(value, dict):
            if depth < NEST_DEPTH:
                out.extend(flat_metrics(value, skip, name + "/", depth + 1))
            continue
        number = metric_number(value)
        if number is not None:
            out.append((name, number))
    return out


def safe_step(value):
    """as_step, never raising (a float too big for an integer is no step)."""
    try:
        return runs.as_step(value)
    except (OverflowError, ValueError):
        return None


def read_trainer_state(path, st, cursor, limits):
    """HuggingFace's trainer_state.json: `log_history` entries with `step` and numbers
    (loss, learning_rate, grad_norm, eval_loss, ...). Read whole (bounded in size), only the
    entries after the count the client holds. Cursor: [file, count, size, mtime]."""
    same = isinstance(cursor, list) and len(cursor) == 4 and cursor[0] == path
    count = cursor[1] if same and isinstance(cursor[1], int) and cursor[1] >= 0 else 0
    out = {"kind": "trainer_state"}
    if same and cursor[2:] == [st.st_size, round(st.st_mtime, 3)]:
        out["cursor"] = cursor
        return out, []
    if st.st_size > limits["metrics_json_bytes"]:
        raise base.ProbeFailure("%s is %d bytes, over the %d-byte limit for a trainer_state.json"
                           % (path, st.st_size, limits["metrics_json_bytes"]))
    with open(path, "rb") as f:
        try:
            data = base.json_loads(f.read(limits["metrics_json_bytes"] + 1).decode("utf-8"))
        except RecursionError:
            raise base.ProbeFailure("%s is nested too deep to read" % path)
    history = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise base.ProbeFailure("%s has no log_history list" % path)
    if count > len(history):  # rewritten shorter: a run resumed from an earlier checkpoint
        out["reset"] = True
        count = 0
    progress = trainer_progress(data, history)
    if progress:
        out["progress"] = progress
    new = history[count:count + limits["metrics_points"]]
    points, skipped = [], 0
    for entry in new:
        step = safe_step(entry.get("step")) if isinstance(entry, dict) else None
        if step is None:
            skipped += 1
            continue
        for key, number in flat_metrics(entry, "step"):
            points.append((key, step, number, None))
    done = count + len(new) == len(history)
    # when capped, the next poll must read the file again although it has not changed
    out["cursor"] = [path, count + len(new), st.st_size if done else None,
                     round(st.st_mtime, 3) if done else None]
    if not done:
        out["pending"] = True
    if skipped:
        out["skipped"], out["skip_reason"] = skipped, "a log_history entry without a step"
    return out, points


def trainer_progress(data, history):
    """HuggingFace TrainerState's own word on how far the run got (seed 004: a run that
    reached its end is finished, not dead): global_step of max_steps, epoch of
    num_train_epochs, and "final" when the last log_history entry is the summary that
    Trainer.train() logs as it returns (train_runtime: also an early-stopped run's end)."""
    out = {}
    for key in ("global_step", "max_steps"):
        step = safe_step(data.get(key))
        if step is not None and step >= 0:
            out[key] = step
    for key in ("epoch", "num_train_epochs"):
        number = runs.as_number(data.get(key))
        if number is not None and number == number and abs(number) != float("inf"):
            out[key] = runs.finite(number)
    last = history[-1] if history else None
    if isinstance(last, dict) and runs.as_number(last.get("train_runtime")) is not None:
        out["final"] = True
    return out


HPARAMS_BYTES = 64 * 1024


def lightning_limits(folder):
    """max_epochs and max_steps from the hparams.yaml beside a Lightning metrics.csv, where
    the module saved them (save_hyperparameters): plain `key: integer` lines at the top level,
    read bounded, never parsed as YAML beyond that."""
    path = os.path.join(folder, "hparams.yaml")
    try:
        st = os.stat(path)
        if (st.st_mode & 0o170000) != 0o100000:
            return {}  # not a regular file: a FIFO would block the read
        with open(path, "rb") as f:
            text = f.read(HPARAMS_BYTES).decode("utf-8", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("max_epochs", "max_steps"):
            step = safe_step(value.strip())
            if step is not None and step > 0:  # Lightning's -1 / null: no limit
                out[key] = step
    return out


def read_lines(path, offset, long_line, limits):
    """Complete lines from offset → (lines, new offset, more left, long_line, lines cut).

    At most limits["metrics_left"] bytes are read (what this poll's budget has left,
    limits["metrics_bytes"] at most), and counted in limits["read_bytes"]. A partial last
    line (a writer mid-line) is left for the next poll. A line longer than metrics_bytes
    is skipped to its end, over as many polls as it takes (long_line: still inside one),
    and counted once in `lines cut` (a 100 MB line is one bad line, not a hundred)."""
    budget = min(limits.get("metrics_left", limits["metrics_bytes"]), limits["metrics_bytes"])
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(budget)
    limits["read_bytes"] = limits.get("read_bytes", 0) + len(data)
    cut = len(data) == budget  # the budget, not the end of the file, ended the read
    start = data.find(b"\n") + 1 if long_line else 0
    if long_line and not start:
        return [], offset + len(data), cut, True, 0
    end = data.rfind(b"\n") + 1
    if end <= start:
        if cut and not start and budget == limits["metrics_bytes"]:
            return [], offset + len(data), True, True, 1  # over-long: skip it to its end
        return [], offset + start, cut, False, 0
    # split at \n only: splitlines() also splits at \f, \x1c, U+2028 ... inside a JSON string
    lines = data[start:end - 1].decode("utf-8", "replace").split("\n")
    return [line[:-1] if line.endswith("\r") else line for line in lines], offset + end, cut, \
        False, 0


def read_rows(path, st, cursor, limits, out, parse, first=0, crc=None):
    """The new lines of a line-based file, each parse(line) → (step, [(tag, value), ...]),
    raising for a line it cannot read: skipped, counted, the first one's problem said.
    A cursor for another header (crc) or beyond the file's end starts it over ("reset").
    Cursor: [file, offset, header crc, long_line]."""
    same = isinstance(cursor, list) and len(cursor) >= 2 and cursor[0] == path
    offset = cursor[1] if same and isinstance(cursor[1], int) else 0
    long_line = same and cursor[3:] == [True]
    if not same or cursor[2:3] not in ([crc], [] if crc is None else [0]) \
            or not first <= offset <= st.st_size:
        if same and offset:
            out["reset"] = True
        offset, long_line = first, False
    lines, offset, more, long_line, skipped = read_lines(path, offset, long_line, limits)
    points, problem = [], "a line over %d bytes" % limits["metrics_bytes"] if skipped else ""
    for line in lines:
        if line.strip():
            try:
                step, metrics = parse(line)
            except Exception as exc:  # ValueError, RecursionError, csv.Error: that line's
                skipped, problem = skipped + 1, problem or base.describe(exc)
                continue
            points.extend((tag, step, value, None) for tag, value in metrics)
    out["cursor"] = [path, offset, crc, long_line]
    if more:
        out["pending"] = True
    if skipped:
        out["skipped"], out["skip_reason"] = skipped, problem[:limits["msg_chars"]]
    return out, points


def jsonl_row(line):
    try:
        entry = base.json_loads(line)
    except (ValueError, RecursionError) as exc:
        raise base.ProbeFailure("not JSON: %s" % exc)
    key = next((k for k in STEP_KEYS if k in entry), None) if isinstance(entry, dict) else None
    step = safe_step(entry[key]) if key else None
    if step is None:
        raise base.ProbeFailure("a line without an integer " + " or ".join(STEP_KEYS))
    return step, flat_metrics(entry, key)


def read_jsonl(path, st, cursor, limits):
    """One JSON object per line, its step under the first of STEP_KEYS it has; every other
    number is a metric, nested objects flattened ({"train": {"loss": x}} is train/loss)."""
    return read_rows(path, st, cursor, limits, {"kind": "jsonl"}, jsonl_row)


def csv_row(line):
    import csv

    return next(csv.reader([line]), [])


def read_csv(path, st, cursor, limits):
    """A CSV log: Lightning's metrics.csv (a `step` column; a metric not logged at that step
    is an empty cell; the file rewritten under a new header when a new metric appears, so a
    changed header starts it over) or Keras' CSVLogger (no step: one row per `epoch`).
    Rows are parsed one line at a time: a bad row (a cell over csv's field limit) is that
    row's problem only."""
    with open(path, "rb") as f:
        header_line = f.readline(limits["metrics_bytes"])
    out = {"kind": "csv"}
    if not header_line.endswith(b"\n"):
        out["cursor"] = [path, 0, None, False]  # the header is still being written
        return out, []
    try:
        header = csv_row(header_line.decode("utf-8", "replace").strip("\r\n"))
    except Exception as exc:  # csv.Error: a header cell over the field limit
        raise base.ProbeFailure("%s has an unreadable header: %s" % (path, base.describe(exc)))
    name = "step" if "step" in header else ("epoch" if "epoch" in header else None)
    if name is None:
        raise base.ProbeFailure("%s has no step or epoch column (header: %s)"
                           % (path, ",".join(header)[:limits["msg_chars"]]))
    at = header.index(name)

    def row(line):
        cells = csv_row(line)
        step = safe_step(cells[at]) if len(cells) == len(header) else None
        if step is None:
            raise base.ProbeFailure("a row without an integer %s, or not %d cells"
                               % (name, len(header)))
        pairs = [(tag, runs.as_number(cell)) for tag, cell in zip(header, cells)
                 if tag != name and len(tag) <= METRICS_TAG_CHARS]
        return step, [(tag, value) for tag, value in pairs if value is not None]

    out, points = read_rows(path, st, cursor, limits, out, row, len(header_line),
                            zlib.crc32(header_line))
    limits_of_fit = lightning_limits(os.path.dirname(path))
    if limits_of_fit:
        out["progress"] = limits_of_fit
    return out, points


METRICS_READERS = {"trainer_state": read_trainer_state, "jsonl": read_jsonl, "csv": read_csv}


def file_cursor(cursor, path):
    """What the client holds for one file of a source: its cursors are a list, one per file
    (a single cursor from an older client's store is one file's)."""
    if isinstance(cursor, list) and cursor and isinstance(cursor[0], str):
        cursor = [cursor]
    for held in cursor if isinstance(cursor, list) else ():
        if isinstance(held, list) and held and held[0] == path:
            return held
    return None


def read_metrics_file(raw, kind, found, cursor, limits):
    st = os.stat(found)
    out, points = METRICS_READERS[kind](found, st, file_cursor(cursor, found), limits)
    out.update({"path": raw, "file": found, "scalars": runs.columns(points, False)})
    out.update(runs.stat_fields(st))
    return out


def collect_metrics(raw, cursor, limits):
    """One metrics source → one answer per file read; "path" in each is the path as the
    request spelled it (the key of its cursors), "file" the file read.

    A trainer_state.json glob reads its newest match (each copy holds the history so far).
    A CSV or JSONL glob reads every match in order (Lightning starts a version_N/ each time a
    run resumes: its history is spread over them), sharing one poll's byte budget; a file
    the budget did not reach answers with its cursor as it was and "pending"."""
    path = runs.box_path(raw)
    kind = metrics_kind(path)
    if kind is None:
        raise base.ProbeFailure("unknown metrics format: %s (expected trainer_state.json, *.csv "
                           "or *.jsonl)" % path)
    if kind == "trainer_state" or not runs.has_glob(path):
        return [read_metrics_file(raw, kind, newest_match(path, limits), cursor, limits)]
    answers, failures, left = [], [], limits["metrics_bytes"]
    for found in ordered_matches(path, limits)[-METRICS_FILES:]:
        budget = dict(limits, metrics_left=left)
        try:
            answers.append(read_metrics_file(raw, kind, found, cursor, budget))
        except Exception as exc:  # one file's problem; the source fails only if all do
            failures.append({"path": raw, "file": found, "error": base.describe(exc)})
        left -= budget.get("read_bytes", 0)
    if not answers:
        raise base.ProbeFailure(failures[-1]["error"] if failures else "no file matches " + path)
    return answers + failures
