"""MIG instances of the NVIDIA GPUs that have MIG on, for both NVIDIA sources: the rows of the
gpus section's "mig" table (gpus/section.py) and which instance each compute process runs in.

From nvidia-smi: its default table's "MIG devices" block (GPU, GPU instance, compute instance,
MIG device, memory, SMs) and "Processes" block (each pid's GPU and compute instance: the
`--query-compute-apps` fields have no instance on driver 580), with `-L` for each MIG device's
profile and UUID. From NVML: each MIG device handle of the GPU. Sent only to a poll whose host
said it has a MIG GPU (the source's hint "mig", wire/bundle.py MIG): most boxes pay nothing.

A MIG instance's utilisation is not reported by the driver (nvidia-smi prints N/A, pmon "-",
NVML says Not Supported on a MIG device): its row carries util_pct only where the driver gave
one.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(
    __package__.rpartition(".")[0] + ".base", fromlist=["_"])

FIELDS = ("gpu", "gi", "ci", "dev", "profile", "uuid", "mem_used_mib", "mem_total_mib", "sm",
          "util_pct")
"""A MIG row's fields: its GPU's index, GPU instance, compute instance, MIG device index (as
nvidia-smi -L numbers it), profile ("3g.40gb", "1c.3g.71gb"), UUID, memory (the GPU instance's,
shared by its compute instances), SM count, utilisation (None: not reported under MIG)."""


def _int(word):
    return int(word) if word.isdigit() else None


def _mib_pair(cell):
    """'11091MiB / 40448MiB' → (11091, 40448); a part that is no figure → None."""
    used, _, total = cell.partition("/")
    out = []
    for part in (used, total):
        word = part.strip()
        if word.endswith("MiB"):
            word = word[:-3].strip()
        out.append(_int(word))
    return out[0], out[1]


def parse_table(text):
    """nvidia-smi's default output → (MIG rows, {pid: (gpu, gi, ci)}). Read by its cells
    (between '|'), not by column: each driver pads them differently (470, 535, 590)."""
    rows, owners = [], {}
    block = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "MIG devices:" in line:
            block = "mig"
            continue
        if "Processes:" in line:
            block = "procs"
            continue
        if block == "mig" and len(cells) >= 3:
            ids = cells[0].split()
            if len(ids) != 4 or not all(w.isdigit() for w in ids):
                continue  # a header, a ruler, the BAR1 line under an instance
            sm = cells[2].split()
            used, total = _mib_pair(cells[1])
            rows.append({"gpu": int(ids[0]), "gi": int(ids[1]), "ci": int(ids[2]),
                         "dev": int(ids[3]), "profile": None, "uuid": None,
                         "mem_used_mib": used, "mem_total_mib": total,
                         "sm": _int(sm[0]) if sm else None, "util_pct": None})
        elif block == "procs" and len(cells) == 1:
            words = cells[0].split()  # GPU GI CI PID Type Name... Memory
            if len(words) >= 6 and all(w.isdigit() for w in words[:4]):
                owners[int(words[3])] = (int(words[0]), int(words[1]), int(words[2]))
    return rows, owners


def parse_list(text):
    """nvidia-smi -L → {(gpu, MIG device): (profile, uuid)}, from lines
    'GPU 0: NAME (UUID: GPU-...)' and under them '  MIG 3g.40gb  Device  0: (UUID: MIG-...)'."""
    out, gpu = {}, None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "GPU" and words[1].rstrip(":").isdigit():
            gpu = int(words[1].rstrip(":"))
        elif gpu is not None and len(words) >= 4 and words[0] == "MIG" and "Device" in words:
            at = words.index("Device")
            dev = words[at + 1].rstrip(":") if at + 1 < len(words) else ""
            uuid = line.partition("(UUID:")[2].rpartition(")")[0].strip() or None
            if dev.isdigit():
                out[(gpu, int(dev))] = (" ".join(words[1:at]) or None, uuid)
    return out


def read_smi(deadline):
    """(MIG rows, owners) from nvidia-smi's table and -L; raises base.ProbeFailure where the
    table cannot be had (the GPU rows stand without their instances)."""
    code, out, err = base.run_bounded(["nvidia-smi"], deadline - time.monotonic())
    if code != 0 or "MIG devices:" not in out:
        raise base.ProbeFailure("nvidia-smi's table has no MIG devices (exit %d: %s)"
                                % (code, base.first_line(out + err)))
    rows, owners = parse_table(out)
    code, out, err = base.run_bounded(["nvidia-smi", "-L"], deadline - time.monotonic())
    names = parse_list(out) if code == 0 else {}
    for row in rows:
        row["profile"], row["uuid"] = names.get((row["gpu"], row["dev"]), (None, None))
    return rows, owners


def profile_of(name):
    """NVML's name of a MIG device, 'NVIDIA H100 80GB HBM3 MIG 3g.40gb' → '3g.40gb'."""
    head, sep, profile = (name or "").rpartition(" MIG ")
    return profile.strip() or None if sep else None


def read_nvml(nvml, handle, index, ask, text):
    """(MIG rows, owners) of one MIG-enabled GPU from its MIG device handles; `ask` calls NVML
    (None where it raises), `text` decodes its bytes."""
    rows, owners = [], {}
    for dev in range(ask(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = ask(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, dev)
        if mig is None:  # no instance at this index
            continue
        gi = ask(nvml.nvmlDeviceGetGpuInstanceId, mig)
        ci = ask(nvml.nvmlDeviceGetComputeInstanceId, mig)
        memory = ask(nvml.nvmlDeviceGetMemoryInfo, mig)
        attrs = ask(nvml.nvmlDeviceGetAttributes, mig)
        util = ask(nvml.nvmlDeviceGetUtilizationRates, mig)  # Not Supported under MIG
        rows.append({
            "gpu": index, "gi": gi, "ci": ci, "dev": dev,
            "profile": profile_of(text(ask(nvml.nvmlDeviceGetName, mig))),
            "uuid": text(ask(nvml.nvmlDeviceGetUUID, mig)),
            "mem_used_mib": memory.used >> 20 if memory is not None else None,
            "mem_total_mib": memory.total >> 20 if memory is not None else None,
            "sm": getattr(attrs, "multiprocessorCount", None),
            "util_pct": util.gpu if util is not None else None})
        for app in ask(nvml.nvmlDeviceGetComputeRunningProcesses, mig) or ():
            owners[app.pid] = (index, gi, ci)
    return rows, owners


def add_smi(out, devices, apps, deadline):
    """The nvidia-smi source's section `out` with the instances of its GPUs that have MIG on
    (`mig`, or `mig_error` where they could not be read; the GPUs stand) and each compute
    process's instance."""
    if not any(d["mig"] for d in devices):
        return
    try:
        rows, owners = read_smi(deadline)
    except base.ProbeFailure as exc:
        out["mig_error"] = base.describe(exc)
        return
    out["mig"] = base.load_module("gpus/section").keyed_table(rows)
    place_apps(apps, owners, dict((d["index"], d["uuid"]) for d in devices))


def place_apps(apps, owners, uuid_of):
    """Each compute process's instance (gi, ci) on its GPU, where `owners` says it; `uuid_of`:
    GPU index → uuid (the apps name their GPU by uuid)."""
    for app in apps:  # every row the same fields (section.keyed_table)
        owner = owners.get(app.get("pid"))
        placed = owner is not None and uuid_of.get(owner[0]) == app.get("uuid")
        app["gi"], app["ci"] = (owner[1], owner[2]) if placed else (None, None)
