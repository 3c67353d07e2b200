"""When a disk fills: THE forecast, used by `disk.full_soon` and by the TUI's disk gauge, so
the two always compute it the same way (U6: a full disk kills a checkpoint save).

The rate is the growth between the oldest sample of a filesystem's free space (same
filesystem, on the box's clock) and the newest: with cron `--once`, the stored previous poll
and this one. `disk.full_soon` judges only on at least `disk_full_min_span_s` of history; the
gauge shows a forecast as soon as two polls exist, marked rough until that span is reached (a
first estimate says where things head; it is not yet evidence). A disk that is not filling has
no forecast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model.history import HostHistory
from ..model.snapshot import DiskUsage


@dataclass(frozen=True, slots=True)
class DiskForecast:
    """A filesystem's free bytes (or inodes) shrinking at `rate_per_s` over `span_s`."""

    free: int
    rate_per_s: float
    span_s: float
    rough: bool = False
    """Measured over less than disk_full_min_span_s: a first estimate, not evidence."""

    @property
    def seconds_left(self) -> float:
        return self.free / self.rate_per_s

    @property
    def hours_left(self) -> float:
        return self.seconds_left / 3600


def trend(samples: Iterable[tuple[float | None, int | None]], *, min_span_s: float,
          full_span_s: float) -> DiskForecast | None:
    """The forecast from (box time, free) samples, oldest first, the newest last: the growth
    between the oldest sample at least `min_span_s` (and more than 0 s) before the newest and
    the newest; rough when that span is under `full_span_s`. None when the newest is unknown,
    no sample is old enough, or the disk is not filling."""
    known = [(t, free) for t, free in samples if t is not None and free is not None]
    if not known:
        return None
    now_t, now_free = known[-1]
    for t, free in known:
        span = now_t - t
        if span > 0 and span >= min_span_s:
            used = free - now_free
            if used <= 0:
                return None
            return DiskForecast(now_free, used / span, span, rough=span < full_span_s)
    return None


def _free(disk: DiskUsage, inodes: bool) -> int | None:
    return disk.inodes_free if inodes else disk.bytes_free


def disk_forecast(history: HostHistory, path: str, mount: str | None = None, *,
                  inodes: bool = False, rough: bool = False) -> DiskForecast | None:
    """The forecast for the disk `path` (mounted on `mount`: default, whatever the newest
    snapshot says) of the host's newest good snapshot; None when it is not filling or the
    history is too short to say: under disk_full_min_span_s, or with `rough`, under two
    polls."""
    now = history.current
    if now is None or now.taken_at is None:
        return None
    disk = next((d for d in now.disks if d.path == path
                 and (mount is None or d.mount == mount)), None)
    if disk is None or disk.error or _free(disk, inodes) is None:
        return None
    samples = []
    for snap in history.snapshots:
        old = next((d for d in snap.disks if d.path == disk.path and d.mount == disk.mount
                    and not d.error), None)
        if old is not None and snap.taken_at is not None and snap.taken_at <= now.taken_at:
            samples.append((snap.taken_at, _free(old, inodes)))
    full = history.thresholds.disk_full_min_span_s
    return trend(samples, min_span_s=0.0 if rough else full, full_span_s=full)
