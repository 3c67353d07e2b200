"""Zero-config runs on the client, across polls: which discovered runs a host has (configured
ones left out, forgotten ones dropped) and which of them the next request carries back, so a
run keeps its name, its incremental offsets, and is still read (as dead) after it dies. The box
side is discover.py (in the probe); the value type is discovery.py, the launch records are
launches.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config.schema import HostConfig
from .discovery import Discovery

if TYPE_CHECKING:
    from .series import RunSeries

MAX_REMEMBERED = 8
"""Discovered runs a request carries back (the most recently alive first)."""
FORGET_AFTER_S = 7 * 86400.0
"""A discovered run dead for this long (box clock) is no longer asked for (the store keeps its
launch record)."""


def is_discovered_state(state: Mapping[str, Any]) -> bool:
    """Whether a run state kept in the store belongs to a discovered run."""
    return isinstance(state.get("discovery"), Mapping)


def _forgotten(series: RunSeries) -> bool:
    """Dead for longer than FORGET_AFTER_S (box clock): no longer asked for nor listed."""
    last = series.last_seen_running_at
    return (not series.pids and last is not None and series.box_time is not None
            and series.box_time - last > FORGET_AFTER_S)


def discovered_names(runs: Mapping[str, RunSeries], host: HostConfig) -> list[str]:
    """The discovered runs of a host's history that are not configured (nor pinned) ones and
    not long dead, by name."""
    configured = {r.name for r in host.runs}
    return sorted(n for n, s in runs.items()
                  if s.discovery is not None and n not in configured
                  and not _pinned(s.discovery, host) and not _forgotten(s))


def _pinned(d: Discovery, host: HostConfig) -> bool:
    """A remembered run that the config now names (pinned): the configured one reads it."""
    return any(r.workdir and d.cwd and r.workdir.rstrip("/") == d.cwd.rstrip("/")
               and r.process and r.process == d.process for r in host.runs)


def discovered_requests(host: HostConfig,
                        runs: Mapping[str, RunSeries] | None) -> list[dict[str, Any]]:
    """`discovered_runs` of the next request: the remembered discovered runs (at most
    MAX_REMEMBERED, the most recently alive first; one dead for FORGET_AFTER_S is dropped),
    each with what the last answers said (offsets, cursors, log size), so that only what is
    new comes back and a dead one is still read."""
    configured = {r.name for r in host.runs}
    kept = []
    for name, series in (runs or {}).items():
        d = series.discovery
        if d is None or name in configured or _pinned(d, host) or _forgotten(series):
            continue
        last = series.last_seen_running_at
        kept.append((last if last is not None else float("-inf"), name, series, d))
    kept.sort(key=lambda item: (-item[0], item[1]))
    out = []
    for _, _name, series, d in kept[:MAX_REMEMBERED]:
        entry = d.to_request()
        entry.update(series.request_state())
        out.append(entry)
    return out


# ---------------------------------------------------------------- how it was started
