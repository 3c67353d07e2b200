"""``gpuwatch --demo``'s fleet: simulated GPU boxes served over real SSH on loopback.

Each box is a ``Box`` (remote/sim/box.py) whose processes are real, so they can be seen and
signalled, with simulated GPUs, cgroup, kernel log and disks, served by its own in-process SSH
server (remote/sim/sshserver.py) on 127.0.0.1 with its own host key. Its /proc is a view of its
own (remote/sim/proc_view.py): its real processes only, its own hostname, load and CPUs, never
this machine's. The fleet writes an
OpenSSH client config, a known_hosts and a gpuwatch config.toml, so gpuwatch reaches the boxes
through exactly the pipeline it uses for real hosts, host-key checking included.

A controller task steps every box once per tick (1 s): GPU state follows the real processes of
each run, logs, event files and checkpoints move because real (pretend) trainers write them,
and each box plays its scenario:

- ``demo-healthy``: a trainer that trains: GPU busy at full clock, loss going down, checkpoints;
  and on GPU 1 a second run, ``sft``, that the config does not name: gpuwatch finds it from the
  GPU's process, with its log, event files and checkpoints.
- ``demo-capped``: the same, on a GPU capped to 250 W from the start: util 100 % at ~37 % of
  max SM clock, power at the limit, ``sw_power_cap`` active from the first poll, sustained from
  the second (U21, U23).
- ``demo-zombie``: a DDP job died; an orphaned rank 3 (a real process) still holds VRAM on GPU 3
  while no live run owns it (U11). Reap it over SSH and the VRAM comes back.
- ``demo-oom``: the trainer's cgroup memory climbs to its limit and the (simulated) OOM killer
  SIGKILLs it: memory.events oom_kill +1, the kernel's line in dmesg, GPU idle (U41). Relaunch it
  over SSH from its latest checkpoint and it runs on without running out of memory again.
- ``demo-disk``: a fine-tune that keeps every checkpoint on / while / fills toward full (U6):
  low from the first poll, its forecast from the second.
- ``demo-driver``: an unattended driver upgrade left the running kernel module and the new
  library apart: nvidia-smi says "Driver/library version mismatch" (exit 18), as every box does
  until it is rebooted. A wedged driver is not "no GPU": gpuwatch says so, and refuses a
  relaunch there (every new CUDA process would fail).
- ``demo-mig``: GPU 0 split into MIG instances (an H100's 3g.40gb, 2g.20gb, 2x 1g.10gb), a
  LoRA fine-tune in the 3g.40gb: the GPU pane lists the instances, with the run's pid in its
  own, and says the driver reports no util under MIG; GPU 1's memory lost data (2 uncorrected
  ECC errors, a row remap pending): its findings, and no relaunch onto it.

The simulated disks (/ and /data) are the simulator hook ``BOX/sim/statvfs.json`` (the probe
reads it only under ``GPUWATCH_SIM_DIR``): ``{"/data": {"bytes_total": int, "bytes_free": int,
"inodes_total": int, "inodes_free": int}}``, keyed by the path exactly as the config lists it.

``async with DemoFleet.start() as fleet: ...`` runs it; ``python -m gpuwatch.remote.sim.fleet``
serves it until Ctrl-C. Every process the fleet or its SSH servers start carries
``GPUWATCH_DEMO_FLEET=<id>`` in its environment and a lifeline pipe; on exit (or if this process
dies) they all end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from gpuwatch.remote.sim.box import Box
from gpuwatch.remote.sim.fleet_box import (
    DemoBox,
    DemoRun,
    RealProcess,
    box_mark,
    demo_log,
    fleet_pids,
    scan_processes,
)
from gpuwatch.remote.sim.fleet_kinds import BOX_KINDS
from gpuwatch.remote.sim.sshserver import BoxSshServer, write_key_pair

__all__ = ["BOX_NAMES", "DemoBox", "DemoFleet", "DemoRun", "Timeline", "main"]

BOX_NAMES = ("demo-healthy", "demo-capped", "demo-zombie", "demo-oom", "demo-disk",
             "demo-driver", "demo-mig")
"""Every box of the demo, in the order the config lists them."""

ROOT_MARKER = ".gpuwatch-demo-fleet"
"""The file that makes a folder a demo root: only such a folder (or an empty one) is reused."""

@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds of the demo (tests shrink these)."""

    step_s: float = 0.5
    """Seconds per training step of the healthy, OOM and disk trainers."""
    capped_step_s: float = 1.4
    """The capped box trains ~2.7x slower: its clock sits at 37 % of max."""
    save_every: int = 40
    """Steps between checkpoints of the healthy and capped runs."""
    capped_interval_s: float = 4.0
    """Unused: demo-capped is capped from its first poll (kept for callers that set it)."""
    oom_after_s: float = 18.0
    """demo-oom's trainer is OOM-killed this long after it started (once per fleet): within
    the demo's first 30 s, after polls that saw it alive."""
    oom_save_every: int = 20
    disk_save_every: int = 30
    disk_start_free: float = 0.045
    """Fraction of / free on demo-disk at the start: low already (disk.low from the first
    poll), its forecast from the second."""
    disk_fill_bytes_s: float = 0.25e9
    """Steady growth on demo-disk's / (caches, logs), besides each checkpoint."""
    disk_checkpoint_bytes: int = 0
    """What each demo-disk checkpoint costs on the simulated / besides its files' bytes."""
    disk_floor: float = 0.006
    """demo-disk's / stops filling at this fraction free (it cannot really run out)."""



# ---------------------------------------------------------------------------------------------
# The fleet


class DemoFleet:
    """Simulated boxes behind real SSH servers on loopback, with the files to reach them.

    Use ``async with DemoFleet.start(...) as fleet``: ``fleet.config_path`` (gpuwatch's
    config.toml), ``fleet.ssh_config``, ``fleet.known_hosts``, ``fleet.client_key``,
    ``fleet.hosts`` (names), ``fleet.box(name)`` (its Box), ``fleet.demo_box(name)``.
    """

    def __init__(self, root: Path, *, boxes: Sequence[str], tick_s: float,
                 timeline: Timeline) -> None:
        unknown = [b for b in boxes if b not in BOX_KINDS]
        if unknown:
            raise ValueError(f"unknown demo boxes {unknown} (known: {', '.join(BOX_KINDS)})")
        self.root = root
        self.id = uuid.uuid4().hex
        self.tick_s = tick_s
        self.timeline = timeline
        self.user = getpass.getuser()
        self.ssh_dir = root / "ssh"
        self.config_path = root / "config.toml"
        self.ssh_config = self.ssh_dir / "config"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.client_key = self.ssh_dir / "id_ed25519"
        self.started_pids: set[int] = set()
        self.lifeline_fd: int | None = None
        self._lifeline_w: int | None = None
        self._names = list(dict.fromkeys(boxes))
        self._boxes: dict[str, DemoBox] = {}
        self._controller: asyncio.Task[None] | None = None
        self.ticks = 0
        self.known_pids: frozenset[int] = frozenset()
        """The pids of the last scan of this machine's processes."""
        self._marks: dict[tuple[int, int], str | None] = {}

    # -- the public face ---------------------------------------------------------------------
    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, root: Path | None = None, *, boxes: Iterable[str] = BOX_NAMES,
                    tick_s: float = 1.0, timeline: Timeline | None = None,
                    ) -> AsyncIterator[DemoFleet]:
        """Build the boxes, start their SSH servers, processes and the controller; on exit
        (or cancellation) stop all of it. root=None: a private temp folder, removed after;
        a root given must be empty or an earlier demo's (its boxes are then started afresh)."""
        own_root = root is None
        base = Path(tempfile.mkdtemp(prefix="gpuwatch-demo-")) if root is None else Path(root)
        _claim_root(base)
        fleet = cls(base.resolve(), boxes=list(boxes), tick_s=tick_s,
                    timeline=timeline or Timeline())
        try:
            await fleet._start()
            yield fleet
        finally:
            try:
                await fleet._stop()
            finally:
                fleet._kill_all_now()
                if own_root:
                    shutil.rmtree(base, ignore_errors=True)

    @property
    def hosts(self) -> list[str]:
        return list(self._names)

    def box(self, name: str) -> Box:
        return self._boxes[name].box

    def demo_box(self, name: str) -> DemoBox:
        return self._boxes[name]

    def run_pids(self, host: str, run: str) -> list[int]:
        """Live trainer pids of a run, from the real /proc now."""
        demo = self._boxes[host]
        spec = next(r for r in demo.runs if r.name == run)
        return sorted(pid for pid, p in scan_processes().items() if spec.matches(p))

    def box_of(self, proc: RealProcess) -> str | None:
        """The box a real process belongs to (its environment's mark, read once per process)."""
        key = (proc.pid, proc.start_ticks)
        if key not in self._marks:
            self._marks[key] = box_mark(proc.pid, self.id)
        return self._marks[key]

    def tick(self) -> None:
        """One step of every box (the controller calls it every tick_s; tests may too)."""
        procs = scan_processes()
        self.known_pids = frozenset(procs)
        self._marks = {k: v for k, v in self._marks.items() if k[0] in procs}
        for demo in self._boxes.values():
            try:
                demo.tick(procs)
            except Exception:  # one box's trouble must not stop the others
                demo_log.exception("demo box %s: tick failed", demo.name)
        self.ticks += 1

    def processes(self) -> list[int]:
        """Live processes this fleet started (directly or through its SSH servers)."""
        return fleet_pids(self.id)

    # -- start and stop ------------------------------------------------------------------------
    async def _start(self) -> None:
        self.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.ssh_dir, 0o700)
        read_fd, write_fd = os.pipe()
        self.lifeline_fd, self._lifeline_w = read_fd, write_fd
        client_key = write_key_pair(self.client_key, f"gpuwatch-demo-client@{self.id[:8]}")
        known: list[str] = []
        for name in self._names:
            demo = BOX_KINDS[name](self, name, self.root / "boxes" / name)
            self._boxes[name] = demo
            demo.prepare()
            host_key = write_key_pair(self.ssh_dir / f"host_{name}_ed25519",
                                      f"gpuwatch-demo-host:{name}")
            demo.server = BoxSshServer(name, host_key=host_key, authorized_keys=[client_key],
                                       user=self.user, home=demo.home, env=demo.env(),
                                       pass_fds=(read_fd,), before_command=demo.before_command)
            port = await demo.server.start()
            known.append(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}")
        self._write_ssh_files(known)
        self._write_config()
        for demo in self._boxes.values():
            await demo.launch()
        self.tick()
        self._controller = asyncio.create_task(self._control(), name="gpuwatch-demo-controller")

    async def _control(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.tick_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if time.monotonic() - next_at > self.tick_s:
                next_at = time.monotonic()  # fell behind (a suspended laptop): no burst
            self.tick()

    async def _stop(self) -> None:
        if self._controller is not None:
            self._controller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._controller
            self._controller = None
        # all at once: each close is bounded (sshserver.py), and five in a row added up
        await asyncio.gather(*(demo.server.close() for demo in self._boxes.values()
                               if demo.server is not None))
        await self._end_processes(grace_s=2.0)

    async def _end_processes(self, grace_s: float) -> None:
        """TERM every process of the fleet, then KILL what is left after the grace."""
        pids = set(self.processes()) | {p for p in self.started_pids if _alive(p)}
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            pids = {p for p in pids if _alive(p)}
        self._kill_all_now()

    def _kill_all_now(self) -> None:
        """SIGKILL every process of the fleet; close the lifeline (survivors end by it)."""
        for pid in set(self.processes()) | {p for p in self.started_pids if _alive(p)}:
            _signal(pid, signal.SIGKILL)
        for fd in (self._lifeline_w, self.lifeline_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lifeline_w = self.lifeline_fd = None

    # -- files -----------------------------------------------------------------------------------
    def _write_ssh_files(self, known: list[str]) -> None:
        def q(path: Path) -> str:
            text = str(path)
            return f'"{text}"' if any(c.isspace() for c in text) else text

        lines = ["# gpuwatch --demo: simulated GPU boxes, each served over real SSH on loopback",
                 "# by gpuwatch's in-process server (remote/sim/sshserver.py). Try:",
                 f"#   ssh -F {q(self.ssh_config)} {self._names[0]} nvidia-smi", ""]
        for name in self._names:
            demo = self._boxes[name]
            lines += [f"Host {name}", "    HostName 127.0.0.1", f"    Port {demo.port}",
                      f"    User {self.user}", f"    IdentityFile {q(self.client_key)}",
                      "    IdentitiesOnly yes", f"    UserKnownHostsFile {q(self.known_hosts)}",
                      "    StrictHostKeyChecking yes", "    PasswordAuthentication no",
                      "    KbdInteractiveAuthentication no", "    BatchMode yes", ""]
        _private_write(self.ssh_config, "\n".join(lines))
        _private_write(self.known_hosts, "".join(line + "\n" for line in known))

    def _write_config(self) -> None:
        data: dict[str, Any] = {
            "interval": 2,
            "ssh": {"config_file": str(self.ssh_config), "known_hosts": str(self.known_hosts),
                    "connect_timeout": 5, "command_timeout": 20},
            "hosts": {name: self._boxes[name].host_config() for name in self._names},
        }
        header = ("# gpuwatch --demo: a simulated fleet served over real SSH on loopback.\n"
                  "# Its GPUs are stand-ins (remote/sim/), its processes are real.\n")
        for name in self._names:
            header += f"#   {name}: {self._boxes[name].story}\n"
        _private_write(self.config_path, header + "\n" + tomli_w.dumps(data))


def _claim_root(root: Path) -> None:
    """Make root the fleet's folder: create it, or reuse an empty one or an earlier demo's
    (wiping what that demo left); refuse anything else rather than delete it."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / ROOT_MARKER
    if any(root.iterdir()) and not marker.exists():
        raise ValueError(f"{root} is not empty and not a gpuwatch demo folder; "
                         "give an empty or new folder")
    for name in ("boxes", "ssh"):
        shutil.rmtree(root / name, ignore_errors=True)
    (root / "config.toml").unlink(missing_ok=True)
    marker.write_text("gpuwatch --demo keeps a simulated fleet here; safe to delete\n",
                      encoding="utf-8")


def _private_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# ---------------------------------------------------------------------------------------------
# Standalone: python -m gpuwatch.remote.sim.fleet


async def _serve(root: Path | None, boxes: Sequence[str], tick_s: float) -> None:
    async with DemoFleet.start(root, boxes=boxes, tick_s=tick_s) as fleet:
        print(f"gpuwatch demo fleet: {len(fleet.hosts)} simulated boxes over SSH on 127.0.0.1")
        for name in fleet.hosts:
            print(f"  {name:<14} port {fleet.demo_box(name).port}  "
                  f"{fleet.demo_box(name).story}")
        print(f"config:     {fleet.config_path}")
        print(f"ssh config: {fleet.ssh_config}")
        print(f"try:        ssh -F {fleet.ssh_config} {fleet.hosts[0]} nvidia-smi")
        print(f"            gpuwatch --config {fleet.config_path}")
        print("serving until Ctrl-C", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwatch.remote.sim.fleet",
        description="Serve gpuwatch's demo fleet (simulated GPU boxes over SSH on loopback) "
                    "until Ctrl-C; prints the config to point gpuwatch at.")
    parser.add_argument("--root", type=Path, help="keep the fleet's files here (default: a "
                        "temporary folder, removed at exit)")
    parser.add_argument("--boxes", nargs="+", default=list(BOX_NAMES), choices=BOX_NAMES)
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between steps")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        asyncio.run(_serve(args.root, args.boxes, args.tick))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
