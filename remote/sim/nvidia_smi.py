#!/usr/bin/env python3
"""gpuwatch's SIMULATED nvidia-smi: a stand-in for GPUs this machine does not have.

This is not NVIDIA's tool. gpuwatch's box simulator copies this file into ``BOX/bin/`` so the
probe, run over real SSH against a fixture box, meets an ``nvidia-smi`` that answers like a real
driver does. Every call re-reads ``sim/gpus.json`` (found through ``$GPUWATCH_SIM_DIR``, else
``../sim`` beside this file), so a test or the demo changes the GPUs by rewriting that file.

What it answers, formatted as real drivers print it (learnt from captured output of drivers
465-610, see tests/test_sim_nvidia_smi.py, which checks it byte for byte against them):

    --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]   [-i|--id=INDEX|UUID|BUS_ID,...]
    --query-compute-apps=F1,...  --format=...
    -L / --list-gpus, --version

Stdlib only, Python 3.6+, imports nothing of gpuwatch: it must start as fast as a bare python3.
"""

import json
import os
import sys
import time

MYPY = False
if MYPY:  # typing costs start-up time, so only the type checker imports it
    from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

    Spec = Tuple[str, str, FrozenSet[str]]
    Table = Dict[str, Spec]
    State = Dict[str, Any]

# ---------------------------------------------------------------------------------------------
# How each field prints. Kinds: value types in gpus.json and their rendering.
STR = "str"  # printed verbatim (names, versions, PCI ids like 0x233010DE, P-states)
INT = "int"  # integer; "81559 MiB" with units, "81559" without
F2 = "f2"  # two decimals; "700.00 W"
HEX16 = "hex16"  # integer bitmask; "0x0000000000000004"
ENABLED = "enabled"  # bool -> Enabled / Disabled
YESNO = "yesno"  # bool -> Yes / No
TIME = "time"  # epoch seconds -> "2026/07/14 09:00:44.742" (local time); a string verbatim
REASON = "reason"  # derived from clocks_event_reasons.active: Active / Not Active

# Fields whose "not available" prints bare "N/A" rather than "[N/A]" (seen in every capture).
PLAIN_NA = "plain_na"

# NVML's nvmlClocksEventReason* bits (the old nvmlClocksThrottleReason* values are the same).
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

# Drivers from R535 on name the throttle fields clocks_event_reasons.* and keep
# clocks_throttle_reasons.* as an alias ("X" or "Y" in --help-query-gpu); older drivers know only
# clocks_throttle_reasons.*. The header shows the driver's own name either way.
EVENT_REASONS_SINCE = 535


def _gpu_fields() -> "Table":
    """Build the --query-gpu table: canonical name -> (unit, kind, flags)."""
    t = {}  # type: Table

    def add(names: str, unit: str, kind: str, *flags: str, prefix: str = "") -> None:
        for n in names.split():
            t[prefix + n] = (unit, kind, frozenset(flags))

    add("timestamp", "", TIME)
    add("driver_version kmd_version vgpu_driver_capability.heterogenous_multivGPU", "", STR)
    add("count index", "", INT)
    add("name serial uuid pci.bus_id pci.domain pci.bus pci.device pci.baseClass pci.subClass"
        " pci.device_id pci.sub_device_id", "", STR)
    add("fractional_multiVgpu heterogeneous_timeSlice_profile heterogeneous_timeSlice_sizes"
        " homogeneous_placements mig_timeSlicing mig_timeSlicing_mode", "", STR,
        prefix="vgpu_device_capability.")
    add("pcie.link.gen.current pcie.link.gen.gpucurrent pcie.link.gen.max pcie.link.gen.gpumax"
        " pcie.link.gen.hostmax pcie.link.width.current pcie.link.width.max", "", INT)
    add("display_mode display_active persistence_mode accounting.mode", "", ENABLED)
    add("display_attached", "", YESNO)
    add("addressing_mode driver_model.current driver_model.pending vbios_version inforom.img"
        " inforom.oem inforom.ecc inforom.pwr inforom.checksum_validation gpu_recovery_action"
        " gom.current gom.pending pstate compute_mode compute_cap", "", STR)
    add("accounting.buffer_size", "", INT)
    add("fan.speed", "%", INT)
    add("supported active", "", HEX16, prefix="clocks_event_reasons.")
    add(" ".join(REASON_BITS), "", REASON, prefix="clocks_event_reasons.")
    add("sw_power_cap sync_boost sw_thermal_slowdown hw_thermal_slowdown hw_power_brake_slowdown",
        "us", INT, prefix="clocks_event_reasons_counters.")
    add("total reserved used free", "MiB", INT, prefix="memory.")
    add("gpu memory encoder decoder jpeg ofa", "%", INT, prefix="utilization.")
    add("sessionCount averageFps averageLatency", "", INT, prefix="encoder.stats.")
    add("dramEncryption.mode.current dramEncryption.mode.pending ecc.mode.current"
        " ecc.mode.pending", "", ENABLED)
    for fix in ("corrected", "uncorrected"):
        for span in ("volatile", "aggregate"):
            add("device_memory dram register_file l1_cache l2_cache texture_memory cbu sram total",
                "", INT, prefix="ecc.errors.%s.%s." % (fix, span))
    add("volatile.sram.parity volatile.sram.secded aggregate.sram.parity aggregate.sram.secded"
        " aggregate.sram.l2 aggregate.sram.sm aggregate.sram.mcu aggregate.sram.pcie"
        " aggregate.sram.other", "", INT, prefix="ecc.errors.uncorrected.")
    add("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded", "", YESNO)
    add("retired_pages.single_bit_ecc.count retired_pages.double_bit.count", "", INT)
    add("retired_pages.pending remapped_rows.pending remapped_rows.failure", "", YESNO)
    add("correctable correctable_inactive uncorrectable uncorrectable_inactive histogram.max"
        " histogram.high histogram.partial histogram.low histogram.none", "", INT,
        prefix="remapped_rows.")
    add("temperature.gpu temperature.gpu.tlimit", "", INT)
    add("temperature.memory", "", INT, PLAIN_NA)
    add("power.management", "", ENABLED)
    add("power.draw power.draw.average power.draw.instant power.limit enforced.power.limit"
        " power.default_limit power.min_limit power.max_limit module.power.draw.average"
        " module.power.draw.instant module.power.limit module.enforced.power.limit"
        " module.power.default_limit module.power.min_limit module.power.max_limit"
        " gpu.base.current gpu.base.requested gpu.base.default gpu.base.min gpu.base.max", "W",
        F2)
    # power_smoothing.*: every capture says [N/A]; the value formats below follow the units in
    # their headers (W and % as power.* and edpp_multiplier print, ms as an integer): a guess.
    ps = "power_smoothing."
    add("tmp_floor tmp_ceil primary_power_floor secondary_power_floor"
        " min_primary_floor_activation_offset min_primary_floor_activation_point"
        " curr_profile.secondary_power_floor curr_profile.primary_floor_act_offset"
        " admin_override.secondary_power_floor admin_override.primary_floor_act_offset",
        "W", F2, prefix=ps)
    add("hw_lifetime_remaining_percent max_percent_tmp_floor min_percent_tmp_floor"
        " curr_profile.percent_tmp_floor admin_override.percent_tmp_floor", "%", F2, prefix=ps)
    add("curr_profile.ramp_up_rate curr_profile.ramp_down_rate admin_override.ramp_up_rate"
        " admin_override.ramp_down_rate", "W/s", F2, prefix=ps)
    add("window_multiplier curr_profile.ramp_down_hysteresis"
        " admin_override.ramp_down_hysteresis", "ms", INT, prefix=ps)
    add("num_preset_profiles priv_level active_profile"
        " curr_profile.primary_floor_act_window_multiplier"
        " curr_profile.primary_floor_tar_window_multiplier"
        " admin_override.primary_floor_act_window_multiplier"
        " admin_override.primary_floor_tar_window_multiplier", "", INT, prefix=ps)
    add("enabled soc_power_smoothing_enabled imm_ramp_down", "", ENABLED, prefix=ps)
    add("delayed_power_smoothing_supported", "", STR, prefix=ps)
    add("edpp_multiplier", "%", F2)
    add("current.graphics current.sm current.memory current.video applications.graphics"
        " applications.memory default_applications.graphics default_applications.memory"
        " max.graphics max.sm max.memory", "MHz", INT, prefix="clocks.")
    add("mig.mode.current mig.mode.pending gsp.mode.current gsp.mode.default c2c.mode", "",
        ENABLED)
    add("total used free", "MiB", INT, prefix="protected_memory.")
    add("fabric.state fabric.status fabric.clusterUuid", "", STR, PLAIN_NA)
    add("fabric.cliqueId", "", INT, PLAIN_NA)
    add("summary bandwidth route_recovery_in_progress route_unhealthy access_timeout_recovery"
        " incorrect_configuration partition_assigned", "", STR, PLAIN_NA,
        prefix="fabric.health.")
    add("platform.chassis_serial_number platform.peer_type hostname", "", STR)
    add("platform.slot_number platform.tray_index platform.host_id platform.module_id", "", INT)
    add("platform.gpu_fabric_guid", "", HEX16)
    add("bbx.time_run", "seconds", INT)
    return t


GPU_FIELDS = _gpu_fields()

# "X" or "Y" in --help-query-gpu: Y is an alias, the header prints X.
GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "inforom.image": "inforom.img",
    "inforom.power": "inforom.pwr",
    "gpu_operation_mode.current": "gom.current",
    "gpu_operation_mode.pending": "gom.pending",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
    "clocks.default_applications.gr": "clocks.default_applications.graphics",
    "clocks.default_applications.mem": "clocks.default_applications.memory",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
}

APP_FIELDS = {  # type: Table
    "timestamp": ("", TIME, frozenset()),
    "gpu_name": ("", STR, frozenset()),
    "gpu_bus_id": ("", STR, frozenset()),
    "gpu_serial": ("", STR, frozenset()),
    "gpu_uuid": ("", STR, frozenset()),
    "pid": ("", INT, frozenset()),
    "process_name": ("", STR, frozenset()),
    "used_gpu_memory": ("MiB", INT, frozenset()),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}
# A compute app's gpu_* columns come from the GPU it runs on.
APP_FROM_GPU = {"gpu_name": "name", "gpu_bus_id": "pci.bus_id", "gpu_serial": "serial",
                "gpu_uuid": "uuid"}

EXIT_INVALID_ARGUMENT = 2  # NVML_ERROR_INVALID_ARGUMENT: what a bad field or option returns
EXIT_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: -i named no GPU of this box
EXIT_DRIVER_NOT_LOADED = 9  # NVML_ERROR_DRIVER_NOT_LOADED
DRIVER_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.")
BAD_ARGUMENTS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
EXIT_GPU_LOST = 15  # nvidia-smi(1): "GPU has fallen off the bus or has otherwise become
#                     inaccessible" (NVML_ERROR_GPU_IS_LOST)
EXIT_LIB_RM_VERSION_MISMATCH = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH, as seen on boxes
# The failures of a driver in trouble: what the real tool prints (on stdout) and its exit status,
# as users have reported them after an unattended driver upgrade, an unloaded module, or no GPU.
DRIVER_FAULTS = {
    "mismatch": (EXIT_LIB_RM_VERSION_MISMATCH,
                 "Failed to initialize NVML: Driver/library version mismatch\n"
                 "NVML library version: {library}"),
    "not_loaded": (EXIT_DRIVER_NOT_LOADED, DRIVER_FAILED),
    "no_devices": (EXIT_NOT_FOUND, "No devices were found"),
}
LOST = "Unable to determine the device handle for GPU {bus}: Unknown Error"


class UsageError(Exception):
    """A command line the real tool would refuse; the message is what it prints."""

    def __init__(self, message: str, status: int = EXIT_INVALID_ARGUMENT) -> None:
        Exception.__init__(self, message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# Values: typed in gpus.json, rendered here; parse_value() is the inverse (used by the tests to
# turn a real capture into a state, and by nobody on a box).

def driver_major(version: object) -> int:
    """510 from "510.47.03"; 0 when it is not a version."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def format_time(value: "Any") -> str:
    """nvidia-smi's timestamp: local time, milliseconds."""
    if isinstance(value, str):
        return value
    secs = float(value)
    ms = int(round((secs - int(secs)) * 1000))
    if ms == 1000:
        secs, ms = secs + 1, 0
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(int(secs))) + ".%03d" % ms


def render(spec: "Spec", value: "Any", units: bool) -> str:
    """One value as the real tool prints it. Errors are {"error": "Not Supported"}."""
    unit, kind, flags = spec
    if value is None:
        return "N/A" if PLAIN_NA in flags else "[N/A]"
    if isinstance(value, dict):
        return "[%s]" % value.get("error", "Unknown Error")
    if kind == TIME:
        return format_time(value)
    if isinstance(value, bool):
        if kind == YESNO:
            return "Yes" if value else "No"
        if kind == REASON:
            return "Active" if value else "Not Active"
        return "Enabled" if value else "Disabled"
    if kind == HEX16 and isinstance(value, int):
        return "0x%016X" % value
    if kind in (INT, F2) and isinstance(value, (int, float)):
        text = "%d" % value if kind == INT else "%.2f" % value
        return text + " " + unit if units and unit else text
    return str(value)


def parse_value(spec: "Spec", text: str) -> "Any":
    """The typed value behind one printed value (the inverse of render)."""
    unit, kind, flags = spec
    if text == "[N/A]" or (text == "N/A" and PLAIN_NA in flags):
        return None
    if text.startswith("[") and text.endswith("]"):
        return {"error": text[1:-1]}
    if kind in (INT, F2) and unit and text.endswith(" " + unit):
        text = text[: -len(unit) - 1]
    try:
        if kind == INT:
            return int(text)
        if kind == F2:
            return float(text)
        if kind == HEX16:
            return int(text, 16)
    except ValueError:
        return text
    words = {ENABLED: ("Enabled", "Disabled"), YESNO: ("Yes", "No"),
             REASON: ("Active", "Not Active")}.get(kind)
    if words and text in words:
        return text == words[0]
    return text


# ---------------------------------------------------------------------------------------------
def sim_dir() -> str:
    """Where gpus.json lives: $GPUWATCH_SIM_DIR, else BOX/sim beside BOX/bin/nvidia-smi."""
    env = os.environ.get("GPUWATCH_SIM_DIR")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim")


def load_state(directory: "Optional[str]" = None) -> "State":
    """The box's GPU state; a box without gpus.json has a driver but no GPU."""
    path = os.path.join(directory or sim_dir(), "gpus.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {"gpus": []}


def gpu_table(state: "State") -> "Tuple[Table, Dict[str, str]]":
    """Field table and aliases for this state's driver (old drivers: throttle names only)."""
    table = dict(GPU_FIELDS)
    aliases = dict(GPU_ALIASES)
    new = driver_major(state.get("driver_version", "")) >= EVENT_REASONS_SINCE
    for name in list(table):
        if name.startswith("clocks_event_reasons"):
            old = name.replace("clocks_event_reasons", "clocks_throttle_reasons", 1)
            if new:
                aliases[old] = name
            else:
                table[old] = table.pop(name)
    for name in state.get("invalid_fields", ()):
        table.pop(name, None)
        aliases.pop(name, None)
    return table, aliases


def resolve(requested: str, table: "Table", aliases: "Dict[str, str]") -> "List[str]":
    """Canonical names for a --query-*= list, or UsageError naming the first bad one."""
    out = []
    for name in requested.split(","):
        name = name.strip()
        canon = aliases.get(name, name)
        if canon not in table:
            raise UsageError('Field "%s" is not a valid field to query.\n' % name)
        out.append(canon)
    return out


def state_key(name: str) -> str:
    """The key gpus.json uses for a field: throttle reasons under their new (event) name."""
    if name.startswith("clocks_throttle_reasons"):
        return "clocks_event_reasons" + name[len("clocks_throttle_reasons"):]
    return name


def gpu_value(state: "State", gpus: "List[State]", index: int, gpu: "State", name: str,
              now: float) -> "Any":
    """A GPU field's value: the state's, else derived (count, index, reasons, timestamp)."""
    key = state_key(name)
    if key in gpu:
        return gpu[key]
    if key == "timestamp":
        return now
    if key == "count":
        return len(gpus)
    if key == "index":
        return index
    if key in ("driver_version", "kmd_version"):
        return state.get("driver_version")
    if key.startswith("clocks_event_reasons."):
        active = gpu.get("clocks_event_reasons.active")
        if active is None or isinstance(active, dict):
            return active
        return bool(active & REASON_BITS[key.split(".", 1)[1]])
    return None


def select(gpus: "List[State]", ids: "Optional[str]") -> "List[Tuple[int, State]]":
    """(index, gpu) pairs chosen by -i: an index, a UUID or a PCI bus id, comma-separated."""
    pairs = list(enumerate(gpus))
    if ids is None:
        return pairs
    chosen = []
    for ident in ids.split(","):
        for i, g in pairs:
            if ident in (str(g.get("index", i)), g.get("uuid"), g.get("pci.bus_id")):
                chosen.append((i, g))
                break
        else:
            raise UsageError("No devices were found\n", EXIT_NOT_FOUND)
    return chosen


def csv_lines(names: "List[str]", table: "Table", rows: "Sequence[Sequence[Any]]",
              fmt: str) -> "List[str]":
    """Header and rows as nvidia-smi prints CSV: ", " between values, units per the format."""
    opts = [o.strip() for o in fmt.split(",")]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        raise UsageError(BAD_ARGUMENTS + "\n")
    units = "nounits" not in opts
    lines = []
    if "noheader" not in opts:
        # The header keeps its units even with nounits (see netdata's tesla-p100.csv capture).
        lines.append(", ".join(n + (" [%s]" % table[n][0] if table[n][0] else "")
                               for n in names))
    for row in rows:
        lines.append(", ".join(render(table[n], row[k], units) for k, n in enumerate(names)))
    return lines


def query_gpu(state: "State", fields: str, fmt: str, ids: "Optional[str]") -> "List[str]":
    table, aliases = gpu_table(state)
    names = resolve(fields, table, aliases)
    gpus = state.get("gpus", [])
    now = time.time()
    lost = lost_gpus(state)
    chosen = select(gpus, ids)
    rows = [[gpu_value(state, gpus, i, g, n, now) for n in names] for i, g in chosen
            if i not in lost]
    lines = csv_lines(names, table, rows, fmt)
    # The GPUs that answer print their rows, then a line for each lost one (U22).
    return lines + [LOST.format(bus=g.get("pci.bus_id", "")) for i, g in chosen if i in lost]


def query_apps(state: "State", fields: str, fmt: str, ids: "Optional[str]") -> "List[str]":
    names = resolve(fields, APP_FIELDS, APP_ALIASES)
    gpus = state.get("gpus", [])
    chosen = {i for i, _ in select(gpus, ids)}
    now = time.time()
    rows = []
    for app in state.get("compute_apps", []):
        i = app.get("gpu", 0)
        if i not in chosen or i >= len(gpus) or i in lost_gpus(state):
            continue
        if app.get("follows_pid") and not process_lives(app.get("pid")):
            continue  # a real driver frees a context when its process exits
        row = []
        for n in names:
            if n in app:
                row.append(app[n])
            elif n in APP_FROM_GPU:
                row.append(gpus[i].get(APP_FROM_GPU[n]))
            elif n == "timestamp":
                row.append(now)
            else:
                row.append(None)
        rows.append(row)
    return csv_lines(names, APP_FIELDS, rows, fmt)


def process_lives(pid: "Any") -> bool:
    """For an app added with follows_pid=True (a real pid, Box(real_proc=True)): is that process
    still alive in this machine's /proc? Exited (gone, or a zombie) means its VRAM is free."""
    try:
        with open("/proc/%d/stat" % int(pid), "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except (OSError, TypeError, ValueError):
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def list_gpus(state: "State") -> "List[str]":
    """-L: one line per GPU, its MIG devices indented below it."""
    lines = []
    for i, g in enumerate(state.get("gpus", [])):
        lines.append("GPU %d: %s (UUID: %s)" % (i, g.get("name"), g.get("uuid")))
        for j, mig in enumerate(g.get("mig_devices", [])):
            lines.append("  MIG %-11s Device %2d: (UUID: %s)" % (mig.get("profile"), j,
                                                                mig.get("uuid")))
    return lines


def version(state: "State") -> "List[str]":
    drv = str(state.get("driver_version", ""))
    return [
        "NVIDIA-SMI version  : " + drv,
        "NVML version        : " + ".".join(drv.split(".")[:2]),
        "DRIVER version      : " + drv,
        "CUDA Version        : " + str(state.get("cuda_version", "")),
        "(gpuwatch simulator: a stand-in nvidia-smi for tests and the demo; no GPU was asked)",
    ]


def parse_args(argv: "Sequence[str]") -> "Dict[str, Any]":
    """The few options this stand-in knows, in either "--opt=v" or "--opt v" spelling."""
    opts = {}  # type: Dict[str, Any]
    it = iter(argv)
    for arg in it:
        key, eq, val = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            value = val if eq else next(it, None)
            if value is None:
                raise UsageError(BAD_ARGUMENTS + "\n")
            opts["--id" if key == "-i" else key] = value
        elif arg in ("-L", "--list-gpus", "--version", "-h", "--help"):
            opts[arg] = True
        else:
            raise UsageError(BAD_ARGUMENTS + "\n")
    return opts


def run(argv: "Sequence[str]", state: "State") -> "Tuple[int, str]":
    """(exit status, stdout text) for one invocation against a loaded state."""
    faults = state.get("faults") or {}
    if faults.get("hang"):
        while True:  # a wedged driver: only a timeout gets the caller out (U16, U17)
            time.sleep(3600)
    if faults.get("delay_s"):
        time.sleep(float(faults["delay_s"]))
    if faults.get("fail"):
        msg = faults["fail"] if isinstance(faults["fail"], str) else DRIVER_FAILED
        return int(faults.get("fail_exit", EXIT_DRIVER_NOT_LOADED)), msg + "\n"
    if faults.get("driver") in DRIVER_FAULTS:
        status, msg = DRIVER_FAULTS[faults["driver"]]
        library = "%s.%s" % (driver_major(state.get("driver_version")) + 5, 65)
        return status, msg.format(library=library) + "\n"
    lost = lost_gpus(state)
    try:
        opts = parse_args(argv)
        if "--version" in opts:
            lines = version(state)
        elif "-L" in opts or "--list-gpus" in opts:
            lines = list_gpus(state)
        elif "--query-gpu" in opts or "--query-compute-apps" in opts:
            if "--format" not in opts:
                raise UsageError(BAD_ARGUMENTS + "\n")
            if "--query-gpu" in opts:
                lines = query_gpu(state, opts["--query-gpu"], opts["--format"], opts.get("--id"))
            else:
                lines = query_apps(state, opts["--query-compute-apps"], opts["--format"],
                                   opts.get("--id"))
        else:
            lines = [__doc__.strip()]
    except UsageError as exc:
        return exc.status, str(exc) + "\n"
    return (EXIT_GPU_LOST if lost else 0), "".join(line + "\n" for line in lines)


def lost_gpus(state: "State") -> "List[int]":
    """Indexes of GPUs that fell off the bus (faults.lost): they answer no query."""
    lost = (state.get("faults") or {}).get("lost") or []
    return [i for i in lost if isinstance(i, int)]


def main(argv: "Optional[Sequence[str]]" = None) -> int:
    status, out = run(sys.argv[1:] if argv is None else argv, load_state())
    sys.stdout.write(out)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
