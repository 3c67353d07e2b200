"""Fleet groups: which group each host is shown in (its `group` key, else its name less the
trailing number), and what a group's row says of its hosts (worst verdict, counts by verdict)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .state import HostData

GROUP_FROM = 24
"""A fleet of more hosts than this is grouped by its hosts' names, and its groups where every
host is fine start collapsed (a `group` key in the config groups a fleet of any size)."""
OTHER = "other"
"""The group of the hosts that have no `group` key and share no name with another host."""
GROUP_ROW = "\x00group:"
"""The fleet table's row key of a group's row, before its name (no host name has a control
character: the config refuses one)."""
_TAIL = re.compile(r"[-_]*\d+[-_]*$")


def name_group(name: str) -> str | None:
    """The group a host's name puts it in: the name (its first DNS label) less the trailing
    digits and separators (`node-017` and `node-018.lab` are in `node`); None where nothing
    trails (`gpu-healthy`) or nothing is left (an IP address)."""
    label = name.split(".", 1)[0]
    stem = _TAIL.sub("", label)
    return stem if stem and stem != label else None


def group_names(hosts: Sequence[HostData]) -> dict[str, str] | None:
    """Each host's group, or None where the fleet is not grouped: at most GROUP_FROM hosts
    and no `group` key, or all in one group. A name shared with no other host is OTHER."""
    configured = any(h.config.group for h in hosts)
    if not configured and len(hosts) <= GROUP_FROM:
        return None
    by_name = {h.name: name_group(h.name) for h in hosts}
    sizes = Counter(g for h in hosts if not h.config.group
                    for g in [by_name[h.name]] if g is not None)
    out: dict[str, str] = {}
    for h in hosts:
        stem = by_name[h.name]
        out[h.name] = h.config.group or (stem if stem is not None and sizes[stem] > 1
                                         else OTHER)
    return out if len(set(out.values())) > 1 else None


@dataclass(frozen=True)
class FleetGroup:
    """A group's row in the fleet table and the hosts under it (shown where not collapsed)."""

    name: str
    hosts: tuple[HostData, ...]
    """The group's hosts that are shown (the filter's), in the fleet's order."""
    collapsed: bool

    @property
    def key(self) -> str:
        """Its row key in the fleet table."""
        return GROUP_ROW + self.name


def group_key_name(key: str) -> str | None:
    """The group's name, where a row key is a group's row (else None: a host's)."""
    return key[len(GROUP_ROW):] if key.startswith(GROUP_ROW) else None


COUNT_GLYPHS = (("unreachable", "✗"), ("critical", "✖"), ("warning", "▲"), ("waiting", "…"),
                ("fine", "●"))
"""A group's hosts counted by verdict, worst first: could not be polled, critical, warning,
not polled yet, the rest (ok, info, stale)."""


def verdict_counts(hosts: Iterable[HostData], now: float, interval: float,
                   paused: bool = False) -> str:
    """The hosts by verdict in glyphs and counts, worst first: `✗2 ✖1 ▲3 ●58`."""
    counts: Counter[str] = Counter()
    for h in hosts:
        verdict = h.verdict(now, interval, paused)
        if verdict.state == "unreachable":
            counts["unreachable"] += 1
        elif verdict.level >= 3:
            counts["critical"] += 1
        elif verdict.level == 2:
            counts["warning"] += 1
        elif verdict.state == "waiting":
            counts["waiting"] += 1
        else:
            counts["fine"] += 1
    return " ".join(f"{glyph}{counts[kind]}" for kind, glyph in COUNT_GLYPHS if counts[kind])
