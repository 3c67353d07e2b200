"""The gpuwatch Textual app, and `build_app`, the one factory the CLI, the tests and the
snapshot apps all use (posting's pattern).

How data gets to the screen (STYLE 3, 4, 18; DESIGN §2):
  FleetWatch (remote/watch/fleet.py, role "tui": its Poller in this event loop, one poll in
  flight per host, never overlapping; every poll landed: judged, remembered, acted on)
    → its listener posts HostReported(report)  (can_replace keyed on host)
    → on_host_reported: HostData.apply(report)   (plain data, no widget)
    → HostUpdated(host) goes down to the screen shown, whichever it is; it hands the data to
      its widgets, which only render. A modal ignores it; the screen under it catches up when
      it resumes.
Screens read a FleetView (tui/view.py) and send their requests up as messages (OpenHost,
ActionRequested, PrepareAround): the app never asks which screen is shown. The scheduler's
rounds (`[slurm]`) come the same way: the pipeline's jobs listener posts JobsReported, and
JobsUpdated goes down; the jobs screen (`J`) reads them through the FleetView and asks for a job's
action with JobActionRequested.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from gpuwatch.remote.actions.restart import WatchEvent
from gpuwatch.remote.config.schema import Config
from gpuwatch.remote.model.series import FLEET_POINTS, apply_budget
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import Collector
from gpuwatch.themes import BUILTIN, DEFAULT_THEME, SERIES_VARIABLES, load_user_themes
from textual import work
from textual.binding import Binding, BindingType
from textual.driver import Driver as TextualDriver
from textual.notifications import SeverityLevel

from .messages import (
    ActionRequested,
    HostReported,
    HostUpdated,
    JobActionRequested,
    JobsReported,
    JobsUpdated,
    OpenHost,
    PollNow,
    PrepareAround,
    Restyled,
    Ticked,
)
from .screens.confirm import ConfirmAction
from .screens.fleet import FleetScreen
from .screens.help import HelpScreen
from .screens.host import HostScreen
from .screens.kept import HostViews
from .state import HostData
from .textual_compat import set_binding_description
from .theme_css import ThemeCssApp
from .view import FleetView

OVERNIGHT_S = 12 * 3600.0
"""How far back the GPU plots reach into the store's history at start."""
TICK_S = 2.0
"""Ages on screen ("stale 42 s") move on between polls at this pace."""
JOB_VERIFY_ROUNDS = 10
JOB_VERIFY_GAP_S = 3.0
"""A job's action is verified by the next rounds of the scheduler: at most this many, this far
apart (as `gpuwatch job` verifies; slurmctld takes a moment)."""


def terminal_driver() -> type[TextualDriver] | None:
    """tui/driver.py's on Linux and macOS; Textual's own elsewhere."""
    if sys.platform == "win32":
        return None
    from .driver import Driver
    return Driver


def _actions() -> Any:
    """remote/actions' plan module, imported when an action is first looked at."""
    from gpuwatch.remote.actions import plan as actions
    return actions


class GpuwatchApp(ThemeCssApp):
    CSS_PATH = "gpuwatch.tcss"
    TITLE = "gpuwatch"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        # K z r, and the keys that only act in one view, are the screens' own bindings.
        Binding("p", "pause", "Pause"),
        Binding("R", "poll_now", "Poll now"),
        Binding("t", "cycle_theme", "Theme"),
        Binding("T", "replay", "Replay"),
        Binding("J", "jobs", "Jobs"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, config: Config, *, store: Store, readonly: bool = False,
                 theme: str | None = None, accept_new_host_keys: bool = False,
                 clock: Callable[[], float] = time.time, poll: bool = True,
                 themes_dir: Path | None = None, collector: Collector | None = None) -> None:
        super().__init__(driver_class=terminal_driver())
        # No animations: the run tabs' underline slid for ~0.4 s after each n / N (15 frames
        # of a screen that should change once); a monitor changes in one step.
        self.animation_level = "none"
        self.readonly = readonly or config.readonly
        self.config = replace(config, readonly=self.readonly)
        self.store = store
        self.accept_new_host_keys = accept_new_host_keys
        self.clock = clock
        self.poll_enabled = poll
        self.requested_theme = theme or config.theme
        self.themes_dir = themes_dir
        self.fleet = FleetWatch(self.config, store, role="tui",
                                accept_new_host_keys=accept_new_host_keys, collector=collector)
        """THE pipeline (remote/watch/fleet.py): polls, judges, remembers, acts."""
        self._waiters: dict[str, list[tuple[float, asyncio.Event]]] = {}
        self._store_failed = False
        self.points_budget = FLEET_POINTS
        """Points kept over every tag of every host's runs (series.apply_budget)."""
        self.hosts: dict[str, HostData] = {h.name: self._restore(h.name) for h in config.hosts}
        self.view = FleetView(MappingProxyType(self.hosts), config.interval, self.readonly,
                              config.path, lambda: self.clock(), lambda: self.fleet.paused,
                              lambda: self.fleet.jobs.report if self.fleet.jobs else None,
                              config.slurm.host if config.slurm is not None else None)
        self.host_views = HostViews(self, lambda name: HostScreen(name, self.view))

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every toast of the app and its screens comes here: shown as written, never as markup
        (a relaunch's log line `saving to [/data/ckpt/step-100]` is no tag, and an unknown tag
        raised MarkupError and took the TUI down), with the box's control characters visible
        (outcome messages and errors carry its command lines, paths and log lines). `markup`
        is accepted for Textual's signature and ignored: nothing here is markup."""
        super().notify(visible(message, multiline=True), title=visible(title),
                       severity=severity, timeout=timeout, markup=False)

    # -- start and stop ----------------------------------------------------------------------
    def _restore(self, name: str) -> HostData:
        """Overnight: what the store holds, shown (stale, with its age) before the first poll."""
        history = self.fleet.history(name)
        data = HostData(self.fleet.host(name).config, history)
        since = self.clock() - OVERNIGHT_S
        rows: list[Any] = []
        with contextlib.suppress(sqlite3.Error):
            rows = self.store.gpu_history(name, since=since)
        data.restore(self.fleet.restored_findings(name), rows, history.last_ok_at)
        data.watchdog = self.fleet.watch_lines(name)
        return data

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Series colours for themes that do not set them (Textual's own, sparse user themes).
        return dict(SERIES_VARIABLES)

    def on_mount(self) -> None:
        for theme in BUILTIN:
            self.register_theme(theme)
        self.theme_names = [t.name for t in BUILTIN]
        user = load_user_themes(self.themes_dir)
        for theme in user.themes:
            self.register_theme(theme)
            if theme.name not in self.theme_names:
                self.theme_names.append(theme.name)
        for warning in user.warnings:
            self.notify(warning, title="Theme not loaded", severity="warning", timeout=8)
        wanted = self.requested_theme or DEFAULT_THEME
        if wanted not in self.available_themes:
            self.notify(f"No theme named {wanted!r}; using {DEFAULT_THEME}. Known: "
                        f"{', '.join(self.theme_names)}", severity="warning", timeout=8)
            wanted = DEFAULT_THEME
        self.theme = wanted
        self.theme_changed_signal.subscribe(self, lambda _t: self._down(Restyled()))
        self.push_screen(FleetScreen(self.view))
        self.fleet.listen(self._reported, self._watched, self._jobs_reported)
        if self.poll_enabled:
            self.fleet.start()
        self.set_interval(TICK_S, lambda: self._down(Ticked()))

    async def on_unmount(self) -> None:
        await self.fleet.stop()
        self.fleet.close(flush_s=5.0)

    # -- data in -----------------------------------------------------------------------------
    def _reported(self, report: Any) -> None:
        """The pipeline's listener (in this loop): post, never touch a widget here."""
        self.post_message(HostReported(report))

    def _jobs_reported(self, report: Any) -> None:
        """The pipeline's jobs listener (in this loop): post, never touch a widget here."""
        self.post_message(JobsReported(report))

    def on_jobs_reported(self, _message: JobsReported) -> None:
        # The pipeline holds the round (fleet.jobs.report); the screen shown reads it there.
        self._down(JobsUpdated())
        if self.screen_stack:
            self.refresh_bindings()

    def _watched(self, host: str, events: list[WatchEvent]) -> None:
        """What the watchdog did on a host (restart policies, tui as a watcher): toasts, and
        the runs' watchdog lines again."""
        for e in events:
            if e.kind in ("restart", "verified", "failed", "gave_up"):
                self.notify(f"{e.run}: {e.message}", title=f"Watchdog on {host}",
                            severity="information" if e.kind in ("restart", "verified")
                            else "error")
        data = self.hosts.get(host)
        if data is not None:
            data.watchdog = self.fleet.watch_lines(host)
            data.version += 1
            self.render_host(host)

    def on_host_reported(self, message: HostReported) -> None:
        report = message.report
        data = self.hosts.get(report.name)
        if data is None:
            if report.name not in self.fleet.names:
                return
            # a Slurm job's node, joined by the scheduler's round: a host from now on
            watched = self.fleet.host(report.name)
            data = self.hosts[report.name] = HostData(watched.config, watched.history)
        data.apply(report)
        # Every host's runs share one budget of points (a sweep of 64 runs would otherwise keep
        # up to 2.4 MB a tag): a new tag anywhere shrinks every tag's share.
        apply_budget((run for d in self.hosts.values() for run in d.history.runs.values()),
                     self.points_budget)
        data.reap_targets = self._reap_targets(data)
        warning = self.fleet.unsaved.get(report.name)
        if warning and not self._store_failed:  # the store is a convenience: never fatal
            self._store_failed = True
            self.notify(f"history is not being saved: {warning}", title="Store",
                        severity="warning")
        waiting = self._waiters.get(report.name, [])
        for after, event in list(waiting):
            if report.outcome.started_at >= after:
                event.set()
                waiting.remove((after, event))
        self.render_host(report.name)

    def _down(self, message: HostUpdated | Ticked | Restyled | JobsUpdated) -> None:
        """A message down to the screen shown, whichever it is (a modal ignores it; the
        screen under it catches up when it resumes)."""
        if self.screen_stack:
            self.screen.post_message(message)

    def render_host(self, name: str) -> None:
        if self.screen_stack:
            self._down(HostUpdated(name))
            self.refresh_bindings()

    @property
    def paused(self) -> bool:
        return self.fleet.paused

    def wait_for_poll(self, host: str, after: float = 0.0) -> asyncio.Event:
        """An event set when an outcome of `host` whose poll began at or after `after` (epoch
        s, the collector's clock) has landed."""
        event = asyncio.Event()
        self._waiters.setdefault(host, []).append((after, event))
        return event

    # -- what the screens ask for ------------------------------------------------------------
    def on_open_host(self, message: OpenHost) -> None:
        self.open_host(message.host)

    def open_host(self, name: str) -> None:
        if name in self.hosts:
            self.host_views.cancel()  # no building ahead behind the host view's keys
            self.push_screen(self.host_views.get(name))
            self.prepare_next_theme()

    def on_poll_now(self, message: PollNow) -> None:
        self.action_poll_now(message.host)

    def on_prepare_around(self, message: PrepareAround) -> None:
        self.host_views.prepare_soon(message.host, message.around)

    def on_action_requested(self, message: ActionRequested) -> None:
        kind, host = message.kind, message.host
        if host not in self.hosts:
            return
        if kind == "ack":
            self._acknowledge(host, message.run)
        elif kind == "kill" and message.pid is not None:
            pid = message.pid
            self._confirm("kill", host,
                          lambda a, data: a.plan_kill(data.config, data.history, pid),
                          f"Kill process {pid} on {host}?", "Kill")
        elif kind == "reap":
            self._confirm("reap", host, lambda a, data: a.plan_reap(data.config, data.history),
                          f"Reap the zombie VRAM holders on {host}?", "Reap")
        elif kind == "relaunch" and message.run is not None:
            run = message.run
            self._confirm("relaunch", host,
                          lambda a, data: a.plan_relaunch(data.config, run, data.history,
                                                          self._launch_record(host, run)),
                          f"Relaunch run {run} on {host}?", "Relaunch")

    def _acknowledge(self, host: str, run: str | None) -> None:
        """`a`: a dead run's death is known; it stops being critical (recorded, audited)."""
        if self.readonly:
            self.notify("actions are off (--readonly)", severity="warning")
            return
        try:
            said = self.fleet.acknowledge(host, run or "")
        except (ValueError, sqlite3.Error) as exc:
            self.notify(str(exc), title="Not acknowledged", severity="warning")
            return
        self.notify(said, title="Acknowledged")
        self.fleet.poll_now(host)  # the next landed poll says it in every view

    # -- actions: K z r ----------------------------------------------------------------------
    def _reap_targets(self, data: HostData) -> frozenset[int]:
        actions = _actions()
        try:
            plan = actions.plan_reap(data.config, data.history)
        except Exception:  # a plan that cannot be made is no target
            return frozenset()
        return frozenset(t.pid for t in plan.targets)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if not self.screen_stack:
            return False
        # Inside a modal only its own keys (and quit) work.
        modal = self.screen.is_modal
        if action == "jobs" and self.config.slurm is None:
            return False  # no [slurm]: no jobs to show, no key
        return not (modal and action in ("pause", "poll_now", "cycle_theme", "help", "replay",
                                         "jobs"))

    def _launch_record(self, host: str, run: str) -> Any:
        """How a discovered (not configured) run was started, as the store recorded it."""
        if self.hosts[host].config.run(run) is not None:
            return None
        from gpuwatch.remote.model.launches import recorded_launch

        try:
            return recorded_launch(self.store, host, run)
        except sqlite3.Error:
            return None  # the plan then says what is missing

    def _confirm(self, kind: str, host: str, make_plan: Callable[[Any, HostData], Any],
                 title: str, verb: str) -> None:
        actions = _actions()
        if self.readonly:
            self.notify("actions are off (--readonly)", severity="warning")
            return
        data = self.hosts[host]
        try:
            plan = make_plan(actions, data)
        except Exception as exc:
            self.notify(f"cannot plan {kind}: {exc}", title=title, severity="error")
            return

        def done(confirmed: bool | None) -> None:
            if confirmed:
                self.execute_plan(plan, host)
            else:
                self.notify(f"{verb} cancelled; nothing was done.", title=host)

        self.push_screen(ConfirmAction(title, plan.describe(), verb=verb, refusal=plan.refusal),
                         done)

    @work(group="actions", exit_on_error=False)
    async def execute_plan(self, plan: Any, host: str) -> None:
        """Execute a confirmed plan (its own bounded SSH call), then poll the host and report
        what the fresh poll verified (U1: a kill's exit code proves nothing)."""
        cfg = self.hosts[host].config
        title = f"{plan.kind} on {host}"
        try:
            outcome = await self.fleet.execute(plan, readonly=self.readonly)
        except Exception as exc:
            self.notify(f"failed: {exc}", title=title, severity="error", timeout=10)
            return
        self.notify(outcome.message, title=title, timeout=8,
                    severity="error" if outcome.ok is False else "information")
        if outcome.ok is False or not self.fleet.polling:
            return
        # Verified by a poll that began after the action ended (U1: a kill's exit code proves
        # nothing; a poll already in flight saw the box before the action). A relaunched run
        # may need a poll or two to show its process.
        bound = (cfg.settings.connect_timeout + cfg.settings.command_timeout
                 + self.config.interval + 5)

        async def fresh_poll() -> str | None:
            polled = self.wait_for_poll(host, after=time.time())
            self.fleet.poll_now(host)
            try:
                await asyncio.wait_for(polled.wait(), timeout=bound)
            except TimeoutError:
                return f"no poll of {host} landed within {bound:.0f} s"
            return None

        try:  # the one verify loop (remote/actions/verify.py), as the action verbs verify
            verified = await self.fleet.verify(plan, fresh_poll)
        except Exception as exc:
            self.notify(f"could not verify: {exc}", title=title, severity="warning")
            return
        if verified is None:
            self.notify(f"no poll of {host} landed; not verified", title=title,
                        severity="warning", timeout=10)
            return
        self.notify(verified.message, title=f"{title}: verified" if verified.ok else title,
                    timeout=10, severity=("information" if verified.ok else
                                          "error" if verified.ok is False else "warning"))

    # -- a Slurm job's actions: r c on the jobs screen ----------------------------------------
    def on_job_action_requested(self, message: JobActionRequested) -> None:
        """Planned as `gpuwatch job` plans it (sources/slurm_act.py), from the jobs the last
        round listed; confirmed; then sent and verified by the pipeline."""
        from gpuwatch.remote.sources.slurm_act import plan_job

        jobs = self.fleet.jobs
        if jobs is None:
            return
        if self.readonly:
            self.notify("actions are off (--readonly)", severity="warning")
            return
        kind, job_id = message.kind, message.job_id
        listed = jobs.report.jobs if jobs.report is not None else ()
        try:
            plan = plan_job(kind, job_id, [v.job for v in listed], readonly=self.readonly)
        except ValueError as exc:
            self.notify(f"cannot plan {kind}: {exc}", severity="error")
            return
        verb = kind.capitalize()
        title = f"{verb} job {job_id} on {jobs.config.host}?"

        def done(confirmed: bool | None) -> None:
            if confirmed:
                self.execute_job_plan(plan)
            else:
                self.notify(f"{verb} cancelled; nothing was sent.", title=f"job {job_id}")

        self.push_screen(ConfirmAction(title, plan.describe(), verb=verb, refusal=plan.refusal),
                         done)

    @work(group="actions", exit_on_error=False)
    async def execute_job_plan(self, plan: Any) -> None:
        """Send a confirmed job action (its own bounded call on the login host, audited), then
        ask the scheduler again until a round shows it done (never the exit status alone)."""
        jobs = self.fleet.jobs
        assert jobs is not None
        title = f"{plan.kind} job {plan.job_id}"
        try:
            sent = await jobs.act(plan, self.store)
        except Exception as exc:
            self.notify(f"failed: {exc}", title=title, severity="error", timeout=10)
            return
        self.notify(sent.message, title=title, timeout=8,
                    severity="information" if sent.ok else "error")
        if not sent.ok:
            return
        rounds = 0

        async def next_round() -> Any:
            nonlocal rounds
            if rounds:
                await asyncio.sleep(JOB_VERIFY_GAP_S)  # slurmctld takes a moment
            rounds += 1
            await self.fleet.jobs_round()  # landed: the jobs screen shows it at once
            from gpuwatch.remote.sources.slurm import SlurmError

            answer = jobs.answer
            return answer if answer is not None else SlurmError("probe", "no answer")

        try:
            verified = await jobs.verify(plan, next_round, self.store, JOB_VERIFY_ROUNDS)
        except Exception as exc:
            self.notify(f"could not verify: {exc}", title=title, severity="warning")
            return
        self.notify(verified.message, title=f"{title}: verified" if verified.ok else
                    f"{title}: not verified", timeout=10,
                    severity="information" if verified.ok else "warning")

    # -- other keys --------------------------------------------------------------------------
    def action_pause(self) -> None:
        if not self.fleet.polling:
            self.notify("polling is off in this session", severity="warning")
            return
        if self.fleet.paused:
            self.fleet.resume()  # every host at once: what is on screen went stale
            self.notify("polling resumed")
        else:
            self.fleet.pause()
            self.notify("polling paused (p resumes; R polls once)")
        # the footer says what p does now
        set_binding_description(self, "p", "Resume" if self.fleet.paused else "Pause")
        self._down(Restyled())

    def action_poll_now(self, host: str | None = None) -> None:
        """R: poll `host` (the host view's) or every host now; while paused, once (htop and
        k9s refresh a frozen view on request), and the pause holds."""
        if not self.fleet.polling:
            self.notify("polling is off in this session", severity="warning")
            return
        paused = self.fleet.paused
        self.fleet.poll_now(host, through_pause=paused)
        what = host if host is not None else f"all {len(self.hosts)} hosts"
        self.notify(f"polling {what} once; polling stays paused (p resumes)" if paused
                    else f"polling {what} now")

    def action_cycle_theme(self) -> None:
        self.theme = self.next_theme()
        self.notify(f"theme: {self.theme}", timeout=2)
        self.prepare_next_theme()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_jobs(self) -> None:
        """J: the user's Slurm jobs (tui/screens/jobs.py)."""
        from .screens.jobs import JobsScreen

        self.push_screen(JobsScreen(self.view))

    def action_replay(self) -> None:
        """T: the night as the store holds it (tui/screens/replay.py); nothing is polled or
        acted on from the past; Esc comes back to the live views."""
        from .screens.replay import ReplayScreen

        self.push_screen(ReplayScreen(self.view, self.store))


def build_app(config: Config, *, store: Store, readonly: bool = False, theme: str | None = None,
              accept_new_host_keys: bool = False, clock: Callable[[], float] | None = None,
              poll: bool = True, themes_dir: Path | None = None,
              collector: Collector | None = None) -> GpuwatchApp:
    """The app, as the CLI, the tests and the snapshot apps all build it.

    clock: this machine's clock for ages (tests freeze it); poll=False: show what the store
    holds and what is fed in by hand, never poll; themes_dir: user themes (default XDG)."""
    return GpuwatchApp(config, store=store, readonly=readonly, theme=theme,
                       accept_new_host_keys=accept_new_host_keys,
                       clock=clock or time.time, poll=poll, themes_dir=themes_dir,
                       collector=collector)
