"""Is it learning? A pure, incremental judge of one scalar curve (a loss, an eval loss).

`CurveTracker` is fed a tag's points in step order, a few at a time (what each poll brought),
and keeps only a bounded summary: the last `window` finite values and their steps (the band a
new point is judged against), the best smoothed level so far, the recent spikes, the latest
divergence and eval-rise episodes, the last non-finite stretch, where the level last improved
and how often it used to, and the run's own seconds per step. Each point costs O(window log
window) whatever the series' length; feeding a sequence in one call or in many pieces gives
the same tracker (tests/unit/test_curves.py holds it). Nothing here knows of hosts, polls or
clocks: `run_curves.py` beside it turns a tracker into findings.

**Its own scale.** A loss is judged on the scale it lives on. While every value the tracker
has seen is positive (a cross-entropy, an MSE, a PINN residual falling over five decades), it
works with their logarithms: its level is a geometric median, its noise a relative spread,
and "3× its median" means the same at 38 as at 1e-4 (a loss near 1e-4 with points 3× its
median is ordinary right-skewed noise, which a linear band calls spikes). A curve that has
shown zero or a negative value (a GAN's losses, a log-likelihood) is judged on the linear
scale from then on.

**Robust statistics.** The rolling median is the level and 1.4826 × the median absolute
deviation (MAD) the noise, never under the values' resolution (Rousseeuw & Croux 1993; Leys
et al. 2013). No threshold is a fixed ratio alone: each is "k noise units, and at least this
much relative change".
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
MEDIAN_SE = 1.2533
"""A median of n normal draws has this × σ/√n as its standard error."""
MAX_SPIKES = 16
MAX_INTERVALS = 64
"""Gaps between timed points kept (the run's own pace: their median is the baseline)."""
MAX_IMPROVEMENTS = 16
"""Steps between the level's last improvements kept (the run's own progress rate)."""
SPIKE_RATIO = 10.0
"""On the log scale, a point this many times its recent median is a spike whatever the
curve's noise: a loss whose minibatches vary ×4 still does not jump ×10 by chance."""
HEAD = 5
"""The first finite values kept: a few-point run's start, against which "is it falling" is
asked before its window fills."""
STATE_VERSION = 2


@dataclass(frozen=True, slots=True)
class CurveParams:
    """The numbers a tracker compares against (Thresholds' curve_* fields)."""

    window: int = 20
    spike_k: float = 6.0
    spike_min_rel: float = 0.25
    diverge_k: float = 4.0
    diverge_critical_k: float = 10.0
    diverge_min_rel: float = 0.2
    diverge_sustain: int = 5
    plateau_k: float = 2.0
    plateau_min_rel: float = 0.01
    overfit_evals: int = 3
    overfit_min_rel: float = 0.05
    overfit_k: float = 4.0


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


def step_noise(values: list[float]) -> float:
    """One value's noise about its own course: the spread of the second differences
    (x[i+1] − 2·x[i] + x[i−1]: a steady trend, even one that turns, is no noise), over √6
    (a second difference holds six times one value's variance)."""
    if len(values) < 4:
        return 0.0
    second = [c - 2 * b + a for a, b, c in zip(values, values[1:], values[2:], strict=False)]
    _, spread = band(second)
    return spread / math.sqrt(6)


def jump_noise(values: list[float]) -> float:
    """Like step_noise, from the mean absolute second difference (every jump counts, not the
    median one): √(π/2)·mean|Δ²x|/√6."""
    if len(values) < 4:
        return 0.0
    second = [abs(c - 2 * b + a) for a, b, c in zip(values, values[1:], values[2:],
                                                     strict=False)]
    return math.sqrt(math.pi / 2) * sum(second) / len(second) / math.sqrt(6)


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

    def __init__(self, params: CurveParams | None = None, rises: bool = True) -> None:
        self.p = params or CurveParams()
        self.rises_judged = rises
        """Whether the eval-rise episodes are judged (an eval curve's; the work is skipped for
        a train loss, which run_curves never asks about them)."""
        size = max(4, self.p.window)
        self.window: deque[float] = deque(maxlen=size)
        self.scaled: deque[float] = deque(maxlen=size)
        """The window's values on the tracker's scale (kept beside it: a log a point)."""
        self.wsteps: deque[int] = deque(maxlen=size)
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.last_value: float | None = None
        self.last_wall = math.nan
        self.n = 0
        """Points fed (finite or not)."""
        self.finite = 0
        self.log = True
        """Judged on the log scale: every finite value so far was positive."""
        self.head: list[float] = []
        # the level (rolling median, on the tracker's scale) and its noise, now and at best
        self.level = math.nan
        self.noise = math.nan
        self.best_level = math.nan
        self.best_noise = math.nan
        self.best_step: int | None = None
        # divergence: the level above its best, sustained; the latest episode
        self.above = 0
        self.above_since: int | None = None
        """The step where that rise began: the middle of the window whose median first stood
        above the line (half its points were up)."""
        self.above_from: int | None = None
        """The first step of that window: where the rise may have begun at the earliest (a
        checkpoint before it holds none of it)."""
        self.diverged: tuple[int, int, float, int, int] | None = None
        """The latest divergence episode: (rising since step, last step, highest rise in
        noise units, finite index of its last point, earliest step of the rise)."""
        # the lowest raw finite value (an eval curve has few points: its own minimum)
        self.min_value = math.nan
        self.min_step: int | None = None
        self.since_min = 0
        self.min_index = 0  # finite points before the minimum
        # eval rise: the smoothed value (median of the last 3) at its lowest, and the latest
        # episode of values standing clearly above it
        self.smin = math.nan
        self.smin_step: int | None = None
        self.smin_index = 0
        self.srise = 0
        self.rose: tuple[int, int, float, int, str, int] | None = None
        """The latest eval-rise episode: (from step, last step, rise (the tracker's scale),
        finite index of its last point, how: "smoothed" | "each", values since the
        lowest)."""
        # plateau: where the level last improved beyond its noise, and how often it did
        self.ref_level = math.nan
        self.improved_step: int | None = None
        self.improved_wall = math.nan
        self.improvements: deque[int] = deque(maxlen=MAX_IMPROVEMENTS)
        self.finite_since_improved = 0
        self.spikes: deque[tuple[int, float, float, float, int]] = deque(maxlen=MAX_SPIKES)
        """(step, value, band median, rise in noise units, finite points before it)."""
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

    # -- the scale
    def tr(self, v: float) -> float:
        """A value on the tracker's scale."""
        return math.log(v) if self.log else v

    def raw(self, x: float) -> float:
        """A level on the tracker's scale, back as a value."""
        if not self.log or not math.isfinite(x):
            return x
        return math.exp(min(x, 700.0))

    def rel(self, share: float, at: float) -> float:
        """A relative change of `share` at level `at`, on the tracker's scale."""
        return math.log1p(share) if self.log else share * abs(at)

    def _scaled(self) -> list[float]:
        return list(self.scaled)

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
        if self.log and value <= 0:
            self._linear()
        self.since_bad += 1
        self.good = (step, value, wall)
        if len(self.head) < HEAD:
            self.head.append(value)
        self._spike(step, value)
        self.finite += 1
        self.window.append(value)
        self.scaled.append(self.tr(value))
        self.wsteps.append(step)
        if math.isnan(self.min_value) or value < self.min_value:
            self.min_value, self.min_step, self.since_min = value, step, 0
            self.min_index = self.finite - 1
        else:
            self.since_min += 1
        if self.rises_judged:
            self._eval_rise(step)
        if len(self.window) < self.window.maxlen:  # type: ignore[operator]
            return
        self.level, self.noise = noisy_band(self._scaled())
        # the best of the levels a window apart (independent medians: the lowest of many
        # overlapping ones is a chance low, not a level the curve held)
        if math.isnan(self.best_level) or (
                self.finite % self.window.maxlen == 0  # type: ignore[operator]
                and self.level < self.best_level):
            self.best_level, self.best_noise, self.best_step = self.level, self.noise, step
        self._diverge(step)
        self._improve(step, wall)

    def _linear(self) -> None:
        """A zero or negative value: the curve is judged on the linear scale from here on;
        what was measured on the log scale starts over."""
        self.log = False
        self.scaled.clear()
        self.scaled.extend(self.window)
        self.level = self.noise = self.best_level = self.best_noise = math.nan
        self.best_step = None
        self.above, self.above_since, self.above_from = 0, None, None
        self.smin, self.smin_step, self.srise, self.smin_index = math.nan, None, 0, 0
        self.ref_level, self.improved_step, self.finite_since_improved = math.nan, None, 0
        self.improvements.clear()

    def _spike(self, step: int, value: float) -> None:
        """A point far above the band of the points before it (upward only: a loss that
        suddenly drops is no alarm)."""
        if len(self.window) < self.window.maxlen or math.isnan(self.level):  # type: ignore[operator]
            return
        med, noise = self.level, self.noise  # the band of the points before this one
        rise = self.tr(value) - med
        far = self.p.spike_k * noise
        if self.log:
            far = min(far, math.log(SPIKE_RATIO))
        if rise > max(far, self.rel(self.p.spike_min_rel, self.raw(med)), 1e-12):
            self.spikes.append((step, value, self.raw(med),
                                round(rise / max(noise, 1e-300), 2), self.finite))

    def _diverge(self, step: int) -> None:
        k = self.rise_k()
        if k >= self.p.diverge_k:
            if not self.above:
                self.above_since = self.wsteps[len(self.wsteps) // 2]
                self.above_from = self.wsteps[0]
            self.above += 1
        else:
            self.above, self.above_since, self.above_from = 0, None, None
        if self.diverging and self.above_since is not None and self.above_from is not None:
            began = self.above_since
            peak = k if self.diverged is None or self.diverged[0] != began \
                else max(k, self.diverged[2])
            self.diverged = (began, step, round(peak, 2), self.finite, self.above_from)

    def sustain(self) -> int:
        """Points the level must stand above its best: a whole window turned over (the
        points of the rise, not the same points' median again), at least diverge_sustain."""
        return max(self.p.diverge_sustain, self.window.maxlen or 0)

    def _improve(self, step: int, wall: float) -> None:
        """The level fell beyond its noise and a small relative floor below where it last
        improved: it is still learning."""
        se = MEDIAN_SE * self.noise / math.sqrt(len(self.window))
        slack = max(self.p.plateau_k * se, self.rel(self.p.plateau_min_rel, self.raw(
            self.ref_level if math.isfinite(self.ref_level) else self.level)), 1e-12)
        if math.isnan(self.ref_level) or self.level < self.ref_level - slack:
            if self.improved_step is not None:
                self.improvements.append(step - self.improved_step)
            self.ref_level, self.improved_step, self.improved_wall = self.level, step, wall
            self.finite_since_improved = 0
        else:
            self.finite_since_improved += 1

    def _eval_rise(self, step: int) -> None:
        """An eval curve rising above its minimum, recorded as an episode (run_curves
        decides what it means). Two ways, by how much the curve has to say:

        - "smoothed": the trend, the median of each 3 values, at its lowest at some point;
          the median of the values since then (overfit_evals of them at least) stands above
          that lowest by overfit_min_rel and by overfit_k of its own noise (a median of r
          values against one of 3: σ·√(1/r + 1/3)), and each of the last overfit_evals
          trend values stands above it by overfit_min_rel;
        - "each": from its very first value, the curve has risen at every value (3 values at
          least): an eval that never improved at all, which a few-evaluation fine-tune
          shows by its third evaluation."""
        vals = list(self.window)
        scaled = self._scaled()
        s = median(scaled[-3:])
        if len(vals) >= 3 and (math.isnan(self.smin) or s < self.smin):
            self.smin, self.smin_step, self.smin_index = s, step, self.finite - 1
        floor = self.rel(self.p.overfit_min_rel, self.raw(self.smin)) \
            if math.isfinite(self.smin) else math.inf
        self.srise = self.srise + 1 if len(vals) >= 3 and s - self.smin > floor else 0
        how, rise = None, 0.0
        since = self.finite - 1 - self.smin_index if math.isfinite(self.smin) else 0
        if since >= self.p.overfit_evals and self.srise >= self.p.overfit_evals:
            span = min(since, len(scaled) - 1)
            # the noise of the whole window, or of the values since the lowest trend where
            # they are the more erratic (all of their jumps counted, not only the typical
            # one): a rise made of jumps is an unsteady eval, not a trend
            noise = max(step_noise(scaled), jump_noise(scaled[-span:]))
            # the values since the lowest trend: all of them (a step up that stays) or the
            # newest half (a rising trend shows there more than in all), the clearer
            _, r = max(((median(scaled[-r:]) - self.smin) / math.sqrt(1 / r + 1 / 3), r)
                       for r in {max(3, (span + 1) // 2), span})
            rise = median(scaled[-r:]) - self.smin
            if rise > max(floor, self.p.overfit_k * noise * math.sqrt(1 / r + 1 / 3)):
                how = "smoothed"
        rises = self.rises()
        if how is None and rises >= 2 and rises == self.finite - 1:
            rise = scaled[-1] - self.tr(self.min_value)
            if rise > self.rel(self.p.overfit_min_rel, self.min_value):
                how = "each"
        if how is not None:
            began = (self.min_step if how == "each" else self.smin_step) or step
            evals = rises if how == "each" else since
            self.rose = (began, step, rise, self.finite, how, evals)

    def rises(self) -> int:
        """How many times in a row the curve rose, ending at its newest value, counted from
        its minimum (0 when the newest is not above the one before, or the run of rises
        does not start at the minimum)."""
        vals = list(self.window)
        count = 0
        for a, b in zip(reversed(vals[:-1]), reversed(vals[1:]), strict=False):
            if b <= a:
                break
            count += 1
        start = self.finite - 1 - count  # the finite index where the run of rises began
        return count if start == self.min_index else 0

    # -- what it says
    def rise_k(self) -> float:
        """How far the level stands above its best, in units of the noise of a difference
        of two levels at the best (0 when it does not clear the relative floor either)."""
        if math.isnan(self.level) or math.isnan(self.best_level):
            return 0.0
        rise = self.level - self.best_level
        if rise <= self.rel(self.p.diverge_min_rel, self.raw(self.best_level)):
            return 0.0
        return rise / self.level_noise()

    def level_noise(self) -> float:
        """The noise of the difference between the level and its best: a median of `window`
        points has a standard error of 1.2533·σ/√window; the difference of two, the root of
        the sum of their squares (σ at the best, and σ now)."""
        root = MEDIAN_SE / math.sqrt(len(self.window) or 1)
        noise = math.hypot(self.best_noise, self.noise if math.isfinite(self.noise) else 0.0)
        return max(root * noise, 1e-12 * abs(self.best_level), 1e-300)

    @property
    def diverging(self) -> bool:
        return self.above >= self.sustain()

    def level_value(self) -> float:
        return self.raw(self.level)

    def best_value(self) -> float:
        return self.raw(self.best_level)

    def falling(self) -> bool | None:
        """Is the curve lower now than where it started? The level against its best a
        window back where there is one; else (a few points) the median of the newest half
        against the first values. None with fewer than 4 points."""
        if self.finite < 4:
            return None
        vals = list(self.window)
        recent = median(vals[-max(2, min(len(vals), self.finite) // 2):])
        start = median(self.head)
        return self.tr(recent) < self.tr(start) - self.rel(self.p.plateau_min_rel, start)

    def progress_gap(self) -> int | None:
        """The run's own progress rate: the median steps between the level's improvements
        (one: the steps it took to reach the first level); None before a level."""
        if self.improved_step is None or self.first_step is None:
            return None
        if self.improvements:
            return int(median(self.improvements))
        return max(1, self.improved_step - self.first_step)

    def point_interval_s(self) -> float | None:
        """The median seconds between two logged points (None without wall times)."""
        return median(dt for dt, _ in self.gaps) if self.gaps else None

    # -- what the store keeps between `--once` runs
    def state(self) -> dict[str, Any]:
        return {
            "v": STATE_VERSION, "window": [_out(v) for v in self.window],
            "rises": self.rises_judged,
            "wsteps": list(self.wsteps), "log": self.log, "head": self.head,
            "first_step": self.first_step, "last_step": self.last_step,
            "last_value": _out(self.last_value), "last_wall": _out(self.last_wall),
            "n": self.n, "finite": self.finite,
            "level": _out(self.level), "noise": _out(self.noise),
            "best": [_out(self.best_level), _out(self.best_noise), self.best_step],
            "above": [self.above, self.above_since, self.above_from],
            "diverged": None if self.diverged is None else list(self.diverged),
            "min": [_out(self.min_value), self.min_step, self.since_min, self.min_index],
            "smin": [_out(self.smin), self.smin_step, self.srise, self.smin_index],
            "rose": None if self.rose is None else [
                self.rose[0], self.rose[1], _out(self.rose[2]), self.rose[3], self.rose[4],
                self.rose[5]],
            "ref": [_out(self.ref_level), self.improved_step, _out(self.improved_wall)],
            "improvements": list(self.improvements),
            "since_improved": self.finite_since_improved,
            "spikes": [[s, _out(v), _out(m), _out(k), i] for s, v, m, k, i in self.spikes],
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
        """Undo `state`; None for anything malformed or of another version (the caller
        starts anew from the points the store kept)."""
        if not isinstance(data, Mapping) or data.get("v") != STATE_VERSION:
            return None
        t = cls(params, rises=data.get("rises") is not False)
        try:
            size = max(4, t.p.window)
            window, wsteps = data["window"][-size:], data["wsteps"][-size:]
            if len(window) != len(wsteps):
                return None
            t.window.extend(_num(v) for v in window)
            t.wsteps.extend(int(s) for s in wsteps)
            if not all(math.isfinite(v) for v in t.window):
                return None
            t.log = data["log"] is True
            if t.log and any(v <= 0 for v in t.window):
                return None
            t.scaled.extend(t.tr(v) for v in t.window)
            t.head = [_num(v) for v in data["head"][:HEAD]]
            t.first_step, t.last_step = _int(data["first_step"]), _int(data["last_step"])
            t.last_value = None if data["last_value"] is None else _num(data["last_value"])
            t.last_wall = _num(data["last_wall"])
            t.n, t.finite = int(data["n"]), int(data["finite"])
            t.above, t.above_since = int(data["above"][0]), _int(data["above"][1])
            t.above_from = _int(data["above"][2])
            d = data["diverged"]
            t.diverged = None if d is None else (int(d[0]), int(d[1]), _num(d[2]), int(d[3]),
                                                 int(d[4]))
            t.level, t.noise = _num(data["level"]), _num(data["noise"])
            t.best_level, t.best_noise = _num(data["best"][0]), _num(data["best"][1])
            t.best_step = _int(data["best"][2])
            t.min_value, t.min_step = _num(data["min"][0]), _int(data["min"][1])
            t.since_min, t.min_index = int(data["min"][2]), int(data["min"][3])
            t.smin, t.smin_step = _num(data["smin"][0]), _int(data["smin"][1])
            t.srise, t.smin_index = int(data["smin"][2]), int(data["smin"][3])
            rose = data["rose"]
            t.rose = None if rose is None else (int(rose[0]), int(rose[1]), _num(rose[2]),
                                                 int(rose[3]), str(rose[4]), int(rose[5]))
            t.ref_level, t.improved_step = _num(data["ref"][0]), _int(data["ref"][1])
            t.improved_wall = _num(data["ref"][2])
            t.improvements.extend(int(g) for g in data["improvements"][-MAX_IMPROVEMENTS:])
            t.finite_since_improved = int(data["since_improved"])
            t.spikes.extend((int(s), _num(v), _num(m), _num(k), int(i))
                            for s, v, m, k, i in data["spikes"][-MAX_SPIKES:])
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
