"""GpuPanel: small multiples, one block per GPU: util against SM clock (% of max) over time,
power against its limit, temperature, VRAM and the throttle reasons decoded; its health where
it says something (uncorrected memory errors, memory rows waiting for a reset or out of spares,
the recovery the driver asks for, a PCIe link below its best), and a MIG GPU's instances as
rows under it.

U21: util says "a kernel ran", not "the SMs were busy"; a capped GPU shows tall util beside a
short clock. The two sparklines share one 0-100 scale so the gap is the finding.
"""

from __future__ import annotations

import textwrap

from gpuwatch.remote.model.gpu import MIG_UTIL_NOT_REPORTED, MigInstance, recovery_action
from gpuwatch.remote.model.snapshot import GpuSample
from gpuwatch.remote.units import duration, mib_pair
from rich.text import Text
from textual.reactive import reactive

from ..colours import colour
from ..format import THROTTLE_MEANING, bar, pct, sparkline, visible
from ..state import GpuPoint, HostData
from .text_pane import TextPane

LABEL = 6
ERROR_LINES = 4
"""Lines a GPU query's failure may take at the pane's top (the tool's words, wrapped)."""


class GpuPanel(TextPane):
    """Renders `data` (a HostData); nothing else."""

    data: reactive[HostData | None] = reactive(None, always_update=True)

    def watch_data(self) -> None:
        self.show_built(self.render_gpus)

    def numbers(self, g: GpuSample) -> Text:
        """Power against its limit, temperature, VRAM used of total."""
        out = Text()
        if g.power_w is not None:
            frac = pct(g.power_w, g.power_limit_w)
            at_cap = frac is not None and frac >= 97
            out.append(f"{g.power_w:.0f}", style=colour(self.app, "power"))
            out.append(f"/{g.power_limit_w:.0f} W" if g.power_limit_w else " W",
                       style=colour(self.app, "warning") if at_cap else "")
        if g.temp_c is not None:
            hot = g.temp_c >= 85
            out.append(f"  {g.temp_c}°C", style=colour(self.app, "error" if hot else "temp"))
        if g.mem_total_mib:
            out.append(f"  VRAM {mib_pair(g.mem_used_mib or 0, g.mem_total_mib)}",
                       style=colour(self.app, "vram"))
        return out

    def render_gpus(self, pane_width: int) -> Text:
        data = self.data
        muted = colour(self.app, "text-muted")
        if data is None or data.snapshot is None:
            return Text("no data yet", style=muted)
        snap = data.snapshot
        err = snap.gpu_error
        if not snap.gpus and err is None:
            reason = snap.section_errors.get("gpus")
            return Text(f"no GPUs reported{': ' + visible(reason) if reason else ''}",
                        style=muted)
        width = max(10, pane_width - LABEL - 6)
        util_c, clock_c = colour(self.app, "util"), colour(self.app, "sm-clock")
        out = Text(no_wrap=True, overflow="ellipsis")
        if err is not None:  # a wedged driver or a lost GPU, first and in the error colour,
            # the tool's own words wrapped to the pane (they say what failed; cut, they did not)
            out.append(f"⚠ GPUs unreadable · {err.summary}",
                       style=f"bold {colour(self.app, 'error')}")
            said = "the query said: " + visible(err.message)  # box text: never markup
            for line in textwrap.wrap(said, max(20, pane_width - 2), max_lines=ERROR_LINES,
                                      placeholder=" …"):
                out.append("\n" + line)
        for n, g in enumerate(snap.gpus):
            if n or err is not None:
                out.append("\n")
            util, clock = g.util_pct, pct(g.sm_clock_mhz, g.sm_clock_max_mhz)
            # Where name and numbers do not fit one line, the numbers get a line of their own
            # rather than VRAM cut to "VR…".
            numbers = self.numbers(g)
            name = Text(f"GPU{g.index} ", style="bold")
            name.append(visible(short_gpu_name(g.name)))  # the driver's name for it: box text
            if g.mig:
                name.append(" MIG", style=colour(self.app, "warning"))
            out.append_text(name)
            if name.cell_len + 2 + numbers.cell_len > pane_width:
                out.append("\n")
            else:
                out.append("  ")
            out.append_text(numbers)
            history = list(data.gpu_history.get(g.index, ()))
            if n == 0:
                self.say_span(history[-width:])
            out.append("\n")
            out.append("util".ljust(LABEL), style=util_c)
            if g.mig and util is None:  # the driver gives none: said, not a blank strip
                out.append(MIG_UTIL_NOT_REPORTED, style=muted)
            else:
                out.append(sparkline([p.util_pct for p in history], width), style=util_c)
                out.append(_num(util), style=util_c)
            out.append("\n")
            out.append("clock".ljust(LABEL), style=clock_c)
            out.append(sparkline([p.clock_pct for p in history], width), style=clock_c)
            out.append(_num(clock), style=clock_c)
            reasons = [r for r in (g.throttle_reasons or ()) if r != "gpu_idle"]
            for r in reasons:  # one a line: a second reason never cuts the first short
                out.append("\n")
                out.append("⚠ ".rjust(LABEL), style=colour(self.app, "warning"))
                out.append(visible(THROTTLE_MEANING.get(r, r)),
                           style=colour(self.app, "warning"))
            if g.throttle_reasons is None:
                out.append("\n" + " " * LABEL)
                out.append("throttle reasons unknown (driver did not say)", style=muted)
            if g.power_w is not None and g.power_limit_w:
                out.append("\n")
                out.append("power".ljust(LABEL), style=colour(self.app, "power"))
                out.append(bar(g.power_w / g.power_limit_w, width),
                           style=colour(self.app, "power"))
            for glyph, level, said in health_lines(g):
                out.append("\n")
                out.append(f"{glyph} ".rjust(LABEL), style=colour(self.app, level))
                out.append(said, style=colour(self.app, level))
            for inst in g.mig_instances:
                out.append("\n")
                out.append_text(self.instance_row(inst))
        return out

    def instance_row(self, inst: MigInstance) -> Text:
        """A MIG instance under its GPU: profile, which instance, the processes the driver
        places in it, its SMs and its memory (cut first where the pane is narrow)."""
        row = Text("  └ ", style=colour(self.app, "text-muted"))
        row.append(visible(inst.profile or "?").ljust(8), style="bold")  # box text
        row.append(f"GI{_ident(inst.gpu_instance)}/CI{_ident(inst.compute_instance)}".ljust(9))
        pids = ",".join(map(str, inst.pids))
        row.append(f"pid {pids}" if pids else "idle", style="" if pids else
                   colour(self.app, "text-muted"))
        if inst.util_pct is not None:
            row.append(f" {inst.util_pct:.0f}%", style=colour(self.app, "util"))
        if inst.sm_count is not None:
            row.append(f"  {inst.sm_count} SM")
        if inst.mem_total_mib:
            row.append(f"  {mib_pair(inst.mem_used_mib, inst.mem_total_mib)}",
                       style=colour(self.app, "vram"))
        return row


    def say_span(self, shown: list[GpuPoint]) -> None:
        """The strips' time scale, under the pane: one column per poll, so the span is the
        time from the oldest column shown to the newest."""
        span = shown[-1].t - shown[0].t if len(shown) > 1 else None
        said = f"strips: last {duration(span)}" if span else ""
        if self.parent is not None and getattr(self.parent, "border_subtitle", said) != said:
            self.parent.border_subtitle = said  # type: ignore[attr-defined]


def health_lines(g: GpuSample) -> list[tuple[str, str, str]]:
    """(glyph, colour, words) for each health field of a GPU that says something: nothing for
    a healthy GPU, whose pane stays as it was."""
    out = []
    action = recovery_action(g.recovery_action)
    if action is not None and action.blocks_relaunch:
        out.append(("✖", "error", f"driver asks for {action.words}"))
    remap = g.remap
    if remap is not None and remap.failed:
        out.append(("✖", "error", "remap failed: no spare rows, replace it"))
    elif remap is not None and remap.needs_reset:
        what = "rows" if remap.pending else "pages"
        out.append(("⚠", "warning", f"remap pending: {what} wait for a GPU reset"))
    ecc = g.ecc
    if ecc is not None and ecc.uncorrected_volatile:
        n = ecc.uncorrected_volatile
        out.append(("✖", "error", f"ECC: {n} uncorrected since driver load"))
    elif ecc is not None and ecc.uncorrected_aggregate:
        out.append(("·", "text-muted", f"ECC: {ecc.uncorrected_aggregate} uncorrected in "
                                       f"its life"))
    link = g.pcie
    if link is not None and link.width and link.width_max and link.width < link.width_max:
        out.append(("⚠", "warning", f"PCIe x{link.width} of x{link.width_max} lanes"))
    elif link is not None and link.gen and link.gen_max and link.gen < link.gen_max and \
            (g.util_pct or 0) >= 50:  # the generation drops at idle to save power
        out.append(("⚠", "warning", f"PCIe gen {link.gen} of {link.gen_max} while busy"))
    return out


def short_gpu_name(name: str | None) -> str:
    """"H100 80GB HBM3" for "NVIDIA H100 80GB HBM3": every GPU here is NVIDIA's."""
    if not name:
        return "?"
    return name.removeprefix("NVIDIA ").strip() or name


def _ident(value: int | None) -> str:
    return "?" if value is None else str(value)


def _num(value: float | None) -> str:
    return "    ?" if value is None else f" {value:3.0f}%"
