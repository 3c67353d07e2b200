"""Messages of the TUI (STYLE 3, 18: attributes down, messages up).

Down, from the app to the screen shown (whichever it is: the app never asks which): a host's
data changed, the clock ticked, the theme changed. Up, from a screen to the app: open a host,
ask for an action, build screens ahead. The pipeline's reports reach the app as HostReported,
its rounds of the scheduler (`[slurm]`) as JobsReported.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.remote.model.slurm_job import JobsReport
from gpuwatch.remote.report import HostReport
from textual.message import Message


@dataclass
class HostReported(Message):
    """A poll of one host landed in the pipeline (remote/watch/fleet.py: judged, remembered)."""

    report: HostReport

    def can_replace(self, message: Message) -> bool:
        # A burst for one host collapses to its newest report: the history already holds
        # everything the older ones brought.
        return isinstance(message, HostReported) and message.report.name == self.report.name


@dataclass
class JobsReported(Message):
    """A round of the scheduler landed in the pipeline (remote/watch/fleet.py's jobs_round)."""

    report: JobsReport

    def can_replace(self, message: Message) -> bool:
        # Each round lists every job: the newest says all the older ones did.
        return isinstance(message, JobsReported)


@dataclass
class JobsUpdated(Message, bubble=False):
    """Down: the jobs changed (a round of the scheduler landed); a screen that shows them
    renders them again."""


@dataclass
class HostUpdated(Message, bubble=False):
    """Down: a host's data changed; the screen shown renders it if it shows that host."""

    host: str


@dataclass
class Ticked(Message, bubble=False):
    """Down: time passed (ages on screen move on between polls)."""


@dataclass
class Restyled(Message, bubble=False):
    """Down: the theme changed; what is drawn in its colours is drawn again."""


@dataclass
class OpenHost(Message):
    """Up: show this host's view."""

    host: str


@dataclass
class PrepareAround(Message):
    """Up: the fleet's cursor rests on `host`: build its view ahead, then `around`'s."""

    host: str
    around: list[str]


@dataclass
class ActionRequested(Message):
    """Up: a person pressed an action's key on a host (kill: a pid; relaunch: a run);
    the app plans it, confirms it, carries it out and verifies it."""

    kind: str
    """kill | reap | relaunch | ack"""
    host: str
    pid: int | None = None
    run: str | None = None


@dataclass
class JobActionRequested(Message):
    """Up: a person pressed a job's action key (the jobs screen); the app plans it, confirms
    it, sends it through the scheduler and verifies it by the next rounds."""

    kind: str
    """requeue | cancel"""
    job_id: str


@dataclass
class PollNow(Message):
    """Up: R in a host's view: poll that host now (once, while paused)."""

    host: str


@dataclass
class ProcessSelected(Message):
    """The highlighted process changed (None: a run header or nothing)."""

    pid: int | None
