"""What judging a run's curves costs per poll, against the length of its series.

    .venv/bin/python -m pytest tests/bench/bench_curves.py -s
    .venv/bin/python tests/bench/bench_curves.py [--new 100] [--polls 20]

For series of 1 k to 1 M points already judged, a poll brings `--new` points; the time of
`run_curves`'s feed for that poll (the trackers of the loss, an eval tag and a third loss tag,
fed only what is new: a binary search to the first new step, then those points) is printed,
median and worst of `--polls` polls, next to the first judge of the series (its newest
MAX_FEED points a tag: a run first seen, or resumed). Nothing is asserted: it prints figures
(the claim: flat in the series' length).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from figures import SMOKE, Row, print_rows, remember
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.findings.run_curves import RunCurves
from gpuwatch.remote.model.series import RunSeries, TagSeries

TAGS = ("train/loss", "eval/loss", "train/aux_loss")
LENGTHS = (1_000, 10_000) if SMOKE else (1_000, 10_000, 100_000, 1_000_000)


def curve(start: int, n: int, rng: random.Random) -> list[tuple[int, float, float]]:
    return [(s, 2.0 / math.sqrt(1 + s) + rng.gauss(0, 0.01), 1.7e9 + s)
            for s in range(start, start + n)]


def main(argv: list[str] | None = None) -> list[Row]:
    """Prints the figures; returns DESIGN §6's row: a poll's cost at the longest series
    against the shortest (flat: about 1x)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--polls", type=int, default=3 if SMOKE else 20)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    print(f"{'points':>9}  {'per poll median':>16}  {'worst':>9}  {'first judge':>15}")
    per_poll = {}
    for n in LENGTHS:
        run = RunSeries("bench", max_points=n + args.new * args.polls)
        tags = {t: TagSeries(run.max_points) for t in TAGS}
        for series in tags.values():
            series.merge(curve(0, n, rng))
        run.event_series.update(tags)
        curves = RunCurves(Thresholds())
        t0 = time.perf_counter()
        curves.feed(run, tags, list(TAGS), None, evals=TAGS[1:2])
        batch = time.perf_counter() - t0
        times, at = [], n
        for _ in range(args.polls):
            for series in tags.values():
                series.merge(curve(at, args.new, rng))
            at += args.new
            t0 = time.perf_counter()
            curves.feed(run, tags, list(TAGS), None, evals=TAGS[1:2])
            times.append(time.perf_counter() - t0)
        per_poll[n] = statistics.median(times)
        print(f"{n:>9}  {statistics.median(times) * 1e3:>13.2f} ms  "
              f"{max(times) * 1e3:>6.2f} ms  {batch * 1e3:>12.0f} ms")
    short, long = LENGTHS[0], LENGTHS[-1]
    ratio = per_poll[long] / per_poll[short]
    return [Row("curve findings per poll: proportional to the new points, not the series' "
                f"length ({args.new} new points a tag)", "flat (<= 2x)",
                f"{ratio:.2f}x at {long:,} points against {short:,}",
                f"a poll at {short:,} points {per_poll[short] * 1e3:.1f} ms, at {long:,} "
                f"{per_poll[long] * 1e3:.1f} ms (medians of {args.polls})", ratio <= 2)]


def test_curves_per_poll() -> None:
    print_rows(remember("curves", main([])), "DESIGN §6 rows:")


if __name__ == "__main__":
    main()
