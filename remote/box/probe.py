"""gpuwatch probe: runs ON the box, once per poll, and prints one JSON document.

Stdlib only and Python 3.6+ (old boxes; nothing is installed there, U42): the client sends
this file, the files of the sections it reads (base.py, host.py, gpus/section.py,
processes.py, disks.py, known_runs.py) and those of the optional parts this poll needs (the
box's GPU reader, gpus/nvidia_smi.py or gpus/nvml.py; runs.py, metrics.py, ... see
wire/bundle.py, modules_for), and
a JSON request over stdin each poll; each is installed as a gpuwatch_<name> module and reached
through it. pynvml is used when it imports and nvmlInit works, else `nvidia-smi`. Nothing read
from the box is ever executed or evaluated; only `nvidia-smi` and `dmesg` are run, from PATH,
under timeouts.

Roots are overridable so tests and the simulator can point it at fixture trees:
GPUWATCH_PROCFS (/proc), GPUWATCH_SYSFS (/sys), GPUWATCH_ETC (/etc).

Request (unknown keys are ignored):
    {"v": 1, "disks": [path, ...],
     "runs": [RUN, ...],
     "limits": {"procs", "cmd_chars", "fds_per_proc", "kernel_events", "msg_chars",
                "dmesg_timeout_s", "events_bytes", "events_time_s", "event_files",
                "walk_depth", "walk_entries", "log_tail_bytes", "log_tail_lines",
                "metrics_bytes", "metrics_json_bytes", "metrics_points", "checkpoints",
                "ckpt_files", "leftovers", "errors_per_source"},
     "nvidia_smi_timeout_s": float, "gpu_hints": {name: str} (what the last poll's GPU source
     said of this box: see gpus/section.py),
     "deadline_s": float (the probe is done this long after it started, see arm_deadline),
     "want": {"gpus", "processes", "disks", "cgroup", "logind", "kernel", "runs", "nvml",
              "discover": bool},
     "discovered_runs": [...] (see discover.py: runs found earlier, to keep reading),
     "discovery_reuse": {...} (what the last discovery found, see discovery_cache),
     "run_cgroups": [path, ...] (the memory cgroups the runs lived in at the last poll, U41),
     "compress": bool}   (the request itself may come zlib-compressed)
    RUN = {"name": str, "process": str (argument words, see match_runs), "workdir": str
           (its processes work there: see match_runs; absent: loose matching),
           "log", "events", "checkpoints" (a glob), "done", "exit": path, "metrics": [path, ...]
           (absolute, or ~ expanded here; events and metrics paths may be globs),
           "offsets": {event file: byte offset}, "cursors": {metrics path as sent: [cursor of
           each of its files, as the last answer gave them]},
           "log_seen": [size, mtime]}   the last three: what the previous answer said

Output: {"v": 1, "probe_s", "cpu_s", "errors": {section: message}, and the sections
"host", "gpus", "processes", "disks", "cgroup", "logind", "kernel", "runs", "discovered"
(run objects as in "runs", each with a "discovered" object, see discover.py),
"discovery": {"reuse": {...}} | {"need": "now" | "next", "why"} (see
discovery_state)}. "gpus" also says "pynvml": whether this python imports it (the client sends
the NVML reader only then; absent when the request's want.nvml is false),
"pynvml_dir": the folder it imported from (the request's "pynvml_dir" next poll, see
import_pynvml_from) and "nvml": why NVML was not used, when it was not. "host" says "spawn":
whether this python has os.posix_spawnp (the client sends run_bounded_popen only where not).
"processes" says "uptime_s": the box's uptime when its rows' "cpu_ticks" (utime + stime,
in clock ticks) were read: what the client's CPU% since the last poll divides by.
"cgroup" also holds "groups": the oom_kill counter and memory limit of the cgroups the runs'
processes live in, where not the probe's own (see run_groups).
"kernel" says "candidates": how many lines may be Xids or OOM kills, and holds them as "raw" (with
"raw_total") where the request came without the parser (see collect_kernel).
A section that fails is {"error": message} (also listed in "errors") and the rest of the
document stands.
Tables are {"fields": [...], "rows": [[...], ...]} to keep the document small. With
"compress": true stdout is the zlib stream of that JSON (forked dataloader workers repeat
their parent's command line: it shrinks about 4x, U15).

A run in the output (a source that fails is left out and its message is in "errors"):
    {"name", "pids": [...],
     "log": {"path", "size", "mtime", "tail": str | absent with "same": true},
     "events": {"path", "capped"?: true, "files": [{"path", "size", "mtime", "offset",
                "start"?, "stopped"? ("eof" | "partial" | "bytes" | "time" | "shrunk" |
                "budget"), "first_wall_time"?, "reset"?: true, "errors"?, "error_count"?,
                "crc"? ("c" | "python": the CRC the box's decoder used),
                "scalars"?: {tag: {"steps", "values", "wall_times"}}} | {"path", "error"}]},
     "metrics": [{"path", "file", "kind" ("trainer_state" | "csv" | "jsonl"), "size", "mtime",
                  (one per file read: a CSV or JSONL glob reads all its matches, in order)
                  "cursor", "scalars": {tag: {"steps", "values"}}, "reset"?, "pending"?,
                  "skipped"?, "skip_reason"?, "progress"?: {"global_step"?, "max_steps"?,
                  "epoch"?, "num_train_epochs"?, "final"?: true (trainer_state) |
                  "max_epochs"?, "max_steps"? (csv: the hparams.yaml beside it)}}
                 | {"path", "file"?, "error"}],
     "checkpoints": {"pattern", "total", "capped"?, "items": table, "leftovers": table}
                    (tables of path, mtime, bytes, capped; oldest first),
     "done": {"path", "exists", "mtime"?},
     "exit": {"path", "exists", "mtime"?, "code"?} (what the launch wrapper of a run gpuwatch
             relaunched recorded when it ended, see collect_exit),
     "errors"?: {"log" | "events" | "checkpoints" | "done" | "exit" | "metrics[i]": message}}
Values are numbers to 9 significant digits; non-finite ones are "nan", "inf", "-inf".
"""

import os
import sys
import time
import zlib

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
host = base.load_module("host")
gpus = base.load_module("gpus/section")
processes = base.load_module("processes")
disks = base.load_module("disks")
known_runs = base.load_module("known_runs")
collect_disks = disks.collect_disks



# ---------------------------------------------------------------- request and document

def read_request(stream):
    """The request JSON from the rest of stdin, zlib-compressed when that paid (a run's event
    file offsets, U15) → (request, problem or None)."""
    raw = stream.read()
    if not raw.strip():
        return {}, None
    try:
        if raw[:1] == b"x":  # a zlib stream's first byte; JSON's is "{"
            raw = zlib.decompress(raw)
        request = base.json_loads(raw.decode("utf-8"))
    except (ValueError, zlib.error) as exc:
        return {}, "request is not JSON: %s" % exc
    if not isinstance(request, dict):
        return {}, "request is not a JSON object"
    if request.get("v", 1) != 1:
        return request, "request version %r; this probe reads version 1" % request.get("v")
    return request, None


def request_limits(request):
    given = request.get("limits")
    limits = {}
    for key, default in base.DEFAULT_LIMITS.items():
        value = base.number_setting(given, key, default)
        limits[key] = int(value) if isinstance(default, int) else float(value)
    return limits


def gather(request, doc=None):
    """The document's sections, into `doc` as each is done (main keeps what was done when the
    deadline cuts this short)."""
    doc = {"v": 1, "errors": {}} if doc is None else doc
    limits = request_limits(request)

    def section(name, fn, *args):
        if not base.want(request, name):
            return
        try:
            doc[name] = fn(*args)
        except Exception as exc:  # one section's failure never sinks the document
            doc[name] = dict(getattr(exc, "detail", None) or {}, error=base.describe(exc))
            doc["errors"][name] = doc[name]["error"]

    disks = request.get("disks")
    found = {}  # what one section learns that another uses: the processes matched to runs
    section("host", host.collect_host)
    section("gpus", gpus.collect_gpus, request)
    gpu_apps = doc.get("gpus", {}).get("apps", {}).get("rows", [])
    section("processes", processes.collect_processes, request, limits, [row[1] for row in gpu_apps],
            found)
    section("disks", collect_disks, disks if isinstance(disks, list) else [])
    if isinstance(request.get("runs"), list) and request["runs"]:
        section("runs", known_runs.collect_runs, request, limits, found)
    if base.want(request, "discover"):
        section("discovered", known_runs.collect_discovered, request, limits, found)
        state = found.get("discovery") or {}
        if "cache" in state:  # sent back by the next poll instead of the module
            doc["discovery"] = {"reuse": state["cache"]}
        elif "need" in state:
            doc["discovery"] = {"need": "now", "why": state["need"]}
        elif state.get("due"):
            doc["discovery"] = {"need": "next", "why": "a search is due"}
    section("cgroup", host.collect_cgroup, doc.get("processes"), request.get("run_cgroups"))
    section("logind", host.collect_logind)
    section("kernel", host.collect_kernel, limits)
    return doc


SECTIONS = ("host", "gpus", "processes", "disks", "runs", "discovered", "cgroup", "logind",
            "kernel")
"""gather's sections, in its order."""


def cut_short(doc, request, message):
    """The document of a probe stopped at its deadline: the sections done stand; the one it
    was reading says so, and so does each one after it that gather would have read (absent,
    a section reads as not asked for, and an absent process table as a box without
    processes)."""
    cut = None
    for name in SECTIONS:
        if name in doc or not base.want(request, name) or name == "runs" and not request.get(
                "runs") or name == "discovered" and not base.want(request, "discover"):
            continue
        doc[name] = {"error": "not read: the probe's deadline passed while it read %s" % cut
                     if cut else "%s while reading this; something on the box hangs" % message}
        if not cut:  # this one hung (a GPU query here is said as a timeout, not "no GPU")
            doc[name]["timeout"] = True
        else:  # never started: nothing is known of it (the GPUs' state is not a failure)
            doc[name]["not_read"] = True
        doc["errors"][name] = doc[name]["error"]
        cut = cut or name


def main():
    started, cpu_start = time.monotonic(), os.times()
    stdout, sys.stdout = sys.stdout, sys.stderr  # nothing but the document reaches stdout
    doc, request = {"v": 1, "errors": {}}, {}
    try:
        base.arm_deadline(base.DEFAULT_DEADLINE_S, started)  # until the request gives its own
        request, problem = read_request(sys.stdin.buffer)
        base.arm_deadline(
            base.number_setting(request, "deadline_s", base.DEFAULT_DEADLINE_S), started)
        if problem:
            doc["errors"]["request"] = problem
        gather(request, doc)
    except base.Deadline as exc:
        cut_short(doc, request, str(exc))
    try:
        # a client that stopped reading
        base.alarm(max(base.time_left(), 0) + base.WRITE_GRACE_S)
        cpu_end = os.times()
        doc["cpu_s"] = round(sum(cpu_end[:2]) - sum(cpu_start[:2]), 3)
        doc["probe_s"] = round(time.monotonic() - started, 3)
        body = base.json_dumps(doc).encode("ascii")
        stdout.buffer.write(zlib.compress(body, 6) if request.get("compress") is True else body)
        stdout.flush()
        sys.stderr.flush()
    except base.Deadline:
        pass  # the client stopped reading, or has gone: nothing more to do for it
    finally:
        base.alarm(0)
        base.kill_children()  # one that a kill could not end at once (D state) is tried again
    os._exit(0)  # do not wait for an NVML thread stuck in a hung driver


if __name__ == "__main__":
    main()
