"""Findings about disks (disk.*): low on space or inodes, filling soon."""

from __future__ import annotations

from collections.abc import Iterable

from .. import units
from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.snapshot import HostSnapshot
from ..units import duration, size
from .base import (
    rule,
)
from .forecast import disk_forecast


def _fs_checkpoint_bytes(now: HostSnapshot, mount: str | None) -> int | None:
    """What the next save of a run on this filesystem needs (the biggest such run's estimate
    from its own checkpoints, RunSample.next_checkpoint_bytes); None when no run keeps its
    checkpoints there (never a "next checkpoint 0 B")."""
    if not mount:
        return None
    mounts = sorted({d.mount for d in now.disks if d.mount}, key=len, reverse=True)
    biggest = None
    for sample in now.runs:
        latest, need = sample.latest_checkpoint, sample.next_checkpoint_bytes
        if latest is None or need is None:
            continue
        home = next((m for m in mounts if latest.path == m or latest.path.startswith(
            m.rstrip("/") + "/")), None)
        if home == mount:
            biggest = max(biggest or 0, need)
    return biggest


@rule({"disk.low": ("U6",), "disk.inodes_low": ("U7",)})
def disk_low(history: HostHistory) -> Iterable[Finding]:
    """U6, U7: free bytes under disk_low_pct of the filesystem or under disk_low_bytes
    (warning); under disk_critical_pct, or too little for the next checkpoint of a run on it
    (critical: torch.save is about to fail). Free inodes likewise (disk.inodes_low)."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    seen: set[str] = set()
    for disk in now.disks:
        fs = disk.mount or disk.path
        if disk.error or fs in seen:
            continue
        seen.add(fs)
        if disk.bytes_total and disk.bytes_free is not None:
            pct = 100.0 * disk.bytes_free / disk.bytes_total
            need = _fs_checkpoint_bytes(now, disk.mount)
            critical = pct < th.disk_critical_pct or (need and disk.bytes_free < need)
            if critical or pct < th.disk_low_pct or disk.bytes_free < th.disk_low_bytes:
                fits = (f"; the next {size(need)} checkpoint will not fit" if need
                        and disk.bytes_free < need else "")
                evidence = {"path": disk.path, "mount": disk.mount,
                            "bytes_free": disk.bytes_free, "bytes_total": disk.bytes_total,
                            "free_pct": round(pct, 2)}
                if need:
                    evidence["next_checkpoint_bytes"] = need
                yield Finding(
                    "disk.low", Severity.CRITICAL if critical else Severity.WARNING,
                    f"{fs} has {size(disk.bytes_free)} free ({pct:.1f}%){fits}: free space "
                    "now — delete old checkpoints and *.tmp partials or move them off",
                    subject=fs, evidence=evidence)
        if disk.inodes_total and disk.inodes_free is not None:
            ipct = 100.0 * disk.inodes_free / disk.inodes_total
            if ipct < th.inodes_low_pct:
                yield Finding(
                    "disk.inodes_low", Severity.CRITICAL if ipct < th.inodes_critical_pct
                    else Severity.WARNING,
                    f"{fs} has {disk.inodes_free:,} inodes free ({ipct:.1f}%): writes will fail "
                    "with 'No space left on device' whatever df -h says — delete or tar up "
                    "small files (per-sample outputs, caches)",
                    subject=fs,
                    evidence={"path": disk.path, "mount": disk.mount,
                              "inodes_free": disk.inodes_free,
                              "inodes_total": disk.inodes_total, "free_pct": round(ipct, 2)})


@rule({"disk.full_soon": ("U6",)})
def disk_full_soon(history: HostHistory) -> Iterable[Finding]:
    """U6: at the growth rate seen over the history (at least disk_full_min_span_s of it:
    with cron `--once`, the stored previous poll and this one), the filesystem fills within
    disk_full_hours. Critical within an hour."""
    th = history.thresholds
    now = history.current
    if now is None or now.taken_at is None:
        return
    for disk in now.disks:
        forecast = disk_forecast(history, disk.path, disk.mount)
        if forecast is None or forecast.hours_left >= th.disk_full_hours:
            continue
        hours, rate, span = forecast.hours_left, forecast.rate_per_s, forecast.span_s
        fs = disk.mount or disk.path
        yield Finding(
            "disk.full_soon", Severity.CRITICAL if hours < 1 else Severity.WARNING,
            f"{fs} fills in about {duration(forecast.seconds_left)} at the last "
            f"{duration(span)}'s rate ({units.rate(rate)}): free space or cap the checkpoints "
            "kept before torch.save fails",
            subject=fs,
            evidence={"path": disk.path, "mount": disk.mount, "bytes_free": disk.bytes_free,
                      "bytes_per_hour": rate * 3600, "hours_left": hours, "span_s": span})
