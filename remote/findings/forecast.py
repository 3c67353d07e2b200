"""When a disk fills: THE forecast, used by `disk.full_soon` and by the TUI's disk gauge, so
the two always say the same thing (U6: a full disk kills a checkpoint save).

The rate is the growth between the oldest snapshot of the history (same filesystem, at least
`disk_full_min_span_s` before the newest, on the box's clock) and the newest: with cron
`--once`, the stored previous poll and this one. A disk that is not filling has no forecast.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.history import HostHistory
from ..model.snapshot import DiskUsage


@dataclass(frozen=True, slots=True)
class DiskForecast:
    """A filesystem's free bytes (or inodes) shrinking at `rate_per_s` over `span_s`."""

    free: int
    rate_per_s: float
    span_s: float

    @property
    def seconds_left(self) -> float:
        return self.free / self.rate_per_s

    @property
    def hours_left(self) -> float:
        return self.seconds_left / 3600


def _free(disk: DiskUsage, inodes: bool) -> int | None:
    return disk.inodes_free if inodes else disk.bytes_free


def disk_forecast(history: HostHistory, path: str, mount: str | None = None, *,
                  inodes: bool = False) -> DiskForecast | None:
    """The forecast for the disk `path` (mounted on `mount`: default, whatever the newest
    snapshot says) of the host's newest good snapshot; None when it is not filling or the
    history is too short to say."""
    now = history.current
    if now is None or now.taken_at is None:
        return None
    disk = next((d for d in now.disks if d.path == path
                 and (mount is None or d.mount == mount)), None)
    if disk is None or disk.error:
        return None
    free = _free(disk, inodes)
    if free is None:
        return None
    first = None
    for snap in history.snapshots:
        old = next((d for d in snap.disks if d.path == disk.path and d.mount == disk.mount
                    and _free(d, inodes) is not None), None)
        if old is not None and snap.taken_at is not None \
                and now.taken_at - snap.taken_at >= history.thresholds.disk_full_min_span_s:
            first = (snap.taken_at, _free(old, inodes) or 0)
            break
    if first is None:
        return None
    span = now.taken_at - first[0]
    used = first[1] - free
    if used <= 0:
        return None
    return DiskForecast(free, used / span, span)
