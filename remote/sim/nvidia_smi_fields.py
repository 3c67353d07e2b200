"""The fields of gpuwatch's SIMULATED nvidia-smi (nvidia_smi.py): what each query field is, how
a real driver prints it, and the exit codes and messages of its failures.

Stdlib only, Python 3.6+, imports nothing of gpuwatch: the box simulator copies it beside the
stand-in (BOX/bin/nvidia_smi_fields.py), which imports it from there.
"""

import time

MYPY = False
if MYPY:  # typing costs start-up time, so only the type checker imports it
    from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple  # noqa: F401

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
