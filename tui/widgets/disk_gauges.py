"""DiskGauges: bytes and inodes per watched filesystem, and when it fills at the recent rate
(U6: a full disk kills a checkpoint save; U7: inodes run out before bytes on small files)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..colours import colour
from ..format import bar, human_age, human_bytes, human_count, visible
from ..state import HostData

GAUGE = 20


class DiskGauges(Static):
    def show(self, data: HostData | None) -> None:
        self.update(self.render_disks(data))

    def render_disks(self, data: HostData | None) -> Text:
        muted = colour(self.app, "text-muted")
        snap = data.snapshot if data is not None else None
        if data is None or snap is None:
            return Text("no data yet", style=muted)
        if not snap.disks:
            return Text("no disks reported", style=muted)
        text = Text(no_wrap=True, overflow="ellipsis")
        for n, d in enumerate(snap.disks):
            if n:
                text.append("\n")
            text.append(visible(d.path), style="bold")  # paths are data: Text, not markup
            if d.mount and d.mount != d.path:
                text.append(f" on {visible(d.mount)}", style=muted)
            if d.error:
                text.append(f"  {visible(d.error)}", style=colour(self.app, "error"))
                continue
            text.append("\n")
            text.append_text(self.gauge("bytes ", d.bytes_total, d.bytes_free, human_bytes,
                                        data.disk_forecast(d.path)))
            text.append("\n")
            if d.inodes_total:
                text.append_text(self.gauge("inodes", d.inodes_total, d.inodes_free,
                                            human_count, data.disk_forecast(d.path, True)))
            else:
                text.append("inodes  not counted by this filesystem", style=muted)
        return text

    def gauge(self, label: str, total: int | None, free: int | None, fmt: object,
              ttf: float | None) -> Text:
        text = Text()
        if not total or free is None:
            text.append(f"{label}  ?", style=colour(self.app, "text-muted"))
            return text
        used = 1 - free / total
        level = "gauge-bad" if used >= 0.95 else "gauge-warn" if used >= 0.85 else "gauge-ok"
        text.append(f"{label}  ")
        text.append(bar(used, GAUGE), style=colour(self.app, level))
        text.append(f" {used * 100:3.0f}%  {fmt(free)} free of {fmt(total)}")  # type: ignore[operator]
        if ttf is not None:
            soon = ttf < 24 * 3600
            text.append(f"  full in ~{human_age(ttf)}",
                        style=f"bold {colour(self.app, 'error' if soon else 'warning')}")
        return text
