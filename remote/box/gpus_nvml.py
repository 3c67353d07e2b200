"""The NVML reader: sent unless the last poll of the host said its python cannot import
pynvml (bundle.NVML).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])


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
    pci_fn = getattr(nvml, "nvmlDeviceGetPciInfo", None)
    persistence_fn = getattr(nvml, "nvmlDeviceGetPersistenceMode", None)
    nvml.nvmlInit()
    try:
        devices, apps = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(ask(nvml.nvmlDeviceGetUUID, handle))
            util = ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = memory_info(handle)
            mask = ask(reasons_fn, handle)
            mig = ask(nvml.nvmlDeviceGetMigMode, handle)
            pci = ask(pci_fn, handle) if pci_fn is not None else None
            persistence = ask(persistence_fn, handle) if persistence_fn is not None else None
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
                None if mask is None else [name for bit, name in base.REASON_BITS if mask & bit],
                None if mig is None else mig[0] == nvml.NVML_DEVICE_MIG_ENABLE,
                None if pci is None else text(getattr(pci, "busId", None)),
                None if persistence is None else persistence == 1,  # NVML_FEATURE_ENABLED
            ])
            for app in ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                name = ask(nvml.nvmlSystemGetProcessName, app.pid)
                used = app.usedGpuMemory  # None where the driver cannot say (WDDM, MIG)
                apps.append([uuid, app.pid, None if used is None else used >> 20, text(name)])
        return {"source": "nvml", "devices": base.table(base.GPU_FIELDS, devices),
                "apps": base.table(base.APP_FIELDS, apps)}
    finally:
        ask(nvml.nvmlShutdown)
