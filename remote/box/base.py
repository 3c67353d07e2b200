"""What every part of the probe uses: its roots and limits, its failures, JSON and re
loaded lazily, its deadline and the bounded commands it runs under it, and the way one part
reaches another (load_module).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

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
DEFAULT_DEADLINE_S = 60.0  # a request without "deadline_s" (the client always sends one)
WRITE_GRACE_S = 0.5  # to print the document once the deadline has passed

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread (no fds, no cmdline)
# comm prefixes of what keeps a run alive when the SSH session ends (seed 000)
DETACH_SERVERS = ("tmux", "screen", "SCREEN")

PROC_FIELDS = ("pid", "ppid", "user", "state", "comm", "cmd", "start_ticks", "tty_nr",
               "session", "pgrp", "sighup_ignored", "sighup_caught", "threads", "cgroup",
               "cwd", "exe", "nvidia_devs", "run", "cpu_ticks")
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
# poll. A steady poll needs neither: JSON goes through the json module's own C
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


def want(request, section):
    wanted = request.get("want")
    return not isinstance(wanted, dict) or wanted.get(section, True) is not False


def number_setting(mapping, key, default):
    value = mapping.get(key) if isinstance(mapping, dict) else None
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if is_number and value > 0 else default




def load_site():
    """Put the box's site-packages on sys.path, for what lives there (pynvml). The probe runs
    under `python3 -S` (bundle.build_command): site, and with it every installed
    package's .pth file, costs 3 ms of a bare Debian python3's start and tens of ms in a
    well-stocked conda env or pyenv, on every poll; it is loaded only where it is needed."""
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()


def load_module(name):
    """A module shipped beside the probe (tfevents, discover, gpus/nvml): on the box the
    bundle's loader installed it as gpuwatch_NAME ("/" as "_": gpuwatch_gpus_nvml), or the
    client left it out of this poll (ImportError: nothing is ever imported from the box's
    disk); on the client it is this package's; run as a script, the file beside this one."""
    shipped = sys.modules.get("gpuwatch_" + name.replace("/", "_"))
    if shipped is not None:
        return shipped
    if __file__.startswith("<"):  # installed by the bundle's loader (bundle.LOADER)
        raise ImportError("gpuwatch_%s was not sent with this poll" % name.replace("/", "_"))
    import importlib

    if __package__:
        return importlib.import_module(__package__ + "." + name.replace("/", "."))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(name.replace("/", "."))




def optional(name):
    """A part the client sends only to the polls that need it (bundle.modules_for), or None
    where this poll came without it."""
    try:
        return load_module(name)
    except ImportError:
        return None


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
        popen = optional("popen")  # sent where the box said it has none
        if popen is None:
            raise ProbeFailure("%s not run: this python has no os.posix_spawnp; the next poll "
                               "brings what it needs" % argv[0])
        return popen.run_bounded_popen(argv, timeout_s)
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
            raise ProbeFailure("%s timed out after %.1fs and was killed"
                                    % (argv[0], timeout_s),
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


