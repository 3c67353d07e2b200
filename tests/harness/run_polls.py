"""One configured run polled again and again through the probe, as the client polls it, with
the GPUs, the kernel log, cgroups and logind left out; and event files written by tensorboardX
for it to read."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.series import RunSeries, run_request
from gpuwatch.remote.model.snapshot import HostSnapshot, RunSample
from gpuwatch.remote.wire.bundle import build_command, build_stdin
from gpuwatch.remote.wire.document import parse_probe_output
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2
from tensorboardX.summary import scalar

QUIET = {"gpus": False, "kernel": False, "cgroup": False, "logind": False}
ENV = {"PATH": "/usr/bin:/bin"}


def probe(request: dict, env: dict[str, str] | None = None,
          python: str = sys.executable) -> bytes:
    result = subprocess.run(["sh", "-c", build_command(python)], input=build_stdin(request),
                            env=env or ENV, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


class Watch:
    """One configured run polled again and again, as the client does it."""

    def __init__(self, run: RunConfig, limits: dict | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.run, self.limits, self.env = run, limits or {}, env
        self.series = RunSeries(run.name)
        self.doc: dict = {}
        self.raw = b""

    def request(self) -> dict:
        return {"v": 1, "want": QUIET, "limits": self.limits, "compress": True,
                "runs": [run_request(self.run, self.series)]}

    def poll(self, python: str = sys.executable) -> RunSample:
        self.raw = probe(self.request(), self.env, python)
        self.doc = json.loads(zlib.decompress(self.raw))
        snap: HostSnapshot = parse_probe_output(self.raw, "box")
        (sample,) = snap.runs
        self.series.update(sample, snap.taken_at)
        return sample


def events_writer(folder: Path, suffix: str = "") -> EventsWriter:
    folder.mkdir(parents=True, exist_ok=True)
    return EventsWriter(str(folder / "events"), suffix)


def write_scalars(writer: EventsWriter, tag: str, points: list[tuple[int, float]],
                  wall: float | None = None) -> None:
    for step, value in points:
        writer.write_event(event_pb2.Event(wall_time=wall or time.time(), step=step,
                                           summary=scalar(tag, value)))
    writer.flush()

