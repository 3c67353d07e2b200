#!/usr/bin/env python3
"""gpuwatch's SIMULATED dmesg: prints the simulated box's kernel log, BOX/sim/dmesg.log.

Not util-linux's dmesg: a stand-in that gpuwatch's box simulator copies into BOX/bin/. The log
holds lines in the kernel's own format, "[  seconds.micros] message", which is what `dmesg`
prints with no options. `-T`/`--ctime` and `--time-format=iso` rewrite the stamp from the boot
time in sim/gpus.json ("btime"), as the real tool does from the kernel's. With the box's
`dmesg_denied` fault set it answers like an unprivileged user's dmesg under
kernel.dmesg_restrict=1. Stdlib only, Python 3.6+, imports nothing of gpuwatch.
"""

import json
import os
import re
import sys
import time

MYPY = False
if MYPY:  # typing costs start-up time, so only the type checker imports it
    from typing import Any, Dict, Optional, Sequence

DENIED = "dmesg: read kernel buffer failed: Operation not permitted\n"
STAMP = re.compile(r"^\[\s*(\d+)\.(\d+)\] ?")


def sim_dir() -> str:
    """$GPUWATCH_SIM_DIR, else BOX/sim beside BOX/bin/dmesg."""
    env = os.environ.get("GPUWATCH_SIM_DIR")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim")


def load_state(directory: str) -> "Dict[str, Any]":
    try:
        with open(os.path.join(directory, "gpus.json"), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {}


def iso(epoch: int, micros: int) -> str:
    """util-linux's --time-format=iso: 2024-11-15T12:02:03,470068+00:00 (local time)."""
    tm = time.localtime(epoch)
    off = tm.tm_gmtoff // 60
    sign = "+" if off >= 0 else "-"
    return "%s,%06d%s%02d:%02d" % (time.strftime("%Y-%m-%dT%H:%M:%S", tm), micros, sign,
                                   abs(off) // 60, abs(off) % 60)


def restamp(line: str, mode: str, btime: int) -> str:
    """The line with its monotonic stamp rewritten for -T or iso; others pass through."""
    m = STAMP.match(line)
    if not m or mode == "raw":
        return line
    secs = int(m.group(1))
    micros = int(m.group(2).ljust(6, "0")[:6])
    rest = line[m.end():]
    if mode == "ctime":
        return "[%s] %s" % (time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(btime + secs)),
                            rest)
    return "%s %s" % (iso(btime + secs, micros), rest)


def main(argv: "Optional[Sequence[str]]" = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = sim_dir()
    state = load_state(directory)
    if (state.get("faults") or {}).get("dmesg_denied"):
        sys.stderr.write(DENIED)
        return 1
    mode = "raw"
    if "-T" in args or "--ctime" in args:
        mode = "ctime"
    if "--time-format=iso" in args or ("--time-format" in args and "iso" in args):
        mode = "iso"
    try:
        with open(os.path.join(directory, "dmesg.log"), encoding="utf-8",
                  errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        lines = []
    btime = int(state.get("btime", 0))
    sys.stdout.write("".join(restamp(line, mode, btime) + "\n" for line in lines))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
