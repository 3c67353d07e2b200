"""A box whose text is out to get the terminal: OSC, CSI, BEL and Textual markup in its hostname,
a process's command line, a run's name, a checkpoint's name and a log line.

The box is simulated (gpuwatch.remote.sim.Box: a fixture /proc, a stand-in nvidia-smi) and
polled as a `local` host, so the real probe reads it and the real gpuwatch shows it. Anyone
on a box can name a process, a file or a log line so; the run's name is the one thing the
honest probe tidies (discover.run_name), so this box's `python` is a wrapper that runs the
real probe and then renames the discovered run in its answer, as a box that lies would.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.sim.box import SimProcess

ESC, BEL = "\x1b", "\x07"
TITLE = "GW-PWNED-TITLE"
"""What an OSC 2 from the box would set the terminal's title to: grep the raw output for it."""
OSC = f"{ESC}]2;{TITLE}{BEL}"
CSI = f"{ESC}[2J{ESC}[H"
MARKUP = "[bold]B[@click=app.quit]Q"  # no "/": it is in a file name too
EVIL = f"{OSC}{CSI}{BEL}{MARKUP}"
"""Every kind of trouble at once; each piece of box text below carries it."""
SHOWN = "\\x1b]2;GW-PWNED-TITLE\\x07\\x1b[2J\\x1b[H\\x07[bold]B[@click=app.quit]Q"
"""EVIL as the screen must show it: control characters visible, markup as written."""

HOSTNAME = f"evilhost{EVIL}"
RUN = f"run{EVIL}"
PID = 4242
CMDLINE = ("python", "train.py", f"--tag={EVIL}")
CHECKPOINT = f"ckpt{EVIL}.pt"
LOG_LINE = f"saving to [/data/ckpt/step-100] {EVIL}"

WRAPPER = """\
#!{python}
# The box's `python`: runs the real one, then renames the discovered run `train` in the
# probe's answer (a box that lies; the real probe would never send such a name).
import json, subprocess, sys, zlib
done = subprocess.run([{python!r}] + sys.argv[1:], stdout=subprocess.PIPE)
out = done.stdout
try:
    packed = out[:1] == b"x"
    doc = json.loads(zlib.decompress(out) if packed else out)
except Exception:
    doc = None
if isinstance(doc, dict) and isinstance(doc.get("discovered"), list):
    def swap(value):
        if isinstance(value, dict):
            return {{k: swap(v) for k, v in value.items()}}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return {run!r} if value == "train" else value
    doc = swap(doc)
    out = json.dumps(doc).encode()
    out = zlib.compress(out) if packed else out
sys.stdout.buffer.write(out)
sys.exit(done.returncode)
"""


@dataclass
class HostileBox:
    box: Box
    workdir: Path
    python: Path

    def config(self, host: str = "evil") -> str:
        """A gpuwatch config with this box as a `local` host."""
        return f'interval = 1\n\n[hosts.{host}]\nssh = "local"\npython = "{self.python}"\n'

    def env(self) -> dict[str, str]:
        """What a gpuwatch process polling this box as `local` needs in its environment."""
        return self.box.env(base_path=os.environ.get("PATH", "/usr/bin:/bin"))


def make(root: Path) -> HostileBox:
    root.mkdir(parents=True, exist_ok=True)
    workdir = root / "work"
    (workdir / "checkpoints").mkdir(parents=True)
    for n, name in enumerate(("ckpt-0001.pt", CHECKPOINT)):
        path = workdir / "checkpoints" / name
        path.write_bytes(b"weights")
        at = time.time() - 600 + 300 * n  # recent, so the run's cadence reads sensibly
        os.utime(path, (at, at))
    log = workdir / "train.log"
    log.write_text(f"step 99 | loss 0.91\n{LOG_LINE}\nstep 100 | loss 0.90\n")
    box = Box(root / "box", h100_sxm(1), hostname=HOSTNAME)
    box.add_process(SimProcess(
        pid=PID, cmdline=CMDLINE, comm="python", state="R", start_s=600.0, cwd=str(workdir),
        fds={0: "/dev/null", 1: str(log), 2: str(log), 3: "/dev/nvidiactl", 4: "/dev/nvidia0"}))
    box.add_compute_app(0, PID, "python", 30_000)
    box.set_gpu(0, util_pct=97, mem_used_mib=30_000)
    python = root / "box-python"
    python.write_text(WRAPPER.format(python=sys.executable, run=RUN))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return HostileBox(box, workdir, python)
