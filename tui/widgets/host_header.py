"""HostHeader: one line about the host: state and staleness, box facts, polling state."""

from __future__ import annotations

from rich.text import Text

from ..colours import STATUS_VARIABLE, colour
from ..format import human_age, visible
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
        status = data.status(now, interval, paused)
        text.append(visible(data.name), style="bold")
        text.append("  ")
        text.append(visible(status.text),
                    style=f"bold {colour(self.app, STATUS_VARIABLE[status.kind])}")
        snap = data.snapshot
        muted = colour(self.app, "text-muted")
        if snap is not None:
            # Most needed first (the box's name for itself, then its limits): where the line
            # is too narrow the last ones go whole rather than a number be cut ("cgroup mem
            # 62…" at 80 columns).
            facts = []
            if snap.hostname:
                facts.append(visible(snap.hostname))  # the box's own name for itself
            if snap.cgroup is not None and snap.cgroup.memory_max_bytes:
                cur = snap.cgroup.memory_current_bytes or 0
                facts.append(f"cgroup mem {cur / snap.cgroup.memory_max_bytes:.0%}")
            if snap.loadavg:
                facts.append(f"load {snap.loadavg[0]:.1f}/{snap.ncpu or '?'} CPUs")
            if snap.uptime_s is not None:
                facts.append(f"up {human_age(snap.uptime_s)}")
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
