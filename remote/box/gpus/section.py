"""The gpus section: the contract every GPU source keeps, and which source reads this box's GPUs.

A source is one file of box/gpus/ (nvidia_smi.py, nvml.py; another vendor's beside them) with

    read(hints, deadline) -> section        (nvml.py: read_nvml(pynvml, hints), run by
                                              call_with_deadline)

- It returns by `deadline` (a time.monotonic() figure), or raises base.ProbeFailure there: its
  commands run under base.run_bounded, and an in-process library call that may hang in a
  wedged driver runs in a thread we stop waiting for (nvml.call_with_deadline).
- The section it returns: {"source": its name, "vendor": "nvidia" | ..., "devices": table,
  "apps": table, "hints"?: {name: str}, "mig"?: table, "lost"?: [line], "apps_error"?: str}.
  Tables are made by `table` from rows keyed by field name: a source sets the fields it can
  read, a field it cannot read (the driver lacks it, N/A, Not Supported) is None or absent for
  that GPU only, and a column that is None in every row is not sent. The client reads rows by
  name (wire/sections.py), so no two files agree by position.
- "hints": what the source learnt of this box that saves the next poll work (the fields its
  driver lacks; "mig": "1" while a GPU has MIG on, so gpus/mig.py comes with the next poll);
  the client sends them back as the request's "gpu_hints" and the source reads them first.
  Strings only (the client keeps strings).
- It raises base.ProbeFailure for "the GPUs could not be read", with `detail` saying what the
  client classifies (model.snapshot.classify_gpu_error): "exit", "said", "timeout", "missing",
  "lost". A box without GPUs of the source's vendor is "missing".

The fields a GPU row may carry (a source sends those it has, in its own order; the client reads
them by name, wire/sections.py `_gpu`):

    index, uuid, name, util_pct, mem_used_mib, mem_total_mib, sm_clock_mhz, sm_clock_max_mhz,
    power_w, power_limit_w, temp_c, throttle_reasons (names), mig (bool), pci_bus_id,
    persistence (bool);
    ecc_corr_vol, ecc_unc_vol, ecc_corr_agg, ecc_unc_agg: ECC counts, corrected / uncorrected,
      since the driver loaded (volatile) / the GPU's lifetime (aggregate);
    retired_sbe, retired_dbe, retired_pending (bool): pages retired (GPUs before Ampere);
    remap_corr, remap_unc, remap_pending (bool), remap_failed (bool), remap_hist (the banks
      with max / high / partial / low / no spare rows): row remapping (Ampere on);
    recovery: what the driver says the GPU needs ("none", "gpu_reset", "node_reboot", ...,
      model.gpu.RECOVERY_ACTIONS);
    pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replays: the PCIe link.
A compute process (apps): uuid (its GPU's), pid, gpu_mem_mib, process_name, and on a MIG GPU
gi, ci (its GPU and compute instance).
A MIG instance ("mig", gpus/mig.py FIELDS): gpu (its GPU's index), gi, ci, dev, profile, uuid,
mem_used_mib, mem_total_mib, sm, util_pct; "mig_error" where they could not be read.

A new GPU field: its line in each source that reads it, its reading in the model, and its
name here and in docs/json.md (docs/development.md, "A new GPU field").

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import sys
import time

base = sys.modules.get("gpuwatch_base") or __import__(
    __package__.rpartition(".")[0] + ".base", fromlist=["_"])

DEFAULT_TIMEOUT_S = 5.0

# NVML clocks event (formerly "throttle") reason bits, nvml.h nvmlClocksEventReason*: both
# NVIDIA sources name the active ones by these
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


def keyed_table(rows):
    """Rows keyed by field name (each a dict of the same fields, in the same order) →
    {"fields", "rows"}: only the fields some row has a value for, the first (the key) always."""
    fields = list(rows[0]) if rows else []
    used = [f for f in fields if f == fields[0] or any(row[f] is not None for row in rows)]
    return {"fields": used, "rows": [[row[f] for f in used] for row in rows]}


def mig_hint(told, devices):
    """The "mig" hint (strings only): "1" while a GPU has MIG on (the client then sends
    gpus/mig.py), "0" once where the last poll said "1" and none has it now."""
    if any(d.get("mig") for d in devices):
        return {"mig": "1"}
    return {"mig": "0"} if told.get("mig") == "1" else {}


def collect_gpus(request):
    """The gpus section: NVML where this python imports pynvml and nvmlInit works, else
    nvidia-smi (the simulator's box: always its stand-in nvidia-smi). The nvidia-smi reader
    is not sent to a box whose last poll read NVML (wire/bundle.py SMI): should NVML fail
    then, its failure is this poll's, and the next poll brings the reader."""
    smi = base.optional("gpus/nvidia_smi")
    timeout_s = base.number_setting(request, "nvidia_smi_timeout_s", DEFAULT_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    hints = request.get("gpu_hints") if isinstance(request.get("gpu_hints"), dict) else {}
    nvml_problem, importable, checked, home = None, False, True, None
    if base.SIM_DIR:
        nvml_problem = "simulated box: GPUs come from the stand-in nvidia-smi"
    elif not base.want(request, "nvml"):  # the client asks again now and then (collect.py)
        checked = False
    else:
        nvml = base.optional("gpus/nvml")  # the NVML reader
        try:
            if nvml is not None:
                pynvml, home = nvml.import_pynvml_from(request.get("pynvml_dir"))
            else:
                base.load_site()
                import pynvml  # noqa: F401
        except ImportError:
            nvml_problem = "pynvml not importable"
        else:
            importable = True
            if nvml is None:  # sent only where pynvml imports
                nvml_problem = "pynvml imports now: NVML is read from the next poll on"
            else:
                try:
                    asked = time.monotonic()
                    section = nvml.call_with_deadline(
                        lambda: nvml.read_nvml(pynvml, hints), timeout_s)
                    section["pynvml"], section["pynvml_dir"] = True, home
                    section["query_s"] = round(time.monotonic() - asked, 3)
                    return section
                except Exception as exc:  # no driver library, no GPU, hung: try nvidia-smi
                    nvml_problem = base.describe(exc)
    if smi is None:
        raise base.ProbeFailure("NVML failed (%s); nvidia-smi's reader comes with the next poll"
                                % nvml_problem)
    started = time.monotonic()
    try:
        section = smi.read(hints, deadline)
    except base.ProbeFailure as exc:  # said loudly by the client: a wedged driver is not "no GPU"
        exc.detail["query_s"] = round(time.monotonic() - started, 3)
        exc.detail["devices"] = smi.has_nvidia_nodes()
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
