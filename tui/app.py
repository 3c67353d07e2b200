"""The gpuwatch Textual app, and `build_app`, the one factory the CLI, the tests and the
snapshot apps all use (posting's pattern).

How data gets to the screen (STYLE 3, 4; DESIGN §2):
  PollFeed (remote Poller in this event loop; one poll in flight per host, never overlapping)
    → on_result posts SnapshotReady(host, outcome)  (dataclass, can_replace keyed on host)
    → on_snapshot_ready: judge() + remember() + HostData.apply()   (plain data, no widget)
    → the visible screen hands HostData down to its widgets, which only render.
While a modal is open nothing is rendered; the screen underneath catches up when it resumes.
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
from typing import Any, ClassVar

from gpuwatch.remote.actions.verify import verify_until
from gpuwatch.remote.config.schema import Config, HostConfig
from gpuwatch.remote.findings.rules import evaluate
from gpuwatch.remote.model.series import FLEET_POINTS, apply_budget
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch import history_from_store, judge, remember, resume
from gpuwatch.remote.wire.collect import Collector, PollOutcome
from gpuwatch.themes import BUILTIN, DEFAULT_THEME, SERIES_VARIABLES, load_user_themes
from textual import work
from textual.binding import Binding, BindingType
from textual.driver import Driver as TextualDriver
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen

from .messages import SnapshotReady
from .polling import PollFeed
from .screens.confirm import ConfirmAction
from .screens.fleet import FleetScreen
from .screens.help import HelpScreen
from .screens.host import HostScreen
from .screens.kept import HostViews
from .state import HostData
from .theme_css import ThemeCssApp
from .watching import Watching
from .why_not import TITLES, why_not
from .widgets.process_table import ProcessTable

OVERNIGHT_S = 12 * 3600.0
"""How far back the GPU plots reach into the store's history at start."""
TICK_S = 2.0
"""Ages on screen ("stale 42 s") move on between polls at this pace."""
ACTIONS = ("kill", "reap", "relaunch")
RUNS_SAVE_S = 60.0


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
        # K as nvitop's kill; k moves the cursor up (vim, htop's and k9s's j / k).
        Binding("K", "kill", "Kill"),
        Binding("z", "reap", "Reap"),
        Binding("r", "relaunch", "Relaunch"),
        # When the action above is greyed out (or hidden), its key falls through to these: a
        # toast says why nothing happened and what to do, instead of silence.
        Binding("K", "cannot('kill')", show=False),
        Binding("z", "cannot('reap')", show=False),
        Binding("r", "cannot('relaunch')", show=False),
        # The host view's keys that its screen hides where they cannot act (one run; a
        # configured run has nothing to pin) land here and say why.
        Binding("n,N", "cannot('next_run')", show=False),
        Binding("P", "cannot('pin')", show=False),
        Binding("p", "pause", "Pause"),
        Binding("R", "poll_now", "Poll now"),
        Binding("t", "cycle_theme", "Theme"),
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
        self.config = config
        self.store = store
        self.readonly = readonly or config.readonly
        self.accept_new_host_keys = accept_new_host_keys
        self.clock = clock
        self.poll_enabled = poll
        self.requested_theme = theme or config.theme
        self.themes_dir = themes_dir
        self.feed: PollFeed | None = None
        self._collector = collector
        self._waiters: dict[str, list[tuple[float, asyncio.Event]]] = {}
        self._store_failed = False
        self._runs_saved: dict[str, float] = {}
        self.points_budget = FLEET_POINTS
        self.host_views = HostViews(self, HostScreen)
        self.watching = Watching.for_app(self)
        """Points kept over every tag of every host's runs (series.apply_budget)."""
        self.hosts: dict[str, HostData] = {h.name: self._restore(h) for h in config.hosts}

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
    def _restore(self, host: HostConfig) -> HostData:
        """Overnight: what the store holds, shown (stale, with its age) before the first poll."""
        history = history_from_store(self.store, host, self.config.thresholds)
        data = HostData(host, history)
        since = self.clock() - OVERNIGHT_S
        data.restore(evaluate(history) if history.snapshots else [],
                     self.store.gpu_history(host.name, since=since), history.last_ok_at)
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
        self.theme_changed_signal.subscribe(self, lambda _t: self._rerender())
        self.push_screen(FleetScreen())
        if self.poll_enabled:
            self.feed = PollFeed(self.config, {n: d.history for n, d in self.hosts.items()},
                                 self._on_result,
                                 accept_new_host_keys=self.accept_new_host_keys,
                                 collector=self._collector)
            for host in self.config.hosts:  # what the last run's polls learnt of each box
                with contextlib.suppress(sqlite3.Error):
                    resume(self.feed.collector, self.store, host)
            self.feed.start()
        self.set_interval(TICK_S, self._tick)

    async def on_unmount(self) -> None:
        if self.feed is not None:
            await self.feed.stop()
        if self.watching is not None:
            self.watching.close()
        self._save_all_runs()

    def _save_all_runs(self) -> None:
        """What the throttled saves have not written yet (offsets, series) goes now."""
        for name, data in self.hosts.items():
            if data.outcome is None or not data.history.runs:
                continue
            with contextlib.suppress(sqlite3.Error):
                self.store.save_runs(name, {
                    run: (series.state(), series.points_state())
                    for run, series in data.history.runs.items()})

    # -- polling -----------------------------------------------------------------------------
    def _on_result(self, host: HostConfig, outcome: PollOutcome) -> None:
        """Called by the Poller in this loop: post, never touch a widget here."""
        self.post_message(SnapshotReady(host.name, outcome))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        data = self.hosts.get(message.host)
        if data is None:
            return
        # judge() never raises: a document that breaks a rule comes back as this host's
        # `probe` error, shown as any failed poll is, and the host backs off as one does.
        report = judge(data.history, message.outcome)
        outcome = report.outcome
        if self.feed is not None:
            if outcome.ok or not message.outcome.ok:
                self.feed.judge_failed.discard(message.host)
            else:
                self.feed.judge_failed.add(message.host)
        # Runs' series go to the store at most every RUNS_SAVE_S per host (and at exit): they
        # are what a restart resumes from, and serialising them on every poll of 64 hosts is
        # the handler's biggest cost. The poll itself (GPU rows, the document) goes every time.
        now = time.monotonic()
        save_runs = now - self._runs_saved.get(message.host, -RUNS_SAVE_S) >= RUNS_SAVE_S
        if save_runs:
            self._runs_saved[message.host] = now
        try:
            remember(self.store, outcome, data.history,
                     self.feed.collector if self.feed is not None else None, save_runs=save_runs)
        except Exception as exc:  # the store is a convenience: never fatal (DESIGN §5)
            if not isinstance(exc, sqlite3.Error):
                from gpuwatch.remote import errorlog

                errorlog.record(exc, f"saving {message.host}")
            if not self._store_failed:
                self._store_failed = True
                self.notify(f"history is not being saved: {exc}", title="Store",
                            severity="warning", markup=False)
        if self.watching is not None:  # restart policies, notifications (tui/watching.py)
            report = self.watching.judged(data, report)
        data.apply(outcome, report.findings)
        # Every host's runs share one budget of points (a sweep of 64 runs would otherwise keep
        # up to 2.4 MB a tag): a new tag anywhere shrinks every tag's share.
        apply_budget((run for d in self.hosts.values() for run in d.history.runs.values()),
                     self.points_budget)
        data.reap_targets = self._reap_targets(data)
        waiting = self._waiters.get(message.host, [])
        for after, event in list(waiting):
            if message.outcome.started_at >= after:
                event.set()
                waiting.remove((after, event))
        self.render_host(message.host)

    def _active(self) -> object | None:
        """The visible screen, or None while the app starts or stops (no screen yet / left)."""
        return self.screen_stack[-1] if self.screen_stack else None

    def render_host(self, name: str) -> None:
        screen = self._active()
        if isinstance(screen, ModalScreen):
            return  # dolphie: no rendering under a modal; the screen catches up on resume
        if isinstance(screen, FleetScreen):
            screen.refresh_host(name)
        elif isinstance(screen, HostScreen) and screen.host == name:
            screen.refresh_data()
        if screen is not None:
            self.refresh_bindings()

    def _rerender(self) -> None:
        screen = self._active()
        if isinstance(screen, FleetScreen):
            screen.refresh_all()
        elif isinstance(screen, HostScreen):
            screen.refresh_data()

    def _tick(self) -> None:
        screen = self._active()
        if isinstance(screen, FleetScreen | HostScreen):
            screen.tick()

    @property
    def paused(self) -> bool:
        return self.feed is not None and self.feed.paused

    def wait_for_poll(self, host: str, after: float = 0.0) -> asyncio.Event:
        """An event set when an outcome of `host` whose poll began at or after `after` (epoch
        s, the collector's clock) has been judged."""
        event = asyncio.Event()
        self._waiters.setdefault(host, []).append((after, event))
        return event

    # -- navigation --------------------------------------------------------------------------
    def open_host(self, name: str) -> None:
        if name in self.hosts:
            self.host_views.cancel()  # no building ahead behind the host view's keys
            self.push_screen(self.host_views.get(name))
            self.prepare_next_theme()

    def current_host(self) -> str | None:
        screen = self._active()
        if isinstance(screen, HostScreen):
            return screen.host
        if isinstance(screen, FleetScreen):
            return screen.selected_host
        return None

    # -- actions: k z r ----------------------------------------------------------------------
    def _reap_targets(self, data: HostData) -> frozenset[int]:
        actions = _actions()
        try:
            plan = actions.plan_reap(data.config, data.history)
        except Exception:  # a plan that cannot be made is no target
            return frozenset()
        return frozenset(t.pid for t in plan.targets)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self._active() is None:
            return False
        modal = isinstance(self.screen, ModalScreen)
        if action == "cannot":
            return not modal
        if action in ACTIONS:
            if modal:
                return False
            if action in ("kill", "relaunch") and not isinstance(self.screen, HostScreen):
                return False  # host-only keys: not in the fleet view's footer
            if self.readonly:
                return None
            name = self.current_host()
            if name is None:
                return None
            data = self.hosts[name]
            if action == "kill":
                screen = self.screen
                assert isinstance(screen, HostScreen)
                return True if screen.selected_pid is not None else None
            if action == "reap":
                return True if data.reap_targets else None
            screen = self.screen
            assert isinstance(screen, HostScreen)
            run = screen.selected_run
            if run is None:
                return None
            series = data.history.runs.get(run)
            alive = series is not None and series.status == "running"
            return None if alive else True
        # Inside a modal only its own keys (and quit) work.
        return not (modal and action in ("pause", "poll_now", "cycle_theme", "help"))

    def action_cannot(self, action: str) -> None:
        """K, z or r pressed while greyed out (or hidden): why, and what to do instead."""
        screen = self.screen
        host = screen if isinstance(screen, HostScreen) else None
        name = self.current_host()
        data = self.hosts.get(name) if name is not None else None
        snap = data.snapshot if data is not None else None
        why = why_not(action, readonly=self.readonly, in_host=host is not None,
                      host=name,
                      selected_run=host.selected_run if host is not None else None,
                      in_processes=isinstance(self.focused, ProcessTable),
                      gpus_unread=snap.gpu_error.summary if snap is not None
                      and snap.gpu_error is not None else None)
        self.notify(why, title=TITLES[action], severity="warning")

    def action_kill(self) -> None:
        screen = self.screen
        if not isinstance(screen, HostScreen) or screen.selected_pid is None:
            return
        pid = screen.selected_pid
        self._confirm("kill", screen.host,
                      lambda a, data: a.plan_kill(data.config, data.history, pid),
                      f"Kill process {pid} on {screen.host}?", "Kill")

    def action_reap(self) -> None:
        name = self.current_host()
        if name is None:
            return
        self._confirm("reap", name, lambda a, data: a.plan_reap(data.config, data.history),
                      f"Reap the zombie VRAM holders on {name}?", "Reap")

    def action_relaunch(self) -> None:
        screen = self.screen
        if not isinstance(screen, HostScreen) or screen.selected_run is None:
            return
        run = screen.selected_run
        self._confirm("relaunch", screen.host,
                      lambda a, data: a.plan_relaunch(data.config, run, data.history,
                                                      self._launch_record(data.config, run)),
                      f"Relaunch run {run} on {screen.host}?", "Relaunch")

    def _launch_record(self, host: HostConfig, run: str) -> Any:
        """How a discovered (not configured) run was started, as the store recorded it."""
        if any(r.name == run for r in host.runs):
            return None
        from gpuwatch.remote.model.discovered import recorded_launch

        try:
            return recorded_launch(self.store, host.name, run)
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
        actions = _actions()
        data = self.hosts[host]
        cfg = data.config
        title = f"{plan.kind} on {host}"
        try:
            outcome = await actions.execute(plan, cfg, store=self.store, readonly=self.readonly,
                                            accept_new_host_keys=self.accept_new_host_keys)
        except Exception as exc:
            self.notify(f"failed: {exc}", title=title, severity="error", timeout=10)
            return
        self.notify(outcome.message, title=title, timeout=8,
                    severity="error" if outcome.ok is False else "information")
        if outcome.ok is not False:
            actions.mark_reaped(plan, data.history)
        if self.feed is None:
            return
        # Verified by a poll that began after the action ended (U1: a kill's exit code proves
        # nothing; a poll already in flight saw the box before the action). A relaunched run
        # may need a poll or two to show its process.
        bound = (cfg.settings.connect_timeout + cfg.settings.command_timeout
                 + self.config.interval + 5)
        feed = self.feed

        async def fresh_poll() -> str | None:
            polled = self.wait_for_poll(host, after=time.time())
            feed.poll_now(cfg)
            try:
                await asyncio.wait_for(polled.wait(), timeout=bound)
            except TimeoutError:
                return f"no poll of {host} landed within {bound:.0f} s"
            return None

        try:  # the one verify loop (remote/actions/verify.py), as the action verbs verify
            verified = await verify_until(plan, cfg, data.history, fresh_poll, store=self.store)
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

    # -- other keys --------------------------------------------------------------------------
    def action_pause(self) -> None:
        if self.feed is None:
            self.notify("polling is off in this session", severity="warning")
            return
        if self.feed.paused:
            self.feed.resume()
            self.feed.poll_now()  # what is on screen went stale while paused
            self.notify("polling resumed")
        else:
            self.feed.pause()
            self.notify("polling paused (p resumes)")
        self._bindings.key_to_bindings["p"] = [  # the footer says what p does now
            replace(b, description="Resume" if self.feed.paused else "Pause")
            for b in self._bindings.key_to_bindings.get("p", [])]
        self.refresh_bindings()
        self._rerender()

    def action_poll_now(self) -> None:
        if self.feed is None:
            self.notify("polling is off in this session", severity="warning")
            return
        if self.feed.paused:  # the poller polls nothing while paused: say so, claim nothing
            self.notify("polling is paused: nothing is polled now; p resumes polling and "
                        "polls every host at once", severity="warning")
            return
        screen = self.screen
        if isinstance(screen, HostScreen):
            self.feed.poll_now(self.hosts[screen.host].config)
            self.notify(f"polling {screen.host} now")
        else:
            self.feed.poll_now()
            self.notify(f"polling all {len(self.hosts)} hosts now")

    def action_cycle_theme(self) -> None:
        self.theme = self.next_theme()
        self.notify(f"theme: {self.theme}", timeout=2)
        self.prepare_next_theme()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


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
