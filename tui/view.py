"""FleetView: the narrow, read-only view of the fleet that the app hands each screen.

A screen reads the hosts' data and the few app-wide facts it renders (the clock, the interval,
paused, read-only) from here, and asks for everything else with a message (tui/messages.py):
it never reaches into the app, so a new screen needs nothing of the app but this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .state import HostData


@dataclass(frozen=True)
class FleetView:
    hosts: Mapping[str, HostData]
    """Every host's data, by name, in the config's order (read-only)."""
    interval: float
    readonly: bool
    config_path: Path | None
    """The config file that `P` pins runs into (None: the default place)."""
    _clock: Callable[[], float]
    _paused: Callable[[], bool]

    def now(self) -> float:
        """This machine's clock, as the app keeps it (tests freeze it)."""
        return self._clock()

    @property
    def paused(self) -> bool:
        return self._paused()
