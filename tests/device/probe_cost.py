"""What the probe's GPU section costs on a real GPU box, NVML path against nvidia-smi path.

Run on the box from the repository root: `python3 tests/device/probe_cost.py [N]`. Prints, as
medians of N runs (default 15), the whole probe (wall and CPU, children included) on each path
(NVML on a first poll, and told where pynvml lives, as every later poll is),
and the NVML path's parts measured in a fresh interpreter each time: site.main() (the probe
runs under -S and loads site only to look for pynvml), `import pynvml`, nvmlInit, the reads of
every GPU, nvmlShutdown; and a bare `nvidia-smi --query-gpu` with the probe's query.
"""

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.getcwd())
from remote.box import gpus_smi as probe  # stdlib only
from remote.wire import bundle as probe_bundle

N = int(sys.argv[1]) if len(sys.argv) > 1 else 15
PARTS = r'''
import sys, time
t0 = time.perf_counter(); import site; site.main(); t1 = time.perf_counter()
import pynvml; t2 = time.perf_counter()
pynvml.nvmlInit(); t3 = time.perf_counter()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetUtilizationRates(h)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM); pynvml.nvmlDeviceGetPowerUsage(h)
    pynvml.nvmlDeviceGetComputeRunningProcesses(h)
t4 = time.perf_counter(); pynvml.nvmlShutdown(); t5 = time.perf_counter()
print(" ".join("%.4f" % x for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)))
'''


def timed(argv, stdin=None):
    before = os.times()
    start = time.perf_counter()
    out = subprocess.run(argv, input=stdin, capture_output=True, check=True).stdout
    wall = time.perf_counter() - start
    after = os.times()
    return wall, (after[2] + after[3]) - (before[2] + before[3]), out


def median_ms(values):
    return f"{1000 * statistics.median(values):.1f}"


def main():
    command = ["sh", "-c", probe_bundle.build_command(sys.executable)]
    home = None
    for path in ("nvml", "nvml, told where pynvml is", "smi"):
        request = {"v": 1, "disks": ["/"], "runs": [], "want": {"discover": False},
                   "compress": False, "spawn": True, "cgroup": 2, "kernel_lines": 0}
        if path == "smi":
            request["want"]["nvml"] = False
            request["pynvml"] = False
        elif home:
            request["pynvml_dir"] = home
        stdin = probe_bundle.build_stdin(request, trim=True)
        walls, cpus = [], []
        for _ in range(N):
            wall, cpu, out = timed(command, stdin)
            gpus = json.loads(out)["gpus"]
            assert gpus["source"] == ("nvidia-smi" if path == "smi" else "nvml"), gpus
            home = home or gpus.get("pynvml_dir")
            walls.append(wall)
            cpus.append(cpu)
        print(f"probe, {path} path: wall {median_ms(walls)} ms, cpu {median_ms(cpus)} ms "
              f"(children included), {len(stdin)} B up")
    bare = [timed([sys.executable, "-S", "-c", "pass"]) for _ in range(N)]
    print(f"bare python -S -c pass: wall {median_ms([b[0] for b in bare])} ms, "
          f"cpu {median_ms([b[1] for b in bare])} ms")
    query = ",".join(f.format(reasons="clocks_event_reasons") for f in probe.SMI_GPU_QUERY)
    smi = [timed(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader,nounits"])
           for _ in range(N)]
    print(f"nvidia-smi --query-gpu alone: wall {median_ms([s[0] for s in smi])} ms, "
          f"cpu {median_ms([s[1] for s in smi])} ms")
    parts = [list(map(float, timed([sys.executable, "-S", "-c", PARTS])[2].split()))
             for _ in range(N)]
    names = ("site.main()", "import pynvml", "nvmlInit", "reads", "nvmlShutdown")
    print("NVML path's parts (wall, ms): " + ", ".join(
        f"{name} {median_ms([p[i] for p in parts])}" for i, name in enumerate(names)))


if __name__ == "__main__":
    main()
