"""The real-curve corpus (tests/data/curves/corpus, its truths in PROVENANCE.md there) and a
replay of each curve as a live run: the file written as its writer would write it, a growing
prefix a poll (HF's Trainer rewrites trainer_state.json whole, Lightning and Keras append CSV
rows, a JSONL logger appends lines, TensorBoard appends records), read by the box's own readers
and judged by the real rules (`evaluate`) on a HostHistory, as `--once` and the TUI judge.

The probe runs once, for real, against a simulated box whose training process is the run (its
processes, host and GPUs); each later poll reads the run's files with the very same box code
(known_runs.collect_runs) in this process, to keep a replay of a thousand polls in seconds. The
run's clock is simulated: each poll is `poll_s` after the last, and every file written is given
that time, so a quick replay is not a run that stalled. Event files keep their own wall times:
the clock then follows them."""

from __future__ import annotations

import copy
import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from findings_helpers import host_config
from gpuwatch.remote.box import known_runs, probe
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.findings.rules import evaluate
from gpuwatch.remote.model.finding import Finding
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from gpuwatch.remote.wire.bundle import build_command, build_stdin
from gpuwatch.remote.wire.collect import build_request
from gpuwatch.remote.wire.document import parse_probe_output

CORPUS = Path(__file__).parent / "data" / "curves" / "corpus"
PROVENANCE = Path(__file__).parent / "data" / "curves" / "PROVENANCE.md"
TRUTHS = ("healthy", "stuck", "overfitting")
CURVE_CODES = {"run.loss_nan", "run.diverging", "run.loss_spike", "run.plateau",
               "run.overfitting", "run.hung", "run.slowed"}


@dataclass(frozen=True)
class Entry:
    """One corpus curve: its file (or events folder) and the truth written before judging."""

    name: str
    path: Path
    truth: str
    words: str


def corpus() -> list[Entry]:
    """The corpus table of PROVENANCE.md (the one place the truths are written)."""
    text = PROVENANCE.read_text(encoding="utf-8")
    table = text.split("## The real-curve corpus", 1)[1]
    out = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`").split("/")[0]
        path = CORPUS / name
        truth, _, words = cells[6].partition(" — ")
        assert truth in TRUTHS, (name, truth)
        assert path.exists(), path
        out.append(Entry(name.split(".")[0], path, truth, words))
    return out


def entry(name: str) -> Entry:
    """The corpus curve of that name."""
    return next(e for e in corpus() if e.name == name)


def event_records(data: bytes) -> list[bytes]:
    """A TensorBoard file's records as they were written (length, its CRC, data, its CRC)."""
    out, at = [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        end = at + 12 + length + 4
        assert end <= len(data), "a torn record in a corpus event file"
        out.append(data[at:end])
        at = end
    return out


class LiveFile:
    """One corpus curve written into `folder` as its writer would, `upto(n)` units at a time
    (a trainer_state entry, a CSV row, a JSONL line, an event record)."""

    def __init__(self, entry: Entry, folder: Path) -> None:
        self.entry, self.folder = entry, folder
        folder.mkdir(parents=True, exist_ok=True)
        name = entry.path.name
        if entry.path.is_dir():
            self.kind = "events"
            (src,) = sorted(entry.path.iterdir())
            self.units: list[Any] = event_records(src.read_bytes())
            self.target = folder / "runs" / src.name
            self.target.parent.mkdir()
        elif name.endswith(".trainer_state.json"):
            self.kind = "hf"
            self.doc = json.loads(entry.path.read_text())
            self.units = list(self.doc["log_history"])
            self.target = folder / "trainer_state.json"
        elif name.endswith(".csv"):
            self.kind = "csv"
            lines = entry.path.read_text().splitlines(keepends=True)
            self.header, self.units = lines[0], lines[1:]
            self.target = folder / ("metrics.csv" if ".metrics." in name else "training_log.csv")
        else:
            self.kind = "jsonl"
            self.units = entry.path.read_text().splitlines(keepends=True)
            self.target = folder / "training_log.jsonl"
        self.written = 0

    def __len__(self) -> int:
        return len(self.units)

    def edit(self, tag: str, change: Callable[[int, float], float]) -> None:
        """Change `tag`'s values: change(index among its points, value) → the new value."""
        seen = 0
        if self.kind == "hf":
            for e in self.units:
                if tag in e and "train_runtime" not in e:
                    e[tag] = change(seen, e[tag])
                    seen += 1
        elif self.kind == "csv":
            import csv

            cols = next(csv.reader([self.header]))
            at = cols.index(tag)
            for i, line in enumerate(self.units):
                cells = next(csv.reader([line]))
                if len(cells) > at and cells[at] != "":
                    cells[at] = repr(change(seen, float(cells[at])))
                    seen += 1
                    self.units[i] = ",".join(cells) + "\n"
        elif self.kind == "jsonl":
            for i, line in enumerate(self.units):
                row = json.loads(line)
                if tag in row:
                    row[tag] = change(seen, row[tag])
                    seen += 1
                    self.units[i] = json.dumps(row, allow_nan=True) + "\n"
        else:
            raise AssertionError("the corpus' event files are replayed as they are")

    def upto(self, n: int, mtime: float) -> None:
        n = min(n, len(self))
        if self.kind == "hf":
            doc = dict(self.doc, log_history=self.units[:n])
            doc["global_step"] = self.units[n - 1].get("step", 0) if n else 0
            self.target.write_text(json.dumps(doc, allow_nan=True))
        elif self.kind == "events":
            with self.target.open("ab") as f:
                f.write(b"".join(self.units[self.written:n]))
        else:
            with self.target.open("a" if self.written else "w") as f:
                if not self.written and self.kind == "csv":
                    f.write(self.header)
                f.write("".join(self.units[self.written:n]))
        os.utime(self.target, (mtime, mtime))
        self.written = n

    def toml(self) -> str:
        if self.kind == "events":
            return f'events = "{self.target.parent}"\n'
        return f'metrics = ["{self.target}"]\n'


class LiveRun:
    """A simulated box whose training process is the run, polled `poll()` after `poll()`."""

    def __init__(self, tmp: Path, live: LiveFile, thresholds: Thresholds | None = None,
                 extra: str = "") -> None:
        self.box = Box(tmp / "box", h100_sxm(1), btime=int(time.time()) - 86_400,
                       uptime_s=86_400.0)
        self.box.add_process(training_process(600, workdir=str(live.folder), nohup=True,
                                              start_s=3600.0))
        self.host = host_config(f'[hosts.gpu1.runs.corpus]\nprocess = "train.py"\n'
                                f'workdir = "{live.folder}"\n' + live.toml() + extra)
        self.history = HostHistory("gpu1", thresholds=thresholds or Thresholds())
        self.env = {**self.box.env(base_path="/usr/bin:/bin")}
        self.doc: dict[str, Any] | None = None
        self.matched: dict[int, str] = {}

    def kill(self) -> None:
        """The run's process dies: the next poll's probe runs again and finds none."""
        self.box.remove_process(600)
        self.doc, self.matched = self._first_doc(alive=False), {}

    def _first_doc(self, alive: bool = True) -> dict[str, Any]:
        """The real probe, once: the box's host, processes and GPUs, the run's pids."""
        request = build_request(self.host, None, self.history.runs)
        request["want"] = {"nvml": False}
        out = subprocess.run(["sh", "-c", build_command(sys.executable)],
                             input=build_stdin(request), env=self.env, capture_output=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        raw = out.stdout
        doc = json.loads(zlib.decompress(raw) if raw[:1] == b"x" else raw)
        (run,) = doc["runs"]
        assert bool(run["pids"]) == alive, "the simulated training process was not matched"
        self.matched = {pid: "corpus" for pid in run["pids"]}
        return dict(doc)

    def poll(self, at: float) -> list[Finding]:
        """One poll at box time `at`: the run's files read by the box's code, judged."""
        if self.doc is None:
            self.doc = self._first_doc()
        request = build_request(self.host, None, self.history.runs)
        doc = copy.copy(self.doc)
        doc["runs"] = known_runs.collect_runs(request, probe.request_limits(request),
                                              {"matched": dict(self.matched)})
        snap = parse_probe_output(json.dumps(doc).encode(), "gpu1")
        snap = replace(snap, taken_at=at)
        self.history.record(snap, at)
        return evaluate(self.history)


@dataclass
class Replayed:
    """What one replay saw: the curve findings of each poll, and the units each poll held."""

    polls: list[list[Finding]]
    upto: list[int]

    def loud(self) -> list[Finding]:
        return [f for found in self.polls for f in found if f.severity.value >= 1]

    def codes(self, at_least: int = 0) -> set[str]:
        return {f.code for found in self.polls for f in found if f.severity.value >= at_least}

    def first(self, code: str, at_least: int = 0) -> int | None:
        return next((i for i, found in enumerate(self.polls)
                     if any(f.code == code and f.severity.value >= at_least for f in found)),
                    None)


def replay(entry: Entry, tmp: Path, per_poll: int,
           change: Callable[[LiveFile], None] | None = None, poll_s: float = 60.0,
           thresholds: Thresholds | None = None) -> Replayed:
    """`entry` written `per_poll` units a poll, a poll after each."""
    live = LiveFile(entry, tmp / "run")
    if change is not None:
        change(live)
    run = LiveRun(tmp, live, thresholds)
    walls = _event_walls(live) if live.kind == "events" else None
    clock = (walls[0] - poll_s if walls else
             time.time() - poll_s * (len(live) // per_poll + 2))
    polls, upto = [], []
    for n in range(per_poll, len(live) + per_poll, per_poll):
        n = min(n, len(live))
        clock = max(clock + 1.0, walls[n - 1] + 1.0) if walls else clock + poll_s
        live.upto(n, clock - 1.0)
        polls.append([f for f in run.poll(clock) if f.code in CURVE_CODES])
        upto.append(n)
    return Replayed(polls, upto)


def _event_walls(live: LiveFile) -> list[float]:
    """Each event record's wall time (a record's first field, the event's double)."""
    out, last = [], 0.0
    for rec in live.units:
        data = rec[12:-4]
        if data[:1] == b"\x09":  # field 1, fixed64: wall_time
            last = struct.unpack("<d", data[1:9])[0]
        out.append(last)
    return out


def granularities(n: int) -> tuple[int, int]:
    """Units a poll for the coarse and the fine replay: about 6 and about 40 polls."""
    return max(1, math.ceil(n / 6)), max(1, math.ceil(n / 40))
