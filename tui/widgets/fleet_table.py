"""FleetTable: every host in one table, one row each, at a glance; the columns that do not fit
the terminal's width go, least important first (Fit), rather than being cut mid-number.

State (ok / stale for N s / unreachable and why), per-GPU util and SM clock as % of max (one
block character per GPU, so 8 GPUs fit in 8 cells: U21 is visible as tall util beside short
clock), VRAM, runs with their status, findings by severity. Scrolls for 64+ hosts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.units import mib_pair
from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ..colours import (
    RUN_GLYPH,
    RUN_VARIABLE,
    SEVERITY_GLYPH,
    STATUS_VARIABLE,
    colour,
    severity_colour,
)
from ..format import fit_words, level_char, pct, visible
from ..groups import FleetGroup, verdict_counts
from ..state import Headline, HostData
from .cursor_keys import CURSOR_KEYS

COLUMNS = (("host", "host"), ("state", "state"), ("util", "GPU util"),
           ("clock", "SM clock"), ("vram", "VRAM"), ("findings", "findings"), ("runs", "runs"))
STATE_WIDTH = 28


@dataclass(frozen=True)
class Fit:
    """Which columns a width affords: the least important go first (runs shortened to their
    glyphs, then dropped; the state and a GPU error cut shorter; findings, then VRAM dropped),
    so that what is shown is never cut mid-number ("lla", "vit" at 80 columns)."""

    state_width: int
    runs: str  # "names", "glyphs" or "" (no column)
    dropped: frozenset[str] = frozenset()
    error_width: int | None = None
    """A wedged driver's words in the GPU util column, cut to this width (None: whole)."""

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        return tuple((key, label) for key, label in COLUMNS
                     if (key != "runs" or self.runs) and key not in self.dropped)


FITS = (Fit(STATE_WIDTH, "names"), Fit(20, "names", error_width=16),
        Fit(20, "glyphs", error_width=12), Fit(16, "glyphs", error_width=12),
        Fit(16, "", error_width=12), Fit(14, "", frozenset({"vram"}), error_width=10),
        Fit(12, "", frozenset({"vram", "clock"}), error_width=10))
"""Widest first; the first that fits the table's width is used. The findings' counts by
severity are the last to go: they say how bad it is where the colour of one glyph would be all
(VRAM, then the SM clock, go before them)."""
PADDING = 2
"""A DataTable cell's padding, both sides together."""
SCROLLBAR = 2


Row = HostData | FleetGroup
"""A row of the table: a host's, or a group's (its hosts follow it unless it is collapsed)."""


class FleetTable(DataTable[Text]):
    """The fleet, one row per host (row key: the host name) and per group (FleetGroup.key),
    in the order its screen gives; `sorted_by` (a column key or None) marks that column's
    header."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *CURSOR_KEYS, Binding("enter", "select_cursor", "Open", key_display="Enter")]
    """The cursor keys, and Enter (the table's own, hidden) shown: it opens the host."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._shown: list[str] = []
        self._keys: list[str] = []
        """Every row's key in order: hosts' names and groups' keys."""
        self._states: dict[str, object] = {}
        """Each row's state cell as last painted (a group's: every cell's words)."""
        self._hosts: list[Row] = []
        self._rows_of: dict[str, int] = {}
        """Each host shown: its row."""
        self._when: tuple[float, float] = (0.0, 0.0)
        self._widths: dict[str, dict[str, int]] = {}
        """Each host's widest cells, for the fit: its name, runs (names, glyphs), findings..."""
        self._widest: dict[str, int] = {}
        """The widest cell of each column this session: columns grow, never shrink back (a
        table whose columns changed width between polls jumped under the eye)."""
        self.fit = FITS[0]
        self.sorted_by: str | None = None
        self.paused = False
        """Set by the screen: old data then reads "paused, data N old", not "stale"."""

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for key, label in self.fit.columns:
            shown = f"{label} ▼" if key == self.sorted_by else label
            self.add_column(shown, key=key, width=self.fit.state_width if key == "state"
                            else None)

    def on_resize(self) -> None:
        self._refit()

    def choose_fit(self) -> Fit:
        """The widest fit whose columns all fit the table's width, with room for each host's
        worst finding in words, whole ("✖ run died: OOM-killed"), where one affords it: the
        findings column's counts go before those words are cut."""
        width = self.size.width - SCROLLBAR
        widest: dict[str, int] = {key: cell_len(label) + 2 * (key == self.sorted_by)
                                  for key, label in COLUMNS}
        widest["runs-glyphs"] = widest["error"] = widest["state"] = widest["finding"] = 0
        for cells in self._widths.values():
            for key, w in cells.items():
                widest[key] = max(widest[key], w)
        for key, w in widest.items():  # never narrower than earlier this session
            self._widest[key] = max(self._widest.get(key, 0), w)
        widest = dict(self._widest)
        for floor in (min(STATE_WIDTH, widest["finding"]), 0):
            for fit in FITS:
                need = self.need(fit, widest, floor)
                if need <= width:
                    return self.widen(replace(fit, state_width=max(fit.state_width, floor)),
                                      width - need, widest)
        return FITS[-1]

    @staticmethod
    def need(fit: Fit, widest: dict[str, int], state_floor: int) -> int:
        """The cells a fit's columns take, its state at least `state_floor` wide."""
        need = 0
        for key, _ in fit.columns:
            if key == "state":
                need += max(fit.state_width, state_floor)
            elif key == "runs":
                need += max(widest["runs" if fit.runs == "names" else "runs-glyphs"],
                            cell_len("runs"))
            elif key == "util":
                error = widest["error"] if fit.error_width is None else min(
                    widest["error"], fit.error_width)
                need += max(widest["util"], error)
            else:
                need += widest[key]
            need += PADDING
        return need

    @staticmethod
    def widen(fit: Fit, spare: int, widest: dict[str, int]) -> Fit:
        """The fit with the columns it left over given to a GPU error's words, then to the
        state's ("▲ busy, low c…" at 80 columns had room beside it). A finding's words in the
        state have their room already (choose_fit): what is left would only lengthen a reason
        that is cut anyway, while "⚠ driver…" lost the error's point."""
        if fit.error_width is not None and widest["error"] > max(fit.error_width,
                                                                  widest["util"]):
            extra = min(spare, widest["error"] - max(fit.error_width, widest["util"]))
            fit = replace(fit, error_width=fit.error_width + extra)
            spare -= extra
        grow = min(spare, max(0, min(STATE_WIDTH, widest["state"]) - fit.state_width))
        return replace(fit, state_width=fit.state_width + grow)

    def _refit(self) -> None:
        if not self.size.width:
            return
        fit = self.choose_fit()
        if fit != self.fit:
            keep = self.selected_key, self.cursor_row  # clear(columns=True) moves the cursor
            self.fit = fit
            self.clear(columns=True)
            self._add_columns()
            self._states.clear()
            self._fill(self._hosts, *self._when, keep=keep)

    @property
    def shown(self) -> list[str]:
        """The hosts' names in the order of the rows (the groups' rows left out)."""
        return list(self._shown)

    @property
    def row_keys(self) -> list[str]:
        """Every row's key in order: a host's name, or a group's key (FleetGroup.key)."""
        return list(self._keys)

    @property
    def selected_key(self) -> str | None:
        """The row key under the cursor: a host's name or a group's key."""
        if not self._keys or self.cursor_row < 0 or self.cursor_row >= len(self._keys):
            return None
        return self._keys[self.cursor_row]

    @property
    def selected_host(self) -> str | None:
        """The host under the cursor (None on a group's row)."""
        key = self.selected_key
        return key if key is not None and key in self._rows_of else None

    def show(self, hosts: Sequence[Row], now: float, interval: float,
             sorted_by: str | None = None) -> None:
        """Replace the rows (a new filter, order, group folded or theme); the cursor stays on
        its row."""
        self._hosts, self._when = list(hosts), (now, interval)
        self._widths = {_key(r): self.measure(r) if isinstance(r, HostData)
                        else self.measure_group(r) for r in hosts}
        fit = self.choose_fit() if self.size.width else self.fit
        keep = self.selected_key, self.cursor_row  # before clear(columns=True) moves the cursor
        if fit != self.fit or sorted_by != self.sorted_by:
            self.sorted_by = sorted_by
            self.fit = fit
            self.clear(columns=True)
            self._add_columns()
        self._fill(hosts, now, interval, keep=keep)

    def _fill(self, hosts: Sequence[Row], now: float, interval: float,
              keep: tuple[str | None, int] | None = None) -> None:
        """Every row anew; the cursor stays on the row it was on (`keep`: that row's key and
        number, taken before any clear), or, where that row is no longer shown, on the row
        number it was on (the next host down), or the last."""
        key, row = keep if keep is not None else (self.selected_key, self.cursor_row)
        self.clear()
        self._states.clear()
        self._keys = [_key(r) for r in hosts]
        self._shown = [r.name for r in hosts if isinstance(r, HostData)]
        self._rows_of = {r.name: i for i, r in enumerate(hosts) if isinstance(r, HostData)}
        for data in hosts:
            cells = (self.cells(data, now, interval) if isinstance(data, HostData)
                     else self.group_cells(data, now, interval))
            self.add_row(*cells, key=_key(data))
        if not self._keys:
            return
        if key in self._keys:
            self.move_cursor(row=self._keys.index(key))
        else:
            self.move_cursor(row=max(0, min(row, len(self._keys) - 1)))

    def update_group(self, group: FleetGroup, now: float, interval: float) -> None:
        """A group's row anew (a poll of one of its hosts landed)."""
        if group.key not in self._widths:
            return
        cells = self._group_cells(group, now, interval)
        said = tuple((cells[key].plain, str(cells[key].style)) for key, _ in self.fit.columns)
        if said == self._states.get(group.key):  # most polls and ticks change nothing here
            return
        widths = _group_widths(cells)
        if widths != self._widths.get(group.key):
            self._widths[group.key] = widths
            if self.choose_fit() != self.fit:
                self._refit()
                return
        self._states[group.key] = said
        for key, _ in self.fit.columns:
            cell = cells[key]
            self.update_cell(group.key, key, cell, update_width=self._grows(key, cell))

    def update_host(self, data: HostData, now: float, interval: float) -> None:
        if data.name not in self._rows_of:
            return
        self._when = (now, interval)
        widths = self.measure(data)
        if widths != self._widths.get(data.name):
            self._widths[data.name] = widths
            fit = self.choose_fit()
            if fit != self.fit:  # a wider cell than the columns afford: every row anew
                self._refit()
                return
        for (key, _), cell in zip(self.fit.columns, self.cells(data, now, interval),
                                  strict=True):
            self.update_cell(data.name, key, cell, update_width=self._grows(key, cell))
            if key == "state":
                self._states[data.name] = cell.plain

    def update_states(self, hosts: Sequence[HostData], now: float, interval: float) -> None:
        """Only the state column (ages move on between polls)."""
        for data in hosts:
            if data.name not in self._rows_of:
                continue
            cell = self.state_cell(data, now, interval)
            if self._states.get(data.name) != cell.plain:  # most ticks change nothing
                self._states[data.name] = cell.plain
                self.update_cell(data.name, "state", cell,
                                 update_width=self._grows("state", cell))

    def _grows(self, key: str, cell: Text) -> bool:
        """Whether a cell is wider than its column now. Columns never shrink back (above), and
        DataTable's update_width of a cell narrower than its column measures every cell of
        that column again: every poll of a 256-host fleet cost a rescan of 256 rows per
        column, seconds of a blocked event loop per round."""
        column = self.columns.get(ColumnKey(key))
        return column is None or cell.cell_len > column.content_width

    # -- cells -------------------------------------------------------------------------------
    def cells(self, data: HostData, now: float, interval: float) -> list[Text]:
        util, clock, vram = self.gpu_cells(data)
        cells = {"host": Text(visible(data.name), style="bold"),
                 "state": self.state_cell(data, now, interval), "util": util, "clock": clock,
                 "vram": vram, "findings": self.findings_cell(data),
                 "runs": self.runs_cell(data, glyphs_only=self.fit.runs == "glyphs")}
        return [cells[key] for key, _ in self.fit.columns]

    def measure(self, data: HostData) -> dict[str, int]:
        """The width each of this host's cells needs (the state is cut to fit instead)."""
        util, clock, vram = self.gpu_cells(data)
        headline = data.headline(*self._when, self.paused)
        snap = data.snapshot
        error = snap is not None and snap.gpu_error is not None and not snap.gpus
        said = cell_len(f"⚠ {snap.gpu_error.summary}") if (
            snap is not None and snap.gpu_error is not None and error) else 0
        return {"host": cell_len(visible(data.name)), "util": 0 if error else util.cell_len,
                "state": cell_len(headline.text) + 1,
                "finding": cell_len(headline.text) + 1 if headline.severity is not None else 0,
                "error": said,
                "clock": clock.cell_len, "vram": vram.cell_len,
                "findings": self.findings_cell(data).cell_len,
                "runs": self.runs_cell(data).cell_len,
                "runs-glyphs": self.runs_cell(data, glyphs_only=True).cell_len}

    def group_cells(self, group: FleetGroup, now: float, interval: float) -> list[Text]:
        """A group's row: ▸ (collapsed) or ▾, its name and hosts; its hosts by verdict in the
        worst one's colour; its GPUs, their VRAM, its hosts' findings and runs summed."""
        cells = self._group_cells(group, now, interval)
        return [cells[key] for key, _ in self.fit.columns]

    def _group_cells(self, group: FleetGroup, now: float, interval: float) -> dict[str, Text]:
        hosts = group.hosts
        fold = "▸" if group.collapsed else "▾"
        name = Text(f"{fold} {visible(group.name)} ({len(hosts)})", style="bold")
        worst = min(hosts, key=lambda h: _worst_key(h, now, interval, self.paused),
                    default=None)
        counts = verdict_counts(hosts, now, interval, self.paused)
        state = Text(fit_words(counts, self.fit.state_width),
                     style=self.headline_colour(worst.headline(now, interval, self.paused))
                     if worst is not None else "")
        gpus = [g for h in hosts if h.snapshot is not None for g in h.snapshot.gpus]
        muted = colour(self.app, "text-muted")
        util = Text(f"{len(gpus)} GPU{'s' * (len(gpus) != 1)}" if gpus else "", style=muted)
        used = sum(g.mem_used_mib or 0 for g in gpus)
        total = sum(g.mem_total_mib or 0 for g in gpus)
        findings = Text()
        for sev in (Severity.CRITICAL, Severity.WARNING, Severity.INFO):
            n = sum(h.severity_counts()[sev] for h in hosts)
            if n:
                if findings:
                    findings.append(" ")
                findings.append(f"{n}{SEVERITY_GLYPH[sev]}", style=severity_colour(self.app, sev))
        runs = Text()
        statuses = Counter(h.run_status(r) for h in hosts for r in h.run_names())
        for status, glyph in RUN_GLYPH.items():
            if statuses[status]:
                if runs:
                    runs.append(" ")
                runs.append(f"{statuses[status]}{glyph}",
                            style=colour(self.app, RUN_VARIABLE[status]))
        return {"host": name, "state": state, "util": util, "clock": Text(""),
                "vram": Text(mib_pair(used, total) if total else "", style=muted),
                "findings": findings, "runs": runs}

    def measure_group(self, group: FleetGroup) -> dict[str, int]:
        """The width each of a group's cells needs (its counts are cut to fit the state)."""
        return _group_widths(self._group_cells(group, *self._when))

    def state_cell(self, data: HostData, now: float, interval: float) -> Text:
        """The host's state, or, where it was polled fine, its worst problem in words: a
        dead run or a wedged driver is not "● ok" (the findings column may not fit). Too long,
        whole words go from the end, the "+N" kept."""
        headline = data.headline(now, interval, self.paused)
        text = fit_words(f"{headline.glyph} {headline.words}", self.fit.state_width,
                         headline.suffix)
        return Text(text, style=self.headline_colour(headline))

    def state_words(self, data: HostData, now: float, interval: float) -> tuple[str, str]:
        """The state cell's words, whole, and their colour."""
        headline = data.headline(now, interval, self.paused)
        return headline.text, self.headline_colour(headline)

    def headline_colour(self, headline: Headline) -> str:
        if headline.severity is not None:
            return severity_colour(self.app, headline.severity)
        return colour(self.app, STATUS_VARIABLE[headline.kind])

    def gpu_cells(self, data: HostData) -> list[Text]:
        snap = data.snapshot
        if snap is not None and snap.gpu_error is not None and not snap.gpus:
            # A wedged driver is not "no GPU": said where the GPUs would be (words: they may
            # be cut short to fit, the host view says them whole).
            said = f"⚠ {visible(snap.gpu_error.summary)}"
            width = self.fit.error_width
            if width is not None:
                said = fit_words(said, width)
            return [Text(said, style=colour(self.app, "error")), Text(""), Text("")]
        if snap is None or not snap.gpus:
            muted = colour(self.app, "text-muted")
            none = "no GPU" if snap is not None else ""
            return [Text(none, style=muted), Text("", style=muted), Text("", style=muted)]
        utils = [g.util_pct for g in snap.gpus]
        clocks = [pct(g.sm_clock_mhz, g.sm_clock_max_mhz) for g in snap.gpus]
        # a MIG GPU reports no util (M), its instances are counted after the mean
        util = Text("".join("M" if g.mig and g.util_pct is None else level_char(g.util_pct)
                            for g in snap.gpus), style=colour(self.app, "util"))
        util.append(f" {_mean(utils)}")
        instances = sum(len(g.mig_instances) for g in snap.gpus)
        if instances:
            util.append(f" {instances} MIG", style=colour(self.app, "text-muted"))
        clock = Text("".join(level_char(c) for c in clocks), style=colour(self.app, "sm-clock"))
        clock.append(f" {_mean(clocks)}")
        used = sum(g.mem_used_mib or 0 for g in snap.gpus)
        total = sum(g.mem_total_mib or 0 for g in snap.gpus)
        vram = Text(mib_pair(used, total) if total else "?")
        return [util, clock, vram]

    def runs_cell(self, data: HostData, glyphs_only: bool = False) -> Text:
        """Each run's name and status glyph; narrow: the glyphs alone (the host view names
        them)."""
        text = Text()
        for i, name in enumerate(data.run_names()):  # configured, then discovered
            status = data.run_status(name)
            if i and not glyphs_only:
                text.append(" ")
            if not glyphs_only:
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


def _group_widths(cells: dict[str, Text]) -> dict[str, int]:
    return {"host": cells["host"].cell_len, "util": cells["util"].cell_len,
            "state": cells["state"].cell_len, "finding": 0, "error": 0, "clock": 0,
            "vram": cells["vram"].cell_len, "findings": cells["findings"].cell_len,
            "runs": cells["runs"].cell_len, "runs-glyphs": cells["runs"].cell_len}


def _key(row: Row) -> str:
    return row.name if isinstance(row, HostData) else row.key


def _worst_key(h: HostData, now: float, interval: float, paused: bool) -> tuple[int, int]:
    """Worst first: could not be polled, critical, warning... (the fleet's own order)."""
    verdict = h.verdict(now, interval, paused)
    return (-verdict.level, 0 if verdict.state == "unreachable" else 1)


def _mean(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):3.0f}%" if known else "  ?"
