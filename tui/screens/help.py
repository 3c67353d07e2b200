"""HelpScreen (`?`): every key, what it does, and where; every glyph in words. Wide, the keys
and the glyphs stand side by side; where it does not all fit, it scrolls and says so."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str, str], ...] = (
    ("Enter / click", "open the host under the cursor", "fleet"),
    ("/", "filter hosts (name, run, user, state, finding code); Enter opens a lone match",
     "fleet"),
    ("Space; u", "fold / unfold a group; who holds the GPUs", "fleet"),
    ("Escape", "back / clear the filter / close", "everywhere"),
    ("j / k, g / G", "down / up, first / last row in a table (also arrows, Home / End)",
     "tables"),
    ("o; M C T I", "sort: hosts by name, state, util, VRAM; processes by VRAM, CPU, age "
                   "(M C T; I reverses)", "fleet, host"),
    ("K", "kill the selected process (TERM, grace, KILL; identity re-checked)", "host"),
    ("z", "reap: end the processes that hold VRAM though no live run owns them",
     "fleet, host"),
    ("r; c", "relaunch the selected run; requeue / cancel a job",
     "host; jobs"),
    ("a", "acknowledge a dead run's death", "host"),
    ("n / N", "next / previous run (configured, then discovered ones)", "host"),
    ("P", "pin the selected discovered run into the config", "host"),
    ("[ ], s S, l, x", "loss plot: previous / next tag, less / more smoothing, log-y, "
                       "x axis (step or wall time)", "host"),
    ("1-7", "jump to a pane: 1 GPUs, 2 Loss, 3 Checkpoints, 4 Disks, 5 Findings, "
            "6 Processes, 7 Log", "host"),
    ("Tab / Shift+Tab", "next / previous pane; arrows, PageUp/PageDown, Home/End scroll it",
     "host"),
    ("End / G", "in the log: back to following its end (scrolling up holds it)", "host"),
    ("p", "pause / resume polling", "everywhere"),
    ("R", "poll now (once while paused)", "everywhere"),
    ("t, T, J", "next theme; replay the night (Esc: live); Slurm jobs ([slurm])",
     "everywhere"),
    ("?, q", "this help; quit", "everywhere"),
)


GLYPHS: tuple[tuple[str, str], ...] = (
    ("● ok", "the host was polled and nothing at warning or worse was found"),
    ("◌ stale", "the last good poll is old; the data shown is that poll's"),
    ("◌ ok 26 s ago", "polling is paused: nothing was wrong in the last poll, that old"),
    ("✗ (state)", "the host could not be polled: the reason follows"),
    ("…", "not polled yet: no poll has landed"),
    ("✖  ▲  ●", "a critical finding, a warning, an info (in the state and findings columns)"),
    ("+2", "after the state's words: that many more findings at warning or worse (the host "
           "view's Findings lists them)"),
    ("▶  ✓  †", "a run running, finished, dead (the host view says why it died)"),
    ("⊘", "left behind: what a dead run left holding VRAM (z reaps it)"),
    ("? not running", "a run gpuwatch has not seen running: not started yet, or it stopped "
                      "before gpuwatch first looked (its files are still shown)"),
    ("▁▂▄█", "per GPU, util and SM clock as a share of their maximum"),
    ("⚠", "the GPUs' driver did not answer (fleet GPU column, GPUs pane), or a GPU is held "
          "back: a throttle reason (GPUs pane)"),
    ("◆", "a checkpoint on the loss plot, at the loss when it was saved"),
    ("▼  ▲", "the column a table is sorted by, and which way (o, and M C T I in Processes)"),
    ("▸ ▾  ├  └", "a group folded, open; Processes: a run's processes as a tree"),
)
"""Every glyph the screens use, in words."""


WIDE = 140
"""Columns from which the keys and the glyphs stand side by side."""


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
        with Vertical(id="help-box"):
            with VerticalScroll(id="help-scroll"):
                with Horizontal(id="help-columns"):
                    yield Static(table, id="help-keys")
                    yield Static(glyphs, id="help-glyphs")
                yield Static("Actions are greyed out when nothing is selected or with "
                             "--readonly; each asks first, with Cancel as the default.",
                             id="help-note", markup=False)
            yield Static(id="help-hint", markup=False)

    def on_mount(self) -> None:
        self.lay_out()
        self.watch(self.query_one("#help-scroll", VerticalScroll), "scroll_y",
                   lambda _: self.show_hint(), init=False)

    def on_resize(self, event: events.Resize) -> None:
        self.lay_out()

    def lay_out(self) -> None:
        """Side by side where the screen is wide; then, once laid out, the hint."""
        self.set_class(self.size.width >= WIDE, "wide")
        self.call_after_refresh(self.show_hint)

    def show_hint(self) -> None:
        scroll = self.query_one("#help-scroll", VerticalScroll)
        if scroll.scroll_y < scroll.max_scroll_y:
            said = "more below: ↓ PageDown End scroll · "
        elif scroll.max_scroll_y > 0:
            said = "↑ PageUp Home scroll · "
        else:
            said = ""
        self.query_one("#help-hint", Static).update(said + "Esc / ? / q close")

    def action_close(self) -> None:
        self.dismiss(None)
