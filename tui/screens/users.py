"""UsersScreen (`u` in the fleet): who holds the fleet's GPUs, one row per user: their GPUs,
the hosts those are on, the VRAM held and for how long. Enter filters the fleet to that user's
hosts; Esc closes. Read when opened (the fleet view behind it goes on updating)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ..holders import Holder, holders
from ..view import FleetView
from ..widgets.users_table import UsersTable


class UsersScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,u,q", "close", "Close"),
    ]

    def __init__(self, view: FleetView) -> None:
        super().__init__()
        self.view = view
        self.rows: list[Holder] = holders(view.hosts.values(), view.now())

    def compose(self) -> ComposeResult:
        with Vertical(id="users-box"):
            yield Static(self.title_line(), id="users-title", markup=False)
            yield UsersTable(id="users-table")
            yield Static("Enter: the fleet filtered to the user's hosts · Esc / u close",
                         id="users-hint", markup=False)

    def title_line(self) -> str:
        gpus = sum(len(r.gpus) for r in self.rows)
        n = len(self.rows)
        if not n:
            return "who holds the GPUs: no process holds a GPU on the hosts polled"
        return (f"who holds the GPUs: {n} user{'s' * (n != 1)} on {gpus} "
                f"GPU{'s' * (gpus != 1)}")

    def on_mount(self) -> None:
        table = self.query_one(UsersTable)
        table.show(self.rows)
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.dismiss(str(event.row_key.value) if event.row_key.value is not None else None)

    def action_close(self) -> None:
        self.dismiss(None)
