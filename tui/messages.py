"""Messages that go up to the app (STYLE 3: attributes down, messages up)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.remote.wire.collect import PollOutcome
from textual.message import Message


@dataclass
class SnapshotReady(Message):
    """A poll of one host ended (with a snapshot or an error)."""

    host: str
    outcome: PollOutcome

    def can_replace(self, message: Message) -> bool:
        # A burst for one host collapses to its newest outcome: it carries everything the older
        # one did (the probe re-reads from the offsets the history had when it was built).
        return isinstance(message, SnapshotReady) and message.host == self.host


@dataclass
class HostSelected(Message):
    """The person opened a host (Enter or a click in the fleet table)."""

    host: str


@dataclass
class ProcessSelected(Message):
    """The highlighted process changed (None: a run header or nothing)."""

    pid: int | None


@dataclass
class RunSelected(Message):
    """The run the host view follows changed."""

    run: str | None
