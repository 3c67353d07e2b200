"""The real curves of tests/data/curves (PROVENANCE.md there) and the writers that replay them
into a run's folder a poll at a time, as the run wrote them: trainer_state.json rewritten
whole (HF's Trainer does), metrics.csv appended to (Lightning's CSVLogger), TensorBoard
events through tensorboardX. An anomaly is injected by changing the points before a replay."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.remote.box.tfevents import read_scalars

DATA = Path(__file__).parent / "data" / "curves"
Points = dict[str, list[tuple[int, float]]]

HF = {"hf_whisper_flemish": "hf_whisper_flemish.trainer_state.json",
      "hf_whisper_tiny": "hf_whisper_tiny_trimmed.trainer_state.json",
      "hf_multi_eval": "hf_multi_eval.trainer_state.json",
      "hf_whisper_hi_overfits": "hf_whisper_hi_overfits.trainer_state.json"}
LIGHTNING = {"lightning_histogene": "lightning_histogene.metrics.csv",
             "lightning_genrisk_gan": "lightning_genrisk_gan.metrics.csv"}
EVENTS = {"mlp_digits": "mlp_digits"}
HEALTHY = ["hf_whisper_flemish", "hf_whisper_tiny", "hf_multi_eval", "lightning_histogene",
           "lightning_genrisk_gan", "mlp_digits"]


def load_events(name: str) -> Points:
    out: Points = {}
    for path in sorted((DATA / EVENTS[name]).iterdir()):
        points, _, errors, _ = read_scalars(str(path))
        assert not errors, errors
        for tag, step, value, _wall in points:
            out.setdefault(tag, []).append((int(step), float(value)))
    return out


class Replay:
    """One curve replayed into `folder` up to a point (`upto(n)`: the first n entries)."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name, self.folder = name, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.kind = "hf" if name in HF else "csv" if name in LIGHTNING else "events"
        self.written = 0
        self.parts = 0
        self.wall = 0.0
        if self.kind == "hf":
            self.doc = json.loads((DATA / HF[name]).read_text())
            self.entries: list[dict[str, Any]] = list(self.doc["log_history"])
        elif self.kind == "csv":
            with (DATA / LIGHTNING[name]).open() as f:
                rows = list(csv.reader(f))
            self.header, self.rows = rows[0], rows[1:]
        else:
            points = load_events(name)
            self.events = sorted(((s, tag, v) for tag, pts in points.items() for s, v in pts),
                                 key=lambda p: p[0])
            # wall times of a run at 0.5 s a step whose last step is about now
            self.wall = time.time() - 0.5 * self.events[-1][0]

    @property
    def path(self) -> Path:
        return {"hf": self.folder / "trainer_state.json", "csv": self.folder / "metrics.csv",
                "events": self.folder / "runs"}[self.kind]

    def __len__(self) -> int:
        return len(self.entries if self.kind == "hf" else self.rows if self.kind == "csv"
                   else self.events)

    def edit(self, tag: str, change: Callable[[int, float], float]) -> None:
        """Change `tag`'s values: change(step, value) → the new value."""
        if self.kind == "hf":
            for e in self.entries:
                if tag in e and "train_runtime" not in e:
                    e[tag] = change(e["step"], e[tag])  # NaN written as HF's json.dumps does
        elif self.kind == "csv":
            col, at = self.header.index(tag), self.header.index("step")
            for row in self.rows:
                if row[col] != "":
                    row[col] = repr(change(int(row[at]), float(row[col])))
        else:
            self.events = [(s, t, change(s, v) if t == tag else v) for s, t, v in self.events]

    def steps(self, tag: str) -> list[int]:
        if self.kind == "hf":
            return [e["step"] for e in self.entries if tag in e and "train_runtime" not in e]
        if self.kind == "csv":
            col, at = self.header.index(tag), self.header.index("step")
            return [int(r[at]) for r in self.rows if r[col] != ""]
        return [s for s, t, _ in self.events if t == tag]

    def upto(self, n: int, seconds_per_entry: float = 0.5) -> None:
        """Write the first n entries (a poll's worth more than before)."""
        n = min(n, len(self))
        if self.kind == "hf":
            doc = dict(self.doc, log_history=self.entries[:n])
            doc["global_step"] = self.entries[n - 1]["step"] if n else 0
            self.path.write_text(json.dumps(doc, allow_nan=True))
        elif self.kind == "csv":
            with self.path.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(self.header)
                w.writerows(self.rows[:n])
        else:
            from tensorboardX import SummaryWriter

            # a writer a poll, closed: tensorboardX's flush() is asynchronous, close() is not
            self.parts += 1
            writer = SummaryWriter(str(self.path), filename_suffix=f".{self.parts:04d}")
            for step, tag, value in self.events[self.written:n]:
                writer.add_scalar(tag, value, step, walltime=self.wall + step * seconds_per_entry)
            writer.close()
        self.written = n

    def toml(self) -> str:
        key = "events" if self.kind == "events" else "metrics"
        value = f'"{self.path}"' if key == "events" else f'["{self.path}"]'
        return f"{key} = {value}\n"
