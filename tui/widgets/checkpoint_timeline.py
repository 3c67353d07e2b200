"""CheckpointTimeline: when each checkpoint of the selected run landed, newest first (the one
a relaunch resumes from is the first row, never below the fold), its size, the gap since the one
before it, the run's cadence and the work at risk since the last one (seed 001), and leftovers
(U6)."""

from __future__ import annotations

import itertools

from gpuwatch.remote.model.series import RunSeries
from gpuwatch.remote.units import duration, size
from rich.cells import cell_len
from rich.text import Text

from ..colours import colour
from ..format import visible
from .text_pane import TextPane

STRIP_CELLS = 48


class CheckpointTimeline(TextPane):
    """Renders one run's checkpoints; `show(run, box_now)`."""

    def show(self, run: RunSeries | None, box_now: float | None) -> None:
        self.show_built(lambda width: self.render_run(run, box_now, width))

    def render_run(self, run: RunSeries | None, box_now: float | None, width: int) -> Text:
        muted = colour(self.app, "text-muted")
        text = Text(no_wrap=True, overflow="ellipsis")
        if run is None:
            return Text("no run selected", style=muted)
        ckpts = sorted(run.checkpoints, key=lambda c: c.mtime)
        cadence = run.cadence_s
        risk = run.work_at_risk_s(box_now)
        latest = run.latest_checkpoint
        # In words: "cadence ?  at risk 7 s" read as jargon.
        if latest is None:
            text.append("no checkpoint yet", style=colour(self.app, "warning"))
        else:
            text.append("latest ")
            text.append(_name(latest.path), style="bold")
            text.append(f" {duration(None if box_now is None else box_now - latest.mtime)} ago")
        # The cadence and the work at risk on a line of their own (a narrow pane cut them).
        said = False
        if cadence:
            text.append(f"\none every {duration(cadence)}")
            said = True
        if risk is not None:
            overdue = cadence is not None and risk > 1.5 * cadence
            text.append(" · " if said else "\n")
            text.append(duration(risk),
                        style=f"bold {colour(self.app, 'error' if overdue else 'success')}")
            text.append(" of work lost" if run.status == "dead" else " of work unsaved")
        if ckpts and box_now is not None:
            text.append("\n")
            cells = max(8, min(STRIP_CELLS, width - 5))
            text.append_text(self.strip(ckpts[0].mtime, box_now, [c.mtime for c in ckpts],
                                        cells))
        # A save under way (or cut short) is newer than any checkpoint: it comes first (U6).
        for left in run.leftovers:
            text.append("\n")
            text.append("unfinished save ", style=colour(self.app, "warning"))
            text.append(_name(left.path))
            text.append(f" {size(left.bytes)}", style=colour(self.app, "warning"))
        name_w = min(22, max((len(_name(c.path)) for c in ckpts), default=0))
        ages = [None if box_now is None else box_now - c.mtime for c in ckpts]
        when_w = max((len(duration(a)) for a in ages), default=0)
        # Newest first; each row's gap is from the checkpoint before it (the row below).
        rows = list(zip(itertools.pairwise([None, *ckpts]), ages, strict=True))
        for (prev, ck), age in reversed(rows):
            assert ck is not None
            text.append("\n")
            when = f"{duration(age):>{when_w}} ago  "
            name = _name(ck.path).ljust(name_w)  # from the box: plain Text, never markup
            text.append(when, style=muted)
            text.append(name)
            bytes_ = f" {size(ck.bytes) + ('+' if ck.capped else ''):>10}"
            gap = f"  +{duration(ck.mtime - prev.mtime)}" if prev is not None else ""
            # What does not fit goes whole, the gap first ("+27…" read as a number cut)
            used = cell_len(when + name)
            if used + len(bytes_) <= width:
                text.append(bytes_)
                if gap and used + len(bytes_) + len(gap) <= width:
                    text.append(gap, style=muted)
        return text

    def strip(self, start: float, end: float, marks: list[float], width: int) -> Text:
        """A time line from the first checkpoint to now with ● at each checkpoint."""
        span = max(1.0, end - start)
        cells = ["─"] * width
        for m in marks:
            cells[min(width - 1, int((m - start) / span * (width - 1)))] = "●"
        text = Text("".join(cells), style=colour(self.app, "checkpoint"))
        text.append("┤now", style=colour(self.app, "text-muted"))
        return text


def _name(path: str) -> str:
    """A checkpoint's folder or file name, as the box wrote it, control characters visible."""
    return visible(path.rstrip("/").rsplit("/", 1)[-1] or path)
