"""The NVIDIA GPU source that runs nvidia-smi: its CSV, read by field name, a field this
driver lacks left out of the query (and out of every later one) rather than failing it.

Keeps the contract of gpus/section.py. Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(
    __package__.rpartition(".")[0] + ".base", fromlist=["_"])
section = base.load_module("gpus/section")


# ---------------------------------------------------------------- nvidia-smi

SMI_APP_QUERY = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
NA_VALUES = ("", "N/A", "ERR!", "Unknown Error", "Not Supported")
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


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


def parse_smi_csv(text, fields):
    """nvidia-smi --format=csv,noheader output → list of {field: raw value}, a field asked by
    its older name (OLDER) under its own. (A header's units and aliases, which the probe never
    asks for, are the tests' to read: tests/harness/smi_capture.py.) nvidia-smi does not quote,
    so the last column (a process name) may hold commas: split at most len(fields)-1 times; a
    line of another length is no row."""
    newer = dict((old, new) for new, old in OLDER.items())
    names = [newer.get(f, f) for f in fields]
    rows = []
    for line in text.splitlines():
        cells = line.split(",", len(names) - 1)
        if line.strip() and len(cells) == len(names):
            rows.append(dict(zip(names, (cell.strip() for cell in cells))))
    return rows


def decode_reasons(row):
    """Active clock event reasons, from the bitmask (None where the driver did not say)."""
    mask = smi_value(row.get("clocks_event_reasons.active", ""))
    try:
        bits = int(mask, 16) if mask is not None else None
    except ValueError:
        bits = None
    return None if bits is None else [name for bit, name in section.REASON_BITS if bits & bit]


def read_field(row, names, kind):
    """One field of a GPU row from the nvidia-smi fields `names`, read as `kind`: n a number,
    t text (the recovery action's words too: the client reads them, model.gpu.recovery_name),
    e a bool ('Enabled' / 'Disabled', 'Yes' / 'No'), r the reasons, h a list of numbers (the
    histogram)."""
    if kind == "n":
        return smi_number(row.get(names[0]))
    if kind == "r":
        return decode_reasons(row)
    if kind == "h":
        counts = [smi_number(row.get(name)) for name in names]
        return None if all(c is None for c in counts) else counts
    value = smi_value(row.get(names[0]) or "")
    if kind == "e":
        return None if value is None else value in ("Enabled", "Yes", "Active", "Pending")
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
recovery gpu_recovery_action t
pcie_gen pcie.link.gen.gpucurrent n
pcie_gen_max pcie.link.gen.max n
pcie_width pcie.link.width.current n
pcie_width_max pcie.link.width.max n
""".replace(" H ", " remapped_rows.histogram." + ",remapped_rows.histogram.".join(
    ("max", "high", "partial", "low", "none")) + " ").strip().splitlines())
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
    return {field: read_field(row, names.split(","), kind) for field, names, kind in GPU_QUERY}


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
    devices, lost, lacks = smi_gpus(hints, deadline)
    out = {"source": "nvidia-smi", "vendor": "nvidia", "devices": section.keyed_table(devices)}
    hints = section.mig_hint(hints, devices)
    if lacks:
        hints["lacks"] = ",".join(lacks)
    if hints:
        out["hints"] = hints
    if lost:
        out["lost"] = lost
    try:
        apps = smi_apps(deadline)
    except base.ProbeFailure as exc:  # the GPU table stands without the process list
        apps = None
        out["apps_error"] = base.describe(exc)
    mig = base.optional("gpus/mig")
    if mig is not None:
        mig.add_smi(out, devices, apps or (), deadline)
    if apps is not None:
        out["apps"] = section.keyed_table(apps)
    return out
