"""FleetView: the narrow, read-only view of the fleet that the app hands each screen.

A screen reads the hosts' data and the few app-wide facts it renders (the clock, the interval,
paused, read-only) from here, and asks for everything else with a message (tui/messages.py):
it never reaches into the app, so a new screen needs nothing of the app but this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.remote.model.slurm_job import JobsReport

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
    _jobs: Callable[[], JobsReport | None] = lambda: None
    slurm_host: str | None = None
    """`[slurm] host` (None: the config has no [slurm]: no jobs to show)."""

    def now(self) -> float:
        """This machine's clock, as the app keeps it (tests freeze it)."""
        return self._clock()

    @property
    def paused(self) -> bool:
        return self._paused()

    def jobs(self) -> JobsReport | None:
        """The latest round of the scheduler, as the pipeline landed it (None: none yet)."""
        return self._jobs()
