"""The reader of cgroup v1 files: sent unless the box said its cgroups are v2
(bundle.CGROUP_V1). The memory and cpu controllers live in their own hierarchies
there: memory.limit_in_bytes ("no limit" is V1_UNLIMITED_BYTES), memory.oom_control's
oom_kill counter, cpu.cfs_quota_us over cpu.cfs_period_us, and cpu.stat's throttled_time
(nanoseconds, given as v2's throttled_usec), read into what host.cgroup_v2 gives.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
host = base.load_module("host")


def cgroup_v1(root, path):
    memory = host.cgroup_dir(os.path.join(root, "memory"), path)
    cpu = host.cgroup_dir(os.path.join(root, "cpu"), path)
    limit = host.read_int_file(os.path.join(memory, "memory.limit_in_bytes"))
    quota = host.read_int_file(os.path.join(cpu, "cpu.cfs_quota_us"), ("-1",))
    oom = host.read_counters(os.path.join(memory, "memory.oom_control"))
    stat = host.read_counters(os.path.join(cpu, "cpu.stat"))
    if "throttled_time" in stat:  # v1 counts nanoseconds; v2's throttled_usec is the shared name
        stat["throttled_usec"] = stat.pop("throttled_time") // 1000
    return {
        "memory_current_bytes": host.read_int_file(os.path.join(memory, "memory.usage_in_bytes")),
        "memory_max_bytes": (limit if limit is not None and limit < host.V1_UNLIMITED_BYTES
                             else None),
        "memory_events": {"oom_kill": oom["oom_kill"]} if "oom_kill" in oom else {},
        "cpu_quota_us": quota,
        "cpu_period_us": host.read_int_file(os.path.join(cpu, "cpu.cfs_period_us")),
        "cpu_stat": stat,
    }
