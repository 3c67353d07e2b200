"""Is it learning, is it making progress? Findings from a run's curves, processes and GPUs.

run.loss_nan, run.diverging, run.loss_spike, run.plateau and run.overfitting judge the curves
(curves.CurveTracker, fed each poll only the points it brought); run.hung and run.slowed judge
the run's step clock against its own pace, with what its processes and GPUs do. Every
finding's evidence carries `step` (where it fired) and `tag`, for a marker on the loss plot.

run.hung and run.stalled: run.stalled (a warning) is "nothing at all written for stalled_s",
for any run, even one whose only artifact is its log. run.hung (critical) is narrower and comes
sooner: the step counter of its events or metrics stopped for far longer than the run's own
step interval while its processes live and neither a checkpoint nor its log is being written.
When both would fire, only run.hung does (`one_alarm`): one silence, one alarm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..config.thresholds import Thresholds
from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.processes import descendants as _descendants
from ..model.processes import gpus_of as _gpus_of
from ..textsafe import visible
from ..units import duration as _dur
from .base import rule
from .base import run_procs as _run_procs
from .curve_tags import MAX_WATCHED, tags_of
from .curves import CurveParams, CurveTracker, band, median
from .rewind import Anomaly, checkpoint_before, latest_anomaly, written_after

if TYPE_CHECKING:
    from ..model.series import RunSeries, TagSeries
    from ..model.snapshot import Checkpoint, HostSnapshot, RunSample

MAX_MARKS = 32
MAX_FEED = 5_000
"""Points a tracker is fed at most in one poll (a first read of a 100 k-point series, or a
resume judged anew): the newest, whose story is the run's now; ~0.1 s a tag here."""


def params(th: Thresholds) -> CurveParams:
    return CurveParams(window=th.curve_window, spike_k=th.spike_k,
                       spike_min_rel=th.spike_min_rel, diverge_k=th.diverge_k,
                       diverge_critical_k=th.diverge_critical_k,
                       diverge_min_rel=th.diverge_min_rel,
                       diverge_sustain=th.diverge_sustain_points, plateau_k=th.plateau_k,
                       plateau_min_rel=th.plateau_min_rel, overfit_evals=th.overfit_evals,
                       overfit_min_rel=th.overfit_min_rel, overfit_k=th.overfit_k)


class RunCurves:
    """One run's trackers and step clock, kept on its RunSeries (and in the store)."""

    def __init__(self, th: Thresholds) -> None:
        self.p = params(th)
        self.trackers: dict[str, CurveTracker] = {}
        self.restart: list[Any] | None = None  # the run's last restart marker seen
        self.clock: tuple[int, float] | None = None  # (newest step, when it was first seen)
        self.marks: list[tuple[float, int]] = []  # (time, step) each time the clock moved
        self.before: dict[str, tuple[int, int]] = {}
        """Each tracker's (points, finite points) before this poll's feed: what this poll
        brought is reported even where a cron poll brought more than the recent span."""

    def feed(self, run: RunSeries, tags: Mapping[str, TagSeries], watch: list[str],
             now: float | None, evals: Iterable[str] = ()) -> None:
        """Feed each watched tag's new points; `evals`: the tags judged as evaluations."""
        evals = set(evals)
        marker = _marker(run.restarts[-1]) if run.restarts else None
        restarted = marker is not None and marker != self.restart  # a resume re-feeds them
        self.restart = marker
        self.before = {name: (t.n, t.finite) for name, t in self.trackers.items()}
        for name in watch:
            series = tags[name]
            t = self.trackers.get(name)
            last = series.last_step
            if t is None or restarted or (last is not None and t.last_step is not None
                                          and last < t.last_step) \
                    or t.rises_judged != (name in evals):  # a resume, or another eval tag
                t = self.trackers[name] = CurveTracker(self.p, rises=name in evals)
                self.before[name] = (0, 0)
                t.feed(_after(series, None))
            elif last is not None and (t.last_step is None or last > t.last_step):
                t.feed(_after(series, t.last_step))
        for name in list(self.trackers):
            if name not in watch:
                del self.trackers[name]
        steps = [t.last_step for t in tags.values() if t.last_step is not None]
        if not steps:
            return
        newest = max(steps)
        if self.clock is None or newest != self.clock[0]:
            walls = [t.last_wall for t in tags.values()
                     if t.last_step == newest and math.isfinite(t.last_wall)]
            when = max(walls) if walls else _artifact_time(run, now)
            if when is None:
                return
            if self.clock is not None and newest < self.clock[0]:
                self.marks = []  # resumed from an earlier step: another pace
            self.clock = (newest, when)
            self.marks = [*self.marks, (when, newest)][-MAX_MARKS:]

    def state(self) -> dict[str, Any]:
        return {"v": 1, "trackers": {k: t.state() for k, t in self.trackers.items()},
                "restart": self.restart, "clock": list(self.clock) if self.clock else None,
                "marks": [list(m) for m in self.marks]}

    @classmethod
    def from_state(cls, data: Any, th: Thresholds) -> RunCurves:
        out = cls(th)
        if not isinstance(data, dict) or data.get("v") != 1:
            return out
        trackers = data.get("trackers")
        for name, raw in (trackers.items() if isinstance(trackers, dict) else ()):
            t = CurveTracker.from_state(raw, out.p)
            if t is not None and isinstance(name, str) and len(out.trackers) < MAX_WATCHED:
                out.trackers[name] = t
        try:
            restart = data.get("restart")
            out.restart = _marker(restart) if restart is not None else None
            clock = data.get("clock")
            out.clock = None if clock is None else (int(clock[0]), float(clock[1]))
            out.marks = [(float(t), int(s)) for t, s in data.get("marks") or ()][-MAX_MARKS:]
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            out.clock, out.marks, out.restart = None, [], None
        return out


def _marker(m: Any) -> list[Any]:
    """A restart marker (step, wall time) as it compares and stores (no NaN: NaN != NaN)."""
    wall = float(m[1]) if m[1] is not None else math.nan
    return [int(m[0]), wall if math.isfinite(wall) else None]


def _after(series: TagSeries, step: int | None) -> Iterator[tuple[int, float, float]]:
    """The points after `step`: a binary search, then only the new points (the work of a
    poll is what it brought, not the series' length), at most the last MAX_FEED of them."""
    from bisect import bisect_right

    start = 0 if step is None else bisect_right(series.steps, step)
    start = max(start, len(series.steps) - MAX_FEED)
    for i in range(start, len(series.steps)):
        yield series.steps[i], series.values[i], series.walls[i]


def _artifact_time(run: RunSeries, now: float | None) -> float | None:
    """When the newest step was written, for sources without wall times: the newest events or
    metrics file's mtime (the box's clock), else the poll's."""
    sample = run.last_sample
    times = [] if sample is None else (
        [f.mtime for f in sample.event_files if f.error is None]
        + [m.mtime for m in sample.metrics if m.mtime is not None and m.error is None])
    return max(times) if times else now


def curves_of(history: HostHistory, run: RunSeries) -> RunCurves:
    held = run.curves
    if not isinstance(held, RunCurves):
        held = run.curves = RunCurves.from_state(run.curves_state, history.thresholds)
    return held


def _num(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _g(v: float) -> str:
    return f"{v:.4g}"


def _secs(s: float) -> str:
    return f"{s:.3g} s" if s < 60 else _dur(s)


@rule({"run.loss_nan": (), "run.diverging": (), "run.loss_spike": (), "run.plateau": (),
       "run.overfitting": (), "run.hung": ("U43", "seed 002"), "run.slowed": ("U23", "U40")})
def run_curves(history: HostHistory) -> Iterable[Finding]:
    """Feed every run's trackers what this poll brought; judge the running ones."""
    now = history.current
    if now is None:
        return
    live = {s.name: s for s in now.runs if s.pids}
    for name, run in history.runs.items():
        tags, loss, ev, watch = tags_of(run, history.curve_tags.get(name, (None, None)))
        curves = curves_of(history, run)
        curves.feed(run, tags, watch, now.taken_at, evals=(ev,) if ev else ())
        run.pace_s = _pace(curves, loss)
        sample = live.get(name)
        if sample is None or name in history.left_behind:
            continue
        yield from _curve_findings(history, run, curves, loss, ev)
        if now.taken_at is not None:
            yield from _hung(history, now, sample, run, curves, loss)
            yield from _slowed(history, now, sample, run, curves, loss)


def anomaly_of(history: HostHistory, run: RunSeries) -> Anomaly | None:
    """The run's latest curve anomaly (rewind.latest_anomaly) from its trackers as the store
    or the last judge left them."""
    th = history.thresholds
    curves = curves_of(history, run)
    _, loss, _, _ = tags_of(run, history.curve_tags.get(run.name, (None, None)))
    return latest_anomaly(run, curves.trackers, loss, th.spike_recent_points, th.spike_repeat)


def checkpoint_before_anomaly(history: HostHistory, run: RunSeries
                              ) -> tuple[Checkpoint | None, Anomaly | None]:
    """(The checkpoint to go back to, the anomaly it is before): the newest checkpoint
    written before the run's latest anomaly; with no anomaly, its latest checkpoint."""
    anomaly = anomaly_of(history, run)
    if anomaly is None:
        return run.latest_checkpoint, None
    return checkpoint_before(run.checkpoints, anomaly.step, anomaly.wall), anomaly


def latest_after_nan(history: HostHistory, run: RunSeries
                     ) -> tuple[Anomaly, Checkpoint, Checkpoint | None] | None:
    """(The NaN, the run's latest checkpoint, the newest one before the NaN) when its latest
    checkpoint was written after its loss went NaN: a resume from it resumes the garbage."""
    anomaly = anomaly_of(history, run)
    latest = run.latest_checkpoint
    if anomaly is None or anomaly.kind != "nan" or latest is None \
            or not written_after(latest, anomaly.step, anomaly.wall):
        return None
    return anomaly, latest, checkpoint_before(run.checkpoints, anomaly.step, anomaly.wall)


def _way_back(run: RunSeries, step: int, wall: float) -> tuple[str | None, str]:
    """(The checkpoint before `step`, the words that end a finding's remedy with it)."""
    ckpt = checkpoint_before(run.checkpoints, step, wall)
    if ckpt is None:
        return None, "a checkpoint saved before it"
    latest = run.latest_checkpoint
    newer = latest is not None and latest.path != ckpt.path
    return ckpt.path, (f"{visible(ckpt.path)}, the newest checkpoint written before it"
                       + (" (not the latest, which may hold the bad state)" if newer else ""))


def _curve_findings(history: HostHistory, run: RunSeries, curves: RunCurves,
                    loss: str | None, ev: str | None) -> Iterator[Finding]:
    th, name = history.thresholds, run.name
    for tag, t in curves.trackers.items():
        brought = curves.before.get(tag, (0, 0))[0] < t.bad_n  # by this poll
        if t.bad_step is None or (t.since_bad >= th.curve_window and not brought):
            continue
        before = t.before_bad
        ckpt, back = _way_back(run, t.bad_step, before[2] if before else math.nan)
        what = "NaN" if math.isnan(t.bad_value) else "infinite"
        tail = (f"; the last finite value was {_g(before[1])} at step {before[0]}"
                if before else "; it never had a finite value")
        recovered = f" (finite again for {t.since_bad} points)" if t.since_bad else ""
        yield Finding(
            "run.loss_nan", Severity.CRITICAL,
            f"run {name}'s {visible(tag)} became {what} at step {t.bad_step}{recovered}{tail} "
            "— the weights after it are likely garbage: stop it, lower the learning rate or "
            f"check the data and mixed precision, and relaunch from {back}",
            run=name, subject=tag,
            evidence={"step": t.bad_step, "tag": tag, "value": _num(t.bad_value),
                      "last_finite_step": before[0] if before else None,
                      "last_finite_value": before[1] if before else None,
                      "checkpoint_before": ckpt, "finite_since": t.since_bad})
    lt = curves.trackers.get(loss) if loss else None
    if lt is not None and loss is not None:
        yield from _loss_findings(th, run, loss, lt, curves.before.get(loss, (0, 0))[1])
        yield from _plateau(th, name, loss, lt, curves.trackers)
    e = curves.trackers.get(ev) if ev else None
    if e is not None and ev is not None:
        yield from _eval_rise(th, run, ev, e, lt, loss, curves.before.get(ev, (0, 0))[1])


def _loss_findings(th: Thresholds, run: RunSeries, tag: str, t: CurveTracker,
                   finite_before: int) -> Iterator[Finding]:
    name = run.name
    episode = t.diverged
    # diverging now, or an episode that this poll's points held (a coarse poll that brought
    # the whole rise and its end says it as a fine one does)
    if episode is not None and (t.diverging or episode[3] > finite_before):
        began, until, peak, _, earliest = episode
        now = t.diverging
        k = t.rise_k() if now else peak
        ratio = t.level_value() / t.best_value() if t.log and now else None
        severe = k >= th.diverge_critical_k and (
            ratio >= 2 if ratio is not None else t.level - t.best_level >= abs(t.best_level))
        ckpt, back = _way_back(run, earliest, math.nan)
        level = (f"its level (the median of the last {th.curve_window} points) is "
                 f"{_g(t.level_value())} at step {t.last_step}, up from its best "
                 f"{_g(t.best_value())} at step {t.best_step}"
                 + (f" ({ratio:.2g}×)" if ratio is not None else "")
                 if now else f"its level rose from step {began} to step {until}, up to "
                 f"{k:.0f} noise units above its best, then came down")
        yield Finding(
            "run.diverging", Severity.CRITICAL if severe else Severity.WARNING,
            f"run {name}'s {visible(tag)} is diverging: {level} — {k:.0f}× the noise of its "
            f"level, rising since step {began}: lower the learning rate (or enable gradient "
            f"clipping) and resume from {back}",
            run=name,
            evidence={"step": began, "tag": tag, "level": t.level_value(),
                      "best": t.best_value(), "best_step": t.best_step,
                      "noise": t.level_noise(), "rise_noise": round(k, 2),
                      "last_step": t.last_step, "until_step": until, "ongoing": now,
                      "checkpoint_before": ckpt})
    yield from _spikes(th, run, tag, t, finite_before)


def _spikes(th: Thresholds, run: RunSeries, tag: str, t: CurveTracker,
            finite_before: int) -> Iterator[Finding]:
    """Spikes among the newest spike_recent_points points, or brought by this poll; a burst
    (spike_repeat of them within spike_recent_points points of each other, counted by their
    own places in the curve, wherever the polls cut it) makes it a warning."""
    spikes = list(t.spikes)
    shown = [s for s in spikes if t.finite - s[4] <= th.spike_recent_points
             or s[4] >= finite_before]
    if not shown:
        return
    bursts = [[s for s in spikes if last[4] - th.spike_recent_points <= s[4] <= last[4]]
              for last in shown]
    burst = max(bursts, key=len)
    many = len(burst) >= th.spike_repeat
    step, value, med, k, _ = burst[-1] if many else shown[-1]
    ckpt, back = _way_back(run, burst[0][0], math.nan) if many else (None, "")
    yield Finding(
        "run.loss_spike", Severity.WARNING if many else Severity.INFO,
        f"run {run.name}'s {visible(tag)} spiked to {_g(value)} at step {step}, against a "
        f"recent median of {_g(med)} ({value / med:.2g}×, {k:.0f} noise units)"
        + (f"; {len(burst)} spikes within {th.spike_recent_points} points, from step "
           f"{burst[0][0]}: the learning rate may be too high or a batch of the data bad — "
           f"if it does not settle, resume from {back} and skip the batches in between"
           if many else ": one bad batch is harmless, several are not"),
        run=run.name,
        evidence={"step": burst[0][0] if many else step, "tag": tag, "value": value,
                  "median": med, "noise_units": k, "spikes": [s[0] for s in burst],
                  "checkpoint_before": ckpt})


def _plateau(th: Thresholds, name: str, tag: str, t: CurveTracker,
             trackers: Mapping[str, CurveTracker]) -> Iterator[Finding]:
    """No improvement beyond its noise for long compared with the run's own progress rate
    (plateau_rate_factor × the median steps between its improvements), or for
    plateau_span_ratio of the run; never while another tracked loss (the eval loss) still
    reaches new lows after it."""
    gap = t.progress_gap()
    if t.improved_step is None or t.first_step is None or t.last_step is None or gap is None \
            or t.finite < th.plateau_min_points or t.diverging:
        return
    span, total = t.last_step - t.improved_step, t.last_step - t.first_step
    points = t.finite_since_improved
    if total <= 0 or points < 2 * th.curve_window or (
            span < th.plateau_rate_factor * gap and span < th.plateau_span_ratio * total):
        return
    timed = math.isfinite(t.improved_wall) and math.isfinite(t.last_wall)
    if timed and t.last_wall - t.improved_wall < th.plateau_min_s:
        return
    learning = [other for other, o in trackers.items() if o is not t and (
        (o.improved_step is not None and o.improved_step > t.improved_step)
        or (o.min_step is not None and o.min_step > t.improved_step and o.finite >= 2))]
    if learning:
        return  # the eval loss (or another loss) still improves: not a plateau
    took = f" ({_dur(t.last_wall - t.improved_wall)})" if timed else ""
    yield Finding(
        "run.plateau", Severity.INFO,
        f"run {name}'s {visible(tag)} has not learned since step {t.improved_step}: its level "
        f"{_g(t.level_value())} has not fallen beyond its noise for {span} steps{took}, "
        f"{span / gap:.0f}× the {gap} steps it used to take to improve — if that is not the "
        "end of training, try another learning rate schedule or stop it early",
        run=name,
        evidence={"step": t.improved_step, "tag": tag, "level": t.level_value(),
                  "span_steps": span, "progress_gap_steps": gap,
                  "span_s": t.last_wall - t.improved_wall if timed else None})


def _train_falls(t: CurveTracker | None, since_step: int) -> bool | None:
    """Did the train loss fall after `since_step`? Its level improved beyond its noise after
    it (not merely its first level, taken then); with too few points for a level, its newest
    half below its first values. None without a train loss."""
    if t is None:
        return None
    if math.isnan(t.level):
        return t.falling()
    return t.improved_step is not None and t.improved_step > since_step \
        and bool(t.improvements)


def _eval_rise(th: Thresholds, run: RunSeries, tag: str, e: CurveTracker,
               t: CurveTracker | None, loss: str | None,
               finite_before: int) -> Iterator[Finding]:
    """The eval loss rising above its minimum (curves.CurveTracker._eval_rise): overfitting
    while the train loss falls or holds; the run getting worse when the eval has risen since
    its very first evaluation and the train loss does not fall (a failed fine-tune)."""
    rose = e.rose
    if rose is None or e.min_step is None or not (rose[3] == e.finite or rose[3] > finite_before):
        return
    if t is not None and t.diverging:
        return  # the train loss rises too: run.diverging says it
    began, until, rise, at, how, since = rose
    if how == "smoothed" and e.finite < th.overfit_min_evals:
        return
    pct = 100 * (math.expm1(rise) if e.log else rise / abs(e.min_value or 1.0))
    falls = _train_falls(t, began)
    ended = "" if at == e.finite else f" until step {until}, then it came back down"
    if how == "each":
        vals = list(e.window)[-(since + 1):] if at == e.finite else []
        shown = f" ({' → '.join(_g(v) for v in vals)})" if 0 < len(vals) <= 6 else ""
        said = (f"{visible(tag)} has risen at each of its {since + 1} evaluations{shown}, "
                f"{pct:.0f}% above the first{ended}")
    else:
        said = (f"{visible(tag)} has stood {pct:.0f}% above its lowest trend (the median of "
                f"3 evaluations, at step {began}) over the {since} evaluations since, beyond "
                f"their own noise{ended}")
    if e.finite <= 5:
        said += f" — only {e.finite} evaluations so far, but each one worse"
    ckpt, _ = _way_back(run, began + 1, math.nan)
    from_first = how == "each"
    train = visible(loss or "the train loss")
    if falls is not True and not from_first and t is not None and since < 2 * th.curve_window:
        return  # a rise while the train loss does not fall: more evaluations must say it
    if falls is not True and (from_first or t is None):
        words = ("and there is no train loss to tell" if t is None
                 else f"while {train} is not falling" if falls is False
                 else f"and {train} has too few points yet to say it falls")
        yield Finding(
            "run.diverging", Severity.WARNING,
            f"run {run.name} is getting worse, not learning: {said}, {words} — a failed "
            "fine-tune (learning rate, data or labels): stop it and check its setup",
            run=run.name,
            evidence={"step": began, "tag": tag, "eval_min": e.min_value,
                      "eval_last": e.last_value, "evals_since_min": since, "how": how,
                      "rise_pct": round(pct, 1), "train_tag": loss, "train_falling": falls})
        return
    if falls and t is not None:
        now = t.level_value() if math.isfinite(t.level) else t.last_value
        train_words = f"while {train} kept falling (to {_g(now or math.nan)})"
    else:
        train_words = f"while {train} held its level"
    yield Finding(
        "run.overfitting", Severity.WARNING,
        f"run {run.name} is overfitting: {said}, {train_words} — keep "
        + (f"{visible(ckpt)} (the newest written by step {began}, its lowest)" if ckpt
           else f"the checkpoint nearest step {began}, its lowest")
        + ", and stop early or regularise",
        run=run.name,
        evidence={"step": began, "tag": tag, "eval_min": e.min_value, "noise": None,
                  "eval_last": e.last_value, "evals_since_min": since, "how": how,
                  "rise_pct": round(pct, 1), "train_tag": loss,
                  "train_best_step": t.best_step if t is not None else None,
                  "train_falling": falls, "checkpoint_before": ckpt})


def _interval(curves: RunCurves, loss: str | None) -> float | None:
    """The run's own seconds between two logged steps: its loss points' wall times, else the
    times the step clock moved."""
    t = curves.trackers.get(loss) if loss else None
    gap = t.point_interval_s() if t is not None else None
    if gap is not None:
        return gap
    gaps = [b[0] - a[0] for a, b in zip(curves.marks, curves.marks[1:], strict=False)
            if b[0] > a[0]]
    return median(gaps) if gaps else None


def _pace(curves: RunCurves, loss: str | None) -> float | None:
    """Seconds a step, the median over the loss points' last 16 timed gaps."""
    t = curves.trackers.get(loss) if loss else None
    rates = [dt / n for dt, n in list(t.gaps)[-16:] if n > 0] if t is not None else []
    return median(rates) if rates else None


def _gpu_evidence(now: HostSnapshot, sample: RunSample) -> list[dict[str, Any]]:
    gpus = _gpus_of(sample.pids, now)
    return [{"gpu": g.index, "util_pct": g.util_pct, "power_w": g.power_w,
             "power_limit_w": g.power_limit_w, "throttle": list(g.throttle_reasons or ())}
            for g in now.gpus if g.index in gpus]


def _hung(history: HostHistory, now: HostSnapshot, sample: RunSample, run: RunSeries,
          curves: RunCurves, loss: str | None) -> Iterator[Finding]:
    th, at = history.thresholds, now.taken_at
    if curves.clock is None or at is None:
        return
    step, since = curves.clock
    interval = _interval(curves, loss)
    if interval is None:
        return  # its step not yet seen to move: no pace of its own to outlast (run.stalled)
    t = curves.trackers.get(loss) if loss else None
    longest = t.longest_gap if t is not None else 0.0
    limit = max(th.hung_factor * interval, th.hung_longest_factor * longest, th.hung_min_s)
    quiet = at - since
    if quiet < limit:
        return
    procs = _run_procs(sample, now)
    started = min((p.started_at for p in procs if p.started_at is not None), default=None)
    if started is not None and at - started < limit:
        return  # a relaunch that has not logged its first step yet
    writing = [c for c in (*sample.checkpoints, *sample.leftovers) if at - c.mtime < limit]
    if writing:
        return  # saving a checkpoint (a long save keeps its file's mtime fresh)
    if sample.log is not None and at - sample.log.mtime < limit and sample.log.mtime > since:
        return  # its log still grows: an evaluation, a save, not a hang
    gpus = _gpu_evidence(now, sample)
    pattern = ", ".join(f"GPU {g['gpu']} " + (f"{g['util_pct']:.0f}%" if g["util_pct"] is not None
                                             else "?%")
                        + (f" at {g['power_w']:.0f} W" if g["power_w"] is not None else "")
                        for g in gpus)
    states = {p.pid: p.state for p in procs}
    yield Finding(
        "run.hung", Severity.CRITICAL,
        f"run {run.name} is hung: every process is alive but its last step, {step}, came "
        f"{_dur(quiet)} ago, against its usual "
        f"{_secs(interval) if interval else 'pace'} between steps"
        + (f" ({pattern})" if pattern else "")
        + " — a stuck collective or dataloader does not recover by itself: py-spy dump a "
        "rank to see where, then kill the whole run and relaunch from its latest checkpoint",
        run=run.name,
        evidence={"step": step, "tag": loss, "last_step_at": since, "quiet_s": quiet,
                  "interval_s": interval, "longest_pause_s": longest, "limit_s": limit,
                  "gpus": gpus,
                  "states": states})


def _slowed(history: HostHistory, now: HostSnapshot, sample: RunSample, run: RunSeries,
            curves: RunCurves, loss: str | None) -> Iterator[Finding]:
    """The latest gaps between logged steps, back to where the pace was usual, against the
    median pace of the gaps before them: slower by slowed_ratio and slowed_k noise units, for
    at least slowed_points gaps spanning slowed_min_s."""
    th = history.thresholds
    t = curves.trackers.get(loss) if loss else None
    if t is None or len(t.gaps) < 3 * th.slowed_points:
        return
    rates = [(dt / n, dt) for dt, n in t.gaps if n > 0]
    slow_n = 0
    for j in range(2 * th.slowed_points, len(rates) - th.slowed_points + 1):
        base, noise = band(r for r, _ in rates[:j])  # the longest slow stretch at the end
        if min(r for r, _ in rates[j:]) > max(th.slowed_ratio * base, base + th.slowed_k * noise):
            slow_n = len(rates) - j
            break
    if not slow_n:
        return
    base, noise = band(r for r, _ in rates[:-slow_n])
    recent = rates[-slow_n:]
    span = sum(dt for _, dt in recent)
    slow = median(r for r, _ in recent)
    if base <= 0 or span < th.slowed_min_s:
        return
    changed = _what_changed(history, now, sample)
    yield Finding(
        "run.slowed", Severity.WARNING,
        f"run {run.name} slowed to {_g(slow)} s a step from its usual {_g(base)} "
        f"({slow / base:.1f}× slower over its last {slow_n} logged steps, {_dur(span)})"
        + (f"; at the same time: {'; '.join(changed)}" if changed else "")
        + " — find what competes with it (throttling, another process, starved dataloader)",
        run=run.name,
        evidence={"step": t.last_step, "tag": loss, "s_per_step": slow,
                  "usual_s_per_step": base, "noise": noise, "slow_points": slow_n,
                  "span_s": span, "changed": changed})


def _what_changed(history: HostHistory, now: HostSnapshot, sample: RunSample) -> list[str]:
    """What gpuwatch saw change on the run's GPUs and host between its oldest kept snapshot
    and now: throttling, another process on its GPUs, CPU oversubscription."""
    out: list[str] = []
    gpus = _gpus_of(sample.pids, now)
    before = history.snapshots[0] if len(history.snapshots) > 1 else None
    for g in now.gpus:
        if g.index not in gpus:
            continue
        reasons = set(g.throttle_reasons or ()) & set(history.thresholds.throttle_reasons)
        old = next((o for o in before.gpus if o.index == g.index), None) if before else None
        was = set(old.throttle_reasons or ()) if old is not None else set()
        if reasons - was:
            out.append(f"GPU {g.index} throttled ({', '.join(sorted(reasons - was))})")
    run_pids = {p.pid for p in _run_procs(sample, now)}
    old_pids = {p.pid for p in before.gpu_processes} if before else set()
    others = [p for p in now.gpu_processes if p.gpu_index in gpus and p.pid not in run_pids
              and p.pid not in old_pids]
    for p in others[:3]:
        out.append(f"another process on GPU {p.gpu_index} (pid {p.pid} "
                   f"{visible(p.process_name or '?')[:40]})")
    if now.loadavg and now.ncpu and now.loadavg[0] > 1.5 * now.ncpu:
        out.append(f"load average {now.loadavg[0]:.0f} on {now.ncpu} CPUs")
    cpus = now.cgroup.cpus if now.cgroup is not None else None
    threads = sum(p.threads for p in _descendants(sample.pids, now))
    if cpus and threads > history.thresholds.cpu_oversubscribed_ratio * cpus:
        out.append(f"{threads} threads on a {cpus:g}-vCPU quota")
    return out


def one_alarm(found: list[Finding]) -> list[Finding]:
    """One silence, one alarm: run.stalled gives way to run.hung for the same run."""
    hung = {f.run for f in found if f.code == "run.hung"}
    return [f for f in found if not (f.code == "run.stalled" and f.run in hung)]
