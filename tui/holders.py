"""Who holds the fleet's GPUs: per user, the GPUs their processes are on, the VRAM they hold
and for how long, from the processes each host's newest snapshot lists (nothing more is read)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .state import HostData


@dataclass(frozen=True)
class Holder:
    """One user's share of the fleet's GPUs."""

    user: str
    gpus: tuple[tuple[str, int], ...]
    """(host, GPU index) of each GPU a process of theirs is on, in the fleet's order."""
    vram_mib: int
    """VRAM their processes hold, as the driver counts it."""
    processes: int
    held_s: float | None
    """How long their oldest GPU process has run (None: no box clock to count from)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(host for host, _ in self.gpus))


def holders(hosts: Iterable[HostData], now: float) -> list[Holder]:
    """Every user with a process on a GPU, most VRAM first (then most GPUs, then name)."""
    gpus: dict[str, dict[tuple[str, int], None]] = {}
    vram: dict[str, int] = {}
    count: dict[str, int] = {}
    held: dict[str, float] = {}
    for h in hosts:
        snap = h.snapshot
        if snap is None:
            continue
        box_now = h.box_now(now)
        for p in snap.processes:
            if p.gpu_index is None and not p.gpu_mem_mib:
                continue
            mine = gpus.setdefault(p.user, {})
            if p.gpu_index is not None:
                mine[(h.name, p.gpu_index)] = None
            vram[p.user] = vram.get(p.user, 0) + (p.gpu_mem_mib or 0)
            count[p.user] = count.get(p.user, 0) + 1
            if box_now is not None and p.started_at is not None:
                held[p.user] = max(held.get(p.user, 0.0), max(0.0, box_now - p.started_at))
    rows = [Holder(user, tuple(its), vram[user], count[user], held.get(user))
            for user, its in gpus.items()]
    return sorted(rows, key=lambda r: (-r.vram_mib, -len(r.gpus), r.user))
