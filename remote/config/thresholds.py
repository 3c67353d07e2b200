"""Every number a rule compares against (the config's `[thresholds]`), and how much history
is kept in memory. Config is the lowest layer: the schema checks `[thresholds]` against these
fields, the model bounds its history with HISTORY_LEN, the rules read the numbers."""

from __future__ import annotations

from dataclasses import dataclass

HISTORY_LEN = 64
"""Snapshots kept per host in memory: enough for 'sustained over several polls' rules."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every number a rule compares against, in one place (config: `[thresholds]`).

    "Sustained" rules (U21: never judge on one snapshot) need `sustain_polls` snapshots in a
    row, of one boot, spanning no more than `sustain_window_s`. A `--once` from cron holds the
    previous stored snapshot plus the current one, so the default of 2 works there; a cron
    interval longer than the window makes those rules go quiet rather than guess.
    """

    sustain_polls: int = 2
    """Snapshots in a row a sustained condition must hold in (2 = the previous and this one)."""
    sustain_window_s: float = 3600.0
    """The longest span those snapshots may cover (older evidence is not 'sustained')."""
    util_busy_pct: float = 90.0
    """U21: utilization at or above this counts as 'the GPU says it is busy'."""
    clock_low_ratio: float = 0.5
    """U21: SM clock under this share of its max while busy: util without clock."""
    power_low_ratio: float = 0.3
    """U21: power under this share of its limit while busy: util without work."""
    idle_util_pct: float = 5.0
    """U38, U11: utilization at or below this counts as idle."""
    idle_while_running_s: float = 600.0
    """U38/U24: a running run's GPUs idle at least this long → gpu.idle_while_running."""
    zombie_unattributed_mib: int = 512
    """U11: memory used on a GPU with no holder visible, above this, is somebody's context."""
    stalled_s: float = 1800.0
    """U43: no step, event, log or checkpoint progress for this long → run.stalled."""
    log_buffered_s: float = 600.0
    """U43: log silent this long while steps/checkpoints advance → run.log_buffered."""
    events_grace_s: float = 900.0
    """U39: a run running this long with no event file / no scalars → run.events_empty."""
    ckpt_overdue_factor: float = 3.0
    """Seed 001: no checkpoint for this many of the run's own cadences → ckpt.overdue."""
    ckpt_overdue_min_s: float = 1800.0
    """…and never before this long (a 1-minute cadence would cry wolf)."""
    disk_low_pct: float = 5.0
    """U6: free bytes under this share of the filesystem → disk.low."""
    disk_low_bytes: int = 10 * 2**30
    """U6: …or under this many bytes, whichever is larger (a checkpoint must still fit)."""
    disk_critical_pct: float = 1.0
    """U6: under this share free, disk.low is critical (torch.save is about to fail)."""
    inodes_low_pct: float = 5.0
    """U7: free inodes under this share → disk.inodes_low."""
    inodes_critical_pct: float = 1.0
    """U7: under this share of inodes free, disk.inodes_low is critical."""
    disk_full_hours: float = 24.0
    """U6: at the growth rate seen over the history, full within this many hours."""
    disk_full_min_span_s: float = 300.0
    """U6: growth is only measured over at least this span of history."""
    cpu_oversubscribed_ratio: float = 4.0
    """U40: a run's threads over this many times the cgroup's vCPU quota."""
    throttle_reasons: tuple[str, ...] = (
        "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
        "hw_power_brake_slowdown")
    """U23: the clocks-event reasons that steal performance (not gpu_idle, sync_boost...)."""
    throttle_info_only: tuple[str, ...] = ("sw_power_cap",)
    """U23: reasons that alone are only info (a GPU at its power cap under full load)."""
    tmp_stale_s: float = 600.0
    """U6: a partial checkpoint untouched this long is a failed save, not one in progress."""
    persistence_slow_s: float = 2.0
    """A GPU query at least this slow with persistence mode off: gpu.persistence_off is a
    warning (the re-initialisation is what costs), else only info."""
    xid_critical: tuple[int, ...] = (48, 79)
    """U22: Xids of a dead GPU: re-rent (48 double-bit ECC, 79 fallen off the bus)."""
    # The curves' findings (findings/run_curves.py; docs/findings.md gives each a source).
    curve_window: int = 20
    """Points in the rolling band (median ± MAD) a curve's new point is judged against."""
    spike_k: float = 6.0
    """run.loss_spike: a point this many noise units (1.4826 MAD) above the band's median…"""
    spike_min_rel: float = 0.25
    """…and at least this share of the median above it (a flat curve's MAD is near 0)."""
    spike_recent_points: int = 100
    """Spikes among this many latest points are reported."""
    spike_repeat: int = 3
    """This many of them make run.loss_spike a warning."""
    diverge_k: float = 4.0
    """run.diverging: the level (rolling median) this many noise units above its best…"""
    diverge_critical_k: float = 10.0
    """…critical from this many."""
    diverge_min_rel: float = 0.2
    """…and at least this share of the best level above it."""
    diverge_sustain_points: int = 5
    """…for this many points in a row."""
    plateau_k: float = 2.0
    """run.plateau: an improvement is the level falling more than this many noise units of
    the level…"""
    plateau_min_rel: float = 0.01
    """…and by at least this share of it."""
    plateau_rate_factor: float = 10.0
    """No improvement for this many times the run's own steps between improvements…"""
    plateau_span_ratio: float = 0.5
    """…or over this share of the run's steps so far…"""
    plateau_min_points: int = 50
    """…with at least this many points logged…"""
    plateau_min_s: float = 3600.0
    """…and for at least this long where the points have wall times."""
    overfit_min_evals: int = 4
    """run.overfitting needs this many evaluations…"""
    overfit_evals: int = 3
    """…the last this many above the eval minimum…"""
    overfit_min_rel: float = 0.05
    """…their median at least this share above it…"""
    overfit_k: float = 4.0
    """…and this many of the evaluations' own noise units, while the train loss kept falling."""
    hung_factor: float = 10.0
    """run.hung: no new step for this many of the run's own intervals between steps…"""
    hung_longest_factor: float = 1.5
    """…and this many times the longest pause between its logged steps so far (an evaluation,
    a save)…"""
    hung_min_s: float = 600.0
    """…and never under this long."""
    slowed_ratio: float = 1.5
    """run.slowed: seconds per step this many times the run's own median…"""
    slowed_k: float = 4.0
    """…each of the recent intervals this many noise units above it…"""
    slowed_points: int = 5
    """…over this many logged intervals…"""
    slowed_min_s: float = 300.0
    """…spanning at least this long."""
