"""A death a person knows of: acknowledged (`gpuwatch ack`, the TUI's `a`), or asked for (a
kill of the run's processes through gpuwatch). An unexpected death is critical until the run is
relaunched, seen finished, or covered by one of these (findings/run.py `run.dead`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .death import Diagnosis

STOPPED = "stopped on request"
ACKNOWLEDGED = "acknowledged"


@dataclass(frozen=True, slots=True)
class Ack:
    run: str
    pids: tuple[int, ...]
    """The dead pids it covers; () covers a death seen at or before `at`."""
    who: str
    at: float
    reason: str = ACKNOWLEDGED

    def covers(self, death: Diagnosis | None, died_at: float | None = None) -> bool:
        """Whether this ack is about `death` (not an earlier or a later death of the run): by
        its pids where both know them, else by time."""
        pids = set(death.pids) if death is not None else set()
        if self.pids and pids:
            return bool(pids & set(self.pids))
        when = death.at if death is not None and death.at is not None else died_at
        return when is None or self.at >= when

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Ack | None:
        try:
            return cls(str(row["run"]), tuple(int(p) for p in row.get("pids") or ()),
                       str(row["who"]), float(row["at"]), str(row.get("reason") or ACKNOWLEDGED))
        except (KeyError, TypeError, ValueError):
            return None


def acks_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Ack]]:
    """The store's rows (Store.acks) by run, oldest first; malformed rows left out."""
    out: dict[str, list[Ack]] = {}
    for row in rows:
        ack = Ack.from_row(row)
        if ack is not None:
            out.setdefault(ack.run, []).append(ack)
    return out


def ack_of(acks: Mapping[str, Iterable[Ack]], run: str, death: Diagnosis | None,
           died_at: float | None = None) -> Ack | None:
    """The newest ack of `run` that covers its current death, if any."""
    found = [a for a in acks.get(run, ()) if a.covers(death, died_at)]
    return found[-1] if found else None
