"""The NVIDIA GPU source that reads NVML through the box's pynvml: sent unless the last poll
of the host said its python cannot import pynvml (bundle.NVML). Keeps the contract of
gpus/section.py; its calls run in a thread the probe stops waiting for at the deadline.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(
    __package__.rpartition(".")[0] + ".base", fromlist=["_"])


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
        base.load_site()
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
        raise base.ProbeFailure("NVML did not answer within %.1fs" % timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]


# nvmlDeviceGetFieldValues ids (nvml.h NVML_FI_DEV_*, numbers fixed by the ABI: an old pynvml
# without the names still asks for them) → the row's field, all in one call per GPU: ECC
# totals (single bit = corrected, double bit = uncorrected; volatile, aggregate), retired
# pages, PCIe replays, row remapping, the recovery action (driver 570 on). Flags (pending,
# failed) and the recovery action go as NVML's numbers: the client reads them (sections.py).
FIELD_IDS = ((3, "ecc_corr_vol"), (4, "ecc_unc_vol"), (5, "ecc_corr_agg"), (6, "ecc_unc_agg"),
             (29, "retired_sbe"), (30, "retired_dbe"), (31, "retired_pending"),
             (94, "pcie_replays"), (142, "remap_corr"), (143, "remap_unc"),
             (144, "remap_pending"), (145, "remap_failed"), (230, "recovery"))


def field_values(nvml, handle):
    """The FIELD_IDS this driver answers, by field; one it does not is left out (None)."""
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, [fid for fid, _ in FIELD_IDS])
    except Exception:  # an old pynvml without the call, or NVML refused the whole call
        return {}
    # nvmlReturn 0: NVML_SUCCESS; valueType 1: unsigned int, else (3) unsigned long long
    return dict((field, v.value.uiVal if v.valueType == 1 else v.value.ullVal)
                for (_, field), v in zip(FIELD_IDS, values) if v.nvmlReturn == 0)


def read_nvml(nvml, hints=None):
    """The gpus section from NVML (the contract: gpus/section.py); every call guarded
    (NotSupported → None for that field)."""
    section = base.load_module("gpus/section")

    def ask(fn, *args):
        try:
            return fn(*args)
        except nvml.NVMLError:
            return None

    def maybe(name, *args):
        fn = getattr(nvml, name, None)
        return None if fn is None else ask(fn, *args)

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
    mig = base.optional("gpus/mig")  # sent where the last poll saw MIG on
    nvml.nvmlInit()
    try:
        devices, apps, instances = [], [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(ask(nvml.nvmlDeviceGetUUID, handle))
            util = ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = memory_info(handle)
            mask = ask(reasons_fn, handle)
            mig = ask(nvml.nvmlDeviceGetMigMode, handle)
            pci = maybe("nvmlDeviceGetPciInfo", handle)
            persistence = maybe("nvmlDeviceGetPersistenceMode", handle)
            row = {
                "index": index, "uuid": uuid, "name": text(ask(nvml.nvmlDeviceGetName, handle)),
                "util_pct": util.gpu if util is not None else None,
                "mem_used_mib": memory.used >> 20 if memory is not None else None,  # → MiB
                "mem_total_mib": memory.total >> 20 if memory is not None else None,
                "sm_clock_mhz": ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                "sm_clock_max_mhz": ask(nvml.nvmlDeviceGetMaxClockInfo, handle,
                                        nvml.NVML_CLOCK_SM),
                "power_w": scaled(ask(nvml.nvmlDeviceGetPowerUsage, handle), 1000),  # mW → W
                "power_limit_w": scaled(ask(nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1000),
                "temp_c": ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                "throttle_reasons": None if mask is None
                else [name for bit, name in section.REASON_BITS if mask & bit],
                "mig": None if mig is None else mig[0] == nvml.NVML_DEVICE_MIG_ENABLE,
                "pci_bus_id": None if pci is None else text(getattr(pci, "busId", None)),
                "persistence": None if persistence is None else persistence == 1,  # ENABLED
                "pcie_gen": maybe("nvmlDeviceGetCurrPcieLinkGeneration", handle),
                "pcie_gen_max": maybe("nvmlDeviceGetMaxPcieLinkGeneration", handle),
                "pcie_width": maybe("nvmlDeviceGetCurrPcieLinkWidth", handle),
                "pcie_width_max": maybe("nvmlDeviceGetMaxPcieLinkWidth", handle),
            }
            row.update(field_values(nvml, handle))
            hist = maybe("nvmlDeviceGetRowRemapperHistogram", handle)
            if hist is not None:
                row["remap_hist"] = [hist.max, hist.high, hist.partial, hist.low, hist.none]
            devices.append(row)
            for app in ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                name = ask(nvml.nvmlSystemGetProcessName, app.pid)
                used = app.usedGpuMemory  # None where the driver cannot say (WDDM, MIG)
                apps.append({"uuid": uuid, "pid": app.pid,
                             "gpu_mem_mib": None if used is None else used >> 20,
                             "process_name": text(name)})
            if row["mig"] and mig is not None:
                rows, owners = mig.read_nvml(nvml, handle, index, ask, text)
                instances.extend(rows)
                mig.place_apps(apps, owners, {index: uuid})
        out = {"source": "nvml", "vendor": "nvidia", "devices": section.keyed_table(devices),
               "apps": section.keyed_table(apps)}
        if instances:
            out["mig"] = section.keyed_table(instances)
        told = hints if isinstance(hints, dict) else {}
        out_hints = section.mig_hint(told, devices)
        if out_hints:
            out["hints"] = out_hints
        return out
    finally:
        ask(nvml.nvmlShutdown)
