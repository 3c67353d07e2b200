"""HostHeader: one line about the host: its state in the fleet's words (its worst finding, or
stale / unreachable and why), box facts, polling state."""

from __future__ import annotations

from gpuwatch.remote.units import duration
from rich.text import Text

from ..colours import STATUS_VARIABLE, colour, severity_colour
from ..format import visible
from ..state import HostData
from .text_pane import TextPane


class HostHeader(TextPane):
    def show(self, data: HostData | None, now: float, interval: float, paused: bool) -> None:
        self.show_built(lambda width: self.render_header(data, now, interval, paused, width))

    def render_header(self, data: HostData | None, now: float, interval: float,
                      paused: bool, width: int) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        if data is None:
            return text
        headline = data.headline(now, interval, paused)  # the fleet's state cell's words
        text.append(visible(data.name), style="bold")
        text.append("  ")
        shade = (severity_colour(self.app, headline.severity) if headline.severity is not None
                 else colour(self.app, STATUS_VARIABLE[headline.kind]))
        text.append(headline.text, style=f"bold {shade}")
        snap = data.snapshot
        muted = colour(self.app, "text-muted")
        if snap is not None:
            # Most needed first (the box's name for itself, then its limits): where the line
            # is too narrow the last ones go whole rather than a number be cut ("cgroup mem
            # 62…" at 80 columns).
            facts = []
            if snap.hostname:
                facts.append(f"hostname {visible(snap.hostname)}")  # the box's own name
            if snap.cgroup is not None and snap.cgroup.memory_max_bytes:
                cur = snap.cgroup.memory_current_bytes or 0
                facts.append(f"cgroup mem {cur / snap.cgroup.memory_max_bytes:.0%}")
            if snap.loadavg:
                facts.append(f"load {snap.loadavg[0]:.1f}/{snap.ncpu or '?'} CPUs")
            if snap.uptime_s is not None:
                facts.append(f"up {duration(snap.uptime_s)}")
            if data.outcome is not None and data.outcome.poll_s:
                facts.append(f"poll {data.outcome.poll_s:.2f} s")
            room = width - text.cell_len - (
                len("  polling paused (p)") if paused else 0)
            while facts and len("  " + " · ".join(facts)) > room:
                facts.pop()
            if facts:
                text.append("  " + " · ".join(facts), style=muted)
        if paused:
            text.append("  polling paused (p)", style=f"bold {colour(self.app, 'warning')}")
        return text
