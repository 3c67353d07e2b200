"""gpuwatch probe: runs ON the box, once per poll, and prints one JSON document.

Stdlib only and Python 3.6+ (old boxes; nothing is installed there, U42): the client sends
this source and a JSON request over stdin each poll (see probe_bundle.py). pynvml is used
when it imports and nvmlInit works, else `nvidia-smi`. Nothing read from the box is ever
executed or evaluated; only `nvidia-smi` and `dmesg` are run, from PATH, under timeouts.

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
     "nvidia_smi_timeout_s": float, "nvidia_smi_reasons": "event" | "throttle",
     "deadline_s": float (the probe is done this long after it started, see arm_deadline),
     "want": {"gpus", "processes", "disks", "cgroup", "logind", "kernel", "runs", "nvml",
              "discover": bool},
     "discovered_runs": [...] (issue 8, see discover.py: runs found earlier, to keep reading),
     "discovery_reuse": {...} (issue 3: what the last discovery found, see discovery_cache),
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
(issue 8: run objects as in "runs", each with a "discovered" object, see discover.py),
"discovery": {"reuse": {...}} | {"need": "now" | "next", "why"} (issue 3, see
discovery_state)}. "gpus" also says "pynvml": whether this python imports it (the client sends
the NVML reader only then, issue 3; absent when the request's want.nvml is false),
"pynvml_dir": the folder it imported from (the request's "pynvml_dir" next poll, see
import_pynvml_from) and "nvml": why NVML was not used, when it was not. "host" says "spawn":
whether this python has os.posix_spawnp (the client sends run_bounded_popen only where not).
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
import pwd
import sys
import time
import zlib

SIGKILL = 9  # Linux (the probe reads /proc); importing signal costs more than it says
PROCFS = os.environ.get("GPUWATCH_PROCFS", "/proc")
SYSFS = os.environ.get("GPUWATCH_SYSFS", "/sys")
ETC = os.environ.get("GPUWATCH_ETC", "/etc")
# Set only on a box of gpuwatch's simulator: its GPUs are the stand-in nvidia-smi's, so the real
# driver of the machine the simulator runs on must not be read through NVML.
SIM_DIR = os.environ.get("GPUWATCH_SIM_DIR")
DEVFS = os.environ.get("GPUWATCH_DEVFS", "/dev")

DEFAULT_LIMITS = {
    "procs": 48,  # processes reported in full; the rest are only counted
    "cmd_chars": 256,
    "fds_per_proc": 4096,  # a process with more open fds is not scanned for /dev/nvidia*
    "kernel_events": 8,  # the last N Xid and the last N OOM kills
    "msg_chars": 160,
    "dmesg_timeout_s": 3.0,
    # training runs: every read is bounded, so a first look at a big run spreads over polls
    "events_bytes": 1024 * 1024,  # event-file bytes per poll, all runs: ~35k points, ~250 KB
    "events_time_s": 3.0,  # and the time spent decoding them
    "event_files": 64,  # per run (the newest by mtime when there are more)
    "walk_depth": 6,  # folders searched below an events folder
    "walk_entries": 10000,  # directory entries looked at per search
    "log_tail_bytes": 4096,
    "log_tail_lines": 40,
    "metrics_bytes": 1024 * 1024,  # CSV/JSONL bytes read per file per poll
    "metrics_json_bytes": 16 * 1024 * 1024,  # the largest trainer_state.json read
    "metrics_points": 20000,  # trainer_state.json entries sent per poll
    "checkpoints": 64,  # the newest N listed, with the total count
    "ckpt_files": 20000,  # files stat'ed to size checkpoint folders, per run
    "leftovers": 16,
    "errors_per_source": 8,
}
DEFAULT_NVIDIA_SMI_TIMEOUT_S = 5.0
DEFAULT_DEADLINE_S = 60.0  # a request without "deadline_s" (the client always sends one)
WRITE_GRACE_S = 0.5  # to print the document once the deadline has passed

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread (no fds, no cmdline)
# comm prefixes of what keeps a run alive when the SSH session ends (seed 000)
DETACH_SERVERS = ("tmux", "screen", "SCREEN")

# NVML clocks event (formerly "throttle") reason bits, nvml.h nvmlClocksEventReason*.
REASON_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

GPU_FIELDS = ("index", "uuid", "name", "util_pct", "mem_used_mib", "mem_total_mib",
              "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temp_c",
              "throttle_reasons", "mig", "pci_bus_id", "persistence")
APP_FIELDS = ("uuid", "pid", "gpu_mem_mib", "process_name")
PROC_FIELDS = ("pid", "ppid", "user", "state", "comm", "cmd", "start_ticks", "tty_nr",
               "session", "pgrp", "sighup_ignored", "sighup_caught", "threads", "cgroup",
               "cwd", "exe", "nvidia_devs", "run")
XID_FIELDS = ("t_mono_s", "t_epoch", "pci", "xid", "pid", "name", "msg")
OOM_FIELDS = ("t_mono_s", "t_epoch", "pid", "name", "memcg", "cgroup", "limit_bytes")


class ProbeFailure(Exception):
    """A section could not be gathered; the message is what the client shows, `detail` what
    else the section's error carries (e.g. a tool's exit status)."""

    def __init__(self, message, detail=None):
        Exception.__init__(self, message)
        self.detail = detail or {}


def describe(exc):
    if isinstance(exc, ProbeFailure):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return "%s: %s" % (exc.strerror, exc.filename) if exc.filename else exc.strerror
    return "%s: %s" % (type(exc).__name__, exc)


# ---------------------------------------------------------------- json and re, lazily
# `json` imports `re`, and `re` imports `enum`: 9 ms of a bare python's 11 ms start, on every
# poll (issue 3). A steady poll needs neither: JSON goes through the json module's own C
# encoder and scanner (_json, there since Python 2.7; any python where it differs gets json
# itself), and each pattern is compiled, importing re, only where a line may match it.

def _unencodable(value):
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


def _json_constant(name):
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _JsonContext(object):
    """What _json.make_scanner reads off a JSONDecoder: json.loads' defaults."""
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = staticmethod(_json_constant)
    memo = {}


def json_dumps(value, separators=(",", ":")):
    """json.dumps(value, separators=separators), the same text."""
    try:
        import _json

        encode = _json.make_encoder({}, _unencodable, _json.encode_basestring_ascii, None,
                                    separators[1], separators[0], False, False, True)
        return "".join(encode(value, 0))
    except (ImportError, AttributeError, TypeError):
        import json

        return json.dumps(value, separators=separators)


def json_loads(text):
    """json.loads(text) (a ValueError for what is not JSON)."""
    try:
        import _json

        scan = _json.make_scanner(_JsonContext())
    except (ImportError, AttributeError, TypeError):
        import json

        return json.loads(text)
    try:
        value, end = scan(text, len(text) - len(text.lstrip(" \t\n\r")))
        if not text[end:].strip(" \t\n\r"):
            return value
    except Exception:  # some Pythons' _json raises its errors only with json.decoder loaded
        pass
    import json  # what is wrong, in json's own words

    try:
        return json.loads(text)
    except RecursionError:  # nested deeper than the interpreter recurses
        raise ValueError("nested too deep")


_COMPILED = {}


def rx(pattern):
    """re.compile(pattern), importing re the first time one is needed."""
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        import re

        compiled = _COMPILED[pattern] = re.compile(pattern)
    return compiled


def table(fields, rows):
    return {"fields": list(fields), "rows": rows}


def proc_path(*parts):
    """A file under the proc root. Joined by hand: os.path.join was a tenth of the process
    table's CPU on a busy box (a few calls per process and one per open fd)."""
    return PROCFS + "/" + "/".join(parts)


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def first_line(text):
    text = text.strip()
    return text.splitlines()[0] if text else ""


# ---------------------------------------------------------------- the probe's deadline

class Deadline(BaseException):
    """The request's deadline passed: raised by the SIGALRM handler into whatever the probe
    was doing (waiting on a child, blocked opening a FIFO, a /proc read that hangs: U17). A
    BaseException, so that no section's `except Exception` takes it for its own failure."""


DEADLINE = {}  # "at": the time.monotonic() the probe must be done by, "s": the request's figure
CHILDREN = set()  # pids of the commands running now (each leads its own process group)


def time_left():
    return DEADLINE.get("at", float("inf")) - time.monotonic()


def arm_deadline(seconds, started):
    """Interrupt the probe `seconds` after `started` (a Deadline raised wherever it is), and
    on SIGTERM or SIGHUP end its commands with it. sshd signals no non-tty command when its
    client goes, so a probe that hangs would outlive its poll: one more process on the box
    every poll, thousands by morning (U16, U17). The client asks for a little less than its
    command_timeout, so that the document still reaches it."""
    DEADLINE["at"], DEADLINE["s"] = started + seconds, seconds
    alarm(max(time_left(), 0.001))


def alarm(seconds):
    """SIGALRM in `seconds` (0: none), the handlers in place."""
    try:
        import _signal as sig  # the C module: `import signal` pulls in enum, 5 ms of a poll
    except ImportError:  # not CPython
        import signal as sig
    for num in (sig.SIGALRM, sig.SIGTERM, sig.SIGHUP):  # TERM: ssh.py asks sshd for it
        sig.signal(num, on_signal)
    sig.setitimer(sig.ITIMER_REAL, min(seconds, 1e6))  # a time_t, whatever the request says


def on_signal(signum, frame):
    kill_children(True)
    if signum != 14:  # SIGTERM, SIGHUP: whoever waited for the document has gone
        os._exit(128 + signum)
    raise Deadline("the probe's deadline (%.1f s, a little under command_timeout) passed"
                   % DEADLINE["s"])


def kill_children(scan=False):
    """SIGKILL every command the probe started, with its process group: those in CHILDREN,
    and with `scan` any child of this process the real /proc shows (one the deadline caught
    between its spawn and its entry there). One stuck in the kernel (D state) outlives it."""
    pids = set(CHILDREN)
    try:
        names = os.listdir("/proc") if scan else ()
    except OSError:
        names = ()
    me = b"%d" % os.getpid()
    for name in names:
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if data[data.rfind(b")"):].split()[2:3] == [me]:  # its parent is this probe
            pids.add(int(name))
    for pid in pids:
        try:
            os.killpg(pid, SIGKILL)  # its group: what it started too
        except OSError:
            try:
                os.kill(pid, SIGKILL)  # not a group leader yet (subprocess, before setsid)
            except OSError:
                pass


# ---------------------------------------------------------------- bounded commands

def run_bounded(argv, timeout_s):
    """Run argv with stdin closed; at the deadline kill its whole process group.

    A hung nvidia-smi (a GPU fallen off the bus, U22) must not hang the poll (U17). A child
    stuck in uninterruptible sleep survives SIGKILL: then we stop waiting and leave it.
    Spawned with os.posix_spawnp (Python 3.8+): importing subprocess (and the selectors,
    threading and signal it pulls in) cost 4 ms, a sixth of every poll's CPU on the box.
    Never past the probe's deadline: a child is stopped a little before it (kill_children
    ends any that the deadline catches running).
    """
    timeout_s = min(timeout_s, time_left() - 0.1)
    if timeout_s <= 0:
        raise ProbeFailure("%s not run: no time left" % argv[0], {"timeout": True})
    if not hasattr(os, "posix_spawnp"):  # Python 3.6, 3.7, PyPy
        popen = globals().get("run_bounded_popen")  # sent where the box said it has none
        if popen is None:
            raise ProbeFailure("%s not run: this python has no os.posix_spawnp; the next poll "
                               "brings what it needs" % argv[0])
        return popen(argv, timeout_s)
    import select

    deadline = time.monotonic() + timeout_s
    out_r, out_w = os.pipe()  # not inheritable: only the dup2'd ends reach the child
    err_r, err_w = os.pipe()
    output = {out_r: bytearray(), err_r: bytearray()}
    try:
        try:
            # SIGPIPE back to its default (13 on every Linux), as subprocess does: python
            # ignores it, and an ignored disposition would pass on to the child
            pid = os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0, setsigdef=(13,),  # novm
                                  file_actions=[
                                      (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),  # novm
                                      (os.POSIX_SPAWN_DUP2, out_w, 1),  # novm
                                      (os.POSIX_SPAWN_DUP2, err_w, 2)])  # novm
        except FileNotFoundError:
            raise ProbeFailure("%s not found on PATH" % argv[0], {"missing": True})
        finally:
            os.close(out_w)
            os.close(err_w)
        CHILDREN.add(pid)
        reading, status = [out_r, err_r], None
        while status is None:
            left = deadline - time.monotonic()
            if reading and left > 0:  # both streams at once: neither pipe fills and blocks it
                for fd in select.select(reading, [], [], left)[0]:
                    data = os.read(fd, 65536)
                    output[fd] += data
                    if not data:
                        reading.remove(fd)
                continue
            status = reaped(pid)  # its output closed, or the time is up: has it ended?
            if status is None:
                if left <= 0:
                    break
                time.sleep(0.002)  # it lingers after closing its output
        if status is None:
            try:
                os.killpg(pid, SIGKILL)
                for _ in range(50):  # up to 0.5 s for it to go; stuck in D state: leave it
                    if reaped(pid) is not None:
                        CHILDREN.discard(pid)  # its pid may be another's from now on
                        break
                    time.sleep(0.01)
            except OSError:
                pass
            raise ProbeFailure("%s timed out after %.1fs and was killed" % (argv[0], timeout_s),
                               {"timeout": True})
        CHILDREN.discard(pid)
    finally:
        os.close(out_r)
        os.close(err_r)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    return (code,) + tuple(output[fd].decode("utf-8", "replace") for fd in (out_r, err_r))


def reaped(pid):
    """A child's wait status once it has ended, None while it runs; 0 where the kernel reaped
    it already (SIGCHLD ignored by whoever started the probe), as subprocess has it."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if done else None


# ================================================================ popen (issue 3)
def run_bounded_popen(argv, timeout_s):
    """run_bounded for Pythons without os.posix_spawnp (3.6, 3.7): sent only to them."""
    import subprocess

    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise ProbeFailure("%s not found on PATH" % argv[0], {"missing": True})
    CHILDREN.add(child.pid)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, SIGKILL)
            child.communicate(timeout=0.5)
            CHILDREN.discard(child.pid)  # reaped: its pid may be another's from now on
        except (OSError, subprocess.TimeoutExpired):
            pass
        raise ProbeFailure("%s timed out after %.1fs and was killed" % (argv[0], timeout_s),
                           {"timeout": True})
    CHILDREN.discard(child.pid)
    return child.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
# ================================================================ end of popen


def load_site():
    """Put the box's site-packages on sys.path, for what lives there (pynvml). The probe runs
    under `python3 -S` (probe_bundle.build_command): site, and with it every installed
    package's .pth file, costs 3 ms of a bare Debian python3's start and tens of ms in a
    well-stocked conda env or pyenv, on every poll; it is loaded only where it is needed."""
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()


# ---------------------------------------------------------------- host

def collect_host():
    stat = read_text(proc_path("stat"))
    btime = [(line[6:].split() or [""])[0] for line in stat.splitlines()
             if line.startswith("btime ")]
    return {
        "hostname": host_name(),
        "boot_id": read_text(proc_path("sys", "kernel", "random", "boot_id")).strip(),
        "uptime_s": float(read_text(proc_path("uptime")).split()[0]),
        "loadavg": [float(x) for x in read_text(proc_path("loadavg")).split()[:3]],
        "time": round(time.time(), 3),
        "btime": int(btime[0]) if btime and btime[0].isdigit() else None,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        "ncpu": os.cpu_count(),  # host cores, not the cgroup quota (U40)
        "python": "%d.%d.%d" % sys.version_info[:3],
        "spawn": hasattr(os, "posix_spawnp"),  # the client sends run_bounded_popen where not
    }


def host_name():
    try:
        return read_text(proc_path("sys", "kernel", "hostname")).strip()
    except OSError:
        import socket  # only here: its import costs 3 ms of every poll's start-up

        return socket.gethostname()


# ---------------------------------------------------------------- cgroup (U9, U40, U41)

def parse_cgroup_file(text):
    """/proc/PID/cgroup → (version, path) of the memory controller's group, or None.

    A hybrid v1 box also lists "0::/"; the v1 memory line is the one that limits it.
    """
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            return 1, parts[2]
        if parts[0] == "0" and parts[1] == "":
            unified = (2, parts[2])
    return unified


def cgroup_dir(base, path):
    """The group's folder; a container sees its own group at the root (its path is the
    host's view), so fall back to the root when the path is absent."""
    full = os.path.join(base, path.lstrip("/"))
    return full if os.path.isdir(full) else base


def read_int_file(path, unlimited=()):
    """An integer file; None when absent or when it holds an 'unlimited' spelling."""
    try:
        text = read_text(path).strip()
    except OSError:
        return None
    if text in unlimited:
        return None
    return int(text)


def read_counters(path):
    """'key value' lines (memory.events, cpu.stat) → {key: int}; {} when absent."""
    try:
        text = read_text(path)
    except OSError:
        return {}
    counters = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            counters[parts[0]] = int(parts[1])
    return counters


def collect_cgroup(processes=None, wanted=None):
    """The probe's own cgroup (the host's view of a container's share), and in "groups" the
    cgroups of the runs' processes and those the request names (run_groups)."""
    found = parse_cgroup_file(read_text(proc_path("self", "cgroup")))
    if found is None:
        raise ProbeFailure("no memory cgroup in %s" % proc_path("self", "cgroup"))
    version, path = found
    root = os.path.join(SYSFS, "fs", "cgroup")
    v1 = globals().get("cgroup_v1")  # sent unless the box said its cgroups are v2
    if version == 1 and v1 is None:
        raise ProbeFailure("cgroup v1 here: the next poll brings its reader")
    info = cgroup_v2(root, path) if version == 2 else v1(root, path)
    info["version"] = version
    info["path"] = path
    groups = globals().get("run_groups")  # sent where a run may be read
    if groups is not None:
        info["groups"] = groups(root, version, path, processes, wanted)
    return info


def cgroup_v2(root, path):
    group = cgroup_dir(root, path)
    cpu_max = None
    try:
        cpu_max = read_text(os.path.join(group, "cpu.max")).split()
    except OSError:
        pass
    return {
        "memory_current_bytes": read_int_file(os.path.join(group, "memory.current")),
        "memory_max_bytes": read_int_file(os.path.join(group, "memory.max"), ("max",)),
        # U41: the oom_kill counter here is authoritative, not host dmesg or free
        "memory_events": read_counters(os.path.join(group, "memory.events")),
        "cpu_quota_us": int(cpu_max[0]) if cpu_max and cpu_max[0] != "max" else None,
        "cpu_period_us": int(cpu_max[1]) if cpu_max and len(cpu_max) > 1 else None,
        "cpu_stat": read_counters(os.path.join(group, "cpu.stat")),
    }


V1_UNLIMITED_BYTES = 1 << 60  # v1 spells "no limit" as PAGE_COUNTER_MAX pages in bytes


# ================================================================ cgroup v1 (issue 3)
def cgroup_v1(root, path):
    memory = cgroup_dir(os.path.join(root, "memory"), path)
    cpu = cgroup_dir(os.path.join(root, "cpu"), path)
    limit = read_int_file(os.path.join(memory, "memory.limit_in_bytes"))
    quota = read_int_file(os.path.join(cpu, "cpu.cfs_quota_us"), ("-1",))
    oom = read_counters(os.path.join(memory, "memory.oom_control"))
    stat = read_counters(os.path.join(cpu, "cpu.stat"))
    if "throttled_time" in stat:  # v1 counts nanoseconds; v2's throttled_usec is the shared name
        stat["throttled_usec"] = stat.pop("throttled_time") // 1000
    return {
        "memory_current_bytes": read_int_file(os.path.join(memory, "memory.usage_in_bytes")),
        "memory_max_bytes": limit if limit is not None and limit < V1_UNLIMITED_BYTES else None,
        "memory_events": {"oom_kill": oom["oom_kill"]} if "oom_kill" in oom else {},
        "cpu_quota_us": quota,
        "cpu_period_us": read_int_file(os.path.join(cpu, "cpu.cfs_period_us")),
        "cpu_stat": stat,
    }
# ================================================================ end of cgroup v1


# ---------------------------------------------------------------- logind (seed 000)

SYSTEMD_BOOLEANS = {"1": True, "yes": True, "y": True, "true": True, "t": True, "on": True,
                    "0": False, "no": False, "n": False, "false": False, "f": False, "off": False}


def collect_logind():
    """KillUserProcesses=yes kills even tmux when the SSH session ends (seed 000).
    Drop-ins override the main file, later names win; None when nothing sets it."""
    base = os.path.join(ETC, "systemd")
    drop_ins = os.path.join(base, "logind.conf.d")
    try:
        names = sorted(n for n in os.listdir(drop_ins) if n.endswith(".conf"))
    except OSError:
        names = []
    paths = [os.path.join(base, "logind.conf")] + [os.path.join(drop_ins, n) for n in names]
    value, source = None, None
    for path in paths:
        try:
            setting = ini_value(read_text(path), "Login", "KillUserProcesses")
        except OSError:
            continue
        if setting is not None:
            value, source = SYSTEMD_BOOLEANS.get(setting.lower()), path
    return {"kill_user_processes": value, "source": source}


def ini_value(text, section, key):
    current, value = None, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line:
            name, _, setting = line.partition("=")
            if name.strip() == key:
                value = setting.strip()
    return value


# ---------------------------------------------------------------- nvidia-smi

REASON_FAMILIES = {"event": "clocks_event_reasons", "throttle": "clocks_throttle_reasons"}
# power.draw and enforced.power.limit are in every capture, from driver 465 to 610;
# power.draw.instant/average exist only on newer drivers.
SMI_GPU_QUERY = ("index", "uuid", "name", "utilization.gpu", "memory.used", "memory.total",
                 "clocks.sm", "clocks.max.sm", "power.draw", "enforced.power.limit",
                 "temperature.gpu", "{reasons}.active", "mig.mode.current", "pci.bus_id",
                 "persistence_mode")
# The header spells it used_gpu_memory (used_memory is an accepted alias).
SMI_APP_QUERY = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
# Canonical names: headers print the long forms, old drivers the throttle family.
SMI_ALIASES = {"clocks.current.sm": "clocks.sm", "used_memory": "used_gpu_memory"}
NA_VALUES = ("", "N/A", "ERR!", "Unknown Error", "Not Supported")
DIGITS = frozenset("0123456789")
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
NAME_CHARS = LETTERS | DIGITS | frozenset("_.")


def canonical_field(header):
    """'memory.used [MiB]' → 'memory.used'; old reason names → the new family."""
    name = header.split(" [", 1)[0].strip()
    name = SMI_ALIASES.get(name, name)
    return name.replace("clocks_throttle_reasons.", "clocks_event_reasons.")


def smi_value(raw):
    """'[N/A]', '[Not Supported]', 'N/A', '[Unknown Error]', 'ERR!' and friends → None."""
    value = raw.strip()
    if value in NA_VALUES or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def smi_number(raw):
    """'81559 MiB', '631.95 W', '100 %', '59' → number (units on or off); else None."""
    value = smi_value(raw) if raw is not None else None
    if not value:
        return None
    end = len(value)  # -?digits(.digits)?, then spaces and a unit of letters or %, or not
    while end and (value[end - 1] in LETTERS or value[end - 1] == "%"):
        end -= 1
    text = value[:end].rstrip()
    whole, dot, fraction = text.partition(".")
    digits = whole[1:] if whole.startswith("-") else whole
    if not digits.isdecimal() or (dot and not fraction.isdecimal()):  # isdecimal: re's \d
        return None
    if len(digits) > 15:  # no reading has that many (the client reads none past 2**53)
        return None
    return float(text) if dot else int(text)


def is_field_name(cell):
    """A header cell of nvidia-smi's CSV: 'index', 'memory.used [MiB]'."""
    name, bracket, unit = cell.partition(" [")
    if bracket and (not unit.endswith("]") or "]" in unit[:-1]):
        return False
    return bool(name) and name[0] not in DIGITS and name[0] != "." and \
        NAME_CHARS.issuperset(name)


def parse_smi_csv(text, fields=None):
    """nvidia-smi --format=csv output → list of {canonical field: raw value}.

    nvidia-smi does not quote, so the last column (a process name) may hold commas: split
    at most len(fields)-1 times. A header line, when present, names the fields.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and all(is_field_name(cell.strip()) for cell in lines[0].split(",")):
        fields = [cell.strip() for cell in lines.pop(0).split(",")]
    if fields is None:
        return []
    names = [canonical_field(f) for f in fields]
    rows = []
    for line in lines:
        cells = line.split(",", len(names) - 1)
        if len(cells) == len(names):
            rows.append(dict(zip(names, (cell.strip() for cell in cells))))
    return rows


def decode_reasons(row):
    """Active clock event reasons, from the bitmask or else the per-reason columns."""
    mask = smi_value(row.get("clocks_event_reasons.active", ""))
    if mask is not None:
        try:
            bits = int(mask, 16)
        except ValueError:
            bits = None
        if bits is not None:
            return [name for bit, name in REASON_BITS if bits & bit]
    named = [name for _, name in REASON_BITS if "clocks_event_reasons." + name in row]
    if not named:
        return None
    return [name for name in named if row["clocks_event_reasons." + name] == "Active"]


def first_number(row, *names):
    for name in names:
        value = smi_number(row.get(name))
        if value is not None:
            return value
    return None


def mig_mode(raw):
    """'Enabled' / 'Disabled' (MIG, persistence mode) → bool; N/A → None."""
    value = smi_value(raw or "")
    return None if value is None else value == "Enabled"


def gpu_row(row):
    """One nvidia-smi row (any driver, units or not) → a GPU_FIELDS row."""
    return [
        smi_number(row.get("index")),
        smi_value(row.get("uuid", "")),
        smi_value(row.get("name", "")),
        first_number(row, "utilization.gpu"),  # [N/A] under MIG
        first_number(row, "memory.used"),
        first_number(row, "memory.total"),
        first_number(row, "clocks.sm"),
        first_number(row, "clocks.max.sm"),
        first_number(row, "power.draw", "power.draw.average", "power.draw.instant"),
        first_number(row, "enforced.power.limit", "power.limit"),
        first_number(row, "temperature.gpu"),
        decode_reasons(row),
        mig_mode(row.get("mig.mode.current")),
        smi_value(row.get("pci.bus_id", "")),  # U22: what an Xid line names the GPU by
        mig_mode(row.get("persistence_mode")),  # off: every query re-initialises the GPUs
    ]


def app_row(row):
    return [smi_value(row.get("gpu_uuid", "")), smi_number(row.get("pid")),
            smi_number(row.get("used_gpu_memory")), smi_value(row.get("process_name", ""))]


def is_invalid_field_error(text):
    # e.g. 'Field "clocks_event_reasons.active" is not a valid field to query.'
    return "not a valid field" in text.lower()


def smi_gpus(hint, deadline):
    """Query GPUs, trying the newer reason family first unless the client says otherwise
    (it echoes back the family that worked last poll, so old drivers pay one call)."""
    families = ["event", "throttle"]
    if hint == "throttle":
        families.reverse()
    for family in families:
        query = [f.format(reasons=REASON_FAMILIES[family]) for f in SMI_GPU_QUERY]
        code, out, err = run_bounded(
            ["nvidia-smi", "--query-gpu=" + ",".join(query), "--format=csv,noheader,nounits"],
            deadline - time.monotonic())
        lost = lost_gpu_lines(out + "\n" + err)
        if code == 0 or lost:
            devices = [gpu_row(row) for row in parse_smi_csv(out, query)]
            if devices or code == 0:  # the GPUs that answered stand beside the lost ones
                return family, devices, lost
        if not is_invalid_field_error(out + err):
            said = first_line(out + "\n" + err)
            raise ProbeFailure("nvidia-smi exited %d: %s" % (code, said),
                               {"exit": code, "said": said, "lost": lost})
    raise ProbeFailure("nvidia-smi knows neither clocks_event_reasons nor clocks_throttle_reasons")


def lost_gpu_lines(text):
    """U22: what nvidia-smi prints for a GPU that fell off the bus (Xid 79) instead of its
    row, e.g. 'Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error';
    the GPUs that still answer print their rows as usual."""
    return [line.strip()[:200] for line in text.splitlines()
            if "device handle for gpu" in line.lower() or "gpu is lost" in line.lower()][:64]


def has_nvidia_nodes():
    """Whether the box has NVIDIA device nodes (/dev/nvidia0, /dev/nvidiactl): a box whose GPU
    tools fail is told apart from a box that has no NVIDIA GPU at all."""
    try:
        # /dev/nvidiaN, one per GPU the driver found; nvidiactl alone is a driver, no GPU
        return any(name.startswith("nvidia") and name[6:].isdigit()
                   for name in os.listdir(DEVFS))
    except OSError:
        return None


def smi_apps(deadline):
    code, out, err = run_bounded(
        ["nvidia-smi", "--query-compute-apps=" + ",".join(SMI_APP_QUERY),
         "--format=csv,noheader,nounits"], deadline - time.monotonic())
    if code != 0 and not lost_gpu_lines(out + "\n" + err):  # a lost GPU's line: the rest stand
        raise ProbeFailure("nvidia-smi compute-apps exited %d: %s" % (code, first_line(out + err)))
    return [app_row(row) for row in parse_smi_csv(out, SMI_APP_QUERY)]


def collect_gpus_smi(hint, deadline):
    family, devices, lost = smi_gpus(hint, deadline)
    section = {"source": "nvidia-smi", "reasons": family, "devices": table(GPU_FIELDS, devices)}
    if lost:
        section["lost"] = lost
    try:
        section["apps"] = table(APP_FIELDS, smi_apps(deadline))
    except ProbeFailure as exc:  # the GPU table stands without the process list
        section["apps_error"] = describe(exc)
    return section


# ---------------------------------------------------------------- NVML

# ================================================================ nvml (issue 3)
def import_pynvml_from(home):
    """import pynvml → (module, the sys.path folder it came from). `home`: the folder this
    box's python found it in last poll (the client carries it back): only that folder goes on
    sys.path, after the stdlib, instead of site.main() with every installed package's .pth
    file: 49.5 ms of a 133.9 ms NVML poll on a real H100 box's torch venv (tests/device/
    probe_cost.py). Where it is not there any more, site as before."""
    fast = isinstance(home, str) and os.path.isabs(home) and "site" not in sys.modules and (
        os.path.isfile(os.path.join(home, "pynvml.py"))
        or os.path.isfile(os.path.join(home, "pynvml", "__init__.py")))
    if fast:
        sys.path.append(home)
    else:
        load_site()
    try:
        import pynvml
    except ImportError:
        if not fast:
            raise
        sys.path.remove(home)
        return import_pynvml_from(None)
    path = os.path.abspath(getattr(pynvml, "__file__", None) or "")
    folder = os.path.dirname(path)  # a package's parent folder
    return pynvml, os.path.dirname(folder) if os.path.basename(path).startswith("__init__.") \
        else folder


def call_with_deadline(fn, timeout_s):
    """Run fn in a daemon thread: an in-process NVML call into a hung driver cannot be
    interrupted, so we stop waiting for it instead (the probe exits with os._exit)."""
    import threading  # only here: NVML boxes

    box = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as exc:  # handed to the caller below
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ProbeFailure("NVML did not answer within %.1fs" % timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]


def collect_gpus_nvml(nvml):
    """Same shape as the nvidia-smi path; every call guarded (NotSupported → None)."""
    def ask(fn, *args):
        try:
            return fn(*args)
        except nvml.NVMLError:
            return None

    def text(value):
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    def scaled(value, divisor):
        return None if value is None else round(value / divisor, 2)

    def memory_info(handle):
        # v1's `used` counts the driver's reserve (480 MiB on an idle H100, driver 580, where
        # nvidia-smi says 0 MiB used): v2, where pynvml and the driver have it, matches
        # nvidia-smi, and an idle GPU does not read as somebody's leftover context (U11).
        if v2 is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except (nvml.NVMLError, TypeError):  # old driver: no _v2; old pynvml: no version
                pass
        return ask(nvml.nvmlDeviceGetMemoryInfo, handle)

    v2 = getattr(nvml, "nvmlMemory_v2", None)
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    pci_fn = getattr(nvml, "nvmlDeviceGetPciInfo", None)
    persistence_fn = getattr(nvml, "nvmlDeviceGetPersistenceMode", None)
    nvml.nvmlInit()
    try:
        devices, apps = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(ask(nvml.nvmlDeviceGetUUID, handle))
            util = ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = memory_info(handle)
            mask = ask(reasons_fn, handle)
            mig = ask(nvml.nvmlDeviceGetMigMode, handle)
            pci = ask(pci_fn, handle) if pci_fn is not None else None
            persistence = ask(persistence_fn, handle) if persistence_fn is not None else None
            devices.append([
                index, uuid, text(ask(nvml.nvmlDeviceGetName, handle)),
                util.gpu if util is not None else None,
                memory.used >> 20 if memory is not None else None,  # bytes → MiB
                memory.total >> 20 if memory is not None else None,
                ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                ask(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
                scaled(ask(nvml.nvmlDeviceGetPowerUsage, handle), 1000),  # mW → W
                scaled(ask(nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1000),
                ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                None if mask is None else [name for bit, name in REASON_BITS if mask & bit],
                None if mig is None else mig[0] == nvml.NVML_DEVICE_MIG_ENABLE,
                None if pci is None else text(getattr(pci, "busId", None)),
                None if persistence is None else persistence == 1,  # NVML_FEATURE_ENABLED
            ])
            for app in ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                name = ask(nvml.nvmlSystemGetProcessName, app.pid)
                used = app.usedGpuMemory  # None where the driver cannot say (WDDM, MIG)
                apps.append([uuid, app.pid, None if used is None else used >> 20, text(name)])
        return {"source": "nvml", "devices": table(GPU_FIELDS, devices),
                "apps": table(APP_FIELDS, apps)}
    finally:
        ask(nvml.nvmlShutdown)
# ================================================================ end of nvml


def collect_gpus(request):
    timeout_s = number_setting(request, "nvidia_smi_timeout_s", DEFAULT_NVIDIA_SMI_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    nvml_problem, importable, checked, home = None, False, True, None
    if SIM_DIR:
        nvml_problem = "simulated box: GPUs come from the stand-in nvidia-smi"
    elif not want(request, "nvml"):  # the client asks again now and then (collect.py)
        checked = False
    else:
        nvml_import = globals().get("import_pynvml_from")  # with the NVML reader
        try:
            if nvml_import is not None:
                pynvml, home = nvml_import(request.get("pynvml_dir"))
            else:
                load_site()
                import pynvml
        except ImportError:
            nvml_problem = "pynvml not importable"
        else:
            importable = True
            reader = globals().get("collect_gpus_nvml")  # sent only where pynvml imports
            if reader is None:
                nvml_problem = "pynvml imports now: NVML is read from the next poll on"
            else:
                try:
                    asked = time.monotonic()
                    section = call_with_deadline(lambda: reader(pynvml), timeout_s)
                    section["pynvml"], section["pynvml_dir"] = True, home
                    section["query_s"] = round(time.monotonic() - asked, 3)
                    return section
                except Exception as exc:  # no driver library, no GPU, hung: try nvidia-smi
                    nvml_problem = describe(exc)
    started = time.monotonic()
    try:
        section = collect_gpus_smi(request.get("nvidia_smi_reasons"), deadline)
    except ProbeFailure as exc:  # said loudly by the client: a wedged driver is not "no GPU"
        exc.detail["query_s"] = round(time.monotonic() - started, 3)
        exc.detail["devices"] = has_nvidia_nodes()
        if nvml_problem and importable:
            exc.detail["nvml"] = nvml_problem
        raise
    section["query_s"] = round(time.monotonic() - started, 3)  # slow: persistence mode off?
    if checked:  # the client sends the NVML part only where it imports
        section["pynvml"] = importable
    if home:
        section["pynvml_dir"] = home
    if nvml_problem:
        section["nvml"] = nvml_problem
    return section


# ---------------------------------------------------------------- processes

def parse_stat(data):
    """/proc/PID/stat → dict. comm may hold spaces and ')' — split on the LAST ')'."""
    left, right = data.index("("), data.rindex(")")
    rest = data[right + 2:].split()
    return {
        "pid": int(data[:left]), "comm": data[left + 1:right], "state": rest[0],
        "ppid": int(rest[1]), "pgrp": int(rest[2]), "session": int(rest[3]),
        "tty_nr": int(rest[4]), "flags": int(rest[6]), "threads": int(rest[17]),
        "start_ticks": int(rest[19]),
    }


SCRIPT_SUFFIXES = (".py", ".sh", ".bash")


def run_script(pid, cwd):
    """U2, U42: the script a run process executes and its mtime (to compare with the start
    time): the first argument that names a .py/.sh file. (None, None) when there is none."""
    for arg in read_argv(pid)[1:]:
        if arg.startswith("-") or not arg.endswith(SCRIPT_SUFFIXES):
            continue
        path = arg if os.path.isabs(arg) or not cwd else os.path.join(cwd, arg)
        try:
            return path, os.stat(path).st_mtime
        except OSError:
            return path, None
    return None, None


def nvidia_devices(pid, cap):
    """Minor numbers of the /dev/nvidiaN a process holds open (U11: the holders nvidia-smi
    may not show). None when its fds are unreadable; 'skipped' above the fd cap."""
    fd_dir = proc_path(pid, "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    if len(names) > cap:
        return "skipped"
    minors, fd_dir = set(), fd_dir + "/"
    for name in names:
        try:
            target = os.readlink(fd_dir + name)
        except OSError:
            continue
        if target.startswith("/dev/nvidia") and target[11:].isdigit():
            minors.add(int(target[11:]))
    return sorted(minors)


def scan_table():
    """Every live user-space process's stat; kernel threads are only counted.
    A process that vanishes mid-scan is skipped silently."""
    procs, kernel_threads = {}, 0
    for name in os.listdir(PROCFS):
        if not name.isdigit():
            continue
        try:
            stat = parse_stat(read_text(proc_path(name, "stat")))
        except (OSError, ValueError, IndexError):
            continue
        if stat["flags"] & PF_KTHREAD:
            kernel_threads += 1
        else:
            procs[stat["pid"]] = stat
    return procs, kernel_threads


def read_argv(pid):
    """/proc/PID/cmdline as its words; [] for a zombie or a process gone."""
    try:
        with open(proc_path(pid, "cmdline"), "rb") as f:
            raw = f.read().rstrip(b"\0")
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0")] if raw else []


def argv_match(argv, words):
    """The arguments of argv where the words of a run's `process` stand in a row, each the
    word or ending in "/" + it ("train.py" matches "train.py", "./train.py", "/w/train.py";
    never "pretrain.py" nor "--out=train.py"), or None. One argument only: a title rewritten
    in place (setproctitle), read word by word. actions_box.argv_match: the same rule."""
    if len(argv) == 1:
        argv = argv[0].split()
    n = len(words)
    for i in range(len(argv) - n + 1):
        if all(a == w or a.endswith("/" + w) for a, w in zip(argv[i:i + n], words)):
            return argv[i:i + n]
    return None


def in_folder(pid, args, roots):
    """A structural run's second test: the process's cwd is in the run's folder (one of
    roots, each ending in /), or a matching argument names a file there (`python
    /w/train.py` started elsewhere). Another user's cwd is unreadable without root: then
    only an absolute argument can place it."""
    cwd = read_link(proc_path(pid, "cwd"))
    for path in [cwd] + [os.path.join(cwd or "/", a) for a in args
                         if "/" in a and (cwd or a[0] == "/")]:
        if path and any((os.path.normpath(path) + "/").startswith(r) for r in roots):
            return True
    return False


def match_runs(procs, runs):
    """pid → the run it belongs to. A run with a `workdir` is structural: its processes are
    those whose arguments match its `process` (argv_match) in its folder (in_folder; the
    folder as written, ~ expanded, and with its symlinks resolved, as /proc shows a cwd),
    and all their live descendants (ranks under a launcher, dataloader workers), whatever
    their command lines: another folder's or another user's `train.py` is not it. A run
    without one is loose, as before: the same match on the words of the whole command line
    (an argument with spaces too), in any folder, of any user, without descendants
    (`gpuwatch check` says so). A process matched directly goes to the first run of the
    request that matches it, before any run claims it as a descendant; a descendant of two
    runs' processes (one run's launcher starting another's) goes to the first seen."""
    patterns = {}
    for r in runs:
        if isinstance(r, dict) and isinstance(r.get("name"), str) \
                and isinstance(r.get("process"), str) and r["process"].strip():
            root = r.get("workdir")
            if isinstance(root, str) and root.strip():
                root = os.path.abspath(os.path.expanduser(root))
                root = [os.path.join(p, "") for p in (root, os.path.realpath(root))]
            patterns[r["name"]] = (r["process"].split(), root if isinstance(root, list) else 0)
    matched = {}
    for pid in procs if patterns else ():
        argv = read_argv(str(pid))
        for name, (words, roots) in patterns.items() if argv else ():
            args = argv_match(argv if roots else " ".join(argv).split(), words)
            if args and (not roots or in_folder(str(pid), args, roots)):
                matched[pid] = name
                break
    children = children_of(procs)
    for pid, name in list(matched.items()):
        for member in subtree(pid, children) if patterns[name][1] else ():
            if procs[member]["state"] not in ("Z", "X"):
                matched.setdefault(member, name)
    return matched


def related(procs, seeds):
    """Ancestors (SIGHUP risk is read from the parent chain) and descendants (dataloader
    workers) of the seed processes, ancestors first."""
    children = children_of(procs)
    ancestors, descendants = [], []
    for pid in seeds:
        parent = procs[pid]["ppid"]
        while parent in procs and parent not in ancestors and parent not in seeds:
            ancestors.append(parent)
            parent = procs[parent]["ppid"]
    stack = list(seeds)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seeds and child not in descendants:
                descendants.append(child)
                stack.append(child)
    return ancestors, descendants


def status_fields(pid):
    fields = {}
    for line in read_text(proc_path(pid, "status")).splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "SigIgn", "SigCgt"):
            fields[key] = value.split()[0]
    return fields


def read_link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def children_of(procs):
    children = {}
    for pid, stat in procs.items():
        children.setdefault(stat["ppid"], []).append(pid)
    return children


def subtree(root, children):
    """A process and all its descendants."""
    members, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    return members


def process_row(stat, users, limits, devices, run):
    pid = str(stat["pid"])
    status = status_fields(pid)
    uid = int(status.get("Uid", "-1"))
    if uid not in users:
        try:
            users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            users[uid] = str(uid)
    try:
        cgroup = parse_cgroup_file(read_text(proc_path(pid, "cgroup")))
    except OSError:
        cgroup = None
    cmd = " ".join(read_argv(pid)) or "[%s]" % stat["comm"]  # zombies have no command line
    sighup = 1  # bit of signal 1 in the SigIgn/SigCgt masks (seed 000: nohup sets SigIgn)
    cwd = read_link(proc_path(pid, "cwd"))
    return [
        stat["pid"], stat["ppid"], users[uid], stat["state"], stat["comm"],
        cmd[:limits["cmd_chars"]], stat["start_ticks"], stat["tty_nr"], stat["session"],
        stat["pgrp"], bool(int(status.get("SigIgn", "0"), 16) & sighup),
        bool(int(status.get("SigCgt", "0"), 16) & sighup), stat["threads"],
        cgroup[1] if cgroup else None, cwd,
        read_link(proc_path(pid, "exe")), devices if isinstance(devices, list) else None, run,
    ]


ELASTIC_MARK = b"TORCHELASTIC_RUN_ID="


def environ_has(pid, mark):
    """Whether /proc/PID/environ (read up to 1 MiB) holds the variable `mark` (b"NAME=")."""
    try:
        with open(proc_path(pid, "environ"), "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return False
    return data.startswith(mark) or (b"\0" + mark) in data


def collect_processes(request, limits, gpu_pids, found):
    procs, kernel_threads = scan_table()
    runs = request.get("runs")
    matched = found["matched"] = match_runs(procs, runs if isinstance(runs, list) else [])
    devices, fd_unreadable, fd_skipped = {}, 0, []
    for pid in procs:
        held = nvidia_devices(str(pid), limits["fds_per_proc"])
        if held is None:
            fd_unreadable += 1
        elif held == "skipped":
            fd_skipped.append(pid)
        devices[pid] = held
    holders = [pid for pid in procs if isinstance(devices[pid], list) and devices[pid]]
    holders += [pid for pid in gpu_pids if pid in procs and pid not in holders]
    if want(request, "discover"):  # issue 8: GPU holders grouped into runs (discover.py)
        found["discovery"] = discovery_state(procs, holders, matched, request)
    seeds = holders + [pid for pid in matched if pid not in holders]
    ancestors, descendants = related(procs, seeds)
    zombies = [pid for pid, stat in procs.items() if stat["state"] == "Z"]
    servers = [pid for pid, stat in procs.items() if stat["comm"].startswith(DETACH_SERVERS)]
    chosen = []
    for pid in seeds + ancestors + zombies + servers + descendants:  # most telling first
        if pid not in chosen:
            chosen.append(pid)
    users, rows, scripts = {}, [], {}
    for pid in chosen[:limits["procs"]]:
        try:
            row = process_row(procs[pid], users, limits, devices[pid], matched.get(pid))
        except (OSError, ValueError):
            continue  # vanished between the scan and the details
        rows.append(row)
        if pid in matched:  # U2, U42: a run's script and its mtime, against its start time
            script, mtime = run_script(str(pid), row[PROC_FIELDS.index("cwd")])
            if script is not None and mtime is not None:  # {script: [mtime, pid, ...]}
                scripts.setdefault(script, [mtime]).append(pid)
    # U11: torchrun starts each rank in a session of its own (torch 2.11, tests/captures): a
    # rank its dead torchrun left behind looks like a `setsid nohup` run but for its
    # environment. Read only for the session leaders that hold a GPU.
    elastic = [pid for pid in holders if procs[pid]["session"] == pid
               and environ_has(str(pid), ELASTIC_MARK)]
    return {
        "procs": table(PROC_FIELDS, rows),
        "scripts": scripts,
        "elastic": elastic,
        "total": len(procs) + kernel_threads,
        "kernel_threads": kernel_threads,
        "zombies": len(zombies),
        "not_listed": len(procs) - len(rows),
        "fd_unreadable": fd_unreadable,
        "fd_skipped": fd_skipped,
        "euid": os.geteuid(),  # whom the probe runs as: root can signal anyone's processes
    }


# ---------------------------------------------------------------- disks (U6, U7)

def unescape_mount(field):
    """/proc/mounts escapes space, tab, newline and backslash as octal."""
    if "\\" not in field:
        return field
    return rx(r"\\([0-7]{3})").sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_points():
    for name in (("self", "mounts"), ("mounts",)):
        try:
            text = read_text(proc_path(*name))
        except OSError:
            continue
        points = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#"):
                points.append(unescape_mount(parts[1]))
        return points
    return []


def mount_of(path, points):
    """The longest mount point that is a prefix of path."""
    best = None
    for point in points:
        prefix = point.rstrip("/") + "/"
        # >=: a later mount on the same point shadows the earlier one
        if (path == point or path.startswith(prefix)) and (best is None or len(point) >= len(best)):
            best = point
    return best


SIM_DISK_KEYS = ("bytes_total", "bytes_free", "inodes_total", "inodes_free")


def simulated_disks():
    """Only for gpuwatch's simulator, never on a real box: $GPUWATCH_SIM_DIR/statvfs.json maps
    a configured disk path to {"bytes_total", "bytes_free", "inodes_total", "inodes_free"},
    which replace statvfs for that path (the demo's disk filling toward full: a simulator
    cannot shrink a real filesystem). {} when unset, missing or unreadable."""
    if not SIM_DIR:
        return {}
    try:
        data = json_loads(read_text(os.path.join(SIM_DIR, "statvfs.json")))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def collect_disks(paths):
    points = mount_points()
    simulated = simulated_disks()
    disks = []
    for path in paths:
        if not isinstance(path, str):
            continue
        real = os.path.realpath(os.path.expanduser(path))
        fake = simulated.get(path)
        if isinstance(fake, dict):  # a filesystem of its own: its mount is itself
            mount = fake.get("mount")
            disk = {"path": path, "mount": mount if isinstance(mount, str) else path}
            for key in SIM_DISK_KEYS:
                value = fake.get(key)
                disk[key] = value if isinstance(value, int) and not isinstance(value, bool) \
                    else None
            disks.append(disk)
            continue
        try:
            st = os.statvfs(real)
        except OSError as exc:
            disks.append({"path": path, "error": describe(exc)})
            continue
        disks.append({
            "path": path, "mount": mount_of(real, points),
            "bytes_total": st.f_blocks * st.f_frsize,
            "bytes_free": st.f_bavail * st.f_frsize,  # what a non-root writer can still use
            "inodes_total": st.f_files or None,  # 0: the filesystem does not count inodes
            "inodes_free": st.f_favail if st.f_files else None,
        })
    return disks


# ---------------------------------------------------------------- kernel log (U3, U9, U22)

RAW_KERNEL_LINES = 2000
"""Without the parser, at most this many of the newest candidate lines go as they are (a box
whose kernel log was clean at the last poll and has more now is in an Xid storm: its Xid
counts then cover only these lines for that one poll; the client marks them partial, so the
next poll's full counts do not report the same codes again)."""


def kernel_candidate(line):
    """A line that may be an NVIDIA Xid, an OOM kill or a memory cgroup's part of an OOM report
    (its limit, and on old kernels its path: what parse_kernel_log looks at)."""
    return ("Xid" in line or "ut of memory" in line or "oom-kill" in line
            or "memory: usage" in line or "as a result of limit of" in line)


def collect_kernel(limits):
    """The kernel log's Xid and OOM lines, parsed (parse_kernel_log). The parser is sent only
    where the last poll saw such lines (issue 3: most boxes have none, and it is an eighth of
    the probe); a box that has some now without it sends them as they are ("raw", the newest
    RAW_KERNEL_LINES of "raw_total") and the client parses them with the same code."""
    code, out, err = run_bounded(["dmesg"], limits["dmesg_timeout_s"])
    if code != 0:  # kernel.dmesg_restrict=1 for a non-root user is common
        raise ProbeFailure("dmesg not readable: %s" % first_line(err + "\n" + out))
    lines = [line for line in out.splitlines() if kernel_candidate(line)]
    parse = globals().get("parse_kernel_log")
    if parse is not None:
        section = parse(lines, limits["kernel_events"], limits["msg_chars"])
    else:
        section = {"xid": table(XID_FIELDS, []), "oom": table(OOM_FIELDS, []), "xid_counts": {}}
        if lines:
            section.update(raw=lines[-RAW_KERNEL_LINES:], raw_total=len(lines))
    section["candidates"] = len(lines)
    return section


# ================================================================ kernel (issue 3)
TS_MONO = r"^\[\s*(\d+\.\d+)\]\s?(.*)$"  # dmesg: [  123.456789] msg
TS_CTIME = r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\s?(.*)$"  # dmesg -T
TS_ISO = (  # dmesg --time-format iso (maybe after -x "kern  :warn  : "), journalctl
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?"
    r"(Z|[+-]\d\d:?\d\d)?\s+(.*)$")
TS_KMSG = r"^\d+,\d+,(\d+),[^;]*;(.*)$"  # /dev/kmsg: prio,seq,usec,flags;msg
JOURNAL_PREFIX = r"^\S+ kernel: "

XID = r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$"
XID_PID = r"^pid=(?:'<unknown>'|(\d+)),\s*name=([^,]*),\s*(.*)$"
OOM_KILL = (
    r"(Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Kill(?:ed)? process (\d+)"
    r"(?:, UID \d+,)? \(([^)]*)\)")
# mm/oom_kill.c: "oom-kill:constraint=%s,nodemask=%*pbl" then, in an order that changed across
# kernels, ",cpuset=…,mems_allowed=…", ",oom_memcg=PATH" (or ",global_oom"), ",task_memcg=PATH",
# and ",task=%s,pid=%d,uid=%d" (4.19 printed pid=%5d: padded with spaces)
OOM_CONSTRAINT = r"oom-kill:constraint=(\w+)(?:.*?,task=([^,]*),pid=\s*(\d+))?"
OOM_MEMCG = r",oom_memcg=(.*?)(?=,task_memcg=|,cpuset=|,task=|$)"
# mm/memcontrol.c, memory cgroup OOMs only, before the kill: "memory: usage %llukB, limit
# %llukB, failcnt %lu"; kernels before 4.19 first "Task in PATH killed as a result of limit of
# PATH" (the second path: the cgroup whose limit was hit)
MEMCG_REPORT = (r"^(?:Task in .* killed as a result of limit of (.*)|"
                r"memory: usage \d+kB, limit (\d+)kB)")
OOM_REPORT_S = 10.0
"""The lines of one OOM report are printed within this many seconds of each other: a cgroup
path or limit older than that belongs to another report (one whose kill line was lost)."""
CGROUP_CHARS = 1024  # a Kubernetes pod's cgroup path is ~250 characters

def split_timestamp(line):
    """A kernel log line → (seconds since boot or None, epoch or None, message)."""
    match = rx(TS_MONO).match(line)
    if match:
        return float(match.group(1)), None, match.group(2)
    match = rx(TS_CTIME).match(line)
    if match:
        return None, time.mktime(time.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")), \
            match.group(2)
    match = rx(TS_ISO).match(line)
    if match:
        import calendar  # only here: it drags in locale and datetime, 4 ms of start-up

        stamp, fraction, zone, message = match.groups()
        epoch = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
        if fraction:
            epoch += float("0." + fraction)
        if zone and zone != "Z":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            epoch -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return None, epoch, rx(JOURNAL_PREFIX).sub("", message)
    match = rx(TS_KMSG).match(line)
    if match:
        return int(match.group(1)) / 1e6, None, match.group(2)
    return None, None, line


def small_int(digits):
    """A pid's digits as an int; None for none or for more than a pid has (int() of thousands
    of digits raises, and the client reads no int beyond int64)."""
    return int(digits) if digits and len(digits) <= 12 else None


def parse_kernel_log(lines, keep, msg_chars):
    """NVIDIA Xid lines and OOM kills, the last `keep` of each, plus Xid counts.

    An Xid names the process it hit where the driver knows it (an MMU fault, Xid 31, does:
    'pid=12083, name=chrome'); the row keeps that pid and name, so the client blames that
    process and not every run on the GPU. One OOM kill can log up to three lines
    ('oom-kill:constraint=…,task=,pid=', 'Out of memory: Killed process PID (name)', old
    kernels' 'Kill process … or sacrifice child'); lines naming the pid of the kill just seen
    merge into it. A memory-cgroup kill (U9, U41) says CONSTRAINT_MEMCG or 'Memory cgroup out
    of memory', and its report names the cgroup whose limit was hit (oom_memcg=, or old
    kernels' 'Task in … killed as a result of limit of …') and that limit ('memory: usage …,
    limit …'): the row carries both. Box text in, never an exception out.
    """
    xids, ooms, counts = [], [], {}
    report = {}  # what the lines before a kill said of it: memcg, cgroup, limit, their time
    for line in lines:
        if kernel_candidate(line):
            try:  # 4096: more than the kernel prints in one record (1024, 2048 since 6.1)
                report = kernel_line(line[:4096].rstrip("\n"), msg_chars, xids, ooms, counts,
                                     report)
            except (ValueError, OverflowError):  # a stamp no clock takes, a number int refuses
                pass
    return {"xid": table(XID_FIELDS, xids[-keep:]), "oom": table(OOM_FIELDS, ooms[-keep:]),
            "xid_counts": counts}


def kernel_line(line, msg_chars, xids, ooms, counts, report):
    """One candidate line into the Xid or the OOM rows; returns what the OOM report being read
    says so far (a kill's row takes it; a line naming the last kill's pid merges into it)."""
    mono, epoch, message = split_timestamp(line)
    mono = mono if mono is not None and -2.0 ** 53 < mono < 2.0 ** 53 else None  # inf, nan
    epoch = epoch if epoch is not None and -2.0 ** 53 < epoch < 2.0 ** 53 else None
    match = rx(XID).search(message)
    if match and len(match.group(2)) <= 9:  # Xid codes are small; int() may refuse more
        pci, code, rest = match.group(1), int(match.group(2)), match.group(3)
        detail = rx(XID_PID).match(rest)
        pid = small_int(detail.group(1)) if detail else None
        name = detail.group(2) if detail and detail.group(2) != "<unknown>" else None
        text = detail.group(3) if detail else rest
        counts[str(code)] = counts.get(str(code), 0) + 1
        xids.append([mono, epoch, pci, code, pid, name, text[:msg_chars]])
        return report
    stamp = mono if mono is not None else epoch
    then = report.get("at")
    if stamp is not None and then is not None and abs(stamp - then) > OOM_REPORT_S:
        report = {}
    match = rx(MEMCG_REPORT).match(message)
    if match:
        report.update(at=stamp, memcg=True)
        if match.group(1):
            report["cgroup"] = match.group(1)[:CGROUP_CHARS]
        if match.group(2) and int(match.group(2)) < 1 << 50:  # else v1's "no limit"
            report["limit"] = int(match.group(2)) * 1024
        return report
    match = rx(OOM_CONSTRAINT).search(message)
    if match:
        where = rx(OOM_MEMCG).search(message)
        report.update(at=stamp, memcg=match.group(1) == "CONSTRAINT_MEMCG")
        if where:
            report["cgroup"] = where.group(1)[:CGROUP_CHARS]
        if small_int(match.group(3)) is None:
            return report  # a truncated line: it still tells the next kill's kind
        pid, name = int(match.group(3)), match.group(2)
    else:
        match = rx(OOM_KILL).search(message)
        if not match or small_int(match.group(2)) is None:
            return report
        pid, name = int(match.group(2)), match.group(3)
        report["memcg"] = report.get("memcg") or match.group(1).startswith("Memory cgroup")
    row = [mono, epoch, pid, name, report.get("memcg", False), report.get("cgroup"),
           report.get("limit")]
    if ooms and ooms[-1][2] == pid:
        ooms[-1] = [b if a is None or a is False or a == "" else a for a, b in zip(ooms[-1], row)]
    else:
        ooms.append(row)
    return {}


# ================================================================ end of kernel


# ---------------------------------------------------------------- modules beside the probe

def load_tfevents():
    """The event decoder (see load_module)."""
    return load_module("tfevents")


def load_module(name):
    """A module shipped beside the probe (tfevents, discover): on the box the bundle's loader
    installed it as gpuwatch_NAME, or the client left it out of this poll (ImportError: nothing
    is ever imported from the box's disk); on the client it is this package's; run as a
    script, the file beside this one."""
    shipped = sys.modules.get("gpuwatch_" + name)
    if shipped is not None:
        return shipped
    if __file__.startswith("<"):  # installed by the bundle's loader (probe_bundle.LOADER)
        raise ImportError("gpuwatch_%s was not sent with this poll" % name)
    import importlib

    if __package__:
        return importlib.import_module(__package__ + "." + name)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(name)


# ================================================================ run files (issue 4)
# Reading a run's cgroup counters, log, event files, metrics and checkpoints, from here to
# "end of run files": the bundle sends this part only to a poll that may read a run (a
# configured one, one that discovery remembers, or a discovery that may find one): a box
# without runs gets the probe without it (issue 3, U15; probe_bundle.RUN_FILES). Nothing
# outside it calls into it unless a run is to be read.

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
    at = PROC_FIELDS.index
    paths = [p for p in wanted if isinstance(p, str)] if isinstance(wanted, list) else []
    paths += [r[at("cgroup")] for r in rows if r[at("run")] is not None or r[at("nvidia_devs")]]
    tried, found = [], []
    for path in paths:
        if not path or path == own or path in tried or len(tried) >= RUN_CGROUPS:
            continue
        tried.append(path)
        try:
            if os.path.isdir(os.path.join(root, "memory" * (version == 1), path.lstrip("/"))):
                info = (cgroup_v2 if version == 2 else globals()["cgroup_v1"])(root, path)
                found.append([path, info["memory_events"].get("oom_kill"),
                              info["memory_max_bytes"]])
        except (OSError, ValueError):
            pass
    return table(("path", "oom_kill", "memory_max_bytes"), found)


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
    if "glob_paths" in globals():  # the glob part: sent where a run's path has glob characters
        return glob_paths(path, cap)
    import glob  # one the client did not see coming: discovery's, on the poll it finds a run

    matches = []
    for match in glob.iglob(path):
        matches.append(match)
        if len(matches) > cap:
            return sorted(matches[:cap]), True
    return sorted(matches), False


# ================================================================ glob (issue 3)
def glob_paths(path, cap):
    """glob.iglob(path), sorted (at most cap) → (paths, capped). Written out here: `import
    glob` pulls in re, enum and contextlib, 3.7 ms of every poll of a box whose run names its
    checkpoints by a glob, as discovery names every HuggingFace run's (checkpoint-*): a sixth
    of the probe's CPU there. Sent only to such polls (probe_bundle.GLOB)."""
    absolute = path.startswith("/")
    parts = path.split("/")[1 if absolute else 0:]
    paths, listed = ["/" if absolute else ""], False
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if not part:  # a doubled or trailing slash: glob keeps it, and wants a folder there
            paths = [p + "/" for p in paths if os.path.isdir(p or ".")] if last else paths
            continue
        found = []
        for base in paths:
            if has_glob(part):
                listed = True
                try:
                    entries = list(os.scandir(base or "."))
                except OSError:
                    continue
                for entry in entries:
                    if ((entry.name[0] != "." or part[0] == ".")  # glob skips hidden names
                            and glob_match(entry.name, part)):
                        try:
                            if last or entry.is_dir():
                                found.append(os.path.join(base, entry.name))
                        except OSError:
                            continue
                    if last and len(found) > cap:
                        return sorted(found[:cap]), True
            else:
                joined = os.path.join(base, part)
                if not listed or (os.path.lexists(joined) if last else os.path.isdir(joined)):
                    found.append(joined)
        paths = found
    return sorted(paths[:cap]), len(paths) > cap


def glob_match(name, pattern):
    """fnmatch.fnmatchcase(name, pattern) without re: `*`, `?`, `[seq]`, `[!seq]` (ranges
    a-z; a `[` without its `]` stands for itself)."""
    n = p = 0
    star = None  # (pattern index after the last `*`, the name index it stands at)
    while n < len(name):
        if p < len(pattern) and pattern[p] == "*":
            p += 1
            star = (p, n)
            continue
        after = glob_token(pattern, p, name[n]) if p < len(pattern) else -1
        if after >= 0:
            p, n = after, n + 1
        elif star is not None:  # let the last `*` take one more character, try again
            p, n = star[0], star[1] + 1
            star = (p, n)
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def glob_token(pattern, p, ch):
    """Where the pattern goes on after its token at p if that token matches ch, else -1."""
    c = pattern[p]
    if c == "?":
        return p + 1
    if c == "[":
        j = p + 1
        if j < len(pattern) and pattern[j] == "!":
            j += 1
        if j < len(pattern) and pattern[j] == "]":
            j += 1
        j = pattern.find("]", j)
        if j >= 0:
            chars = pattern[p + 1:j]
            negate = chars[:1] == "!"
            chars = chars[1:] if negate else chars
            k, hit = 0, False
            while k < len(chars) and not hit:
                if k + 2 < len(chars) and chars[k + 1] == "-":
                    hit, k = chars[k] <= ch <= chars[k + 2], k + 3
                else:
                    hit, k = chars[k] == ch, k + 1
            return j + 1 if hit != negate else -1
    return p + 1 if c == ch else -1
# ================================================================ end of glob


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
    except ImportError:  # not sent with this poll: the records go as they are (issue 3)
        return read_raw_records(entry, path, offset, st.st_size, budget)
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


# ================================================================ raw records (issue 3)
# Sent only to a poll that reads event files without the decoder (probe_bundle.RAW_RECORDS).

RAW_CAP = 24 * 1024
"""Event-file bytes sent raw per poll, all files (issue 3): a poll whose probe carries no
decoder (the client's steady state, modules_for) sends the new records as they are and the
client decodes them; more than this, and the next poll ships the decoder."""


def read_raw_records(entry, path, offset, size, budget):
    """The whole TFRecords from `offset` on, within RAW_CAP and the poll's byte budget, walked
    by their lengths alone (8-byte length, its 4-byte CRC, data, the data's 4-byte CRC): the
    client checks both CRCs and decodes them (remote/wire/raw_events.py) into what read_scalars
    would have given; nothing of a file read from 0 that is larger than that (a first load:
    the decoder, shipped next poll, reads it on the box). A record cut short at the end of the
    file stays for the next poll, as the decoder leaves it; its header goes as "head" so that
    the client can tell a live writer's record from a damaged length (which the decoder,
    shipped next, resynchronises over)."""
    import binascii

    cap = min(budget.setdefault("raw", RAW_CAP), budget["bytes"])
    data = b""
    if offset or size <= cap:  # a first load larger than that: the decoder, next poll
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max(0, min(cap, size - offset)))
    n = len(data)
    pos = stopped = 0
    while not stopped:
        if pos + 12 > n:
            stopped = "bytes" if offset + n < size else "partial" if pos < n else "eof"
            continue
        end = pos + 16 + int.from_bytes(data[pos:pos + 8], "little")
        if end > n:
            stopped = "partial" if offset + end > size else "bytes"
        else:
            pos = end
    budget["raw"] -= pos
    budget["bytes"] -= pos
    entry.update({"start": offset, "offset": offset + pos, "stopped": stopped,
                  "raw": binascii.b2a_base64(data[:pos], newline=False).decode()})
    if stopped == "partial" and pos + 12 <= n:
        entry["head"] = binascii.b2a_base64(data[pos:pos + 12], newline=False).decode()
    return entry


# ================================================================ end of raw records


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
            out["files"].append({"path": name, "error": describe(exc)})
    return out


# ================================================================ metrics (issue 3)
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
    matches, _ = expand_glob(path, limits["walk_entries"])
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
    if not has_glob(path):
        return path
    matches = ordered_matches(path, limits)
    if not matches:
        raise ProbeFailure("no file matches %s" % path)
    return matches[-1]


def metric_number(value):
    """A metric's value as a float; None for what is not a number (or an integer too big for
    a float: JSON allows 400 digits)."""
    if isinstance(value, str):
        return None  # a JSON string is text, not a metric ("note": "warmup")
    try:
        return as_number(value)
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
        return as_step(value)
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
        raise ProbeFailure("%s is %d bytes, over the %d-byte limit for a trainer_state.json"
                           % (path, st.st_size, limits["metrics_json_bytes"]))
    with open(path, "rb") as f:
        try:
            data = json_loads(f.read(limits["metrics_json_bytes"] + 1).decode("utf-8"))
        except RecursionError:
            raise ProbeFailure("%s is nested too deep to read" % path)
    history = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise ProbeFailure("%s has no log_history list" % path)
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
        number = as_number(data.get(key))
        if number is not None and number == number and abs(number) != float("inf"):
            out[key] = finite(number)
    last = history[-1] if history else None
    if isinstance(last, dict) and as_number(last.get("train_runtime")) is not None:
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
                skipped, problem = skipped + 1, problem or describe(exc)
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
        entry = json_loads(line)
    except (ValueError, RecursionError) as exc:
        raise ProbeFailure("not JSON: %s" % exc)
    key = next((k for k in STEP_KEYS if k in entry), None) if isinstance(entry, dict) else None
    step = safe_step(entry[key]) if key else None
    if step is None:
        raise ProbeFailure("a line without an integer " + " or ".join(STEP_KEYS))
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
        raise ProbeFailure("%s has an unreadable header: %s" % (path, describe(exc)))
    name = "step" if "step" in header else ("epoch" if "epoch" in header else None)
    if name is None:
        raise ProbeFailure("%s has no step or epoch column (header: %s)"
                           % (path, ",".join(header)[:limits["msg_chars"]]))
    at = header.index(name)

    def row(line):
        cells = csv_row(line)
        step = safe_step(cells[at]) if len(cells) == len(header) else None
        if step is None:
            raise ProbeFailure("a row without an integer %s, or not %d cells"
                               % (name, len(header)))
        pairs = [(tag, as_number(cell)) for tag, cell in zip(header, cells)
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
    out.update({"path": raw, "file": found, "scalars": columns(points, False)})
    out.update(stat_fields(st))
    return out


def collect_metrics(raw, cursor, limits):
    """One metrics source → one answer per file read; "path" in each is the path as the
    request spelled it (the key of its cursors), "file" the file read.

    A trainer_state.json glob reads its newest match (each copy holds the history so far).
    A CSV or JSONL glob reads every match in order (Lightning starts a version_N/ each time a
    run resumes: its history is spread over them), sharing one poll's byte budget; a file
    the budget did not reach answers with its cursor as it was and "pending"."""
    path = box_path(raw)
    kind = metrics_kind(path)
    if kind is None:
        raise ProbeFailure("unknown metrics format: %s (expected trainer_state.json, *.csv "
                           "or *.jsonl)" % path)
    if kind == "trainer_state" or not has_glob(path):
        return [read_metrics_file(raw, kind, newest_match(path, limits), cursor, limits)]
    answers, failures, left = [], [], limits["metrics_bytes"]
    for found in ordered_matches(path, limits)[-METRICS_FILES:]:
        budget = dict(limits, metrics_left=left)
        try:
            answers.append(read_metrics_file(raw, kind, found, cursor, budget))
        except Exception as exc:  # one file's problem; the source fails only if all do
            failures.append({"path": raw, "file": found, "error": describe(exc)})
        left -= budget.get("read_bytes", 0)
    if not answers:
        raise ProbeFailure(failures[-1]["error"] if failures else "no file matches " + path)
    return answers + failures
# ================================================================ end of metrics


# -------------------------------- checkpoints, leftovers, done marker (seed 001, 004, U6)


def tree_size(path, st, budget):
    """(bytes, newest mtime, capped) of a file or a folder, walking at most budget["files"]
    files in all (a checkpoint folder of shards is summed; a huge one says it was capped).
    Leftover-named files (*.tmp, ...) inside it count for neither."""
    if not os.path.isdir(path):
        return st.st_size, st.st_mtime, False
    total, newest, stack = 0, None, [path]  # files' mtimes, not the folder's: a stray
    while stack:  # file dropped into it later (a leftover, a note) renews the folder's
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if budget["files"] <= 0:
                return total, st.st_mtime if newest is None else newest, True
            budget["files"] -= 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if leftover(entry.name):
                    continue  # a partial write is not the checkpoint (listed as a leftover)
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_size
            newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
    return total, st.st_mtime if newest is None else newest, False


def checkpoint_rows(paths, budget):
    """[path, mtime, bytes, capped] rows, oldest first; a folder's mtime is its newest file's
    (when the checkpoint was last written) and its size is summed. The newest are measured
    first, so a capped walk leaves the old ones, not the one that matters, unmeasured."""
    stats = []
    for path in paths:
        try:
            stats.append((path, os.stat(path)))
        except OSError:
            continue
    stats.sort(key=lambda item: item[1].st_mtime, reverse=True)
    rows = []
    for path, st in stats:
        size, newest, capped = tree_size(path, st, budget)
        rows.append([path, round(newest, 3), size, capped])
    rows.sort(key=lambda row: row[1])
    return rows


def collect_checkpoints(pattern, limits):
    """The checkpoints a glob matches (files or folders), and `*.tmp`, `*.partial`, `tmp*`
    leftovers among them, beside them (in their folders) or inside checkpoint folders (U6)."""
    matches, capped = expand_glob(pattern, limits["walk_entries"])
    if matches == [pattern] and not os.path.exists(pattern):
        matches = []
    checkpoints, leftovers = [], set()
    for path in matches:
        if leftover(os.path.basename(path.rstrip("/"))):
            leftovers.add(path)
        else:
            checkpoints.append(path)
    folders = {os.path.dirname(path) for path in matches}
    if not matches and not has_glob(os.path.dirname(pattern)):
        folders.add(os.path.dirname(pattern))  # none yet: a leftover may sit where they go
    folders.update(path for path in checkpoints if os.path.isdir(path))
    folders.discard("")
    seen = 0
    for folder in sorted(folders):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for name in entries:
            seen += 1
            if seen > limits["walk_entries"]:
                capped = True
                break
            if leftover(name):
                leftovers.add(os.path.join(folder, name))
    total = len(checkpoints)
    budget = {"files": limits["ckpt_files"]}
    rows = checkpoint_rows(checkpoints, budget)[-limits["checkpoints"]:]
    out = {"pattern": pattern, "total": total, "items": table(CKPT_FIELDS, rows),
           "leftovers": table(CKPT_FIELDS,
                              checkpoint_rows(sorted(leftovers), budget)[-limits["leftovers"]:])}
    if capped:
        out["capped"] = True
    return out


def collect_done(path):
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"path": path, "exists": False}
    return {"path": path, "exists": True, "mtime": round(st.st_mtime, 3)}


EXIT_RECORD_BYTES = 512


def collect_exit(path):
    """The exit record gpuwatch's launch wrapper writes when a run it relaunched ends
    (actions_box.launch_script): {"v", "run", "code"} with the command's exit status (128+N:
    killed by signal N). Read bounded, as data; "code" only when it is a status (0-255)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"path": path, "exists": False}
    out = {"path": path, "exists": True, "mtime": round(st.st_mtime, 3)}
    if (st.st_mode & 0o170000) != 0o100000:
        raise ProbeFailure("%s is not a regular file" % path)
    with open(path, "rb") as f:
        data = f.read(EXIT_RECORD_BYTES + 1)
    if len(data) > EXIT_RECORD_BYTES:
        raise ProbeFailure("%s is over %d bytes: not an exit record" % (path, EXIT_RECORD_BYTES))
    record = json_loads(data.decode("utf-8", "replace"))
    code = record.get("code") if isinstance(record, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
        out["code"] = code
    return out


# -------------------------------- one run


def collect_run(run, pids, budget, limits):
    out = {"name": run.get("name"), "pids": pids}
    errors = {}

    def source(key, fn, *args):
        try:
            out[key] = fn(*args)
        except Exception as exc:  # a missing or malformed file is this source's error only
            errors[key] = describe(exc)

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
                reader = globals().get("collect_metrics")  # sent where a run names metrics
                if reader is None:
                    raise ProbeFailure("the metrics readers were not sent with this poll")
                out["metrics"].extend(reader(raw, cursors.get(raw), limits))
            except Exception as exc:
                out["metrics"].append({"path": raw, "error": describe(exc)})
                errors["metrics[%d]" % i] = describe(exc)
    if ckpts:
        source("checkpoints", collect_checkpoints, ckpts, limits)
    if done:
        source("done", collect_done, done)
    if exit_file:
        source("exit", collect_exit, exit_file)
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


# ================================================================ end of run files


# ---------------------------------------------------------------- runs, configured and discovered

def collect_runs(request, limits, found):
    runs = [r for r in request.get("runs") or () if isinstance(r, dict)]
    if "matched" not in found:  # the processes section was not asked for, or failed
        procs, _ = scan_table()
        found["matched"] = match_runs(procs, runs)
    pids = {}
    for pid, name in found["matched"].items():
        pids.setdefault(name, []).append(pid)
    budget = found["budget"] = {"bytes": limits["events_bytes"],  # discovered runs share it
                                "deadline": time.monotonic() + limits["events_time_s"]}
    out = []
    for run in runs:
        if not isinstance(run.get("name"), str):
            continue
        try:
            out.append(collect_run(run, sorted(pids.get(run["name"], [])), budget, limits))
        except Exception as exc:  # never happens by design; if it does, the run says so
            out.append({"name": run["name"], "pids": [], "errors": {"run": describe(exc)}})
    return out


def collect_discovered(request, limits, found):
    """Issue 8: the runs nobody configured, found by discover.py and read like configured ones
    (after them: they share the event budget)."""
    if "discovery" not in found:
        raise ProbeFailure("discovery needs the processes section")
    state = found["discovery"]
    if "need" in state:
        raise ProbeFailure("no discover module sent, no discovery to reuse: %s" % state["need"])
    budget = found.get("budget") or {"bytes": limits["events_bytes"],
                                     "deadline": time.monotonic() + limits["events_time_s"]}
    try:
        load_tfevents()
        has_decoder = True
    except ImportError:  # left out of this poll's bundle: no run asked for event files
        has_decoder = False
    if "reused" in state:
        return collect_reused(state, request, limits, budget, has_decoder)
    return load_module("discover").collect(state, request, limits, budget, collect_run,
                                           has_decoder)


# -------------------------------- discovery between searches (issue 3)
# The discover module was a quarter of what every poll sent up, half with the event decoder that
# came with it (U15: each byte goes up every few seconds). The client sends it on a host's first
# poll and when the probe asks for it; on the polls between, it sends back what the last
# discovery found (the request's "discovery_reuse", made by discovery_cache) and the probe
# checks here that discover.group would find just that again: the same launchers, a GPU holder
# of each still in its tree (new holders only inside them: dataloader workers), every other
# holder accounted for, the same remembered runs, and no new process that could be one of them.
# Then each run is read from the paths the client remembers, as discover.collect reads a run
# whose launch the client has seen and whose folder is not due for a search. When the probe
# cannot tell, its document says {"discovery": {"need": "now"}} and the client polls again at
# once with the module; a folder due for a search says "next" (the next poll searches it).
# Processes are known by pid and start time: one that exec()s another program in place is seen
# as such by the next poll that sends the module (every discover_every_s at the latest).

def discovery_state(procs, holders, matched, request):
    """found["discovery"]: discover.group's state with the cache for the next poll, the reused
    state, or {"need": why} when neither can be had without the module."""
    reuse, why = request.get("discovery_reuse"), "none sent"
    if isinstance(reuse, dict):
        try:
            state, why = reuse_discovery(reuse, procs, holders, matched, request)
        except Exception as exc:  # malformed: discover afresh
            state, why = None, describe(exc)
        if state is not None:
            return state
    try:
        discover = load_module("discover")
    except ImportError:
        return {"need": why}
    configured = dict(matched)
    state = discover.group(procs, holders, matched, request)
    try:
        state["cache"] = discovery_cache(state, procs, holders, configured, request,
                                         discover.DEFAULTS)
    except Exception:  # never by design; without a cache the next poll sends the module again
        pass
    return state


def boot_id():
    try:
        return read_text(proc_path("sys", "kernel", "random", "boot_id")).strip()
    except OSError:
        return None


def remembered(request):
    """The request's remembered discovered runs (as discover.remembered_runs reads them)."""
    runs = request.get("discovered_runs")
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("name"), str)
            and isinstance(r.get("key"), list)] if isinstance(runs, list) else []


def runs_digest(runs):
    return zlib.crc32(json_dumps(sorted(json_dumps([r["name"], r["key"]], (", ", ": "))
                                        for r in runs), (", ", ": "))
                      .encode())


def lookalikes(procs, inside, configured, runs):
    """discover.group also looks among all processes for a remembered run's key [cwd, script]:
    the live processes outside every run that could have one (that cwd, and the script's name
    in the command line) → [[pid, start_ticks, crc32 of cwd and command line]]."""
    words = {}
    for r in runs:
        cwd, what = r["key"]
        words.setdefault(cwd, set()).add(os.path.basename(what.split()[-1]) if what.split()
                                         else "")
    out = []
    for pid in sorted(procs) if words else ():
        if pid in inside or pid in configured or procs[pid]["state"] in ("Z", "X"):
            continue
        cwd = read_link(proc_path(str(pid), "cwd"))
        if cwd in words:
            cmd = " ".join(read_argv(str(pid)))
            if any(word in cmd for word in words[cwd]):
                out.append([pid, procs[pid]["start_ticks"],
                            zlib.crc32(("%s\0%s" % (cwd, cmd)).encode("utf-8", "replace"))])
    return out


def owner_of(pid, procs, children, configured):
    """The nearest ancestor (or itself) whose tree holds a configured run's process: why
    discover.group put a GPU holder in no run (the configured run is that run)."""
    while pid in procs:
        if any(p in configured for p in subtree(pid, children)):
            return pid
        pid = procs[pid]["ppid"]
    return None


def discovery_cache(state, procs, holders, configured, request, defaults):
    """What the next poll sends back as "discovery_reuse": per run [name, launcher pid, its
    start ticks, its ppid, a GPU holder in its tree (the launcher when found by its key) and
    that one's start ticks]; the other holders in no run (not a configured run's) [pid, start
    ticks, ppid, defunct, owner (owner_of), owner's start ticks]; the processes that could be
    a remembered run (lookalikes); a digest of the runs the next request will remember (their
    names and keys)."""
    children = children_of(procs)
    groups, inside = [], set()
    for g in state["groups"]:
        tree = subtree(g["root"], children)
        inside |= tree
        anchor = next((pid for pid in holders if pid in tree), g["root"])
        groups.append([g["name"], g["root"], g["start_ticks"], procs[g["root"]]["ppid"], anchor,
                       procs[anchor]["start_ticks"]])
    outside = []
    for pid in holders:
        if pid not in inside and pid not in configured:  # a configured run's: its run
            owner = owner_of(pid, procs, children, configured)
            outside.append([pid, procs[pid]["start_ticks"], procs[pid]["ppid"],
                            procs[pid]["state"] in ("Z", "X"), owner,
                            procs[owner]["start_ticks"] if owner is not None else None])
    runs = remembered(request) + [{"name": g["name"], "key": g["key"]} for g in state["groups"]
                                  if not g["remembered"]]
    return {"boot": boot_id(), "groups": groups, "outside": outside,
            "seen": lookalikes(procs, inside, configured, runs), "remembered": runs_digest(runs),
            "every_s": defaults["discover_every_s"], "cap": defaults["discover_runs"]}


def reuse_discovery(reuse, procs, holders, matched, request):
    """→ (state, None) when discover.group would find what the poll that made `reuse` found
    (discovery_cache), with each run's pids written into `matched`; else (None, why)."""
    if reuse["boot"] != boot_id():
        return None, "rebooted"
    runs = remembered(request)
    if runs_digest(runs) != reuse["remembered"]:
        return None, "remembered runs changed"
    known = dict((r["name"], r) for r in runs)
    configured = set(r.get("name") for r in request.get("runs") or () if isinstance(r, dict))
    children = children_of(procs)
    groups, inside, keys = [], set(), []
    for name, root, start, ppid, anchor, anchor_start in reuse["groups"]:
        tree = subtree(root, children) if root in procs else ()
        pids = sorted(p for p in tree if procs[p]["state"] not in ("Z", "X"))
        run = known.get(name) or {}
        if (root not in pids or [procs[root]["start_ticks"], procs[root]["ppid"]] != [start, ppid]
                or anchor not in tree or procs[anchor]["start_ticks"] != anchor_start
                or (anchor != root and anchor not in holders) or run.get("key") in keys
                or name in configured or run.get("launch_seen") != [root, start]):
            return None, "run %s changed" % name
        if any(p in matched for p in tree):
            return None, "configured run's process in run %s" % name
        inside |= tree
        keys.append(run["key"])
        groups.append({"name": name, "root": root, "start_ticks": start, "pids": pids})
    outside = dict((rec[0], rec[1:]) for rec in reuse["outside"])
    for pid in holders:
        if pid in inside or pid in matched:  # a configured run's process: that run's
            continue
        stat, rec = procs[pid], outside.get(pid)
        dead = stat["state"] in ("Z", "X")
        if rec is None or rec[:3] != [stat["start_ticks"], stat["ppid"], dead] or not (
                dead if rec[3] is None else rec[3] in procs and procs[rec[3]]["start_ticks"]
                == rec[4] and owner_of(pid, procs, children, matched) == rec[3]):
            return None, "GPU holder %d in no run" % pid
    seen = [tuple(s) for s in reuse["seen"]]
    for found in lookalikes(procs, inside, matched, runs):
        if tuple(found) not in seen:
            return None, "%d may be a remembered run" % found[0]
    for g in groups:
        for pid in g["pids"]:
            matched[pid] = g["name"]
    return {"reused": groups, "every_s": reuse["every_s"], "cap": reuse["cap"]}, None


def collect_reused(state, request, limits, budget, has_decoder):
    """The discovered section from a reused discovery: each live run as discover.collect reads
    one whose launch the client has seen, less what the client keeps from the last answer
    (Discovery.merged: how it was launched, its paths), then the remembered runs that are
    not running."""
    now, out = time.time(), []
    given = request.get("limits")
    every_s = number_setting(given, "discover_every_s", state["every_s"])
    cap = int(number_setting(given, "discover_runs", state["cap"]))
    runs = remembered(request)
    known = dict((r["name"], r) for r in runs)
    groups = state["reused"]
    if len(groups) > cap:  # the newest launches, as discover.collect keeps them
        groups = sorted(groups, key=lambda g: (g["start_ticks"], g["root"]))[-cap:]
    for g in groups:
        run = known[g["name"]]
        searched_at = run.get("searched_at")
        if not isinstance(searched_at, (int, float)) or now - searched_at >= every_s:
            state["due"] = True  # the next poll sends the module, which searches
        details = {"key": run["key"], "same": True,
                   "launcher": {"pid": g["root"], "start_ticks": g["start_ticks"]}}
        out.append(read_known_run(run, g["pids"], details, budget, limits, has_decoder))
    alive = set(g["name"] for g in state["reused"])
    configured = set(r.get("name") for r in request.get("runs") or () if isinstance(r, dict))
    for run in runs:
        if run["name"] not in alive and run["name"] not in configured:
            out.append(read_known_run(run, [], {"key": run["key"], "alive": False}, budget,
                                      limits, has_decoder))
    return out


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
        request = json_loads(raw.decode("utf-8"))
    except (ValueError, zlib.error) as exc:
        return {}, "request is not JSON: %s" % exc
    if not isinstance(request, dict):
        return {}, "request is not a JSON object"
    if request.get("v", 1) != 1:
        return request, "request version %r; this probe reads version 1" % request.get("v")
    return request, None


def want(request, section):
    wanted = request.get("want")
    return not isinstance(wanted, dict) or wanted.get(section, True) is not False


def number_setting(mapping, key, default):
    value = mapping.get(key) if isinstance(mapping, dict) else None
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if is_number and value > 0 else default


def request_limits(request):
    given = request.get("limits")
    limits = {}
    for key, default in DEFAULT_LIMITS.items():
        value = number_setting(given, key, default)
        limits[key] = int(value) if isinstance(default, int) else float(value)
    return limits


def gather(request, doc=None):
    """The document's sections, into `doc` as each is done (main keeps what was done when the
    deadline cuts this short)."""
    doc = {"v": 1, "errors": {}} if doc is None else doc
    limits = request_limits(request)

    def section(name, fn, *args):
        if not want(request, name):
            return
        try:
            doc[name] = fn(*args)
        except Exception as exc:  # one section's failure never sinks the document
            doc[name] = dict(getattr(exc, "detail", None) or {}, error=describe(exc))
            doc["errors"][name] = doc[name]["error"]

    disks = request.get("disks")
    found = {}  # what one section learns that another uses: the processes matched to runs
    section("host", collect_host)
    section("gpus", collect_gpus, request)
    gpu_apps = doc.get("gpus", {}).get("apps", {}).get("rows", [])
    section("processes", collect_processes, request, limits, [row[1] for row in gpu_apps],
            found)
    section("disks", collect_disks, disks if isinstance(disks, list) else [])
    if isinstance(request.get("runs"), list) and request["runs"]:
        section("runs", collect_runs, request, limits, found)
    if want(request, "discover"):
        section("discovered", collect_discovered, request, limits, found)
        state = found.get("discovery") or {}
        if "cache" in state:  # issue 3: sent back by the next poll instead of the module
            doc["discovery"] = {"reuse": state["cache"]}
        elif "need" in state:
            doc["discovery"] = {"need": "now", "why": state["need"]}
        elif state.get("due"):
            doc["discovery"] = {"need": "next", "why": "a search is due"}
    section("cgroup", collect_cgroup, doc.get("processes"), request.get("run_cgroups"))
    section("logind", collect_logind)
    section("kernel", collect_kernel, limits)
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
        if name in doc or not want(request, name) or name == "runs" and not request.get(
                "runs") or name == "discovered" and not want(request, "discover"):
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
        arm_deadline(DEFAULT_DEADLINE_S, started)  # until the request gives its own
        request, problem = read_request(sys.stdin.buffer)
        arm_deadline(number_setting(request, "deadline_s", DEFAULT_DEADLINE_S), started)
        if problem:
            doc["errors"]["request"] = problem
        gather(request, doc)
    except Deadline as exc:
        cut_short(doc, request, str(exc))
    try:
        alarm(max(time_left(), 0) + WRITE_GRACE_S)  # a client that stopped reading
        cpu_end = os.times()
        doc["cpu_s"] = round(sum(cpu_end[:2]) - sum(cpu_start[:2]), 3)
        doc["probe_s"] = round(time.monotonic() - started, 3)
        body = json_dumps(doc).encode("ascii")
        stdout.buffer.write(zlib.compress(body, 6) if request.get("compress") is True else body)
        stdout.flush()
        sys.stderr.flush()
    except Deadline:
        pass  # the client stopped reading, or has gone: nothing more to do for it
    finally:
        alarm(0)
        kill_children()  # one that a kill could not end at once (D state) is tried again
    os._exit(0)  # do not wait for an NVML thread stuck in a hung driver


if __name__ == "__main__":
    main()
