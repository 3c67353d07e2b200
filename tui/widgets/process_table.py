"""ProcessTable: the box's listed processes as a tree by run: pid, user, GPU, VRAM, CPU% since
the previous poll ("–" until a second poll has seen the process), age (how long the process has
run: since it took the GPU, for a run's process), state and the zombie flag (U11: VRAM held by a
process no live run owns), command line. Within each run, the order its screen picks
(`sorted_by`, cycled with `o`) or one of the table's own keys (htop's and nvitop's: M by VRAM,
C by CPU, T by age, I the other way round); the runs follow their first process.

The command says what runs as nvitop does: the program and the script or module by name with
their arguments (`python3 train.py --lr 3e-4`, `torchrun --nproc_per_node 8 train.py`), not
the interpreter's path that used to fill the column up to the script (`python3 /tmp/gpuwa…`);
the selected row shows the whole command line, wrapped to the pane.

Command lines come from the box: they are Text, never markup (STYLE 10), with their control
characters visible (STYLE 14: an OSC in a command line would retitle the terminal)."""

from __future__ import annotations

import os
import textwrap
from typing import ClassVar

from gpuwatch.remote.model.snapshot import ProcessInfo
from gpuwatch.remote.units import duration, mib
from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from ..colours import RUN_GLYPH, RUN_VARIABLE, RUN_WORDS, colour
from ..format import visible
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
SORT_KEYS = {"M": "vram", "C": "cpu", "T": "age"}
"""The table's direct sort keys (htop's M and T; C for CPU, since P pins a run here)."""
FULL_LINES = 8
"""Lines the selected row's whole command may take."""
INTERPRETERS = ("python", "pypy", "perl", "ruby", "node", "bash", "sh", "Rscript", "julia")
"""Programs whose first non-option argument is the script that says what runs."""
VALUED_OPTIONS = frozenset({"-W", "-X", "-Q"})
"""Python options that take the next word as their value (`python -X dev train.py`)."""
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".pl", ".rb", ".js", ".R", ".jl", ".ipynb")


def short_command(cmd: str) -> str:
    """The command as nvitop shows it: the program by name (`/usr/bin/python3.11` is
    `python3.11`), the interpreter's own options dropped, a script by its file name
    (`/tmp/x/train.py` is `train.py`, after a launcher too: `torchrun ... train.py`), a module
    as `-m name`, then the arguments as they are. The box gives argv joined by spaces, so words
    are split on spaces; a kernel thread or a zombie's "[comm]" stays as it is."""
    words = cmd.split()
    if not words or cmd.startswith("["):
        return cmd
    program = os.path.basename(words[0]) or words[0]
    out = [program]
    rest = words[1:]
    if program.startswith(INTERPRETERS):
        i = 0
        while i < len(rest) and rest[i].startswith("-") and rest[i] not in ("-m", "-c", "-"):
            i += 2 if rest[i] in VALUED_OPTIONS else 1
        rest = rest[i:]
    for word in rest:
        is_script = "/" in word and not word.startswith("-") and word.endswith(SCRIPT_SUFFIXES)
        out.append(os.path.basename(word) if is_script else word)
    return " ".join(out)


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

    BINDINGS: ClassVar[list[BindingType]] = [
        *CURSOR_KEYS,
        Binding("M", "sort_by('vram')", "By VRAM", show=False),
        Binding("C", "sort_by('cpu')", "By CPU", show=False),
        Binding("T", "sort_by('age')", "By age", show=False),
        Binding("I", "sort_reverse", "Reverse", show=False),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", **kwargs)  # type: ignore[arg-type]
        self._keys: list[str] = []
        self._version: tuple[object, ...] | None = None
        self.sorted_by: str | None = None
        self.reverse = False
        self._own_sort: str | None = None
        """A sort chosen with the table's own keys (M, C, T): it holds until the screen's `o`
        picks another order."""
        self._screen_sort: str | None = None
        self._shown_with: tuple[HostData | None, float | None] = (None, None)
        self._selected: str | None = None
        """The row key the rows were built with as the selected one (its command shown
        whole): a cursor that moved off it asks for a rebuild."""
        self._columns_for: tuple[str | None, bool] | None = None

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        arrow = " ▲" if self.reverse else " ▼"
        for key, label in COLUMNS:
            self.add_column(f"{label}{arrow}" if key == self.sorted_by else label, key=key)

    # -- sorting ---------------------------------------------------------------------------
    def action_sort_by(self, column: str) -> None:
        """A direct sort key: that column, most first (oldest first for age); again: reversed."""
        self.reverse = not self.reverse if self.sorted_by == column else False
        self._own_sort = column
        self._resort()

    def action_sort_reverse(self) -> None:
        self.reverse = not self.reverse
        if self._own_sort is None:
            self._own_sort = self.sorted_by or "pid"
        self._resort()

    def _resort(self) -> None:
        data, box_now = self._shown_with
        self.show(data, box_now, force=True, sorted_by=self._screen_sort)
        words = dict(SORTS).get(None if self.sorted_by == "pid" else self.sorted_by,
                                "run, then pid")
        how = words.replace("most first", "least first").replace("oldest first", "newest first")
        self.notify(f"processes sorted by {how if self.reverse else words}", timeout=2)

    @property
    def selected_pid(self) -> int | None:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        key = self._keys[self.cursor_row]
        return int(key[4:]) if key.startswith("pid:") else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self._cursor_key() != self._selected:
            self.call_after_refresh(self._expand_selected)
        self.post_message(ProcessSelected(self.selected_pid))

    def _cursor_key(self) -> str | None:
        return self._keys[self.cursor_row] if 0 <= self.cursor_row < len(self._keys) else None

    def on_resize(self, event: events.Resize) -> None:
        if self._selected is not None:  # the whole command is wrapped to the pane's width
            self.call_after_refresh(self._expand_selected, True)

    def _expand_selected(self, always: bool = False) -> None:
        """Show the selected row's whole command (a rebuild: a row's height is set as it is
        added)."""
        if always or self._cursor_key() != self._selected:
            data, box_now = self._shown_with
            self.show(data, box_now, force=True, sorted_by=self._screen_sort)

    def show(self, data: HostData | None, box_now: float | None, force: bool = False,
             sorted_by: str | None = None) -> None:
        if sorted_by != self._screen_sort:  # the screen's `o` picked an order: it wins
            self._screen_sort, self._own_sort, self.reverse = sorted_by, None, False
        order = self._own_sort if self._own_sort is not None else sorted_by
        version = (id(data), data.version if data else -1, order, self.reverse)
        if version == self._version and not force:
            return
        self._version = version
        self._shown_with = (data, box_now)
        if (order, self.reverse) != self._columns_for:
            self.sorted_by, self._columns_for = order, (order, self.reverse)
            self.clear(columns=True)
            self._add_columns()
        keep = self._cursor_key()
        self.clear()
        self._keys = []
        self._selected = keep
        snap = data.snapshot if data is not None else None
        if data is None or snap is None:
            return
        groups: dict[str, list[ProcessInfo]] = {}
        shown = [p for p in snap.processes if self.worth_a_row(p, data)]
        if order in (None, "pid"):
            groups = {r.name: [] for r in data.config.runs}
            ordered = sorted(shown, key=lambda p: (p.run is None, p.run or "", p.pid),
                             reverse=self.reverse)
        else:  # the run of the first process first
            ordered = sorted(shown, key=lambda p: process_key(order, p), reverse=self.reverse)
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
                key = f"pid:{p.pid}"
                cells = self.cells(p, branch, data, box_now)
                lines = self._whole_command(p, cells) if key == keep else None
                if lines is not None:
                    cells[-1] = lines
                self._add(key, cells, height=len(lines.plain.splitlines()) if lines else 1)
        if keep in self._keys:
            self.move_cursor(row=self._keys.index(keep))
        self.post_message(ProcessSelected(self.selected_pid))

    def _whole_command(self, p: ProcessInfo, cells: list[Text]) -> Text | None:
        """The selected process's whole command line, wrapped to the room the other columns
        leave (FULL_LINES at most); None where it fits as it is or the width is not known."""
        full = visible(p.cmd)
        if not self.size.width:
            return None
        others = sum(max(cell_len(c.plain), cell_len(label)) + 2 * self.cell_padding + 2
                     for c, (_, label) in zip(cells[:-1], COLUMNS[:-1], strict=True))
        room = max(20, self.size.width - others - 2 * self.cell_padding - 1)
        if cell_len(full) <= room:
            return Text(full, no_wrap=True)
        lines = textwrap.wrap(full, room, break_on_hyphens=False, max_lines=FULL_LINES,
                              placeholder=" …")
        return Text("\n".join(lines))

    @staticmethod
    def worth_a_row(p: ProcessInfo, data: HostData) -> bool:
        """A run's process, or one that holds a GPU. The box also lists a run's parents (its
        shell, tmux, init: whether it dies with the SSH session, seed 000): evidence for the
        findings, not rows here."""
        return (p.run is not None or p.gpu_index is not None or bool(p.gpu_mem_mib)
                or bool(p.nvidia_devs) or p.zombie or p.pid in data.reap_targets)

    def _add(self, key: str, cells: list[Text], height: int = 1) -> None:
        self.add_row(*cells, key=key, height=height)
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
        vram = mib(p.gpu_mem_mib) if p.gpu_mem_mib else ""
        return [Text(f"{branch} {p.pid}"), Text(visible(p.user)),
                Text("" if p.gpu_index is None else str(p.gpu_index)), Text(vram),
                cpu_cell(p.cpu_pct), Text(duration(age) if age is not None else "?"), flag,
                Text(visible(short_command(p.cmd)), no_wrap=True, overflow="ellipsis")]
