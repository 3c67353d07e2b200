"""The jobs screen (`J`) driven by Textual's Pilot: each job's state and cause in words, the
time-limit warning, box text shown as written, `r` asks first and requeues through the pipeline
(the same plan, send, audit and verify as `gpuwatch job requeue`), the next round shows the job
pending; at 80×24 the columns that do not fit go whole. The scheduler is a stand-in answering
as slurm_parse reads a real one (the real Slurm drives tests/tui/test_tui_jobs_tmux.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import tui_fixtures as fx
from gpuwatch.remote.config.schema import Config, SlurmConfig
from gpuwatch.remote.model.slurm_job import Job
from gpuwatch.remote.sources.slurm import Answer
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.screens.confirm import ConfirmAction
from gpuwatch.tui.screens.fleet import FleetScreen
from gpuwatch.tui.screens.help import HelpScreen
from gpuwatch.tui.screens.jobs import JobsScreen
from gpuwatch.tui.widgets.jobs_table import JobsTable
from harness.toasts import record_toasts, toasts_of
from harness.waiting import wait_for_async

NOW = fx.NOW
EVIL = "[bold red]x[/]\x1b[2J"
"""A job name as a user may type it: markup-looking, with an escape sequence."""


def jobs_now() -> list[Job]:
    """In the order SlurmSource.merge gives them: running, pending, then ended, newest first."""
    return [
        Job("101", "train-a", "me", "RUNNING", partition="gpu", start_at=NOW - 3300,
            end_at=NOW + 300, time_limit_s=3600, elapsed_s=3300, nodes=("gpu-healthy",)),
        Job("104", "queued", "me", "PENDING", reason="Priority", time_limit_s=7200),
        Job("103", "sweep-3", "me", "FAILED", start_at=NOW - 600, end_at=NOW - 500,
            time_limit_s=3600, elapsed_s=100, nodes=("gpu-healthy",), exit_code=3,
            source="sacct"),
        Job("102", EVIL, "me", "TIMEOUT", start_at=NOW - 7200, end_at=NOW - 3600,
            time_limit_s=3600, elapsed_s=3600, nodes=("gpu-healthy",), source="sacct"),
    ]


class FakeScheduler:
    """Answers rounds with `jobs` (what squeue and sacct would list) and takes actions: a
    requeue makes the job PENDING from the next round, as slurmctld does."""

    def __init__(self) -> None:
        self.jobs = jobs_now()
        self.acts: list[tuple[str, str]] = []
        self.rounds = 0

    async def poll(self) -> Answer:
        self.rounds += 1
        return Answer(tuple(self.jobs), "22.05.8", "squeue --json", "me", NOW)

    async def act(self, kind: str, job_id: str) -> tuple[int, str]:
        self.acts.append((kind, job_id))
        self.jobs = [replace(j, state="PENDING", reason="BeginTime", end_at=None,
                             source="squeue") if j.job_id == job_id and kind == "requeue"
                     else j for j in self.jobs]
        return 0, ""


def slurm_config(**kwargs: Any) -> Config:
    return replace(fx.config(**kwargs), slurm=SlurmConfig(host="login1", nodes="gpu-{node}",
                                                          warn_before_limit_s=1800))


def make_app(cfg: Config | None = None) -> tuple[GpuwatchApp, FakeScheduler]:
    cfg = cfg or slurm_config()
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False)
    record_toasts(app)
    scheduler = FakeScheduler()
    assert app.fleet.jobs is not None
    app.fleet.jobs.source = scheduler  # type: ignore[assignment]
    return app, scheduler


def cell(table: JobsTable, job: str, column: str) -> str:
    return table.get_cell(job, column).plain


async def test_j_lists_each_job_with_its_state_cause_and_the_time_limit_warning() -> None:
    app, _scheduler = make_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await app.fleet.jobs_round()
        await pilot.press("J")
        screen = await wait_for_async(lambda: isinstance(app.screen, JobsScreen) and app.screen)
        table = screen.query_one(JobsTable)
        await wait_for_async(lambda: table.row_count == 4, what="four jobs")
        assert table.shown == ["101", "104", "103", "102"]
        assert cell(table, "101", "state") == "● RUNNING"  # info: no run linked to it
        assert cell(table, "101", "left") == "5 min"
        assert cell(table, "101", "time") == "55 min / 1 h"
        assert cell(table, "101", "why").startswith("time limit in 5 min; no run linked")
        assert cell(table, "102", "state") == "✖ TIMEOUT"
        assert cell(table, "102", "why").startswith("killed at its 1 h time limit after")
        assert cell(table, "103", "why").startswith("exited with code 3")
        assert cell(table, "104", "why").startswith("pending: higher-priority jobs are ahead")
        # a job's name is the user's text: shown as written, its escape made visible
        assert cell(table, "102", "name") == "[bold red]x[/]\\x1b[2J"
        assert "asked 0 s ago" in str(screen.query_one("#jobs-title").render())
        await pilot.press("escape")
        await wait_for_async(lambda: isinstance(app.screen, FleetScreen), what="back")


async def test_r_asks_first_then_requeues_and_the_next_round_shows_it_pending() -> None:
    app, scheduler = make_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await app.fleet.jobs_round()
        await pilot.press("J")
        screen = await wait_for_async(lambda: isinstance(app.screen, JobsScreen) and app.screen)
        table = screen.query_one(JobsTable)
        await wait_for_async(lambda: table.row_count == 4, what="four jobs")
        assert screen.check_action("requeue", ()) is True  # the running job: requeue it
        await pilot.press("down")  # the pending job: r greyed, c (cancel) not
        assert screen.selected is not None and screen.selected.job.job_id == "104"
        assert screen.check_action("requeue", ()) is None
        assert screen.check_action("cancel_job", ()) is True
        await pilot.press("r")  # greyed: a toast says why, nothing is asked
        await toasts_of(app).saying("a pending one waits already")
        assert not isinstance(app.screen, ConfirmAction)
        await pilot.press("down", "down")  # the timed-out job (the last row)
        assert screen.selected is not None and screen.selected.job.job_id == "102"
        assert screen.check_action("cancel_job", ()) is None  # it has ended
        await pilot.press("r")
        modal = await wait_for_async(lambda: isinstance(app.screen, ConfirmAction)
                                     and app.screen)
        assert "requeue job 102" in modal.description and "TIMEOUT" in modal.description
        assert "scontrol requeue 102" in modal.description
        assert app.focused is not None and app.focused.id == "cancel"
        await pilot.press("enter")  # the default: Cancel
        await toasts_of(app).saying("nothing was sent")
        assert scheduler.acts == []
        await pilot.press("r")
        await wait_for_async(lambda: isinstance(app.screen, ConfirmAction))
        await pilot.press("y")
        await toasts_of(app).saying("is PENDING")
        assert scheduler.acts == [("requeue", "102")]
        await wait_for_async(lambda: cell(table, "102", "state") == "PENDING",
                             what="the requeued job pending")
        audit = [(e.action, e.phase, e.outcome) for e in app.store.audit_log("login1")]
        assert audit[-2:] == [("job requeue", "execute", "sent"),
                              ("job requeue", "verify", "verified")]


async def test_readonly_greys_the_actions_and_help_lists_the_keys() -> None:
    app, scheduler = make_app(slurm_config(readonly=True))
    async with app.run_test(size=(200, 50)) as pilot:
        await app.fleet.jobs_round()
        await pilot.press("J")
        screen = await wait_for_async(lambda: isinstance(app.screen, JobsScreen) and app.screen)
        await wait_for_async(lambda: screen.query_one(JobsTable).row_count == 4)
        assert screen.check_action("requeue", ()) is None
        await pilot.press("r")
        await toasts_of(app).saying("actions are off")
        assert scheduler.acts == []
        await pilot.press("question_mark")
        await wait_for_async(lambda: isinstance(app.screen, HelpScreen))

        def shown() -> str:
            text = "\n".join(fx.svg_lines(app.export_screenshot())).replace("\xa0", " ")
            return text if "t, T, J" in text else ""

        text = await wait_for_async(shown, what="the help's keys")
        assert "requeue / cancel a job" in text, text


async def test_at_80x24_whole_columns_go_and_job_state_why_stay() -> None:
    app, _scheduler = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await app.fleet.jobs_round()
        await pilot.press("J")
        screen = await wait_for_async(lambda: isinstance(app.screen, JobsScreen) and app.screen)
        table = screen.query_one(JobsTable)
        await wait_for_async(lambda: table.row_count == 4)
        assert {"job", "state", "why"} <= set(table.shown_columns)
        assert "run" not in table.shown_columns
        lines = fx.svg_lines(app.export_screenshot())
        assert all(len(line.rstrip()) <= 80 for line in lines)
        assert any("TIMEOUT" in line and "102" in line for line in lines)


async def test_without_slurm_there_is_no_j() -> None:
    cfg = fx.config()
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("J")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert app.check_action("jobs", ()) is False
