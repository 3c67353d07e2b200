"""ProcessTable: the box's listed processes as a tree by run: pid, user, GPU, VRAM, CPU% since
the previous poll ("–" until a second poll has seen the process), age (how long the process has
run: since it took the GPU, for a run's process), state and the zombie flag (U11: VRAM held by a
process no live run owns), command line. Within each run, the order its screen picks
(`sorted_by`): by pid, most VRAM first, most CPU first, or oldest first; the runs follow their
first process.

Command lines come from the box: they are Text, never markup (STYLE 10), with their control
characters visible (STYLE 14: an OSC in a command line would retitle the terminal)."""

from __future__ import annotations

from typing import ClassVar

from gpuwatch.remote.model.snapshot import ProcessInfo
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from ..colours import RUN_GLYPH, RUN_VARIABLE, RUN_WORDS, colour
from ..format import human_age, visible
from ..messages import ProcessSelected
from ..state import HostData
from .cursor_keys import CURSOR_KEYS

COLUMNS = (("pid", "pid"), ("user", "user"), ("gpu", "GPU"), ("vram", "VRAM"), ("cpu", "CPU%"),
           ("age", "age"), ("flag", "state"), ("cmd", "command"))
NO_RUN = "(no run)"
HEAD_CELLS = 14
"""A run heading's name is cut here (the run's tab and the header carry it whole)."""
SORTS: tuple[tuple[str | None, str], ...] = ((None, "run, then pid"), ("vram", "VRAM, most first"),
                                           ("cpu", "CPU, most first"),
                                           ("age", "age, oldest first"))
"""The orders the screen cycles through: a column key (its header is marked) and words."""


def process_key(column: str | None, p: ProcessInfo) -> tuple[float, int]:
    if column == "vram":
        return (-(p.gpu_mem_mib or 0), p.pid)
    if column == "cpu":  # not known yet: after every figure
        return (-p.cpu_pct if p.cpu_pct is not None else float("inf"), p.pid)
    if column == "age":
        return (p.started_at if p.started_at is not None else float("inf"), p.pid)
    return (0.0, p.pid)


def cpu_cell(pct: float | None) -> Text:
    """CPU% as top shows it, right-aligned; "–" until two polls have seen the process."""
    if pct is None:
        return Text("–", justify="right")
    return Text(f"{pct:.0f}" if pct >= 9.95 or pct == 0 else f"{pct:.1f}", justify="right")


class ProcessTable(DataTable[Text]):
    """Row keys: "pid:N" for processes, "run:NAME" for the run headers of the tree."""

    BINDINGS: ClassVar[list[BindingType]] = CURSOR_KEYS

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", **kwargs)  # type: ignore[arg-type]
        self._keys: list[str] = []
        self._version: tuple[int, int, str | None] | None = None
        self.sorted_by: str | None = None

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for key, label in COLUMNS:
            self.add_column(f"{label} ▼" if key == self.sorted_by else label, key=key)

    @property
    def selected_pid(self) -> int | None:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        key = self._keys[self.cursor_row]
        return int(key[4:]) if key.startswith("pid:") else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(ProcessSelected(self.selected_pid))

    def show(self, data: HostData | None, box_now: float | None, force: bool = False,
             sorted_by: str | None = None) -> None:
        version = (id(data), data.version if data else -1, sorted_by)
        if version == self._version and not force:
            return
        self._version = version
        if sorted_by != self.sorted_by:
            self.sorted_by = sorted_by
            self.clear(columns=True)
            self._add_columns()
        keep = self._keys[self.cursor_row] if self._keys and 0 <= self.cursor_row < len(
            self._keys) else None
        self.clear()
        self._keys = []
        snap = data.snapshot if data is not None else None
        if data is None or snap is None:
            return
        groups: dict[str, list[ProcessInfo]] = {}
        shown = [p for p in snap.processes if self.worth_a_row(p, data)]
        if sorted_by is None:
            groups = {r.name: [] for r in data.config.runs}
            ordered = sorted(shown, key=lambda p: (p.run is None, p.run or "", p.pid))
        else:  # the run of the first process first
            ordered = sorted(shown, key=lambda p: process_key(sorted_by, p))
        for p in ordered:
            groups.setdefault(p.run or NO_RUN, []).append(p)
        muted = colour(self.app, "text-muted")
        for run, procs in groups.items():
            # The run's heading: its name in the pid column (cut, so that a long name does not
            # widen the pid column and push state and command off a narrow pane), its status
            # in the state column, its count in the command column.
            status = "" if run == NO_RUN else data.run_status(run)
            head = Text(f"▾ {visible(run)}", style="bold", no_wrap=True, overflow="ellipsis")
            head.truncate(HEAD_CELLS, overflow="ellipsis")
            state = Text("")
            if status:
                state = Text(f"{RUN_GLYPH[status]} {RUN_WORDS.get(status, status)}",
                             style=colour(self.app, RUN_VARIABLE[status]))
            count = Text(f"{len(procs)} process{'es' * (len(procs) != 1)}", style=muted)
            self._add(f"run:{run}", [head, *(Text("") for _ in COLUMNS[1:-2]), state, count])
            for i, p in enumerate(procs):
                branch = "└" if i == len(procs) - 1 else "├"
                self._add(f"pid:{p.pid}", self.cells(p, branch, data, box_now))
        if keep in self._keys:
            self.move_cursor(row=self._keys.index(keep))
        self.post_message(ProcessSelected(self.selected_pid))

    @staticmethod
    def worth_a_row(p: ProcessInfo, data: HostData) -> bool:
        """A run's process, or one that holds a GPU. The box also lists a run's parents (its
        shell, tmux, init: whether it dies with the SSH session, seed 000): evidence for the
        findings, not rows here."""
        return (p.run is not None or p.gpu_index is not None or bool(p.gpu_mem_mib)
                or bool(p.nvidia_devs) or p.zombie or p.pid in data.reap_targets)

    def _add(self, key: str, cells: list[Text]) -> None:
        self.add_row(*cells, key=key)
        self._keys.append(key)

    def cells(self, p: ProcessInfo, branch: str, data: HostData,
              box_now: float | None) -> list[Text]:
        zombie = p.pid in data.reap_targets or p.zombie
        age = (None if p.started_at is None or box_now is None
               else box_now - p.started_at)
        flag = Text(visible(p.state))
        if zombie:
            flag = Text("ZOMBIE" if p.zombie else "zombie VRAM",
                        style=f"bold {colour(self.app, 'error')}")
        vram = f"{p.gpu_mem_mib / 1024:.1f} GiB" if p.gpu_mem_mib else ""
        return [Text(f"{branch} {p.pid}"), Text(visible(p.user)),
                Text("" if p.gpu_index is None else str(p.gpu_index)), Text(vram),
                cpu_cell(p.cpu_pct), Text(human_age(age) if age is not None else "?"), flag,
                Text(visible(p.cmd), no_wrap=True, overflow="ellipsis")]
