"""gpuwatch probe: runs ON the box, once per poll, and prints one JSON document.

Stdlib only and Python 3.6+ (old boxes; nothing is installed there, U42): the client sends
this source and a JSON request over stdin each poll (see probe_bundle.py). pynvml is used
when it imports and nvmlInit works, else `nvidia-smi`. Nothing read from the box is ever
executed or evaluated; only `nvidia-smi` and `dmesg` are run, from PATH, under timeouts.

Roots are overridable so tests and the simulator can point it at fixture trees:
GPUWATCH_PROCFS (/proc), GPUWATCH_SYSFS (/sys), GPUWATCH_ETC (/etc).

Request (unknown keys are ignored):
    {"v": 1, "disks": [path, ...], "runs": [{"name": str, "process": str}, ...],
     "limits": {"procs", "cmd_chars", "fds_per_proc", "kernel_events", "msg_chars",
                "dmesg_timeout_s"},
     "nvidia_smi_timeout_s": float, "nvidia_smi_reasons": "event" | "throttle",
     "want": {"gpus", "processes", "disks", "cgroup", "logind", "kernel", "nvml": bool},
     "compress": bool}

Output: {"v": 1, "probe_s", "cpu_s", "errors": {section: message}, and the sections
"host", "gpus", "processes", "disks", "cgroup", "logind", "kernel"}. A section that fails
is {"error": message} (also listed in "errors") and the rest of the document stands.
Tables are {"fields": [...], "rows": [[...], ...]} to keep the document small. With
"compress": true stdout is the zlib stream of that JSON (forked dataloader workers repeat
their parent's command line: it shrinks about 4x, U15).
"""

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
import zlib

PROCFS = os.environ.get("GPUWATCH_PROCFS", "/proc")
SYSFS = os.environ.get("GPUWATCH_SYSFS", "/sys")
ETC = os.environ.get("GPUWATCH_ETC", "/etc")
# Set only on a box of gpuwatch's simulator: its GPUs are the stand-in nvidia-smi's, so the real
# driver of the machine the simulator runs on must not be read through NVML.
SIM_DIR = os.environ.get("GPUWATCH_SIM_DIR")

DEFAULT_LIMITS = {
    "procs": 48,  # processes reported in full; the rest are only counted
    "cmd_chars": 256,
    "fds_per_proc": 4096,  # a process with more open fds is not scanned for /dev/nvidia*
    "kernel_events": 8,  # the last N Xid and the last N OOM kills
    "msg_chars": 160,
    "dmesg_timeout_s": 3.0,
}
DEFAULT_NVIDIA_SMI_TIMEOUT_S = 5.0

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
              "throttle_reasons", "mig")
APP_FIELDS = ("uuid", "pid", "gpu_mem_mib", "process_name")
PROC_FIELDS = ("pid", "ppid", "user", "state", "comm", "cmd", "start_ticks", "tty_nr",
               "session", "pgrp", "sighup_ignored", "sighup_caught", "threads", "cgroup",
               "cwd", "exe", "nvidia_devs", "run")
XID_FIELDS = ("t_mono_s", "t_epoch", "pci", "xid", "pid", "name", "msg")
OOM_FIELDS = ("t_mono_s", "t_epoch", "pid", "name", "memcg")


class ProbeFailure(Exception):
    """A section could not be gathered; the message is what the client shows."""


def describe(exc):
    if isinstance(exc, ProbeFailure):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return "%s: %s" % (exc.strerror, exc.filename) if exc.filename else exc.strerror
    return "%s: %s" % (type(exc).__name__, exc)


def table(fields, rows):
    return {"fields": list(fields), "rows": rows}


def proc_path(*parts):
    return os.path.join(PROCFS, *parts)


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def first_line(text):
    text = text.strip()
    return text.splitlines()[0] if text else ""


# ---------------------------------------------------------------- bounded commands

def run_bounded(argv, timeout_s):
    """Run argv with stdin closed; at the deadline kill its whole process group.

    A hung nvidia-smi (a GPU fallen off the bus, U22) must not hang the poll (U17). A child
    stuck in uninterruptible sleep survives SIGKILL: then we stop waiting and leave it.
    """
    if timeout_s <= 0:
        raise ProbeFailure("%s not run: no time left" % argv[0])
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise ProbeFailure("%s not found on PATH" % argv[0])
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate(timeout=0.5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        raise ProbeFailure("%s timed out after %.1fs and was killed" % (argv[0], timeout_s))
    return child.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def call_with_deadline(fn, timeout_s):
    """Run fn in a daemon thread: an in-process NVML call into a hung driver cannot be
    interrupted, so we stop waiting for it instead (the probe exits with os._exit)."""
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


# ---------------------------------------------------------------- host

def collect_host():
    stat = read_text(proc_path("stat"))
    match = re.search(r"^btime (\d+)", stat, re.M)
    return {
        "hostname": host_name(),
        "boot_id": read_text(proc_path("sys", "kernel", "random", "boot_id")).strip(),
        "uptime_s": float(read_text(proc_path("uptime")).split()[0]),
        "loadavg": [float(x) for x in read_text(proc_path("loadavg")).split()[:3]],
        "time": round(time.time(), 3),
        "btime": int(match.group(1)) if match else None,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        "ncpu": os.cpu_count(),  # host cores, not the cgroup quota (U40)
        "python": "%d.%d.%d" % sys.version_info[:3],
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


def collect_cgroup():
    found = parse_cgroup_file(read_text(proc_path("self", "cgroup")))
    if found is None:
        raise ProbeFailure("no memory cgroup in %s" % proc_path("self", "cgroup"))
    version, path = found
    root = os.path.join(SYSFS, "fs", "cgroup")
    info = cgroup_v2(root, path) if version == 2 else cgroup_v1(root, path)
    info["version"] = version
    info["path"] = path
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
                 "temperature.gpu", "{reasons}.active", "mig.mode.current")
# The header spells it used_gpu_memory (used_memory is an accepted alias).
SMI_APP_QUERY = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
# Canonical names: headers print the long forms, old drivers the throttle family.
SMI_ALIASES = {"clocks.current.sm": "clocks.sm", "used_memory": "used_gpu_memory"}
NA_VALUES = ("", "N/A", "ERR!", "Unknown Error", "Not Supported")
NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:[A-Za-z%]+)?$")
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]*\])?$")  # 'memory.used [MiB]'


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
    match = NUMBER.match(value) if value is not None else None
    if match is None:
        return None
    text = match.group(1)
    return float(text) if "." in text else int(text)


def parse_smi_csv(text, fields=None):
    """nvidia-smi --format=csv output → list of {canonical field: raw value}.

    nvidia-smi does not quote, so the last column (a process name) may hold commas: split
    at most len(fields)-1 times. A header line, when present, names the fields.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and all(FIELD_NAME.match(cell.strip()) for cell in lines[0].split(",")):
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
        if code == 0:
            devices = [gpu_row(row) for row in parse_smi_csv(out, query)]
            return family, devices
        if not is_invalid_field_error(out + err):
            raise ProbeFailure("nvidia-smi exited %d: %s" % (code, first_line(out + "\n" + err)))
    raise ProbeFailure("nvidia-smi knows neither clocks_event_reasons nor clocks_throttle_reasons")


def smi_apps(deadline):
    code, out, err = run_bounded(
        ["nvidia-smi", "--query-compute-apps=" + ",".join(SMI_APP_QUERY),
         "--format=csv,noheader,nounits"], deadline - time.monotonic())
    if code != 0:
        raise ProbeFailure("nvidia-smi compute-apps exited %d: %s" % (code, first_line(out + err)))
    return [app_row(row) for row in parse_smi_csv(out, SMI_APP_QUERY)]


def collect_gpus_smi(hint, deadline):
    family, devices = smi_gpus(hint, deadline)
    section = {"source": "nvidia-smi", "reasons": family, "devices": table(GPU_FIELDS, devices)}
    try:
        section["apps"] = table(APP_FIELDS, smi_apps(deadline))
    except ProbeFailure as exc:  # the GPU table stands without the process list
        section["apps_error"] = describe(exc)
    return section


# ---------------------------------------------------------------- NVML

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

    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    nvml.nvmlInit()
    try:
        devices, apps = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(ask(nvml.nvmlDeviceGetUUID, handle))
            util = ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = ask(nvml.nvmlDeviceGetMemoryInfo, handle)
            mask = ask(reasons_fn, handle)
            mig = ask(nvml.nvmlDeviceGetMigMode, handle)
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
            ])
            for app in ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                name = ask(nvml.nvmlSystemGetProcessName, app.pid)
                used = app.usedGpuMemory  # None where the driver cannot say (WDDM, MIG)
                apps.append([uuid, app.pid, None if used is None else used >> 20, text(name)])
        return {"source": "nvml", "devices": table(GPU_FIELDS, devices),
                "apps": table(APP_FIELDS, apps)}
    finally:
        ask(nvml.nvmlShutdown)


def collect_gpus(request):
    timeout_s = number_setting(request, "nvidia_smi_timeout_s", DEFAULT_NVIDIA_SMI_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    nvml_problem = None
    if SIM_DIR:
        nvml_problem = "simulated box: GPUs come from the stand-in nvidia-smi"
    elif want(request, "nvml"):
        try:
            import pynvml
        except ImportError:
            nvml_problem = "pynvml not importable"
        else:
            try:
                return call_with_deadline(lambda: collect_gpus_nvml(pynvml), timeout_s)
            except Exception as exc:  # no driver library, no GPU, hung: try nvidia-smi
                nvml_problem = describe(exc)
    section = collect_gpus_smi(request.get("nvidia_smi_reasons"), deadline)
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


def read_cmdline(pid):
    try:
        with open(proc_path(pid, "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


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
    minors = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
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


def run_pattern(text):
    """A run's `process` matches whole command-line words: "train.py" matches
    "python /x/train.py --resume" but not "pretrain.py" (a path prefix is allowed)."""
    return re.compile(r"(?:^|[\s/])" + re.escape(text) + r"(?:$|\s)")


def match_runs(procs, runs):
    """pid → name of the first run whose pattern its command line matches."""
    patterns = [(r.get("name"), r.get("process")) for r in runs if isinstance(r, dict)]
    patterns = [(n, run_pattern(p)) for n, p in patterns
                if isinstance(n, str) and isinstance(p, str) and p.strip()]
    matched = {}
    if patterns:
        for pid in procs:
            cmd = read_cmdline(str(pid))
            for name, pattern in patterns:
                if pattern.search(cmd):
                    matched[pid] = name
                    break
    return matched


def related(procs, seeds):
    """Ancestors (SIGHUP risk is read from the parent chain) and descendants (dataloader
    workers) of the seed processes, ancestors first."""
    children = {}
    for pid, stat in procs.items():
        children.setdefault(stat["ppid"], []).append(pid)
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
    cmd = read_cmdline(pid) or "[%s]" % stat["comm"]  # zombies have no command line
    sighup = 1  # bit of signal 1 in the SigIgn/SigCgt masks (seed 000: nohup sets SigIgn)
    return [
        stat["pid"], stat["ppid"], users[uid], stat["state"], stat["comm"],
        cmd[:limits["cmd_chars"]], stat["start_ticks"], stat["tty_nr"], stat["session"],
        stat["pgrp"], bool(int(status.get("SigIgn", "0"), 16) & sighup),
        bool(int(status.get("SigCgt", "0"), 16) & sighup), stat["threads"],
        cgroup[1] if cgroup else None, read_link(proc_path(pid, "cwd")),
        read_link(proc_path(pid, "exe")), devices if isinstance(devices, list) else None, run,
    ]


def collect_processes(request, limits, gpu_pids):
    procs, kernel_threads = scan_table()
    runs = request.get("runs")
    matched = match_runs(procs, runs if isinstance(runs, list) else [])
    devices, fd_unreadable, fd_skipped = {}, 0, []
    for pid in procs:
        found = nvidia_devices(str(pid), limits["fds_per_proc"])
        if found is None:
            fd_unreadable += 1
        elif found == "skipped":
            fd_skipped.append(pid)
        devices[pid] = found
    holders = [pid for pid in procs if isinstance(devices[pid], list) and devices[pid]]
    holders += [pid for pid in gpu_pids if pid in procs and pid not in holders]
    seeds = holders + [pid for pid in matched if pid not in holders]
    ancestors, descendants = related(procs, seeds)
    zombies = [pid for pid, stat in procs.items() if stat["state"] == "Z"]
    servers = [pid for pid, stat in procs.items() if stat["comm"].startswith(DETACH_SERVERS)]
    chosen = []
    for pid in seeds + ancestors + zombies + servers + descendants:  # most telling first
        if pid not in chosen:
            chosen.append(pid)
    users, rows = {}, []
    for pid in chosen[:limits["procs"]]:
        try:
            rows.append(process_row(procs[pid], users, limits, devices[pid], matched.get(pid)))
        except (OSError, ValueError):
            continue  # vanished between the scan and the details
    return {
        "procs": table(PROC_FIELDS, rows),
        "total": len(procs) + kernel_threads,
        "kernel_threads": kernel_threads,
        "zombies": len(zombies),
        "not_listed": len(procs) - len(rows),
        "fd_unreadable": fd_unreadable,
        "fd_skipped": fd_skipped,
    }


# ---------------------------------------------------------------- disks (U6, U7)

def unescape_mount(field):
    """/proc/mounts escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


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


def collect_disks(paths):
    points = mount_points()
    disks = []
    for path in paths:
        if not isinstance(path, str):
            continue
        real = os.path.realpath(os.path.expanduser(path))
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

TS_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")  # dmesg: [  123.456789] msg
TS_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\s?(.*)$")  # dmesg -T
TS_ISO = re.compile(  # dmesg --time-format iso (maybe after -x "kern  :warn  : "), journalctl
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?"
    r"(Z|[+-]\d\d:?\d\d)?\s+(.*)$")
TS_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")  # /dev/kmsg: prio,seq,usec,flags;msg
JOURNAL_PREFIX = re.compile(r"^\S+ kernel: ")

XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
XID_PID = re.compile(r"^pid=(?:'<unknown>'|(\d+)),\s*name=([^,]*),\s*(.*)$")
OOM_KILL = re.compile(
    r"(Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Kill(?:ed)? process (\d+)"
    r"(?:, UID \d+,)? \(([^)]*)\)")
OOM_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+)(?:.*?,task=([^,]*),pid=(\d+))?")


def split_timestamp(line):
    """A kernel log line → (seconds since boot or None, epoch or None, message)."""
    match = TS_MONO.match(line)
    if match:
        return float(match.group(1)), None, match.group(2)
    match = TS_CTIME.match(line)
    if match:
        return None, time.mktime(time.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")), \
            match.group(2)
    match = TS_ISO.match(line)
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
        return None, epoch, JOURNAL_PREFIX.sub("", message)
    match = TS_KMSG.match(line)
    if match:
        return int(match.group(1)) / 1e6, None, match.group(2)
    return None, None, line


def parse_kernel_log(lines, keep, msg_chars):
    """NVIDIA Xid lines and OOM kills, the last `keep` of each, plus Xid counts.

    One OOM kill can log up to three lines ('oom-kill:constraint=…,task=,pid=',
    'Out of memory: Killed process PID (name)', old kernels' 'Kill process … or sacrifice
    child'); lines naming the pid of the kill just seen merge into it. A memory-cgroup kill
    (U9, U41) says CONSTRAINT_MEMCG or 'Memory cgroup out of memory'.
    """
    xids, ooms, counts = [], [], {}
    pending_memcg = False
    for line in lines:
        if "Xid" not in line and "emory" not in line and "oom-kill" not in line:
            continue
        mono, epoch, message = split_timestamp(line.rstrip("\n"))
        match = XID.search(message)
        if match:
            pci, code, rest = match.group(1), int(match.group(2)), match.group(3)
            detail = XID_PID.match(rest)
            pid = int(detail.group(1)) if detail and detail.group(1) else None
            name = detail.group(2) if detail and detail.group(2) != "<unknown>" else None
            text = detail.group(3) if detail else rest
            counts[str(code)] = counts.get(str(code), 0) + 1
            xids.append([mono, epoch, pci, code, pid, name, text[:msg_chars]])
            continue
        match = OOM_CONSTRAINT.search(message)
        if match:
            memcg = match.group(1) == "CONSTRAINT_MEMCG"
            if match.group(3):
                ooms.append([mono, epoch, int(match.group(3)), match.group(2), memcg])
            else:
                pending_memcg = memcg  # a truncated line: it still tells the next kill's kind
            continue
        match = OOM_KILL.search(message)
        if match:
            pid, name = int(match.group(2)), match.group(3)
            memcg = match.group(1).startswith("Memory cgroup") or pending_memcg
            if ooms and ooms[-1][2] == pid:
                ooms[-1][3] = ooms[-1][3] or name
                ooms[-1][4] = ooms[-1][4] or memcg
            else:
                ooms.append([mono, epoch, pid, name, memcg])
            pending_memcg = False
    return {"xid": table(XID_FIELDS, xids[-keep:]), "oom": table(OOM_FIELDS, ooms[-keep:]),
            "xid_counts": counts}


def collect_kernel(limits):
    code, out, err = run_bounded(["dmesg"], limits["dmesg_timeout_s"])
    if code != 0:  # kernel.dmesg_restrict=1 for a non-root user is common
        raise ProbeFailure("dmesg not readable: %s" % first_line(err + "\n" + out))
    return parse_kernel_log(out.splitlines(), limits["kernel_events"], limits["msg_chars"])


# ---------------------------------------------------------------- request and document

def read_request(stream):
    """The request JSON from the rest of stdin → (request, problem or None)."""
    raw = stream.read()
    if not raw.strip():
        return {}, None
    try:
        request = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
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


def gather(request):
    doc = {"v": 1, "errors": {}}
    limits = request_limits(request)

    def section(name, fn, *args):
        if not want(request, name):
            return
        try:
            doc[name] = fn(*args)
        except Exception as exc:  # one section's failure never sinks the document
            doc[name] = {"error": describe(exc)}
            doc["errors"][name] = doc[name]["error"]

    disks = request.get("disks")
    section("host", collect_host)
    section("gpus", collect_gpus, request)
    gpu_apps = doc.get("gpus", {}).get("apps", {}).get("rows", [])
    section("processes", collect_processes, request, limits, [row[1] for row in gpu_apps])
    section("disks", collect_disks, disks if isinstance(disks, list) else [])
    section("cgroup", collect_cgroup)
    section("logind", collect_logind)
    section("kernel", collect_kernel, limits)
    return doc


def main():
    started, cpu_start = time.monotonic(), os.times()
    stdout, sys.stdout = sys.stdout, sys.stderr  # nothing but the document reaches stdout
    request, problem = read_request(sys.stdin.buffer)
    doc = gather(request)
    if problem:
        doc["errors"]["request"] = problem
    cpu_end = os.times()
    doc["cpu_s"] = round(sum(cpu_end[:2]) - sum(cpu_start[:2]), 3)
    doc["probe_s"] = round(time.monotonic() - started, 3)
    body = json.dumps(doc, separators=(",", ":")).encode("ascii")
    stdout.buffer.write(zlib.compress(body, 6) if request.get("compress") is True else body)
    stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # do not wait for an NVML thread stuck in a hung driver


if __name__ == "__main__":
    main()
