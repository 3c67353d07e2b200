"""ReplayScreen: the fleet as the store saw it at a chosen moment (the morning after).

A banner says it is the past; the table shows each host then (whether it answered, its worst
finding, its GPUs, its runs), the pane below the highlighted host's findings, runs and the events
around the moment. ← → step one poll interval (⇧ ten), [ ] jump to the previous / next event,
`g` takes a time typed (`03:12`, `03:12:40`, or `-2h`), Esc (or `T`) leaves replay for the live
views, which kept polling meanwhile. Nothing is polled, and no action is offered, from here:
the data is remote/replay.py's reading of the store.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import ClassVar

from gpuwatch.remote.replay import HostAt, host_at, moments
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from ..format import human_age
from ..view import FleetView

STEPS_BIG = 10
LOOK_BACK_S = 7 * 86_400.0
"""How far back `[` looks for an event."""
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_AGO = re.compile(r"-(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_moment(text: str, now: float) -> float | None:
    """`HH:MM[:SS]` (the latest such time of this machine's clock, at or before now) or `-D`
    (`-2h`, `-30m`): an epoch time; None when it is neither."""
    said = text.strip()
    ago = _AGO.fullmatch(said)
    if ago:
        return now - float(ago.group(1)) * _UNIT[ago.group(2)]
    clock = _CLOCK.fullmatch(said)
    if clock is None:
        return None
    h, m, s = int(clock.group(1)), int(clock.group(2)), int(clock.group(3) or 0)
    if h > 23 or m > 59 or s > 59:
        return None
    today = datetime.fromtimestamp(now).astimezone()
    moment = today.replace(hour=h, minute=m, second=s, microsecond=0)
    if moment.timestamp() > now:
        moment -= timedelta(days=1)
    return moment.timestamp()


def state_cell(h: HostAt) -> str:
    if h.reachable is False:
        return "✖ unreachable"
    worst = h.worst
    if worst is None:
        return "● ok" if h.reachable else "○ not known yet"
    more = len([f for f in h.findings if f.severity != "info"]) - 1
    glyph = {"critical": "✖", "warning": "▲"}.get(worst.severity, "●")
    return f"{glyph} {worst.code}" + (f" +{more}" if more > 0 else "")


def gpus_cell(h: HostAt) -> str:
    if not h.gpus:
        return "-"
    cells = [f"{g.gpu}:{'-' if g.util_pct is None else f'{g.util_pct:.0f}'}%"
             f"/{'-' if g.power_w is None else f'{g.power_w:.0f}'}W" for g in h.gpus]
    span = {60: " (minute avg)", 3600: " (hour avg)"}.get(h.gpus_span, "")
    return " ".join(cells) + span


def runs_cell(h: HostAt) -> str:
    return " ".join(f"{r.name}:{r.status}" for r in h.runs) or "-"


def detail(h: HostAt) -> str:
    """The highlighted host at the moment, for the pane below the table."""
    lines = [f"{h.host} at {_clock(h.at)}"]
    for f in h.findings:
        lines.append(f"  {f.severity.upper():8} {f.code}: {f.message} (since {_clock(f.since)})")
    if not h.findings:
        lines.append("  no finding held then")
    for r in h.runs:
        held = f" pids {', '.join(map(str, r.pids))} on GPUs {', '.join(map(str, r.gpus))}" \
            if r.pids else ""
        lines.append(f"  run {r.name}: {r.status}{held}")
    if h.events:
        lines.append("  around then:")
        for e in h.events:
            mark = "▶" if e.at <= h.at else " "
            lines.append(f"  {mark} {_clock(e.at)}  {e.kind:11} {e.code + ': ' if e.code else ''}"
                         f"{e.message}")
    return visible("\n".join(lines), multiline=True)


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M:%S")


class ReplayScreen(Screen[None]):
    """The past, read from the store; Esc returns to the live views."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Back a poll"),
        Binding("right", "step(1)", "On a poll"),
        Binding("shift+left", f"step(-{STEPS_BIG})", "Back 10", show=False),
        Binding("shift+right", f"step({STEPS_BIG})", "On 10", show=False),
        Binding("left_square_bracket", "event(-1)", "Previous event"),
        Binding("right_square_bracket", "event(1)", "Next event"),
        Binding("g", "ask_time", "Go to a time"),
        Binding("escape,T", "leave", "Live"),
        # the app's live keys, pressed here: they would act on the present, not on what is
        # shown; a toast says so instead
        Binding("R,p", "live_only", show=False),
    ]

    def __init__(self, view: FleetView, store: Store, at: float | None = None) -> None:
        super().__init__(id="replay")
        self.view, self.store = view, store
        self.names = list(view.hosts)
        now = view.now()
        if at is None:  # the last thing that happened, else a poll ago
            last = moments(store, self.names, now - LOOK_BACK_S, now)
            at = last[-1] if last else now - view.interval
        self.at = at
        self.states: dict[str, HostAt] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="replay-banner", markup=False)
        yield Input(placeholder="a time: 03:12, 03:12:40, or -2h; Enter goes there",
                    id="replay-when")
        yield DataTable(id="replay-table", cursor_type="row")
        yield Static(id="replay-detail", markup=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("HOST", "STATE THEN", "GPUs util/power", "RUNS", "FINDINGS")
        self.show_moment()
        table.focus()

    # -- the moment -----------------------------------------------------------------------------
    def show_moment(self) -> None:
        now = self.view.now()
        self.at = min(self.at, now)
        self.states = {name: host_at(self.store, name, self.at) for name in self.names}
        self.query_one("#replay-banner", Static).update(
            f"REPLAY — the past: {_clock(self.at)} ({human_age(now - self.at)} ago). Nothing "
            "is polled or acted on from here; Esc returns to live.")
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        for name in self.names:
            h = self.states[name]
            table.add_row(visible(name), visible(state_cell(h)), gpus_cell(h),
                          visible(runs_cell(h)), str(len(h.findings)), key=name)
        if self.names:
            table.move_cursor(row=min(max(row, 0), len(self.names) - 1))
        self.show_detail()

    def show_detail(self) -> None:
        table = self.query_one(DataTable)
        if not self.names:
            return
        name = self.names[min(max(table.cursor_row, 0), len(self.names) - 1)]
        self.query_one("#replay-detail", Static).update(detail(self.states[name]))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        if self.states:
            self.show_detail()

    # -- keys -----------------------------------------------------------------------------------
    def action_step(self, polls: int) -> None:
        self.at += polls * self.view.interval
        self.show_moment()

    def action_event(self, direction: int) -> None:
        now = self.view.now()
        if direction < 0:
            times = [t for t in moments(self.store, self.names, self.at - LOOK_BACK_S, self.at)
                     if t < self.at]
            if not times:
                self.notify("no earlier event in the store", timeout=3)
                return
            self.at = times[-1]
        else:
            times = [t for t in moments(self.store, self.names, self.at, now) if t > self.at]
            if not times:
                self.notify("no later event: the next is the present (Esc)", timeout=3)
                return
            self.at = times[0]
        self.show_moment()

    def action_ask_time(self) -> None:
        field = self.query_one("#replay-when", Input)
        field.display = True
        field.value = ""
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        field = self.query_one("#replay-when", Input)
        moment = parse_moment(event.value, self.view.now())
        field.display = False
        self.query_one(DataTable).focus()
        if moment is None:
            self.notify(f"not a time: {visible(event.value)!r} (03:12, 03:12:40 or -2h)",
                        severity="warning", timeout=4)
            return
        self.at = moment
        self.show_moment()

    def action_live_only(self) -> None:
        self.notify("this is the past: polling acts on the live views (Esc returns to them)",
                    timeout=3)

    def action_leave(self) -> None:
        field = self.query_one("#replay-when", Input)
        if field.display:  # Esc in the time field closes it, not replay
            field.display = False
            self.query_one(DataTable).focus()
            return
        self.dismiss()
