"""FleetScreen: every host in one table; `/` filters, Enter opens a host."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from ..state import HostData
from ..widgets.fleet_table import FleetTable
from ..widgets.key_footer import KeyFooter

if TYPE_CHECKING:
    from ..app import GpuwatchApp


class FleetScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="fleet")
        self.filter_text = ""

    @property
    def gw(self) -> GpuwatchApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title", markup=False)
        yield Input(placeholder="filter: host, run, state or finding code", id="filter")
        yield FleetTable(id="fleet-table")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.refresh_all()
        self.query_one(FleetTable).focus()

    def on_screen_resume(self) -> None:
        self.refresh_all()

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    @property
    def selected_host(self) -> str | None:
        return self.table.selected_host

    # -- data in ---------------------------------------------------------------------------
    def visible_hosts(self) -> list[HostData]:
        hosts = list(self.gw.hosts.values())
        needle = self.filter_text.strip().lower()
        if not needle:
            return hosts
        now, interval = self.gw.clock(), self.gw.config.interval

        def words(h: HostData) -> str:
            return " ".join([h.name, h.config.ssh, *h.run_names(),
                             h.status(now, interval).text, *(f.code for f in h.findings)]
                            ).lower()

        return [h for h in hosts if needle in words(h)]

    def refresh_all(self) -> None:
        self.table.show(self.visible_hosts(), self.gw.clock(), self.gw.config.interval)
        self.refresh_title()

    def refresh_host(self, name: str) -> None:
        self.table.update_host(self.gw.hosts[name], self.gw.clock(), self.gw.config.interval)
        self.refresh_title()

    def tick(self) -> None:
        if not self.is_mounted:
            return
        self.table.update_states(self.visible_hosts(), self.gw.clock(), self.gw.config.interval)

    def refresh_title(self) -> None:
        gw = self.gw
        n = len(gw.hosts)
        shown = self.table.row_count
        bits = [f"gpuwatch · {n} host{'s' * (n != 1)}"]
        if shown != n:
            bits.append(f"{shown} shown (filter {self.filter_text!r})")
        bits.append(f"polling every {gw.config.interval:g} s")
        if gw.paused:
            bits.append("PAUSED (p resumes)")
        if gw.readonly:
            bits.append("read-only")
        self.query_one("#fleet-title", Static).update(" · ".join(bits))

    # -- keys and mouse --------------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.gw.open_host(str(event.row_key.value))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.gw.refresh_bindings()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus and box.value:
            box.value = ""
            return
        box.value = ""
        box.display = False
        self.table.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.refresh_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.display = False
        self.table.focus()
