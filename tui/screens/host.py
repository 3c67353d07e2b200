"""HostScreen: one host in panes: GPUs, loss, checkpoints, disks, findings, processes, log.

Wide terminals (120+ columns) get a grid where every pane is visible at once; narrow ones stack
the panes in a scrolling column, each pane at most a screenful with its own scroll. Either way
each pane is one focus stop: Tab / Shift+Tab go from pane to pane and the number keys 1-7 jump to
one, and the focused pane is scrolled into view whole, its title included (lazygit's number keys;
at 80×24 the GPU pane alone used to fill the screen and the panes below it were out of reach).
The runs are tabs at the top (n / N, or a click): the selected run drives the loss, checkpoint and
log panes and is what `r` relaunches; the highlighted process is what `k` kills.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import ClassVar

from gpuwatch.remote.actions.pin import pin_run_async
from gpuwatch.remote.config.load import find_config
from gpuwatch.remote.config.schema import RunConfig
from gpuwatch.remote.model.discovery import Discovery
from gpuwatch.remote.model.series import RunSeries
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import Static, Tab, Tabs

from ..colours import RUN_GLYPH, RUN_WORDS, SEVERITY_GLYPH, SEVERITY_VARIABLE
from ..format import visible
from ..messages import ActionRequested, HostUpdated, PollNow, ProcessSelected, Restyled, Ticked
from ..state import HostData
from ..view import FleetView
from ..why_not import TITLES, why_not
from ..widgets.answer_lines import AnswerLines
from ..widgets.checkpoint_timeline import CheckpointTimeline
from ..widgets.disk_gauges import DiskGauges
from ..widgets.findings_list import FindingsList
from ..widgets.gpu_panel import GpuPanel
from ..widgets.host_header import HostHeader
from ..widgets.key_footer import KeyFooter
from ..widgets.log_tail import LogTail
from ..widgets.loss_pane import LossPane, StepMark
from ..widgets.process_table import SORTS as PROCESS_SORTS
from ..widgets.process_table import ProcessTable
from .kept import KeptScreen

PANES = (("pane-gpus", "GPUs"), ("pane-loss", "Loss"), ("pane-ckpt", "Checkpoints"),
         ("pane-disks", "Disks"), ("pane-findings", "Findings"), ("pane-procs", "Processes"),
         ("pane-log", "Log"))


def artifacts(log: str | None, events: str | None, checkpoints: str | None,
              metrics: Sequence[str], short: Callable[[str], str] = str) -> list[str]:
    """What a run's files are, in words ("log train.log", "events runs"), the ones it has."""
    where = [f"{k} {short(v)}" for k, v in (("log", log), ("events", events),
                                             ("checkpoints", checkpoints)) if v]
    return where + [f"metrics {short(m)}" for m in metrics]


def found_text(d: Discovery) -> Text:
    """A discovered run in two lines that fit a narrow terminal: what runs where, then what was
    found, paths relative to its folder (the whole story is discovered.describe's)."""
    cwd = (d.cwd or "").rstrip("/")

    def short(path: str) -> str:
        return path[len(cwd) + 1:] if cwd and path.startswith(cwd + "/") else path

    what = short(d.script) if d.script else (f"-m {d.module}" if d.module else "?")
    where = artifacts(d.log, d.events, d.checkpoints, d.metrics, short)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(visible(f"discovered run {d.name}: {d.kind or 'process'} {what} in "
                        f"{d.cwd or '?'} · "))
    text.append("P", style="bold")
    text.append(" pins it\n")
    text.append("found: " + ("; ".join(visible(w) for w in where) if where else
                             "no log, event files or checkpoints yet"))
    if d.search_capped:
        text.append(f" (search stopped at its {visible(str(d.search_capped))} bound: pin it to "
                    "be sure)")
    return text


def configured_text(run: RunConfig) -> Text:
    """A configured run in the same two lines as a discovered one: what it matches where, then
    what it reads (from the config: the person's own words)."""
    where = artifacts(run.log, run.events, run.checkpoints, run.metrics)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(visible(f"configured run {run.name}: process {run.process or '?'}"
                        + (f" in {run.workdir}" if run.workdir else " (any folder)")) + "\n")
    text.append("reads: " + ("; ".join(visible(w) for w in where) if where else
                             "no log, event files or checkpoints set"))
    return text


WIDE = 120
"""From this many columns on, every pane is on screen at once (the grid)."""


class PaneColumn(VerticalScroll, can_focus=False):
    """The panes: a grid when wide, a scrolling column when narrow. Not a focus stop itself:
    Tab goes from pane to pane."""


class HostScreen(KeptScreen):
    # Textual declares it `ClassVar[...] | None`, which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        # K as nvitop's kill; k moves the cursor up (vim, htop's and k9s's j / k).
        Binding("K", "kill", "Kill"),
        Binding("z", "reap", "Reap"),
        Binding("r", "relaunch", "Relaunch"),
        Binding("a", "ack", "Ack death"),
        # When an action above is greyed out (or hidden), its key falls through to these: a
        # toast says why nothing happened and what to do, instead of silence.
        Binding("K", "cannot('kill')", show=False),
        Binding("z", "cannot('reap')", show=False),
        Binding("r", "cannot('relaunch')", show=False),
        Binding("a", "cannot('ack')", show=False),
        Binding("R", "poll_here", "Poll now"),
        Binding("escape", "back", "Back"),
        Binding("left_square_bracket", "tag(-1)", "Tag", show=False),
        # A pair's footer entry shows both of its keys (the one left out is still bound).
        Binding("right_square_bracket", "tag(1)", "Tag", key_display="[ ]"),
        Binding("s", "smoothing(-1)", "Smooth-", show=False),
        Binding("S", "smoothing(1)", "Smooth", key_display="s S"),
        Binding("l", "logy", "Log-y"),
        Binding("x", "axis", "X axis"),
        Binding("n", "next_run(1)", "Run", key_display="n N"),
        Binding("N", "next_run(-1)", "Run", show=False),
        Binding("n,N", "cannot('next_run')", show=False),
        Binding("P", "pin", "Pin run"),
        Binding("P", "cannot('pin')", show=False),
        Binding("o", "sort", "Sort"),
    ]

    BINDINGS += [Binding(str(n), f"pane({n - 1})", "Pane", key_display="1-7", show=n == 1)
                 for n in range(1, len(PANES) + 1)]

    def __init__(self, host: str, view: FleetView) -> None:
        super().__init__(classes="host-screen")
        self.host = host
        self.view = view
        self.selected_pid: int | None = None
        self._tab_names: list[str] = []
        """Run names in tab order (tab id run-N): configured, then discovered as they come."""
        self.selected_run: str | None = None
        self.process_sort = 0
        """An index into the process table's SORTS (`o` cycles)."""
        self._shown: tuple[object, ...] | None = None
        """What the panes were last handed (refresh_data): a kept screen that resumes on the
        same skips handing it down again."""
        self._found: Text | None = None
        """What #run-found shows."""

    @property
    def data(self) -> HostData:
        return self.view.hosts[self.host]

    def compose(self) -> ComposeResult:
        # The breakpoint's class now, not on the first Resize (Textual sets it there): the
        # first paint used to be neither layout, one squashed column that reflowed ~0.5 s later.
        self._set_breakpoint()
        self.mark_styled()  # its widgets are styled as they mount
        self._tab_names = self.data.run_names()
        yield HostHeader(id="host-header")
        yield AnswerLines(id="answer")
        yield Tabs(*(Tab(Text(visible(name)), id=f"run-{i}")
                     for i, name in enumerate(self._tab_names)),
                   id="run-tabs")
        yield Static(id="run-found")
        with PaneColumn(id="panes"):
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
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        for pane_id, title in PANES:
            self.query_one(f"#{pane_id}").border_title = title
        self.selected_run = self._tab_names[0] if self._tab_names else None
        tabs = self.query_one("#run-tabs", Tabs)
        tabs.can_focus = False  # n / N switch runs: Tab goes from pane to pane
        if not self._tab_names:
            tabs.display = False
        self.refresh_data()
        # Wide: every pane is on screen, and the process cursor is what k acts on. Narrow: the
        # top pane, so that the focus is where the eye is.
        first = ProcessTable if self.app.size.width >= WIDE else GpuPanel
        self.pane_target(self.query_one(first)).focus(scroll_visible=False)

    def _set_breakpoint(self) -> None:
        wide = self.app.size.width >= WIDE
        self.set_class(wide, "-wide")
        self.set_class(not wide, "-narrow")

    async def on_screen_resume(self) -> None:
        # A kept screen (screens/kept.py) missed the resizes and polls while away.
        self._set_breakpoint()
        if self._shown != self._shown_key():
            self.refresh_data()
        else:
            self.tick()
            self.app.refresh_bindings()
        # Before Screen's own handler lays the screen out and paints it: the keys are in that
        # paint, not in a second one (a new screen's footer was empty at first).
        await self.query_one(KeyFooter).show_keys_now()

    def _shown_key(self) -> tuple[object, ...]:
        data, view = self.data, self.view
        return (data.version, data.reap_targets, view.paused, self.app.theme, self.process_sort,
                self.app.size)

    # -- data in ---------------------------------------------------------------------------
    def run_series(self) -> RunSeries | None:
        if self.selected_run is None:
            return None
        return self.data.history.runs.get(self.selected_run) or RunSeries(self.selected_run)

    def step_marks(self) -> tuple[StepMark, ...]:
        """The selected run's findings that name a step (a NaN loss, a spike): marks on its
        curve, in their severity's glyph and colour."""
        marks = []
        for f in self.data.findings:
            step = f.evidence.get("step")
            if f.run == self.selected_run and isinstance(step, int) and not isinstance(
                    step, bool):
                marks.append(StepMark(step, SEVERITY_GLYPH[f.severity],
                                      SEVERITY_VARIABLE[f.severity]))
        return tuple(sorted(marks, key=lambda m: m.step))

    def refresh_data(self) -> None:
        """Hand the host's data down to every pane (attributes down)."""
        if not self.query(HostHeader):  # a poll landing while the screen is torn down (quit)
            return
        view, data = self.view, self.data
        now = view.now()
        box_now = data.box_now(now)
        self.query_one(HostHeader).show(data, now, view.interval, view.paused)
        self.query_one(AnswerLines).show(data.findings)
        self.query_one(GpuPanel).data = data
        self.query_one(DiskGauges).show(data)
        self.query_one(FindingsList).show(data.findings)
        self.query_one(ProcessTable).show(data, box_now,
                                          sorted_by=PROCESS_SORTS[self.process_sort][0])
        snap = data.snapshot
        self.query_one("#pane-procs").border_subtitle = (
            "which process uses which GPU is unknown: the GPUs could not be read"
            if snap is not None and snap.gpu_error is not None else "")
        self.refresh_run(box_now)
        self._shown = self._shown_key()

    def refresh_run(self, box_now: float | None) -> None:
        """The panes of the selected run, its tab labels and the keys (n / N change only
        these: the other panes stay as they are painted)."""
        data = self.data
        run = self.run_series()
        self.query_one(LossPane).show_run(run, self.step_marks())
        self.query_one(CheckpointTimeline).show(run, box_now)
        self.query_one(LogTail).show(run.tail if run is not None else None,
                                     "no run configured or discovered yet" if run is None
                                     else "no log lines yet")
        tabs = self.query_one(Tabs)
        for name in data.run_names():  # a run discovered since: one more tab
            if name not in self._tab_names:
                self._tab_names.append(name)
                tabs.add_tab(Tab(Text(visible(name)), id=f"run-{len(self._tab_names) - 1}"))
                tabs.display = True
        for i, name in enumerate(self._tab_names):
            status = data.run_status(name)
            with contextlib.suppress(NoMatches):  # added above, mounting
                tab = tabs.query_one(f"#run-{i}", Tab)
                label = Text(f"{visible(name)} {RUN_GLYPH[status]} "
                             f"{RUN_WORDS.get(status, status)}"
                             f"{data.run_progress(name)}")
                if tab.label.plain != label.plain:
                    tab.label = label
        self._show_found()
        self._refresh_keys()

    def _show_found(self) -> None:
        """For a discovered run: what was found, and where (box text: never markup). Its lines
        are kept while a configured run of a host that has discovered ones is shown, so that
        n / N do not move every pane up and down: they say what the config tells gpuwatch to
        read of that run."""
        found = self.query_one("#run-found", Static)
        d = self.data.discovery(self.selected_run)
        watch = self.data.watchdog.get(self.selected_run or "")  # the watchdog's line
        found.display = bool(watch) or any(self.data.discovery(name) is not None
                                           for name in self._tab_names)
        configured = self.data.config.run(self.selected_run)
        # A configured run's lines are kept (n / N do not move the panes): they say what
        # gpuwatch reads of it.
        text = (found_text(d) if d is not None else Text(watch) if watch else
                configured_text(configured) if configured is not None else Text(" \n "))
        if text != self._found:  # Static.update lays the screen out again, even for the same
            self._found = text
            found.update(text)

    def tick(self) -> None:
        view = self.view
        with contextlib.suppress(NoMatches):  # the screen is being torn down
            self.query_one(HostHeader).show(self.data, view.now(), view.interval, view.paused)

    # -- what the app says -----------------------------------------------------------------
    def on_host_updated(self, message: HostUpdated) -> None:
        if message.host == self.host and self.is_mounted:
            with contextlib.suppress(NoMatches):  # being torn down
                self.refresh_data()

    def on_ticked(self, _message: Ticked) -> None:
        self.tick()

    def on_restyled(self, _message: Restyled) -> None:
        if self.is_mounted:
            with contextlib.suppress(NoMatches):
                self.refresh_data()

    # -- selection -------------------------------------------------------------------------
    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is None or event.tab.id is None:
            return
        index = int(event.tab.id.removeprefix("run-"))
        names = self._tab_names
        if 0 <= index < len(names) and names[index] != self.selected_run:
            self.selected_run = names[index]
            self.query_one(LogTail).action_follow()  # another run's log: from its end
            self.refresh_run(self.data.box_now(self.view.now()))

    def on_process_selected(self, event: ProcessSelected) -> None:
        self.selected_pid = event.pid
        self._refresh_keys()

    def _refresh_keys(self) -> None:
        """The footer's keys again, if this screen is the one shown: one built ahead (or being
        torn down, after the app's screens are gone) refreshes them when it is shown."""
        if self.is_current:
            self.app.refresh_bindings()

    # -- panes -----------------------------------------------------------------------------
    def pane_target(self, widget: Widget) -> Widget:
        """What takes the focus for the pane that holds `widget`: the pane's own focusable
        widget (the process table, the log, the loss pane) or the pane's scroll container."""
        pane = self.pane_of(widget)
        if pane is None:
            return widget
        for child in pane.query("*"):
            if child.can_focus:
                return child
        return pane

    @staticmethod
    def pane_of(widget: Widget) -> Widget | None:
        for node in (widget, *widget.ancestors):
            if isinstance(node, Widget) and node.has_class("pane"):
                return node
        return None

    def action_pane(self, index: int) -> None:
        pane = self.query_one(f"#{PANES[index][0]}")
        self.pane_target(pane).focus()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The focused pane comes into view whole, title and all (Textual only centres the
        focused widget, which can leave a pane's title above the top edge)."""
        pane = self.pane_of(event.widget)
        if pane is not None:
            self.call_after_refresh(pane.scroll_visible, animate=False)

    # -- keys ------------------------------------------------------------------------------
    def action_back(self) -> None:
        self.dismiss(None)

    def action_sort(self) -> None:
        self.process_sort = (self.process_sort + 1) % len(PROCESS_SORTS)
        self.refresh_data()
        self.notify(f"processes sorted by {PROCESS_SORTS[self.process_sort][1]}", timeout=2)

    def _no_curve(self, pane: LossPane, key: str) -> bool:
        """`key` acts on the loss plot: say so when the run has no curve to show it on (the
        setting still takes, for when points come)."""
        if pane.tags():
            return False
        run = self.selected_run
        self.notify(f"{key} acts on the loss plot, and {run or self.host} has no curve yet "
                    "(no scalars in its event files or metrics)" if run else
                    f"{key} acts on a run's loss plot, and {self.host} has no run",
                    title="No curve", severity="warning", timeout=4)
        return True

    def action_tag(self, delta: int) -> None:
        pane = self.query_one(LossPane)
        if self._no_curve(pane, "[ ]"):
            return
        if len(pane.tags()) == 1:
            self.notify(f"{pane.tags()[0]} is the only curve of {self.selected_run}",
                        title="One curve", timeout=3)
            return
        pane.cycle_tag(delta)

    def action_smoothing(self, delta: int) -> None:
        pane = self.query_one(LossPane)
        before = pane.settings.smoothing
        pane.change_smoothing(delta)
        if not self._no_curve(pane, "s S") and pane.settings.smoothing == before:
            self.notify("smoothing is already at its " + ("least" if delta < 0 else "most"),
                        title="Smoothing", timeout=3)

    def action_logy(self) -> None:
        pane = self.query_one(LossPane)
        pane.toggle_logy()
        self._no_curve(pane, "l")

    def action_axis(self) -> None:
        pane = self.query_one(LossPane)
        pane.toggle_axis()
        self._no_curve(pane, "x")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "pin":  # only a discovered run can be pinned; the key is hidden otherwise
            return self.data.discovery(self.selected_run) is not None and not self.view.readonly
        if action == "next_run":  # shown once there is another run to go to
            return len(self._tab_names) > 1
        if action in ("kill", "reap", "relaunch", "ack"):
            if self.view.readonly:
                return None
            if action == "kill":
                return True if self.selected_pid is not None else None
            if action == "reap":
                return True if self.data.reap_targets else None
            if self.selected_run is None:
                return None
            status = self.data.run_status(self.selected_run)
            if action == "ack":
                return True if status == "dead" else None
            return None if status == "running" else True
        return True

    # -- actions: the app plans, confirms, carries out and verifies them ---------------------
    def action_kill(self) -> None:
        if self.selected_pid is not None:
            self.post_message(ActionRequested("kill", self.host, pid=self.selected_pid))

    def action_reap(self) -> None:
        self.post_message(ActionRequested("reap", self.host))

    def action_relaunch(self) -> None:
        if self.selected_run is not None:
            self.post_message(ActionRequested("relaunch", self.host, run=self.selected_run))

    def action_ack(self) -> None:
        if self.selected_run is not None:
            self.post_message(ActionRequested("ack", self.host, run=self.selected_run))

    def action_poll_here(self) -> None:
        self.post_message(PollNow(self.host))

    def action_cannot(self, action: str) -> None:
        """An action key pressed while greyed out (or hidden): why, and what to do instead."""
        snap = self.data.snapshot
        why = why_not(action, readonly=self.view.readonly, in_host=True, host=self.host,
                      selected_run=self.selected_run,
                      in_processes=isinstance(self.focused, ProcessTable),
                      gpus_unread=snap.gpu_error.summary if snap is not None
                      and snap.gpu_error is not None else None)
        self.notify(why, title=TITLES[action], severity="warning")

    def action_next_run(self, delta: int) -> None:
        names = self._tab_names
        if len(names) < 2:
            return
        index = names.index(self.selected_run) if self.selected_run in names else 0
        self.query_one(Tabs).active = f"run-{(index + delta) % len(names)}"

    async def action_pin(self) -> None:
        """Write the selected discovered run into the config as a configured run (in a thread:
        it reads and writes files, never on the event loop)."""
        d = self.data.discovery(self.selected_run)
        if d is None or self.view.readonly:
            return
        path = self.view.config_path or find_config(None)[0]
        try:
            said = await pin_run_async(path, self.host, d, ssh=self.data.config.ssh)
        except (ValueError, OSError) as exc:
            self.notify(str(exc), title="Not pinned", severity="error", timeout=10)
            return
        self.notify(f"{said}; gpuwatch reads it as a configured run from its next start",
                    title="Pinned", timeout=10)
