"""Reading a run's cgroup counters, log and event files: sent, with checkpoints.py,
only to a poll that may read a run (a configured one, one that discovery remembers, or a
discovery that may find one; bundle.RUN_FILES, U15).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
host = base.load_module("host")



RUN_CGROUPS = 8
"""At most this many cgroups besides the probe's own are read: a box with hundreds of
containers has hundreds of cgroups, and a run lives in one or two."""


def run_groups(root, version, own, processes, wanted):
    """The cgroup section's "groups" (here, in the run files part: only a poll with runs needs
    it). U41: [path, oom_kill, memory_max_bytes] of each cgroup a run lives in, besides the
    probe's own: those the request names first (where the runs lived at the last poll, dead
    ones' too), then a run's process's, then a GPU holder's. A run in a Docker or Slurm cgroup
    is OOM-killed there, and the probe's own counter never moves. A cgroup whose folder is not
    here (another cgroup namespace) is left out: not known."""
    rows = processes.get("procs", {}).get("rows", []) if isinstance(processes, dict) else []
    at = base.PROC_FIELDS.index
    paths = [p for p in wanted if isinstance(p, str)] if isinstance(wanted, list) else []
    paths += [r[at("cgroup")] for r in rows if r[at("run")] is not None or r[at("nvidia_devs")]]
    tried, found = [], []
    for path in paths:
        if not path or path == own or path in tried or len(tried) >= RUN_CGROUPS:
            continue
        tried.append(path)
        try:
            if os.path.isdir(os.path.join(root, "memory" * (version == 1), path.lstrip("/"))):
                read = host.cgroup_v2 if version == 2 else base.load_module("cgroup_v1").cgroup_v1
                info = read(root, path)
                found.append([path, info["memory_events"].get("oom_kill"),
                              info["memory_max_bytes"]])
        except (OSError, ValueError):
            pass
    return base.table(("path", "oom_kill", "memory_max_bytes"), found)


# U6: torch.save's `latest.pth.tmp`, HuggingFace's `tmp-checkpoint-N`, downloaders' `.partial`
def leftover(name):
    """A half-written save: *.tmp, *.partial, tmp* (U6)."""
    return name.endswith((".tmp", ".partial")) or name.startswith("tmp")


def has_glob(path):
    return "*" in path or "?" in path or "[" in path
CKPT_FIELDS = ("path", "mtime", "bytes", "capped")
LOG_SAMPLE = 4096  # bytes of a log's head read once to give its lines back as data


def box_path(path):
    """A request path on this box: ~ expanded here; None for anything but a non-empty string."""
    if not isinstance(path, str) or not path.strip():
        return None
    return os.path.expanduser(path)


def finite(value):
    """A number for JSON: non-finite values as "nan", "inf", "-inf" (JSON has none); floats
    to 9 significant digits (a float32 round-trips; the document stays small)."""
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return float("%.9g" % value)
    return value


def as_number(value):
    """A metric value from JSON or CSV as a float; None for anything that is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) or (isinstance(value, str) and value.strip()):
        try:
            return float(value)
        except (ValueError, OverflowError):  # an int beyond a float's range too
            return None
    return None


def as_step(value):
    """A step: an integer, or an integral float ("500.0" in a CSV); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -2 ** 63 <= value < 2 ** 63 else None  # the client's series: int64
    number = as_number(value)
    if number is None or number != number or number in (float("inf"), float("-inf")):
        return None
    return int(number) if number == int(number) and -2.0 ** 63 <= number < 2.0 ** 63 else None


def columns(points, with_wall):
    """[(tag, step, value, wall), ...] → {tag: {"steps", "values"[, "wall_times"]}}."""
    out = {}
    for tag, step, value, wall in points:
        col = out.get(tag)
        if col is None:
            col = out[tag] = {"steps": [], "values": []}
            if with_wall:
                col["wall_times"] = []
        col["steps"].append(step)
        col["values"].append(finite(value))
        if with_wall:
            col["wall_times"].append(round(wall, 3) if wall == wall else None)
    return out


def stat_fields(st):
    return {"size": st.st_size, "mtime": round(st.st_mtime, 3)}


# -------------------------------- the log: a bounded tail, as data


def collect_log(path, seen, limits):
    """Size, mtime and the last lines of the log. The tail is bytes decoded as UTF-8 with
    replacement and never interpreted (Rich markup or escapes in it are text). When the
    client already holds this size and mtime (`seen`), the tail is not sent again."""
    st = os.stat(path)
    out = {"path": path}
    out.update(stat_fields(st))
    if seen == [out["size"], out["mtime"]]:
        out["same"] = True
        return out
    start = max(0, st.st_size - limits["log_tail_bytes"])
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(limits["log_tail_bytes"])
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1:]  # a cut first line says less than nothing
    parts = data.split(b"\n")
    keep = limits["log_tail_lines"] + (1 if parts and parts[-1] == b"" else 0)
    out["tail"] = b"\n".join(parts[-keep:]).decode("utf-8", "replace")
    return out


# -------------------------------- TensorBoard event files


def walk_files(root, accept, limits):
    """Files under root (a file, or a folder walked depth-first to limits["walk_depth"]) whose
    name `accept`s, visiting at most limits["walk_entries"] entries → (paths, capped)."""
    if not os.path.isdir(root):
        os.stat(root)  # a missing path raises here: the source's error
        return [root], False
    found, stack, visited, capped = [], [(root, 0)], 0, False
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            if folder == root:
                raise
            continue
        for entry in entries:
            visited += 1
            if visited > limits["walk_entries"]:
                return found, True
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < limits["walk_depth"]:
                        stack.append((entry.path, depth + 1))
                    else:
                        capped = True
                elif accept(entry.name) and entry.is_file():
                    found.append(entry.path)
            except OSError:
                continue
    return found, capped


def expand_glob(path, cap):
    """A path with glob characters → its matches, sorted (at most cap); else [path]."""
    if not has_glob(path):
        return [path], False
    globs = base.optional("globs")  # sent where a run's path has glob characters
    if globs is not None:
        return globs.glob_paths(path, cap)
    import glob  # one the client did not see coming: discovery's, on the poll it finds a run

    matches = []
    for match in glob.iglob(path):
        matches.append(match)
        if len(matches) > cap:
            return sorted(matches[:cap]), True
    return sorted(matches), False


# ---------------------------------------------------------------- modules beside the probe

def load_tfevents():
    """The event decoder (see load_module)."""
    return base.load_module("tfevents")




def find_event_files(path, limits):
    """Event files (name containing "tfevents") under a file, a folder (recursive) or a glob,
    at most limits["event_files"] (the newest by mtime) → ([(path, stat), ...] in reading
    order, capped). Reading order is by file name: writers name them by creation time."""
    roots, capped = expand_glob(path, limits["event_files"])
    files = []
    for root in roots:
        found, cut = walk_files(root, lambda name: "tfevents" in name, limits)
        capped = capped or cut
        for name in found:
            try:
                files.append((name, os.stat(name)))
            except OSError:
                continue
    if len(files) > limits["event_files"]:
        files.sort(key=lambda item: item[1].st_mtime)
        files, capped = files[-limits["event_files"]:], True
    files.sort(key=lambda item: (os.path.basename(item[0]), item[0]))
    return files, capped



def read_event_file(path, st, offset, budget, limits):
    """One event file's entry: unchanged files cost one stat; the others are read from the
    client's offset within the poll's remaining byte and time budget."""
    entry = {"path": path}
    entry.update(stat_fields(st))
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        offset = 0
    if offset == st.st_size:
        entry["offset"] = offset
        return entry
    if offset > st.st_size:  # truncated or replaced: read it afresh
        entry["reset"] = True
        offset = 0
    if budget["bytes"] <= 0 or time.monotonic() >= budget["deadline"]:
        entry["offset"] = offset
        entry["stopped"] = "budget"
        return entry
    try:
        tfevents = load_tfevents()
    except ImportError:  # not sent with this poll: the records go as they are
        return base.load_module("events").read_raw_records(entry, path, offset, st.st_size, budget)
    points, new_offset, errors, info = tfevents.read_scalars(
        path, offset, max_bytes=budget["bytes"], deadline_s=budget["deadline"])
    budget["bytes"] -= info["bytes_read"]
    entry.update({"start": offset, "offset": new_offset, "stopped": info["stopped"],
                  "scalars": columns(points, True), "crc": info["crc"]})
    if info.get("first_wall_time") is not None:
        entry["first_wall_time"] = round(info["first_wall_time"], 3)
    if errors:
        entry["errors"] = ["offset %s: %s" % (e.get("offset"), e.get("message"))
                           for e in errors[:limits["errors_per_source"]]]
        entry["error_count"] = len(errors)
    return entry




def collect_events(path, offsets, budget, limits):
    files, capped = find_event_files(path, limits)
    offsets = offsets if isinstance(offsets, dict) else {}
    out = {"path": path, "files": []}
    if capped:
        out["capped"] = True
    for name, st in files:
        try:
            out["files"].append(read_event_file(name, st, offsets.get(name, 0), budget, limits))
        except Exception as exc:  # one bad file never hides the others
            out["files"].append({"path": name, "error": base.describe(exc)})
    return out


# -------------------------------- one run


def collect_run(run, pids, budget, limits):
    out = {"name": run.get("name"), "pids": pids}
    errors = {}

    def source(key, fn, *args):
        try:
            out[key] = fn(*args)
        except Exception as exc:  # a missing or malformed file is this source's error only
            errors[key] = base.describe(exc)

    log, events, ckpts, done, exit_file = (box_path(run.get(k)) for k in
                                           ("log", "events", "checkpoints", "done", "exit"))
    if log:
        source("log", collect_log, log, run.get("log_seen"), limits)
    if events:
        source("events", collect_events, events, run.get("offsets"), budget, limits)
    metrics = run.get("metrics")
    if isinstance(metrics, list):
        cursors = run.get("cursors") if isinstance(run.get("cursors"), dict) else {}
        out["metrics"] = []
        for i, raw in enumerate(metrics):
            if box_path(raw) is None:
                continue
            try:
                reader = base.optional("metrics")  # sent where a run names metrics
                if reader is None:
                    raise base.ProbeFailure("the metrics readers were not sent with this poll")
                out["metrics"].extend(reader.collect_metrics(raw, cursors.get(raw), limits))
            except Exception as exc:
                out["metrics"].append({"path": raw, "error": base.describe(exc)})
                errors["metrics[%d]" % i] = base.describe(exc)
    if ckpts:
        source("checkpoints", base.load_module("checkpoints").collect_checkpoints, ckpts, limits)
    if done:
        source("done", base.load_module("checkpoints").collect_done, done)
    if exit_file:
        source("exit", base.load_module("checkpoints").collect_exit, exit_file)
    if errors:
        out["errors"] = errors
    return out


def read_known_run(known, pids, details, budget, limits, has_decoder):
    """A discovered run read like a configured one from the paths the client remembers (as
    discover.read_run reads it)."""
    run = {"name": known["name"]}
    for key in ("log", "events", "checkpoints", "exit"):
        if isinstance(known.get(key), str):
            run[key] = known[key]
    metrics = known.get("metrics") if isinstance(known.get("metrics"), list) else []
    if any(isinstance(m, str) for m in metrics):
        run["metrics"] = [m for m in metrics if isinstance(m, str)]
    for key in ("offsets", "cursors", "log_seen"):
        if key in known:
            run[key] = known[key]
    result = collect_run(run, pids, budget, limits)  # without the decoder: records raw
    result["discovered"] = details
    return result


