"""Is it learning? A pure, incremental judge of one scalar curve (a loss, an eval loss).

`CurveTracker` is fed a tag's points in step order, a few at a time (what each poll brought),
and keeps only a bounded summary: the last `window` finite values (the band a new point is
judged against), the best smoothed level so far and the noise there, the recent spikes, the
last non-finite stretch, and the run's own seconds per step. Each point costs O(window log
window) whatever the series' length; feeding a sequence in one call or in many pieces gives
the same tracker (tests/test_curves.py holds it). Nothing here knows of hosts, polls or clocks:
`run_curves.py` beside it turns a tracker into findings.

The statistics are robust: the rolling median is the curve's level and 1.4826 × the median
absolute deviation (MAD) its noise (a normal curve's standard deviation, unmoved by the very
outliers we look for: Rousseeuw & Croux 1993; Leys et al. 2013 recommend median ± 2.5-3 MAD as
an outlier band). No threshold is a fixed ratio of the loss alone: each is "k times this curve's
own noise", with a small relative floor so that a curve flat to the last digit (a MAD of 0) does
not call its next rounding error a spike.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAD_SIGMA = 1.4826
"""MAD × this estimates a normal distribution's standard deviation."""
MAX_SPIKES = 16
MAX_INTERVALS = 64
"""Gaps between timed points kept (the run's own pace: their median is the baseline)."""


@dataclass(frozen=True, slots=True)
class CurveParams:
    """The numbers a tracker compares against (Thresholds' curve_* fields)."""

    window: int = 20
    spike_k: float = 8.0
    spike_min_rel: float = 0.25
    diverge_k: float = 4.0
    diverge_critical_k: float = 10.0
    diverge_min_rel: float = 0.1
    diverge_sustain: int = 5
    plateau_k: float = 2.0


def median(values: Iterable[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        return math.nan
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def band(values: Iterable[float]) -> tuple[float, float]:
    """(median, 1.4826·MAD) of finite values."""
    vals = list(values)
    med = median(vals)
    return med, MAD_SIGMA * median(abs(v - med) for v in vals)


def noisy_band(values: Iterable[float]) -> tuple[float, float]:
    """(median, noise): the noise is 1.4826·MAD, but never under the values' resolution (the
    smallest gap between two distinct values): a loss logged to 4 decimals that sits at
    0.0003 has a MAD of 0, and 0.0004 is no spike."""
    vals = sorted(values)
    med, noise = band(vals)
    gaps = [b - a for a, b in itertools.pairwise(vals) if b > a]
    return med, max(noise, min(gaps, default=0.0))


def _num(v: Any, default: float = math.nan) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if v in ("nan", "inf", "-inf"):
        return float(v)
    return default


def _out(v: float | None) -> float | str | None:
    """A float for JSON state (non-finite ones as strings)."""
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


class CurveTracker:
    """One curve's bounded summary, fed in step order (see the module's docstring)."""

    def __init__(self, params: CurveParams | None = None) -> None:
        self.p = params or CurveParams()
        self.window: deque[float] = deque(maxlen=max(4, self.p.window))
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.last_value: float | None = None
        self.last_wall = math.nan
        self.n = 0
        """Points fed (finite or not)."""
        self.finite = 0
        # the smoothed level (rolling median) at its best, and the noise there
        self.level = math.nan
        self.noise = math.nan
        self.best_level = math.nan
        self.best_noise = math.nan
        self.best_step: int | None = None
        self.above = 0
        """Finite points in a row whose level stood above the divergence line."""
        self.above_since: int | None = None  # the step where that row began
        # the lowest raw finite value (an eval curve has few points: its own minimum)
        self.min_value = math.nan
        self.min_step: int | None = None
        self.since_min = 0
        # plateau: where the level last improved beyond the noise
        self.ref_level = math.nan
        self.improved_step: int | None = None
        self.improved_wall = math.nan
        self.spikes: deque[tuple[int, float, float, float, int]] = deque(maxlen=MAX_SPIKES)
        """(step, value, band median, band noise, finite points before it) of each spike."""
        # the last non-finite stretch
        self.bad_step: int | None = None
        self.bad_wall = math.nan
        self.bad_value = math.nan
        self.before_bad: tuple[int, float, float] | None = None
        """(step, value, wall) of the last finite point before that stretch."""
        self.since_bad = 0
        """Finite points since the last non-finite one."""
        self.bad_n = 0  # self.n at the last non-finite point
        self.good: tuple[int, float, float] | None = None  # the last finite point
        self.gaps: deque[tuple[float, int]] = deque(maxlen=MAX_INTERVALS)
        """(seconds, steps) between consecutive points with wall times: the run's pace."""
        self.paced: tuple[int, float] | None = None  # (step, wall) of the last timed point
        self.longest_gap = 0.0
        """The longest wait between two timed points so far: the run's own pauses (an
        evaluation, a save), which a hang must outlast."""

    # -- feeding
    def feed(self, points: Iterable[tuple[int, float, float]]) -> int:
        """Fold in points (step, value, wall) newer than the last fed; the number folded."""
        count = 0
        for step, value, wall in points:
            if self.last_step is not None and step <= self.last_step:
                continue
            self._one(int(step), float(value), float(wall))
            count += 1
        return count

    def _one(self, step: int, value: float, wall: float) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step, self.last_value, self.n = step, value, self.n + 1
        if math.isfinite(wall):
            self.last_wall = wall
            if self.paced is not None and step > self.paced[0] and wall >= self.paced[1]:
                self.gaps.append((wall - self.paced[1], step - self.paced[0]))
                self.longest_gap = max(self.longest_gap, wall - self.paced[1])
            self.paced = (step, wall)
        if not math.isfinite(value):
            if self.bad_step is None or self.since_bad > 0:
                self.bad_step, self.bad_wall, self.bad_value = step, wall, value
                self.before_bad = self.good
            self.since_bad, self.bad_n = 0, self.n
            return
        self.since_bad += 1
        self.good = (step, value, wall)
        self.finite += 1
        self._spike(step, value)
        self.window.append(value)
        if math.isnan(self.min_value) or value < self.min_value:
            self.min_value, self.min_step, self.since_min = value, step, 0
        else:
            self.since_min += 1
        if len(self.window) < self.window.maxlen:  # type: ignore[operator]
            return
        self.level, self.noise = noisy_band(self.window)
        if math.isnan(self.best_level) or self.level < self.best_level:
            self.best_level, self.best_noise, self.best_step = self.level, self.noise, step
        if self.rise_k() >= self.p.diverge_k:
            self.above_since = step if not self.above else self.above_since
            self.above += 1
        else:
            self.above, self.above_since = 0, None
        slack = self.p.plateau_k * max(self.noise, 1e-12 * abs(self.level))
        if math.isnan(self.ref_level) or self.level < self.ref_level - slack:
            self.ref_level, self.improved_step, self.improved_wall = self.level, step, wall

    def _spike(self, step: int, value: float) -> None:
        """A point far above the band of the points before it (upward only: a loss that
        suddenly drops is no alarm)."""
        if len(self.window) < self.window.maxlen:  # type: ignore[operator]
            return
        med, noise = noisy_band(self.window)
        if value - med > max(self.p.spike_k * noise, self.p.spike_min_rel * abs(med), 1e-12):
            self.spikes.append((step, value, med, noise, self.finite - 1))

    # -- what it says
    def rise_k(self) -> float:
        """How far the level stands above its best, in the noise at the best (0 when it does
        not clear the relative floor either)."""
        if math.isnan(self.level) or math.isnan(self.best_level):
            return 0.0
        rise = self.level - self.best_level
        if rise <= self.p.diverge_min_rel * abs(self.best_level):
            return 0.0
        return rise / self.level_noise()

    def level_noise(self) -> float:
        """The noise of the level itself at the best: the standard error of a median of
        `window` points, 1.2533·σ/√window (a median of 20 noisy points moves much less than
        one point does)."""
        se = 1.2533 * self.best_noise / math.sqrt(len(self.window) or 1)
        return max(se, 1e-12 * abs(self.best_level), 1e-300)

    @property
    def diverging(self) -> bool:
        return self.above >= self.p.diverge_sustain

    def point_interval_s(self) -> float | None:
        """The median seconds between two logged points (None without wall times)."""
        return median(dt for dt, _ in self.gaps) if self.gaps else None

    # -- what the store keeps between `--once` runs
    def state(self) -> dict[str, Any]:
        return {
            "v": 1, "window": [_out(v) for v in self.window],
            "first_step": self.first_step, "last_step": self.last_step,
            "last_value": _out(self.last_value), "last_wall": _out(self.last_wall),
            "n": self.n, "finite": self.finite,
            "level": _out(self.level), "noise": _out(self.noise),
            "best": [_out(self.best_level), _out(self.best_noise), self.best_step],
            "above": [self.above, self.above_since],
            "min": [_out(self.min_value), self.min_step, self.since_min],
            "ref": [_out(self.ref_level), self.improved_step, _out(self.improved_wall)],
            "spikes": [[s, _out(v), _out(m), _out(n), i] for s, v, m, n, i in self.spikes],
            "bad": [self.bad_step, _out(self.bad_wall), _out(self.bad_value), self.since_bad,
                    self.bad_n],
            "before_bad": None if self.before_bad is None else [
                self.before_bad[0], _out(self.before_bad[1]), _out(self.before_bad[2])],
            "good": None if self.good is None else [
                self.good[0], _out(self.good[1]), _out(self.good[2])],
            "gaps": [[_out(dt), n] for dt, n in self.gaps],
            "paced": None if self.paced is None else [self.paced[0], _out(self.paced[1])],
            "longest": self.longest_gap,
        }

    @classmethod
    def from_state(cls, data: Any, params: CurveParams | None = None) -> CurveTracker | None:
        """Undo `state`; None for anything malformed (the caller starts anew from the points
        the store kept)."""
        t = cls(params)
        if not isinstance(data, Mapping) or data.get("v") != 1:
            return None
        try:
            t.window.extend(_num(v) for v in data["window"][-max(4, t.p.window):])
            t.first_step, t.last_step = _int(data["first_step"]), _int(data["last_step"])
            t.last_value = None if data["last_value"] is None else _num(data["last_value"])
            t.last_wall = _num(data["last_wall"])
            t.n, t.finite = int(data["n"]), int(data["finite"])
            t.above, t.above_since = int(data["above"][0]), _int(data["above"][1])
            t.level, t.noise = _num(data["level"]), _num(data["noise"])
            t.best_level, t.best_noise = _num(data["best"][0]), _num(data["best"][1])
            t.best_step = _int(data["best"][2])
            t.min_value, t.min_step = _num(data["min"][0]), _int(data["min"][1])
            t.since_min = int(data["min"][2])
            t.ref_level, t.improved_step = _num(data["ref"][0]), _int(data["ref"][1])
            t.improved_wall = _num(data["ref"][2])
            t.spikes.extend((int(s), _num(v), _num(m), _num(n), int(i))
                            for s, v, m, n, i in data["spikes"][-MAX_SPIKES:])
            t.bad_step, t.bad_wall = _int(data["bad"][0]), _num(data["bad"][1])
            t.bad_value, t.since_bad = _num(data["bad"][2]), int(data["bad"][3])
            t.bad_n = int(data["bad"][4])
            t.before_bad = _point(data["before_bad"])
            t.good = _point(data["good"])
            t.gaps.extend((_num(dt), int(n)) for dt, n in data["gaps"][-MAX_INTERVALS:])
            paced = data["paced"]
            t.paced = None if paced is None else (int(paced[0]), _num(paced[1]))
            t.longest_gap = float(_num(data["longest"], 0.0))
            if not math.isfinite(t.longest_gap):
                return None
        except (KeyError, TypeError, ValueError, IndexError, OverflowError):
            return None
        return t


def _int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(v)
    return v


def _point(v: Any) -> tuple[int, float, float] | None:
    if v is None:
        return None
    return (int(v[0]), _num(v[1]), _num(v[2]))
