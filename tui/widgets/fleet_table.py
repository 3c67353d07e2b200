"""FleetTable: every host in one table, one row each, at a glance.

State (ok / stale for N s / unreachable and why), per-GPU util and SM clock as % of max (one
block character per GPU, so 8 GPUs fit in 8 cells: U21 is visible as tall util beside short
clock), VRAM, runs with their status, findings by severity. Scrolls for 64+ hosts.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.remote.findings import Severity
from rich.text import Text
from textual.widgets import DataTable

from ..colours import (
    RUN_GLYPH,
    RUN_VARIABLE,
    SEVERITY_GLYPH,
    STATUS_VARIABLE,
    colour,
    severity_colour,
)
from ..format import level_char, pct, visible
from ..state import HostData

COLUMNS = (("host", "host"), ("state", "state"), ("util", "GPU util"),
           ("clock", "SM clock"), ("findings", "findings"), ("runs", "runs"), ("vram", "VRAM"))
STATE_WIDTH = 28


class FleetTable(DataTable[Text]):
    """The fleet, one row per host (row key: the host name)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._shown: list[str] = []
        self._states: dict[str, str] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key, width=STATE_WIDTH if key == "state" else None)

    @property
    def selected_host(self) -> str | None:
        if not self._shown or self.cursor_row < 0 or self.cursor_row >= len(self._shown):
            return None
        return self._shown[self.cursor_row]

    def show(self, hosts: Sequence[HostData], now: float, interval: float) -> None:
        """Replace the rows (a new filter, a theme change); the cursor stays on its host."""
        keep = self.selected_host
        self.clear()
        self._states.clear()
        self._shown = [h.name for h in hosts]
        for data in hosts:
            self.add_row(*self.cells(data, now, interval), key=data.name)
        if keep in self._shown:
            self.move_cursor(row=self._shown.index(keep))

    def update_host(self, data: HostData, now: float, interval: float) -> None:
        if data.name not in self._shown:
            return
        for (key, _), cell in zip(COLUMNS, self.cells(data, now, interval), strict=True):
            self.update_cell(data.name, key, cell, update_width=True)
            if key == "state":
                self._states[data.name] = cell.plain

    def update_states(self, hosts: Sequence[HostData], now: float, interval: float) -> None:
        """Only the state column (ages move on between polls)."""
        for data in hosts:
            if data.name not in self._shown:
                continue
            cell = self.state_cell(data, now, interval)
            if self._states.get(data.name) != cell.plain:  # most ticks change nothing
                self._states[data.name] = cell.plain
                self.update_cell(data.name, "state", cell, update_width=True)

    # -- cells -------------------------------------------------------------------------------
    def cells(self, data: HostData, now: float, interval: float) -> list[Text]:
        util, clock, vram = self.gpu_cells(data)
        return [Text(visible(data.name), style="bold"), self.state_cell(data, now, interval), util,
                clock, self.findings_cell(data), self.runs_cell(data), vram]

    def state_cell(self, data: HostData, now: float, interval: float) -> Text:
        status = data.status(now, interval)
        glyph = {"ok": "●", "stale": "◌", "unreachable": "✗", "waiting": "…"}[status.kind]
        text = f"{glyph} {visible(status.text)}"  # an error's text may quote the box
        if len(text) > STATE_WIDTH:
            text = text[: STATE_WIDTH - 1] + "…"
        return Text(text, style=colour(self.app, STATUS_VARIABLE[status.kind]))

    def gpu_cells(self, data: HostData) -> list[Text]:
        snap = data.snapshot
        if snap is not None and snap.gpu_error is not None and not snap.gpus:
            # A wedged driver is not "no GPU": said where the GPUs would be.
            return [Text(f"⚠ {snap.gpu_error.summary}", style=colour(self.app, "error")),
                    Text(""), Text("")]
        if snap is None or not snap.gpus:
            muted = colour(self.app, "text-muted")
            none = "no GPU" if snap is not None else ""
            return [Text(none, style=muted), Text("", style=muted), Text("", style=muted)]
        utils = [g.util_pct for g in snap.gpus]
        clocks = [pct(g.sm_clock_mhz, g.sm_clock_max_mhz) for g in snap.gpus]
        util = Text("".join(level_char(u) for u in utils), style=colour(self.app, "util"))
        util.append(f" {_mean(utils)}")
        clock = Text("".join(level_char(c) for c in clocks), style=colour(self.app, "sm-clock"))
        clock.append(f" {_mean(clocks)}")
        used = sum(g.mem_used_mib or 0 for g in snap.gpus)
        total = sum(g.mem_total_mib or 0 for g in snap.gpus)
        vram = Text(f"{used / 1024:.0f}/{total / 1024:.0f} GiB" if total else "?")
        return [util, clock, vram]

    def runs_cell(self, data: HostData) -> Text:
        text = Text()
        for i, name in enumerate(data.run_names()):  # configured, then discovered (issue 8)
            status = data.run_status(name)
            if i:
                text.append(" ")
            text.append(visible(name))  # a config's or the box's name: Text, never markup
            text.append(RUN_GLYPH[status], style=colour(self.app, RUN_VARIABLE[status]))
        return text

    def findings_cell(self, data: HostData) -> Text:
        counts = data.severity_counts()
        text = Text()
        for sev in (Severity.CRITICAL, Severity.WARNING, Severity.INFO):
            if counts[sev]:
                if text:
                    text.append(" ")
                text.append(f"{counts[sev]}{SEVERITY_GLYPH[sev]}",
                            style=severity_colour(self.app, sev))
        return text


def _mean(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):3.0f}%" if known else "  ?"
