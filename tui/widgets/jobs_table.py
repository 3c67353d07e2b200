"""JobsTable: the user's Slurm jobs, one row each (row key: the job id), from the latest round of
the scheduler; the columns that do not fit the width go, least needed first (as the fleet table's
do), and the last column, why it ended or waits, takes what is left, cut at a word.

Every cell is Text built from the scheduler's strings through `visible` (a job's name, its nodes
and its run are the user's text, never markup).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.model.slurm_job import JobView
from gpuwatch.remote.units import duration
from rich.cells import cell_len
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from ..colours import SEVERITY_GLYPH, colour, severity_colour
from ..format import fit_words, visible
from .cursor_keys import CURSOR_KEYS

COLUMNS = (("job", "job"), ("name", "name"), ("state", "state"), ("time", "elapsed/limit"),
           ("left", "left"), ("nodes", "nodes"), ("run", "run"), ("ckpt", "ckpt"),
           ("why", "why"))
"""In the order shown."""
DROP = ("run", "nodes", "time", "name", "ckpt", "left")
"""Where the width is short, these go first to last (job, state and why stay)."""
WHY_MIN = 28
"""The why column's least width: below it another column goes."""
PADDING = 2
"""A DataTable cell's padding, both sides together."""
SCROLLBAR = 2
STATE_VARIABLE = {"RUNNING": "success", "COMPLETING": "success", "PENDING": "text-muted",
                  "COMPLETED": "primary"}


def time_left(view: JobView, now: float) -> float | None:
    """Seconds a running job has until its time limit (None: not running, or no limit)."""
    job = view.job
    if not job.running:
        return None
    if job.end_at is not None:
        return max(0.0, job.end_at - now)
    if job.time_limit_s is not None and job.elapsed_s is not None:
        return max(0.0, job.time_limit_s - job.elapsed_s)
    return None


def limit_warning(view: JobView) -> Finding | None:
    """The time-limit finding of a job (docs/slurm.md: job.time_limit), if it has one."""
    return next((f for f in view.findings if f.code == "job.time_limit"), None)


def worst(view: JobView) -> Severity | None:
    return max((f.severity for f in view.findings), default=None)


def why_words(view: JobView, now: float) -> str:
    """Why it ended or waits (slurm_why's sentence); for a running job near its limit, the
    warning in short."""
    if view.why:
        return view.why
    warning = limit_warning(view)
    if warning is None:
        return ""
    left = duration(time_left(view, now))
    age = warning.evidence.get("checkpoint_age_s")
    if view.run is None:
        return f"time limit in {left}; no run linked (checkpoints unseen)"
    if age is None:
        return f"time limit in {left} and no checkpoint: its work is lost then"
    return f"time limit in {left}; last checkpoint {duration(float(str(age)))} old"


class JobsTable(DataTable[Text]):
    """The jobs in the scheduler's order (running, pending, then ended, newest first)."""

    BINDINGS: ClassVar[list[BindingType]] = [*CURSOR_KEYS]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._views: list[JobView] = []
        self._now = 0.0
        self.shown_columns: tuple[str, ...] = ()

    @property
    def shown(self) -> list[str]:
        """The jobs' ids in the order of the rows."""
        return [v.job.job_id for v in self._views]

    @property
    def selected(self) -> JobView | None:
        if not self._views or not 0 <= self.cursor_row < len(self._views):
            return None
        return self._views[self.cursor_row]

    def show(self, views: Sequence[JobView], now: float) -> None:
        """Every row anew; the cursor stays on its job (or the row it was on)."""
        keep = self.selected.job.job_id if self.selected else None
        row = self.cursor_row
        self._views, self._now = list(views), now
        cells = [self.cells(v, now) for v in self._views]
        columns = self.fit(cells)
        if columns != self.shown_columns:
            self.shown_columns = columns
            self.clear(columns=True)
            for key, label in COLUMNS:
                if key in columns:
                    self.add_column(label, key=key)
        else:
            self.clear()
        why_width = self.why_width(cells, columns)
        for view, row_cells in zip(self._views, cells, strict=True):
            shown = []
            for key in columns:
                cell = row_cells[key]
                if key == "why":
                    cell = Text(fit_words(cell.plain, why_width), style=cell.style)
                shown.append(cell)
            self.add_row(*shown, key=view.job.job_id)
        if not self._views:
            return
        ids = self.shown
        self.move_cursor(row=ids.index(keep) if keep in ids else max(0, min(row, len(ids) - 1)))

    def on_resize(self) -> None:
        if self._views:
            self.show(self._views, self._now)

    def fit(self, cells: Sequence[dict[str, Text]]) -> tuple[str, ...]:
        """The columns the width affords, dropping DROP's in its order."""
        width = (self.size.width or self.app.size.width) - SCROLLBAR
        widest = {key: max([cell_len(label), *(cell_len(c[key].plain) for c in cells)])
                  for key, label in COLUMNS}
        keep = [key for key, _ in COLUMNS]
        for drop in (None, *DROP):
            if drop is not None:
                keep.remove(drop)
            need = sum(widest[k] + PADDING for k in keep if k != "why") + WHY_MIN + PADDING
            if need <= width:
                break
        return tuple(keep)

    def why_width(self, cells: Sequence[dict[str, Text]], columns: tuple[str, ...]) -> int:
        width = (self.size.width or self.app.size.width) - SCROLLBAR
        used = sum(max([cell_len(label), *(cell_len(c[key].plain) for c in cells)]) + PADDING
                   for key, label in COLUMNS if key in columns and key != "why")
        return max(WHY_MIN, width - used - PADDING)

    def cells(self, view: JobView, now: float) -> dict[str, Text]:
        job = view.job
        severity = worst(view)
        glyph = SEVERITY_GLYPH[severity] + " " if severity is not None else ""
        variable = STATE_VARIABLE.get(job.state)
        state_style = (severity_colour(self.app, severity) if severity is not None
                       else colour(self.app, variable) if variable is not None else "")
        limit = "no limit" if job.time_limit_s is None else duration(job.time_limit_s)
        elapsed = duration(job.elapsed_s) if job.elapsed_s is not None else "-"
        left = time_left(view, now)
        run = view.run
        if run is None:
            ckpt = ""
        elif run.checkpoint_at is None:
            ckpt = "none"
        else:
            ckpt = duration(now - run.checkpoint_at)
        warning = limit_warning(view)
        why = why_words(view, now)
        why_style = severity_colour(self.app, severity) if severity is not None and (
            warning is not None or job.ended) else ""
        nodes = ",".join(job.nodes) or job.node_list or ""
        return {
            "job": Text(visible(job.job_id), style="bold"),
            "name": Text(visible(job.name)),
            "state": Text(glyph + visible(job.state), style=state_style),
            "time": Text(f"{elapsed} / {limit}" if not job.pending else f"- / {limit}"),
            "left": Text(duration(left) if left is not None else "",
                         style=severity_colour(self.app, Severity.WARNING)
                         if warning is not None else ""),
            "nodes": Text(visible(nodes)),
            "run": Text(visible(f"{run.host}:{run.run}") if run is not None else ""),
            "ckpt": Text(ckpt, style=severity_colour(self.app, Severity.WARNING)
                         if warning is not None and run is not None else ""),
            "why": Text(visible(why), style=why_style),
        }
