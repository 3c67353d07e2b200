"""The NVIDIA GPU source that runs nvidia-smi: its CSV, read by field name, a field this
driver lacks left out of the query (and out of every later one) rather than failing it.

Keeps the contract of gpus/section.py. Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(
    __package__.rpartition(".")[0] + ".base", fromlist=["_"])


# ---------------------------------------------------------------- nvidia-smi

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


def read_field(row, names, kind):
    """One field of a GPU row from the nvidia-smi fields `names`, read as `kind`: n a number
    (the first of the names that has one), t text, e a bool ('Enabled' / 'Disabled', 'Yes' /
    'No'), r the reasons, a the recovery action, h a list of numbers (the histogram)."""
    if kind == "n":
        return first_number(row, *names)
    if kind == "r":
        return decode_reasons(row)
    if kind == "h":
        counts = [smi_number(row.get(name)) for name in names]
        return None if all(c is None for c in counts) else counts
    value = smi_value(row.get(names[0]) or "")
    if kind == "e":
        return None if value is None else value in ("Enabled", "Yes", "Active", "Pending")
    if kind == "a" and value is not None:
        # gpu_recovery_action's words ('None', 'Reset', 'Reboot', 'Drain P2P', ...) → a name
        # of model.gpu.RECOVERY_ACTIONS; words it does not know kept, as lower_case
        word = "_".join(value.lower().replace("-", " ").split())[:40]
        return {"reset": "gpu_reset", "reboot": "node_reboot"}.get(word, word)
    return value


# Each field of a GPU row: its name, the nvidia-smi fields asked for it (comma-separated; H:
# the five remapped_rows.histogram.* fields), how they are read (read_field). A field the
# driver lacks is asked by its older name (OLDER), or left out of the query (smi_gpus) and its
# reader finds nothing: None. pci_bus_id: what an Xid line names the GPU by (U22); persistence
# mode off: each query re-initialises the GPUs; utilization.gpu is [N/A] under MIG.
GPU_QUERY = tuple(line.split() for line in """
index index n
uuid uuid t
name name t
util_pct utilization.gpu n
mem_used_mib memory.used n
mem_total_mib memory.total n
sm_clock_mhz clocks.sm n
sm_clock_max_mhz clocks.max.sm n
power_w power.draw n
power_limit_w enforced.power.limit n
temp_c temperature.gpu n
throttle_reasons clocks_event_reasons.active r
mig mig.mode.current e
pci_bus_id pci.bus_id t
persistence persistence_mode e
ecc_corr_vol ecc.errors.corrected.volatile.total n
ecc_unc_vol ecc.errors.uncorrected.volatile.total n
ecc_corr_agg ecc.errors.corrected.aggregate.total n
ecc_unc_agg ecc.errors.uncorrected.aggregate.total n
retired_sbe retired_pages.single_bit_ecc.count n
retired_dbe retired_pages.double_bit.count n
retired_pending retired_pages.pending e
remap_corr remapped_rows.correctable n
remap_unc remapped_rows.uncorrectable n
remap_pending remapped_rows.pending e
remap_failed remapped_rows.failure e
remap_hist H h
recovery gpu_recovery_action a
pcie_gen pcie.link.gen.gpucurrent n
pcie_gen_max pcie.link.gen.max n
pcie_width pcie.link.width.current n
pcie_width_max pcie.link.width.max n
""".replace(" H ", " remapped_rows.histogram." + ",remapped_rows.histogram.".join(
    ("max", "high", "partial", "low", "none")) + " ").strip().splitlines())
# Read where a row has them, never asked: power.draw and enforced.power.limit are in every
# capture from driver 465 to 610; power.draw.instant/average only on newer drivers.
READ_ALSO = {"power_w": ",power.draw.average,power.draw.instant",
             "power_limit_w": ",power.limit", "pcie_gen": ",pcie.link.gen.current"}
# A field's name on drivers older than it: clocks_event_reasons.* came with R535 (older drivers
# know the throttle family only), pcie.link.gen.gpucurrent with R550.
OLDER = {"clocks_event_reasons.active": "clocks_throttle_reasons.active",
         "pcie.link.gen.gpucurrent": "pcie.link.gen.current"}
REQUIRED = ("index",)
"""Without these a row is nothing: a driver that lacks one fails the query."""
SMI_GPU_QUERY = tuple(name for _, names, _ in GPU_QUERY for name in names.split(","))
"""Every field the query asks for, on a driver that has them all."""


def gpu_row(row):
    """One nvidia-smi row (any driver, units or not) → a GPU row keyed by field name."""
    return {field: read_field(row, (names + READ_ALSO.get(field, "")).split(","), kind)
            for field, names, kind in GPU_QUERY}


def app_row(row):
    return {"uuid": smi_value(row.get("gpu_uuid", "")), "pid": smi_number(row.get("pid")),
            "gpu_mem_mib": smi_number(row.get("used_gpu_memory")),
            "process_name": smi_value(row.get("process_name", ""))}


def invalid_field(text):
    """The field nvidia-smi refused: 'Field "X" is not a valid field to query.' → X; None where
    it does not say which."""
    for line in text.splitlines():
        if "not a valid field" in line.lower() and line.count('"') >= 2:
            return line.split('"')[1].strip()
    return None


MAX_RETRIES = 6
"""Queries a poll may spend finding the fields this driver lacks (each is remembered)."""


def smi_query(lacks):
    query = []
    for name in SMI_GPU_QUERY:
        name = OLDER.get(name, name) if name in lacks else name
        if name not in lacks:
            query.append(name)
    return query


def smi_gpus(hints, deadline):
    """Query GPUs with every field this driver has: a field it refuses ("is not a valid field
    to query": a driver older or newer than the field) is asked by its older name or left out,
    and the query asked again, the rest standing (that field None) → (rows, lost lines, the
    fields it lacks). `hints["lacks"]`: those the last poll learnt (comma-separated), so a
    driver pays the lesson once."""
    told = hints.get("lacks")
    lacks = set(told.split(",") if isinstance(told, str) else ())
    for _ in range(MAX_RETRIES + 1):
        query = smi_query(lacks)
        code, out, err = base.run_bounded(
            ["nvidia-smi", "--query-gpu=" + ",".join(query), "--format=csv,noheader,nounits"],
            deadline - time.monotonic())
        said = out + "\n" + err
        lost = lost_gpu_lines(said)
        if code == 0 or lost:
            devices = [gpu_row(row) for row in parse_smi_csv(out, query)]
            if devices or code == 0:  # the GPUs that answered stand beside the lost ones
                return devices, lost, sorted(lacks)
        bad = invalid_field(said)
        if bad is None:
            first = base.first_line(said)
            raise base.ProbeFailure("nvidia-smi exited %d: %s" % (code, first),
                                    {"exit": code, "said": first, "lost": lost})
        if bad not in query or bad in REQUIRED:
            break
        lacks.add(bad)
    raise base.ProbeFailure("nvidia-smi refuses the fields it is asked for: %s"
                            % base.first_line(said), {"exit": code})


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
                   for name in os.listdir(base.DEVFS))
    except OSError:
        return None


def smi_apps(deadline):
    code, out, err = base.run_bounded(
        ["nvidia-smi", "--query-compute-apps=" + ",".join(SMI_APP_QUERY),
         "--format=csv,noheader,nounits"], deadline - time.monotonic())
    if code != 0 and not lost_gpu_lines(out + "\n" + err):  # a lost GPU's line: the rest stand
        raise base.ProbeFailure("nvidia-smi compute-apps exited %d: %s"
                                % (code, base.first_line(out + err)))
    return [app_row(row) for row in parse_smi_csv(out, SMI_APP_QUERY)]


def read(hints, deadline):
    """The gpus section from nvidia-smi (the contract: gpus/section.py)."""
    section_module = base.load_module("gpus/section")
    devices, lost, lacks = smi_gpus(hints, deadline)
    section = {"source": "nvidia-smi", "vendor": "nvidia",
               "devices": section_module.keyed_table(devices)}
    hints = section_module.mig_hint(hints, devices)
    if lacks:
        hints["lacks"] = ",".join(lacks)
    if hints:
        section["hints"] = hints
    if lost:
        section["lost"] = lost
    try:
        apps = smi_apps(deadline)
    except base.ProbeFailure as exc:  # the GPU table stands without the process list
        apps = None
        section["apps_error"] = base.describe(exc)
    mig = base.optional("gpus/mig") if any(d["mig"] for d in devices) else None
    if mig is not None:
        try:
            rows, owners = mig.read_smi(deadline)
        except base.ProbeFailure as exc:  # the GPUs stand without their instances
            section["mig_error"] = base.describe(exc)
        else:
            section["mig"] = section_module.keyed_table(rows)
            mig.place_apps(apps or (), owners, dict((d["index"], d["uuid"]) for d in devices))
    if apps is not None:
        section["apps"] = section_module.keyed_table(apps)
    return section
