#!/usr/bin/env python3
"""gpuwatch's SIMULATED nvidia-smi: a stand-in for GPUs this machine does not have.

This is not NVIDIA's tool. gpuwatch's box simulator copies this file into ``BOX/bin/`` so the
probe, run over real SSH against a fixture box, meets an ``nvidia-smi`` that answers like a real
driver does. Every call re-reads ``sim/gpus.json`` (found through ``$GPUWATCH_SIM_DIR``, else
``../sim`` beside this file), so a test or the demo changes the GPUs by rewriting that file.

What it answers, formatted as real drivers print it (learnt from captured output of drivers
465-610, see tests/test_sim_nvidia_smi.py, which checks it byte for byte against them):

    --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]   [-i|--id=INDEX|UUID|BUS_ID,...]
    --query-compute-apps=F1,...  --format=...
    -L / --list-gpus, --version, and no argument: the table (GPUs, MIG devices, processes)

Stdlib only, Python 3.6+, imports nothing of gpuwatch: it must start as fast as a bare python3.
"""

import json
import os
import sys
import time

MYPY = False
if MYPY:  # typing costs start-up time, so only the type checker imports it
    from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

    Spec = Tuple[str, str, FrozenSet[str]]
    Table = Dict[str, Spec]
    State = Dict[str, Any]

if __package__:
    from .nvidia_smi_fields import (  # noqa: F401 (some re-exported: the tests, sim/box.py)
        APP_ALIASES,
        APP_FIELDS,
        APP_FROM_GPU,
        BAD_ARGUMENTS,
        DRIVER_FAILED,
        DRIVER_FAULTS,
        EVENT_REASONS_SINCE,
        EXIT_DRIVER_NOT_LOADED,
        EXIT_GPU_LOST,
        EXIT_NOT_FOUND,
        GPU_ALIASES,
        GPU_FIELDS,
        LOST,
        REASON,
        REASON_BITS,
        UsageError,
        driver_major,
        parse_value,
        render,
    )
else:  # the stand-in: BOX/bin/nvidia-smi, beside BOX/bin/nvidia_smi_fields.py
    from nvidia_smi_fields import (  # noqa: F401 (some re-exported: the tests, sim/box.py)
        APP_ALIASES,
        APP_FIELDS,
        APP_FROM_GPU,
        BAD_ARGUMENTS,
        DRIVER_FAILED,
        DRIVER_FAULTS,
        EVENT_REASONS_SINCE,
        EXIT_DRIVER_NOT_LOADED,
        EXIT_GPU_LOST,
        EXIT_NOT_FOUND,
        GPU_ALIASES,
        GPU_FIELDS,
        LOST,
        REASON,
        REASON_BITS,
        UsageError,
        driver_major,
        parse_value,
        render,
    )


# ---------------------------------------------------------------------------------------------
def sim_dir() -> str:
    """Where gpus.json lives: $GPUWATCH_SIM_DIR, else BOX/sim beside BOX/bin/nvidia-smi."""
    env = os.environ.get("GPUWATCH_SIM_DIR")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim")


def load_state(directory: "Optional[str]" = None) -> "State":
    """The box's GPU state; a box without gpus.json has a driver but no GPU."""
    path = os.path.join(directory or sim_dir(), "gpus.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {"gpus": []}


def gpu_table(state: "State") -> "Tuple[Table, Dict[str, str]]":
    """Field table and aliases for this state's driver (old drivers: throttle names only)."""
    table = dict(GPU_FIELDS)
    aliases = dict(GPU_ALIASES)
    new = driver_major(state.get("driver_version", "")) >= EVENT_REASONS_SINCE
    for name in list(table):
        if name.startswith("clocks_event_reasons"):
            old = name.replace("clocks_event_reasons", "clocks_throttle_reasons", 1)
            if new:
                aliases[old] = name
            else:
                table[old] = table.pop(name)
    for name in state.get("invalid_fields", ()):
        table.pop(name, None)
        aliases.pop(name, None)
    return table, aliases


def resolve(requested: str, table: "Table", aliases: "Dict[str, str]") -> "List[str]":
    """Canonical names for a --query-*= list, or UsageError naming the first bad one."""
    out = []
    for name in requested.split(","):
        name = name.strip()
        canon = aliases.get(name, name)
        if canon not in table:
            raise UsageError('Field "%s" is not a valid field to query.\n' % name)
        out.append(canon)
    return out


def state_key(name: str) -> str:
    """The key gpus.json uses for a field: throttle reasons under their new (event) name."""
    if name.startswith("clocks_throttle_reasons"):
        return "clocks_event_reasons" + name[len("clocks_throttle_reasons"):]
    return name


def gpu_value(state: "State", gpus: "List[State]", index: int, gpu: "State", name: str,
              now: float) -> "Any":
    """A GPU field's value: the state's, else derived (count, index, reasons, timestamp)."""
    key = state_key(name)
    if key in gpu:
        return gpu[key]
    if key == "timestamp":
        return now
    if key == "count":
        return len(gpus)
    if key == "index":
        return index
    if key in ("driver_version", "kmd_version"):
        return state.get("driver_version")
    if key.startswith("clocks_event_reasons."):
        active = gpu.get("clocks_event_reasons.active")
        if active is None or isinstance(active, dict):
            return active
        return bool(active & REASON_BITS[key.split(".", 1)[1]])
    return None


def select(gpus: "List[State]", ids: "Optional[str]") -> "List[Tuple[int, State]]":
    """(index, gpu) pairs chosen by -i: an index, a UUID or a PCI bus id, comma-separated."""
    pairs = list(enumerate(gpus))
    if ids is None:
        return pairs
    chosen = []
    for ident in ids.split(","):
        for i, g in pairs:
            if ident in (str(g.get("index", i)), g.get("uuid"), g.get("pci.bus_id")):
                chosen.append((i, g))
                break
        else:
            raise UsageError("No devices were found\n", EXIT_NOT_FOUND)
    return chosen


def csv_lines(names: "List[str]", table: "Table", rows: "Sequence[Sequence[Any]]",
              fmt: str) -> "List[str]":
    """Header and rows as nvidia-smi prints CSV: ", " between values, units per the format."""
    opts = [o.strip() for o in fmt.split(",")]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        raise UsageError(BAD_ARGUMENTS + "\n")
    units = "nounits" not in opts
    lines = []
    if "noheader" not in opts:
        # The header keeps its units even with nounits (see netdata's tesla-p100.csv capture).
        lines.append(", ".join(n + (" [%s]" % table[n][0] if table[n][0] else "")
                               for n in names))
    for row in rows:
        lines.append(", ".join(render(table[n], row[k], units) for k, n in enumerate(names)))
    return lines


def query_gpu(state: "State", fields: str, fmt: str, ids: "Optional[str]") -> "List[str]":
    table, aliases = gpu_table(state)
    names = resolve(fields, table, aliases)
    gpus = state.get("gpus", [])
    now = time.time()
    lost = lost_gpus(state)
    chosen = select(gpus, ids)
    rows = [[gpu_value(state, gpus, i, g, n, now) for n in names] for i, g in chosen
            if i not in lost]
    lines = csv_lines(names, table, rows, fmt)
    # The GPUs that answer print their rows, then a line for each lost one (U22).
    return lines + [LOST.format(bus=g.get("pci.bus_id", "")) for i, g in chosen if i in lost]


def query_apps(state: "State", fields: str, fmt: str, ids: "Optional[str]") -> "List[str]":
    names = resolve(fields, APP_FIELDS, APP_ALIASES)
    gpus = state.get("gpus", [])
    chosen = {i for i, _ in select(gpus, ids)}
    now = time.time()
    rows = []
    for app in state.get("compute_apps", []):
        i = app.get("gpu", 0)
        if i not in chosen or i >= len(gpus) or i in lost_gpus(state):
            continue
        if app.get("follows_pid") and not process_lives(app.get("pid")):
            continue  # a real driver frees a context when its process exits
        row = []
        for n in names:
            if n in app:
                row.append(app[n])
            elif n in APP_FROM_GPU:
                row.append(gpus[i].get(APP_FROM_GPU[n]))
            elif n == "timestamp":
                row.append(now)
            else:
                row.append(None)
        rows.append(row)
    return csv_lines(names, APP_FIELDS, rows, fmt)


def process_lives(pid: "Any") -> bool:
    """For an app added with follows_pid=True (a real pid, Box(real_proc=True)): is that process
    still alive in this machine's /proc? Exited (gone, or a zombie) means its VRAM is free."""
    try:
        with open("/proc/%d/stat" % int(pid), "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except (OSError, TypeError, ValueError):
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def list_gpus(state: "State") -> "List[str]":
    """-L: one line per GPU, its MIG devices indented below it."""
    lines = []
    for i, g in enumerate(state.get("gpus", [])):
        lines.append("GPU %d: %s (UUID: %s)" % (i, g.get("name"), g.get("uuid")))
        for j, mig in enumerate(g.get("mig_devices", [])):
            lines.append("  MIG %-11s Device %2d: (UUID: %s)" % (mig.get("profile"), j,
                                                                mig.get("uuid")))
    return lines


RULE = "+" + "-" * 89 + "+"
GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
GPU_HEAD = (
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|=========================================+========================+======================|")
MIG_RULE = "+" + "-" * 18 + "+" + "-" * 34 + "+" + "-" * 11 + "+" + "-" * 23 + "+"
MIG_HEAD = (
    "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
    "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
    "|                  |                                  |        ECC|                       |",
    "|==================+==================================+===========+=======================|")
PROC_HEAD = (
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|")


def _boxed(text: str) -> str:
    return "| " + text.ljust(88) + "|"


def _onoff(value: "Any") -> str:
    return "On" if value is True else "Off" if value is False else "N/A"


def _num(value: "Any", fmt: str) -> str:
    return "N/A" if value is None else fmt % value


def table(state: "State", now: float) -> "List[str]":
    """`nvidia-smi` with no argument: the GPUs, then their MIG devices (where MIG is on), then
    the compute processes with their GPU and compute instance, as driver 590 prints them
    (tests/test_sim_nvidia_smi.py checks the MIG and process blocks byte for byte against the
    exporter's H100 and H200 MIG captures)."""
    drv = str(state.get("driver_version", ""))
    lines = [time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "       ", RULE,
             "| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|" % (
                 drv, drv, state.get("cuda_version", "")), GPU_RULE]
    lines.extend(GPU_HEAD)
    gpus = state.get("gpus", [])
    for i, g in enumerate(gpus):
        mig = g.get("mig.mode.current") is True
        left = "%4d  %s" % (i, g.get("name"))
        ecc = "On" if mig else _num(g.get("ecc.errors.uncorrected.volatile.total"), "%d")
        power = "%sW / %4sW" % (_num(g.get("power.draw"), "%d"),
                                _num(g.get("enforced.power.limit"), "%d"))
        fan = _num(g.get("fan.speed"), "%d%%")
        util = "N/A" if mig else _num(g.get("utilization.gpu"), "%d%%")
        lines += [
            "|%s%s  |   %s Off |%21s |" % (left, _onoff(g.get("persistence_mode")).rjust(
                39 - len(left)), g.get("pci.bus_id", ""), ecc),
            "| %3s   %2sC    %s%s |%23s |%8s %12s |" % (
                fan, _num(g.get("temperature.gpu"), "%d"), g.get("pstate", "P0"),
                power.rjust(24), "%sMiB / %6sMiB" % (_num(g.get("memory.used"), "%d"),
                                                     _num(g.get("memory.total"), "%d")),
                util, g.get("compute_mode", "Default")),
            "|%41s|%24s|%21s |" % ("", "", "Enabled" if mig else "Disabled"), GPU_RULE]
    devices = [(i, d) for i, g in enumerate(gpus) if g.get("mig.mode.current") is True
               for d in g.get("mig_devices", [])]
    if devices:
        lines += ["", RULE, _boxed("MIG devices:"), MIG_RULE]
        lines.extend(MIG_HEAD)
        for j, (i, d) in enumerate(devices):
            lines += [
                "|%3d%5d%4d%4d  |%30s    |%3d%7s |%3d%4d%5d%5d%5d |" % (
                    i, d.get("gi", 0), d.get("ci", 0), d.get("dev", j),
                    "%dMiB / %5dMiB" % (d.get("mem_used", 0), d.get("mem_total", 0)),
                    d.get("sm", 0), _num(d.get("sram_uncorrected", 0), "%d"), d.get("ce", 0),
                    d.get("enc", 0), d.get("dec", 0), d.get("ofa", 0), d.get("jpg", 0)),
                "|%18s|%30s    |%11s|%23s|" % ("", "%dMiB / %5dMiB" % (
                    d.get("bar1_used", 0), d.get("bar1_total", 0)), "", ""),
                MIG_RULE]
    lines += ["", RULE, _boxed("Processes:")]
    lines.extend(PROC_HEAD)
    lost = lost_gpus(state)
    apps = [a for a in state.get("compute_apps", []) if a.get("gpu", 0) < len(gpus)
            and a.get("gpu", 0) not in lost
            and not (a.get("follows_pid") and not process_lives(a.get("pid")))]
    if not apps:
        lines.append(_boxed(" No running processes found"))
    for a in apps:
        if a.get("gi") is None:
            ids = "%5d   N/A  N/A%16d" % (a.get("gpu", 0), a.get("pid", 0))
        else:
            ids = "%5d%5d%5d%17d" % (a.get("gpu", 0), a.get("gi"), a.get("ci", 0),
                                     a.get("pid", 0))
        mem = _num(a.get("used_gpu_memory"), "%dMiB")
        name = str(a.get("process_name", ""))
        room = 50 - 3 - len(mem) - 2
        if len(name) > room:  # nvidia-smi keeps the end of a long name
            name = "..." + name[-(room - 3):]
        lines.append("|" + ids + "%7s   " % a.get("type", "C") + name.ljust(room)
                     + " " + mem + " |")
    lines.append(RULE)
    return lines


def version(state: "State") -> "List[str]":
    drv = str(state.get("driver_version", ""))
    return [
        "NVIDIA-SMI version  : " + drv,
        "NVML version        : " + ".".join(drv.split(".")[:2]),
        "DRIVER version      : " + drv,
        "CUDA Version        : " + str(state.get("cuda_version", "")),
        "(gpuwatch simulator: a stand-in nvidia-smi for tests and the demo; no GPU was asked)",
    ]


def parse_args(argv: "Sequence[str]") -> "Dict[str, Any]":
    """The few options this stand-in knows, in either "--opt=v" or "--opt v" spelling."""
    opts = {}  # type: Dict[str, Any]
    it = iter(argv)
    for arg in it:
        key, eq, val = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            value = val if eq else next(it, None)
            if value is None:
                raise UsageError(BAD_ARGUMENTS + "\n")
            opts["--id" if key == "-i" else key] = value
        elif arg in ("-L", "--list-gpus", "--version", "-h", "--help"):
            opts[arg] = True
        else:
            raise UsageError(BAD_ARGUMENTS + "\n")
    return opts


def run(argv: "Sequence[str]", state: "State") -> "Tuple[int, str]":
    """(exit status, stdout text) for one invocation against a loaded state."""
    faults = state.get("faults") or {}
    if faults.get("hang"):
        while True:  # a wedged driver: only a timeout gets the caller out (U16, U17)
            time.sleep(3600)
    if faults.get("delay_s"):
        time.sleep(float(faults["delay_s"]))
    if faults.get("fail"):
        msg = faults["fail"] if isinstance(faults["fail"], str) else DRIVER_FAILED
        return int(faults.get("fail_exit", EXIT_DRIVER_NOT_LOADED)), msg + "\n"
    if faults.get("driver") in DRIVER_FAULTS:
        status, msg = DRIVER_FAULTS[faults["driver"]]
        library = "%s.%s" % (driver_major(state.get("driver_version")) + 5, 65)
        return status, msg.format(library=library) + "\n"
    lost = lost_gpus(state)
    try:
        opts = parse_args(argv)
        if "--version" in opts:
            lines = version(state)
        elif "-L" in opts or "--list-gpus" in opts:
            lines = list_gpus(state)
        elif "--query-gpu" in opts or "--query-compute-apps" in opts:
            if "--format" not in opts:
                raise UsageError(BAD_ARGUMENTS + "\n")
            if "--query-gpu" in opts:
                lines = query_gpu(state, opts["--query-gpu"], opts["--format"], opts.get("--id"))
            else:
                lines = query_apps(state, opts["--query-compute-apps"], opts["--format"],
                                   opts.get("--id"))
        elif not opts:
            lines = table(state, time.time())
        else:
            lines = [__doc__.strip()]
    except UsageError as exc:
        return exc.status, str(exc) + "\n"
    return (EXIT_GPU_LOST if lost else 0), "".join(line + "\n" for line in lines)


def lost_gpus(state: "State") -> "List[int]":
    """Indexes of GPUs that fell off the bus (faults.lost): they answer no query."""
    lost = (state.get("faults") or {}).get("lost") or []
    return [i for i in lost if isinstance(i, int)]


def main(argv: "Optional[Sequence[str]]" = None) -> int:
    status, out = run(sys.argv[1:] if argv is None else argv, load_state())
    sys.stdout.write(out)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
