"""HostScreen: one host in panes: GPUs, loss, checkpoints, disks, findings, processes, log.

Wide terminals (120+ columns) get a grid where every pane is visible at once; narrow ones stack
the panes in a scrolling column. The runs are tabs at the top: the selected run drives the loss,
checkpoint and log panes and is what `r` relaunches; the highlighted process is what `k` kills.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ClassVar

from gpuwatch.remote.series import RunSeries
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Tab, Tabs

from ..colours import RUN_GLYPH
from ..messages import ProcessSelected
from ..state import HostData
from ..widgets.checkpoint_timeline import CheckpointTimeline
from ..widgets.disk_gauges import DiskGauges
from ..widgets.findings_list import FindingsList
from ..widgets.gpu_panel import GpuPanel
from ..widgets.host_header import HostHeader
from ..widgets.log_tail import LogTail
from ..widgets.loss_pane import LossPane
from ..widgets.process_table import ProcessTable

if TYPE_CHECKING:
    from ..app import GpuwatchApp

PANES = (("pane-gpus", "GPUs"), ("pane-loss", "Loss"), ("pane-ckpt", "Checkpoints"),
         ("pane-disks", "Disks"), ("pane-findings", "Findings"), ("pane-procs", "Processes"),
         ("pane-log", "Log"))


class HostScreen(Screen[None]):
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (120, "-wide")]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("left_square_bracket", "tag(-1)", "Tag", show=False),
        Binding("right_square_bracket", "tag(1)", "Tag"),
        Binding("s", "smoothing(-1)", "Smooth-", show=False),
        Binding("S", "smoothing(1)", "Smooth+"),
        Binding("l", "logy", "Log-y"),
        Binding("x", "axis", "X axis"),
    ]

    def __init__(self, host: str) -> None:
        super().__init__(classes="host-screen")
        self.host = host
        self.selected_pid: int | None = None
        self.selected_run: str | None = None

    @property
    def gw(self) -> GpuwatchApp:
        return self.app  # type: ignore[return-value]

    @property
    def data(self) -> HostData:
        return self.gw.hosts[self.host]

    def compose(self) -> ComposeResult:
        runs = self.data.config.runs
        yield HostHeader(id="host-header")
        yield Tabs(*(Tab(Text(r.name), id=f"run-{i}") for i, r in enumerate(runs)),
                   id="run-tabs")
        with VerticalScroll(id="panes"):
            with VerticalScroll(id="pane-gpus", classes="pane"):
                yield GpuPanel(id="gpus")
            with Vertical(id="pane-loss", classes="pane"):
                yield LossPane(id="loss")
            with VerticalScroll(id="pane-ckpt", classes="pane"):
                yield CheckpointTimeline(id="ckpt")
            with VerticalScroll(id="pane-disks", classes="pane"):
                yield DiskGauges(id="disks")
            with VerticalScroll(id="pane-findings", classes="pane"):
                yield FindingsList(id="findings")
            with Vertical(id="pane-procs", classes="pane"):
                yield ProcessTable(id="procs")
            with Vertical(id="pane-log", classes="pane"):
                yield LogTail(id="log")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        for pane_id, title in PANES:
            self.query_one(f"#{pane_id}").border_title = title
        runs = self.data.config.runs
        self.selected_run = runs[0].name if runs else None
        if not runs:
            self.query_one("#run-tabs").display = False
        self.refresh_data()
        self.query_one(ProcessTable).focus()

    def on_screen_resume(self) -> None:
        self.refresh_data()

    # -- data in ---------------------------------------------------------------------------
    def run_series(self) -> RunSeries | None:
        if self.selected_run is None:
            return None
        return self.data.history.runs.get(self.selected_run) or RunSeries(self.selected_run)

    def refresh_data(self) -> None:
        """Hand the host's data down to every pane (attributes down)."""
        gw, data = self.gw, self.data
        now = gw.clock()
        box_now = data.box_now(now)
        self.query_one(HostHeader).show(data, now, gw.config.interval, gw.paused)
        self.query_one(GpuPanel).data = data
        self.query_one(DiskGauges).show(data)
        self.query_one(FindingsList).show(data.findings)
        self.query_one(ProcessTable).show(data, box_now)
        run = self.run_series()
        self.query_one(LossPane).show_run(run)
        self.query_one(CheckpointTimeline).show(run, box_now)
        self.query_one(LogTail).show(run.tail if run is not None else None,
                                     "no run configured" if run is None else "no log lines yet")
        tabs = self.query_one(Tabs)
        for i, r in enumerate(data.config.runs):
            series = data.history.runs.get(r.name)
            status = series.status if series is not None else "unknown"
            tab = tabs.query_one(f"#run-{i}", Tab)
            label = Text(f"{r.name} {RUN_GLYPH[status]} {status}")
            if tab.label.plain != label.plain:
                tab.label = label
        gw.refresh_bindings()

    def tick(self) -> None:
        gw = self.gw
        with contextlib.suppress(NoMatches):  # the screen is being torn down
            self.query_one(HostHeader).show(self.data, gw.clock(), gw.config.interval,
                                            gw.paused)

    # -- selection -------------------------------------------------------------------------
    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is None or event.tab.id is None:
            return
        index = int(event.tab.id.removeprefix("run-"))
        runs = self.data.config.runs
        if 0 <= index < len(runs) and runs[index].name != self.selected_run:
            self.selected_run = runs[index].name
            self.refresh_data()

    def on_process_selected(self, event: ProcessSelected) -> None:
        self.selected_pid = event.pid
        self.gw.refresh_bindings()

    # -- keys ------------------------------------------------------------------------------
    def action_back(self) -> None:
        self.dismiss(None)

    def action_tag(self, delta: int) -> None:
        self.query_one(LossPane).cycle_tag(delta)

    def action_smoothing(self, delta: int) -> None:
        self.query_one(LossPane).change_smoothing(delta)

    def action_logy(self) -> None:
        self.query_one(LossPane).toggle_logy()

    def action_axis(self) -> None:
        self.query_one(LossPane).toggle_axis()
