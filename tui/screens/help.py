"""HelpScreen (`?`): every key, what it does, and where."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str, str], ...] = (
    ("Enter / click", "open the host under the cursor", "fleet"),
    ("/", "filter hosts (name, run, state, finding code)", "fleet"),
    ("Escape", "back / clear the filter / close", "everywhere"),
    ("j / k, g / G", "down / up, first / last row in a table (also arrows, Home / End)",
     "tables"),
    ("o", "sort: hosts by name, state, util, VRAM; processes by VRAM, CPU, age",
     "fleet, host"),
    ("K", "kill the selected process (TERM, grace, KILL; identity re-checked)", "host"),
    ("z", "reap: end the processes that hold VRAM though no live run owns them",
     "fleet, host"),
    ("r", "relaunch the selected run from its latest checkpoint", "host"),
    ("n / N", "next / previous run (configured, then discovered ones)", "host"),
    ("P", "pin the selected discovered run into the config", "host"),
    ("[ / ]", "previous / next scalar tag", "host"),
    ("s / S", "less / more EMA smoothing", "host"),
    ("l", "log-y on / off", "host"),
    ("x", "x axis: step or wall time", "host"),
    ("1-7", "jump to a pane: 1 GPUs, 2 Loss, 3 Checkpoints, 4 Disks, 5 Findings, "
            "6 Processes, 7 Log (a narrow terminal scrolls it into view)", "host"),
    ("Tab / Shift+Tab", "next / previous pane; arrows, PageUp/PageDown, Home/End scroll it",
     "host"),
    ("End / G", "in the log: back to following its end (scrolling up pauses it)", "host"),
    ("p", "pause / resume polling", "everywhere"),
    ("R", "poll now (this host, or every host in the fleet view)", "everywhere"),
    ("t", "next theme", "everywhere"),
    ("?", "this help", "everywhere"),
    ("q", "quit", "everywhere"),
)


GLYPHS: tuple[tuple[str, str], ...] = (
    ("● ok", "the host was polled and nothing at warning or worse was found"),
    ("◌ stale", "the last good poll is old; the data shown is that poll's"),
    ("✗ (state)", "the host could not be polled: the reason follows"),
    ("…", "not polled yet: no poll has landed"),
    ("✖  ▲  ●", "a critical finding, a warning, an info (in the state and findings columns)"),
    ("▶  ✓  ✗", "a run running, finished, dead"),
    ("⊘", "left behind: what a dead run left holding VRAM (z reaps it)"),
    ("? not running", "a run gpuwatch has not seen running: not started yet, or it stopped "
                      "before gpuwatch first looked (its files are still shown)"),
    ("▁▂▄█", "per GPU, util and SM clock as a share of their maximum"),
)
"""Every glyph the screens use, in words."""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        table = Table(title="gpuwatch keys", expand=True, box=None, padding=(0, 1))
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("what it does")
        table.add_column("where", no_wrap=True)
        for key, what, where in KEYS:
            table.add_row(Text(key), Text(what), Text(where))
        glyphs = Table(title="what the glyphs mean", expand=True, box=None, padding=(0, 1))
        glyphs.add_column("glyph", style="bold", no_wrap=True)
        glyphs.add_column("means")
        for glyph, means in GLYPHS:
            glyphs.add_row(Text(glyph), Text(means))
        with VerticalScroll(id="help-box"):
            yield Static(table)
            yield Static(glyphs)
            yield Static("Actions are greyed out when nothing is selected or with --readonly; "
                         "each asks first, with Cancel as the default.", id="help-note",
                         markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
