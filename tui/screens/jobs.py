"""JobsScreen (`J`): the user's Slurm jobs (`[slurm]`), as the latest round of the scheduler has
them: state, why each ended or waits in words, elapsed / limit / time left, nodes, the linked run
and its latest checkpoint's age, the time-limit warning; `r` requeues the selected job and `c`
cancels it, each asked first (docs/slurm.md, docs/tui.md).

It reads the rounds through its FleetView (`jobs()`), renders them on JobsUpdated (a round
landed) and Ticked (ages move on), and asks for an action with JobActionRequested: the app plans
it (remote/sources/slurm_act.py), confirms it, and the pipeline sends and verifies it.
"""

from __future__ import annotations

from typing import ClassVar

from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.slurm_job import JobsReport, JobView
from gpuwatch.remote.sources.slurm_act import can
from gpuwatch.remote.units import duration
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ..colours import SEVERITY_GLYPH, severity_colour
from ..format import visible
from ..messages import JobActionRequested, JobsUpdated, Restyled, Ticked
from ..view import FleetView
from ..widgets.jobs_table import JobsTable, time_left
from ..widgets.key_footer import KeyFooter

CANNOT = {
    "requeue": "r requeues a job that runs or has ended (a pending one waits already)",
    "cancel": "c cancels a job that is pending or running (an ended one is over already)",
}


class JobsScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "requeue", "Requeue"),
        Binding("c", "cancel_job", "Cancel job"),
        # A greyed-out action's key falls through to these: a toast says why, not silence.
        Binding("r", "cannot('requeue')", show=False),
        Binding("c", "cannot('cancel')", show=False),
        Binding("escape,J", "back", "Back"),
    ]

    def __init__(self, view: FleetView) -> None:
        super().__init__(id="jobs")
        self.view = view

    def compose(self) -> ComposeResult:
        yield Static(id="jobs-title", markup=False)
        yield JobsTable(id="jobs-table")
        yield Static(id="jobs-detail", markup=False)
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.refresh_jobs()
        self.table.focus()

    def on_screen_resume(self) -> None:
        self.refresh_jobs()

    @property
    def table(self) -> JobsTable:
        return self.query_one(JobsTable)

    @property
    def selected(self) -> JobView | None:
        tables = self.query(JobsTable)  # none while the screen is being torn down
        return tables.first().selected if tables else None

    # -- data in ---------------------------------------------------------------------------
    def on_jobs_updated(self, _message: JobsUpdated) -> None:
        self.refresh_jobs()

    def on_ticked(self, _message: Ticked) -> None:
        """Ages move on: the title's, and the rows only where a job runs (an ended or pending
        job's cells do not change with the clock; 500 of them need not be built anew)."""
        report = self.view.jobs()
        if report is not None and any(v.job.running for v in report.jobs):
            self.refresh_jobs()
        elif self.is_mounted and self.query(JobsTable):
            self.query_one("#jobs-title", Static).update(self.title_text(report,
                                                                         self.view.now()))

    def on_restyled(self, _message: Restyled) -> None:
        self.refresh_jobs()

    def refresh_jobs(self) -> None:
        if not (self.is_mounted and self.query(JobsTable)):
            return
        report = self.view.jobs()
        now = self.view.now()
        self.table.show(report.jobs if report is not None else (), now)
        self.query_one("#jobs-title", Static).update(self.title_text(report, now))
        self.show_detail()
        self.refresh_bindings()

    def title_text(self, report: JobsReport | None, now: float) -> Text:
        where = visible(self.view.slurm_host or "?")
        if report is None:
            return Text(f"jobs on {where} · asking the scheduler…")
        if not report.ok:
            error = report.error or {}
            return Text(f"jobs on {where} · ✗ the scheduler could not be asked: "
                        f"{visible(error.get('message', '?'))}",
                        style=severity_colour(self.app, Severity.CRITICAL))
        jobs = [v.job for v in report.jobs]
        counts = [f"{n} {word}" for n, word in (
            (sum(j.running for j in jobs), "running"), (sum(j.pending for j in jobs), "pending"),
            (sum(j.ended for j in jobs), "ended")) if n]
        parts = [f"jobs on {where}", f"Slurm {visible(report.version or '?')}",
                 ", ".join(counts) or "no jobs", f"asked {duration(now - report.polled_at)} ago"]
        if report.problems:
            parts.append(f"{len(report.problems)} line(s) unread")
        return Text(" · ".join(parts))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.show_detail()
        self.refresh_bindings()

    def show_detail(self) -> None:
        """The selected job in full: who and where, why, every finding, its run."""
        view = self.selected
        detail = self.query_one("#jobs-detail", Static)
        if view is None:
            report = self.view.jobs()
            detail.update(Text("no jobs of yours in the scheduler's last round" if report
                               is not None and report.ok else ""))
            return
        job, now = view.job, self.view.now()
        text = Text()
        head = [f"job {job.job_id} ({job.name})", job.state, f"user {job.user or '?'}"]
        if job.partition:
            head.append(f"partition {job.partition}")
        if job.nodes or job.node_list:
            head.append("on " + (", ".join(job.nodes) or job.node_list or ""))
        left = time_left(view, now)
        if left is not None:
            head.append(f"{duration(left)} left")
        text.append(visible(" · ".join(head)), style="bold")
        if view.why:
            text.append("\n" + visible(view.why))
        for finding in view.findings:
            if finding.message.endswith(view.why or "\0"):
                continue  # the cause's own finding says what the line above said
            text.append("\n" + SEVERITY_GLYPH[finding.severity] + " ",
                        style=severity_colour(self.app, finding.severity))
            text.append(visible(finding.message))
        run = view.run
        if run is not None:
            said = [f"run {run.run} on {run.host}"]
            said.append("latest checkpoint " + (f"{duration(now - run.checkpoint_at)} old"
                                                if run.checkpoint_at is not None else "none"))
            if run.last_step is not None:
                said.append(f"step {run.last_step}")
            if run.last_loss is not None:
                said.append(f"loss {run.last_loss:.4g}")
            if run.log:
                said.append(f"log {run.log}")
            text.append("\n" + visible(" · ".join(said)))
        elif job.stdout:
            text.append("\n" + visible(f"log {job.stdout}"))
        detail.update(text)

    # -- keys ------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("requeue", "cancel_job"):
            view = self.selected
            if self.view.readonly or view is None:
                return None
            return True if can("requeue" if action == "requeue" else "cancel", view.job) \
                else None
        return True

    def action_requeue(self) -> None:
        if self.selected is not None:
            self.post_message(JobActionRequested("requeue", self.selected.job.job_id))

    def action_cancel_job(self) -> None:
        if self.selected is not None:
            self.post_message(JobActionRequested("cancel", self.selected.job.job_id))

    def action_cannot(self, action: str) -> None:
        """An action key pressed while greyed out: why, and what to do instead."""
        if self.view.readonly:
            why = "actions are off (--readonly)"
        elif self.selected is None:
            why = "no job is selected"
        else:
            why = CANNOT[action]
        self.notify(why, title=f"Cannot {action}", severity="warning")

    def action_back(self) -> None:
        self.dismiss(None)
