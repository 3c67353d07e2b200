"""Device capture helper for tests/device/health_capture.sh (read-only NVML queries).

    python3 health_nvml.py dump OUT.json    every health call NVML has, its result or the
                                            exception's class and text, per GPU, with its time
    python3 health_nvml.py load STOP MAX_S  a small torch matmul loop on every GPU until the
                                            file STOP exists or MAX_S seconds pass

Only queries: no NVML setter is called (no persistence, clocks, power, MIG, ECC or reset).
A pynvml that cannot be imported, an NVML that cannot be initialised, or a call that raises
is written into the JSON as what it was; the dump itself never fails.
"""

import ctypes
import json
import os
import sys
import time


def plain(value, depth=0):
    """A pynvml result → JSON: ctypes structures by field, arrays as lists, bytes as text."""
    if depth > 6:
        return repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) or isinstance(value, ctypes.Array):
        return [plain(v, depth + 1) for v in list(value)[:256]]
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    fields = getattr(value, "_fields_", None)
    if fields:
        out = {}
        for field in fields:
            name = field[0]
            try:
                out[name] = plain(getattr(value, name), depth + 1)
            except Exception as exc:  # a union member, a pointer
                out[name] = "<%s>" % type(exc).__name__
        return out
    if hasattr(value, "value"):  # c_uint and friends
        return plain(value.value, depth + 1)
    return repr(value)


class Recorder:
    def __init__(self):
        self.calls = []

    def call(self, label, fn, *args, **kwargs):
        started = time.perf_counter()
        entry = {"call": label}
        try:
            entry["result"] = plain(fn(*args, **kwargs))
        except Exception as exc:
            entry["error"] = type(exc).__name__
            entry["error_text"] = str(exc)[:300]
        entry["ms"] = round((time.perf_counter() - started) * 1000, 3)
        self.calls.append(entry)
        return entry


def field_values(nvml, rec, handle, names):
    """nvmlDeviceGetFieldValues for the named NVML_FI_DEV_* ids, each value decoded by its
    valueType, with its own nvmlReturn; the batch call, then each id alone."""
    ids = [(name, getattr(nvml, name)) for name in names if hasattr(nvml, name)]
    missing = [name for name in names if not hasattr(nvml, name)]
    union = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
             6: "usVal"}

    def decode(values):
        out = []
        for (name, fid), value in zip(ids, values):
            ret = int(value.nvmlReturn)
            row = {"name": name, "id": fid, "nvmlReturn": ret,
                   "valueType": int(value.valueType), "latencyUsec": int(value.latencyUsec)}
            if ret == 0:
                row["value"] = getattr(value.value, union.get(int(value.valueType), "ullVal"))
            else:
                try:
                    row["error_text"] = str(nvml.NVMLError(ret))
                except Exception:
                    pass
            out.append(row)
        return out

    entry = rec.call("nvmlDeviceGetFieldValues(batch)",
                     lambda: decode(nvml.nvmlDeviceGetFieldValues(handle, [i for _, i in ids])))
    entry["unknown_to_this_pynvml"] = missing
    for name, fid in ids:
        rec.call("nvmlDeviceGetFieldValues(%s=%d)" % (name, fid),
                 lambda fid=fid: [
                     {"nvmlReturn": int(v.nvmlReturn), "valueType": int(v.valueType),
                      "ullVal": int(v.value.ullVal), "dVal": float(v.value.dVal)}
                     for v in nvml.nvmlDeviceGetFieldValues(handle, [fid])])


FIELDS = [
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    "NVML_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_DBE", "NVML_FI_DEV_RETIRED_PENDING",
    "NVML_FI_DEV_RETIRED_PENDING_SBE", "NVML_FI_DEV_RETIRED_PENDING_DBE",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER",
    "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC", "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE", "NVML_FI_DEV_REMAPPED_ROWS_COR_INACTIVE",
    "NVML_FI_DEV_REMAPPED_ROWS_UNC_INACTIVE",
    "NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER", "NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS",
    "NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR", "NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR",
    "NVML_FI_DEV_RESET_STATUS", "NVML_FI_DEV_DRAIN_AND_RESET_STATUS",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NVML_FI_DEV_PERF_POLICY_POWER", "NVML_FI_DEV_PERF_POLICY_THERMAL",
    "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST", "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT",
    "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION", "NVML_FI_DEV_PERF_POLICY_RELIABILITY",
    "NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS", "NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "NVML_FI_DEV_NVLINK_GET_STATE",
]


def device_calls(nvml, rec, handle):
    g = lambda name: getattr(nvml, name, None)  # noqa: E731
    ask = rec.call
    for name in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo",
                 "nvmlDeviceGetEccMode", "nvmlDeviceGetRetiredPagesPendingStatus",
                 "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram",
                 "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                 "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
                 "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetPcieReplayCounter",
                 "nvmlDeviceGetPcieSpeed", "nvmlDeviceGetPcieLinkMaxSpeed",
                 "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
                 "nvmlDeviceIsMigDeviceHandle",
                 "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetSupportedClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons",
                 "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPersistenceMode",
                 "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetPerformanceState",
                 "nvmlDeviceGetComputeMode", "nvmlDeviceGetSerial", "nvmlDeviceGetMinorNumber"):
        fn = g(name)
        if fn is None:
            rec.calls.append({"call": name, "error": "NotInThisPynvml"})
        else:
            ask(name, fn, handle)
    for clock in ("NVML_CLOCK_SM", "NVML_CLOCK_MEM"):
        ask("nvmlDeviceGetClockInfo(%s)" % clock, nvml.nvmlDeviceGetClockInfo, handle,
            getattr(nvml, clock))
        ask("nvmlDeviceGetMaxClockInfo(%s)" % clock, nvml.nvmlDeviceGetMaxClockInfo, handle,
            getattr(nvml, clock))
    for err in ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):
        for counter in ("NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"):
            ask("nvmlDeviceGetTotalEccErrors(%s,%s)" % (err, counter),
                nvml.nvmlDeviceGetTotalEccErrors, handle, getattr(nvml, err),
                getattr(nvml, counter))
            for loc in ("L1_CACHE", "L2_CACHE", "DRAM", "REGISTER_FILE", "TEXTURE_MEMORY",
                        "TEXTURE_SHM", "CBU", "SRAM"):
                location = getattr(nvml, "NVML_MEMORY_LOCATION_" + loc, None)
                if location is not None:
                    ask("nvmlDeviceGetMemoryErrorCounter(%s,%s,%s)" % (err, counter, loc),
                        nvml.nvmlDeviceGetMemoryErrorCounter, handle, getattr(nvml, err),
                        getattr(nvml, counter), location)
    for cause in ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
                  "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"):
        ask("nvmlDeviceGetRetiredPages(%s)" % cause, nvml.nvmlDeviceGetRetiredPages, handle,
            getattr(nvml, cause))
        if g("nvmlDeviceGetRetiredPages_v2"):
            ask("nvmlDeviceGetRetiredPages_v2(%s)" % cause, nvml.nvmlDeviceGetRetiredPages_v2,
                handle, getattr(nvml, cause))
    for policy in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION",
                   "RELIABILITY", "TOTAL_APP_CLOCKS", "TOTAL_BASE_CLOCKS"):
        ask("nvmlDeviceGetViolationStatus(%s)" % policy, nvml.nvmlDeviceGetViolationStatus,
            handle, getattr(nvml, "NVML_PERF_POLICY_" + policy))
    ask("nvmlDeviceGetProcessUtilization(0)", nvml.nvmlDeviceGetProcessUtilization, handle, 0)
    since = int((time.time() - 5) * 1e6)
    ask("nvmlDeviceGetProcessUtilization(now-5s)", nvml.nvmlDeviceGetProcessUtilization,
        handle, since)
    if g("nvmlDeviceGetProcessesUtilizationInfo"):
        ask("nvmlDeviceGetProcessesUtilizationInfo(0)",
            nvml.nvmlDeviceGetProcessesUtilizationInfo, handle, 0)
    if g("nvmlDeviceGetGpuInstances") and g("NVML_GPU_INSTANCE_PROFILE_1_SLICE") is not None:
        ask("nvmlDeviceGetGpuInstances(1_SLICE)", nvml.nvmlDeviceGetGpuInstances, handle,
            nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    field_values(nvml, rec, handle, FIELDS)


def dump(path):
    doc = {"python": sys.version, "argv": sys.argv, "t_epoch": time.time(),
           "constants": {}, "gpus": []}
    try:
        import pynvml as nvml
    except Exception as exc:
        doc["import_error"] = "%s: %s" % (type(exc).__name__, exc)
        write(path, doc)
        return
    doc["pynvml_file"] = getattr(nvml, "__file__", None)
    for name in dir(nvml):
        if name.startswith(("NVML_FI_DEV_GET_GPU_RECOVERY", "NVML_GPU_RECOVERY_ACTION",
                            "NVML_FI_DEV_REMAPPED", "NVML_FI_DEV_PCIE_REPLAY",
                            "NVML_FI_DEV_ECC_", "NVML_FI_DEV_RETIRED")):
            doc["constants"][name] = getattr(nvml, name)
    rec = Recorder()
    init = rec.call("nvmlInit", nvml.nvmlInit)
    doc["system"] = rec.calls
    if "error" in init:
        write(path, doc)
        return
    try:
        for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
                     "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
                     "nvmlDeviceGetCount"):
            fn = getattr(nvml, name, None)
            if fn is not None:
                rec.call(name, fn)
        count = rec.calls[-1].get("result") or 0
        for index in range(count if isinstance(count, int) else 0):
            grec = Recorder()
            got = grec.call("nvmlDeviceGetHandleByIndex(%d)" % index,
                            nvml.nvmlDeviceGetHandleByIndex, index)
            if "error" not in got:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    device_calls(nvml, grec, handle)
                except Exception as exc:  # a bug here must not lose the rest
                    grec.calls.append({"call": "device_calls", "error": type(exc).__name__,
                                       "error_text": str(exc)[:300]})
            doc["gpus"].append({"index": index, "calls": grec.calls})
    finally:
        rec.call("nvmlShutdown", nvml.nvmlShutdown)
    write(path, doc)


def write(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=repr)
        f.write("\n")


def load(stop, max_s):
    """bf16 matmuls on every GPU, ~8 GiB each at most, until `stop` exists."""
    import torch

    end = time.monotonic() + max_s
    devices = list(range(torch.cuda.device_count()))
    mats = [torch.randn(8192, 8192, device="cuda:%d" % d, dtype=torch.bfloat16)
            for d in devices]
    print("load pid %d on %d GPU(s)" % (os.getpid(), len(devices)), flush=True)
    while time.monotonic() < end and not os.path.exists(stop):
        for m in mats:
            for _ in range(20):
                m @ m  # noqa: B018
        for d in devices:
            torch.cuda.synchronize(d)
    print("load done", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "load":
        load(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)
