"""The TUI as a watcher while it is open: the same restart policies, lease and notifications
as `gpuwatch watch` (remote/watcher.py), off the poll handler.

Only where there is something to do (a run with `restart = "on-failure"`, or a notification
target): otherwise the app has no Watching at all. The lease makes one actor of the TUI, a
`watch` daemon and a cron `watch --once` on one store; the others show what it did (each run's
line under its tab: policy, restarts used, next restart, who acts, the last message).
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuwatch.remote.report import HostReport
from gpuwatch.remote.watcher import Watcher, wants_watcher, watch_lines

from .state import HostData

if TYPE_CHECKING:
    from .app import GpuwatchApp


class Watching:
    def __init__(self, app: GpuwatchApp, watcher: Watcher) -> None:
        self.app, self.watcher = app, watcher
        self._acting: set[str] = set()

    @classmethod
    def for_app(cls, app: GpuwatchApp) -> Watching | None:
        if not wants_watcher(app.config):
            return None
        watcher = Watcher(replace(app.config, readonly=app.readonly), app.store,
                          lambda _line: None, kind="tui",
                          accept_new_host_keys=app.accept_new_host_keys)
        watcher.log_failed_polls = False  # the screens say it
        return cls(app, watcher)

    def judged(self, data: HostData, report: HostReport) -> HostReport:
        """A judged poll: run.restart_limit added where the watchdog gave up; the acting (a
        restart is an SSH call) goes to a worker, one per host at a time."""
        with contextlib.suppress(sqlite3.Error):
            report = self.watcher.add_findings(data.config, data.history, report)
        if data.name not in self._acting:
            self._acting.add(data.name)
            self.app.run_worker(self._act(data, report), group=f"watch:{data.name}",
                                exit_on_error=False)
        return report

    async def _act(self, data: HostData, report: HostReport) -> None:
        try:
            events = await self.watcher.act(data.config, data.history, report)
            data.watchdog = watch_lines(self.app.store, data.config, data.history)
        except Exception as exc:  # the store or a send: never fatal here
            from gpuwatch.remote import errorlog

            errorlog.record(exc, f"watching {data.name}")
            events = []
        finally:
            self._acting.discard(data.name)
        for e in events:
            if e.kind in ("restart", "verified", "failed", "gave_up"):
                self.app.notify(f"{e.run}: {e.message}", title=f"Watchdog on {data.name}",
                                severity="information" if e.kind in ("restart", "verified")
                                else "error")
        self.app.render_host(data.name)

    def close(self) -> None:
        self.watcher.close(flush_s=5.0)
