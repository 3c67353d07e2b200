"""UsersTable: who holds the fleet's GPUs, one row per user (row key: the user): their GPUs, the
VRAM held, for how long, and the hosts (whole names, then "+N" for the ones that do not fit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuwatch.remote.units import mib
from rich.cells import cell_len
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from ..format import human_age, visible
from ..holders import Holder
from .cursor_keys import CURSOR_KEYS

HOSTS_WIDTH = 30


def hosts_words(hosts: Sequence[str], width: int = HOSTS_WIDTH) -> str:
    """The hosts' names, whole, as many as fit `width` with "+N" for the rest."""
    names = [visible(h) for h in hosts]
    for k in range(len(names), 0, -1):
        rest = len(names) - k
        said = " ".join(names[:k]) + (f" +{rest}" if rest else "")
        if cell_len(said) <= width:
            return said
    return f"{names[0]} +{len(names) - 1}" if len(names) > 1 else (names[0] if names else "")


class UsersTable(DataTable[Text]):
    BINDINGS: ClassVar[list[BindingType]] = [*CURSOR_KEYS]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        for key, label in (("user", "user"), ("gpus", "GPUs"), ("vram", "VRAM"),
                           ("held", "for"), ("hosts", "hosts")):
            self.add_column(label, key=key)

    def show(self, rows: Sequence[Holder]) -> None:
        self.clear()
        for row in rows:
            self.add_row(Text(visible(row.user), style="bold"), Text(str(len(row.gpus))),
                         Text(mib(row.vram_mib)),
                         Text(human_age(row.held_s) if row.held_s is not None else "?"),
                         Text(hosts_words(row.hosts)), key=row.user)
