"""DiskGauges: bytes and inodes per watched filesystem, and when it fills at the recent rate,
with that rate (U6: a full disk kills a checkpoint save; U7: inodes run out before bytes on
small files). The forecast shows from the second poll on, marked rough until it rests on
`disk_full_min_span_s` of samples (the span `disk.full_soon` waits for)."""

from __future__ import annotations

from collections.abc import Callable

from gpuwatch.remote.findings.forecast import DiskForecast, trend
from gpuwatch.remote.units import duration, size
from rich.text import Text

from ..colours import colour
from ..format import bar, human_count, visible
from ..state import HostData
from .text_pane import TextPane

GAUGE = 20
"""The bar's widest; it gives way to the numbers in a narrow pane (never "free…")."""
MIN_GAUGE = 6


class DiskGauges(TextPane):
    def show(self, data: HostData | None) -> None:
        self.show_built(lambda width: self.render_disks(data, width))

    def render_disks(self, data: HostData | None, width: int) -> Text:
        muted = colour(self.app, "text-muted")
        snap = data.snapshot if data is not None else None
        if data is None or snap is None:
            return Text("no data yet", style=muted)
        if not snap.disks:
            return Text("no disks reported", style=muted)
        text = Text(no_wrap=True, overflow="ellipsis")
        rows: list[tuple[str, int | None, int | None, Fmt, DiskForecast | None]] = []
        for d in snap.disks:
            if not d.error:
                rows.append(("bytes ", d.bytes_total, d.bytes_free, size,
                             gauge_forecast(data, d.path)))
                if d.inodes_total:
                    rows.append(("inodes", d.inodes_total, d.inodes_free, human_count,
                                 gauge_forecast(data, d.path, True)))
        # One bar width for every gauge, so the percentages line up; the totals go first,
        # then the forecast takes a line of its own, before the bar gets too short to read.
        shape = (GAUGE, True, False)
        for with_total, forecast_below in ((True, False), (False, False), (False, True)):
            bar_w = min([GAUGE] + [width - self.fixed(r, with_total, forecast_below)
                                   for r in rows])
            shape = (bar_w, with_total, forecast_below)
            if bar_w >= MIN_GAUGE:
                break
        for n, d in enumerate(snap.disks):
            if n:
                text.append("\n")
            text.append(visible(d.path), style="bold")  # paths are data: Text, not markup
            if d.mount and d.mount != d.path:
                # a folder on a filesystem mounted higher up: say so in words ("/data on /"
                # read as jargon)
                text.append(f" (on the {visible(d.mount)} filesystem)", style=muted)
            if d.error:
                text.append(f"  {visible(d.error)}", style=colour(self.app, "error"))
                continue
            text.append("\n")
            text.append_text(self.gauge("bytes ", d.bytes_total, d.bytes_free, size,
                                        gauge_forecast(data, d.path), shape))
            text.append("\n")
            if d.inodes_total:
                text.append_text(self.gauge("inodes", d.inodes_total, d.inodes_free,
                                            human_count, gauge_forecast(data, d.path, True),
                                            shape))
            else:
                text.append("inodes  not counted by this filesystem", style=muted)
        return text

    @staticmethod
    def parts(label: str, total: int, free: int, fmt: Fmt,
              ttf: DiskForecast | None) -> tuple[str, str, str, str]:
        """The words of a gauge line but its bar: head, percentage and free, total, forecast."""
        used = 1 - free / total
        return (f"{label}  ", f" {used * 100:3.0f}%  {fmt(free)} free", f" of {fmt(total)}",
                forecast_words(ttf, fmt) if ttf is not None else "")

    def fixed(self, row: tuple[str, int | None, int | None, Fmt, DiskForecast | None],
              with_total: bool, forecast_below: bool) -> int:
        """The cells a gauge line needs besides its bar."""
        label, total, free, fmt, ttf = row
        if not total or free is None:
            return 0
        head, middle, of, full = self.parts(label, total, free, fmt, ttf)
        return len(head) + len(middle) + (len(of) if with_total else 0) + (
            len(full) + 2 if full and not forecast_below else 0)

    def gauge(self, label: str, total: int | None, free: int | None, fmt: Fmt,
              ttf: DiskForecast | None, shape: tuple[int, bool, bool]) -> Text:
        text = Text()
        if not total or free is None:
            text.append(f"{label}  ?", style=colour(self.app, "text-muted"))
            return text
        bar_w, with_total, forecast_below = shape
        used = 1 - free / total
        level = "gauge-bad" if used >= 0.95 else "gauge-warn" if used >= 0.85 else "gauge-ok"
        head, middle, of, full = self.parts(label, total, free, fmt, ttf)
        text.append(head)
        text.append(bar(used, max(MIN_GAUGE // 2, bar_w)), style=colour(self.app, level))
        text.append(middle + (of if with_total else ""))
        if ttf is not None:
            soon = ttf.seconds_left < 24 * 3600
            text.append("\n" + " " * len(head) if forecast_below else "  ")
            text.append(full, style=f"bold {colour(self.app, 'error' if soon else 'warning')}")
        return text


Fmt = Callable[[float | None], str]


def gauge_forecast(data: HostData, path: str, inodes: bool = False) -> DiskForecast | None:
    """The gauge's forecast: THE forecast (remote/findings/forecast.py) over the samples of
    this disk the host view keeps (longer than the history the findings judge on), from the
    second poll on; rough until it spans disk_full_min_span_s."""
    points = data.disk_history.get(path, ())
    full = data.history.thresholds.disk_full_min_span_s
    return trend(((p.t, p.inodes_free if inodes else p.bytes_free) for p in points),
                 min_span_s=0.0, full_span_s=full)


def forecast_words(forecast: DiskForecast, fmt: Fmt) -> str:
    """"full in ~6 min (838.2 GiB/h)", and "(838.2 GiB/h, rough)" while it rests on less than
    disk_full_min_span_s of samples (a first estimate, not yet the evidence disk.full_soon
    waits for)."""
    rate = f"{fmt(forecast.rate_per_s * 3600)}/h"
    return (f"full in ~{duration(forecast.seconds_left)} "
            f"({rate}{', rough' if forecast.rough else ''})")
