"""The gpus section: nvidia-smi's CSV, and the choice between it and NVML (gpus_nvml).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])


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
            return [name for bit, name in base.REASON_BITS if bits & bit]
    named = [name for _, name in base.REASON_BITS if "clocks_event_reasons." + name in row]
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
        code, out, err = base.run_bounded(
            ["nvidia-smi", "--query-gpu=" + ",".join(query), "--format=csv,noheader,nounits"],
            deadline - time.monotonic())
        lost = lost_gpu_lines(out + "\n" + err)
        if code == 0 or lost:
            devices = [gpu_row(row) for row in parse_smi_csv(out, query)]
            if devices or code == 0:  # the GPUs that answered stand beside the lost ones
                return family, devices, lost
        if not is_invalid_field_error(out + err):
            said = base.first_line(out + "\n" + err)
            raise base.ProbeFailure("nvidia-smi exited %d: %s" % (code, said),
                               {"exit": code, "said": said, "lost": lost})
    raise base.ProbeFailure(
        "nvidia-smi knows neither clocks_event_reasons nor clocks_throttle_reasons")


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


def collect_gpus_smi(hint, deadline):
    family, devices, lost = smi_gpus(hint, deadline)
    section = {"source": "nvidia-smi", "reasons": family,
               "devices": base.table(base.GPU_FIELDS, devices)}
    if lost:
        section["lost"] = lost
    try:
        section["apps"] = base.table(base.APP_FIELDS, smi_apps(deadline))
    except base.ProbeFailure as exc:  # the GPU table stands without the process list
        section["apps_error"] = base.describe(exc)
    return section




def collect_gpus(request):
    timeout_s = base.number_setting(request, "nvidia_smi_timeout_s",
                                    base.DEFAULT_NVIDIA_SMI_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    nvml_problem, importable, checked, home = None, False, True, None
    if base.SIM_DIR:
        nvml_problem = "simulated box: GPUs come from the stand-in nvidia-smi"
    elif not base.want(request, "nvml"):  # the client asks again now and then (collect.py)
        checked = False
    else:
        nvml = base.optional("gpus_nvml")  # the NVML reader
        try:
            if nvml is not None:
                pynvml, home = nvml.import_pynvml_from(request.get("pynvml_dir"))
            else:
                base.load_site()
                import pynvml
        except ImportError:
            nvml_problem = "pynvml not importable"
        else:
            importable = True
            if nvml is None:  # sent only where pynvml imports
                nvml_problem = "pynvml imports now: NVML is read from the next poll on"
            else:
                try:
                    asked = time.monotonic()
                    section = nvml.call_with_deadline(lambda: nvml.collect_gpus_nvml(pynvml),
                                                      timeout_s)
                    section["pynvml"], section["pynvml_dir"] = True, home
                    section["query_s"] = round(time.monotonic() - asked, 3)
                    return section
                except Exception as exc:  # no driver library, no GPU, hung: try nvidia-smi
                    nvml_problem = base.describe(exc)
    started = time.monotonic()
    try:
        section = collect_gpus_smi(request.get("nvidia_smi_reasons"), deadline)
    except base.ProbeFailure as exc:  # said loudly by the client: a wedged driver is not "no GPU"
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


