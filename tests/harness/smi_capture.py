"""nvidia-smi's CSV as people save it, read into the rows the probe's `gpu_row` and `app_row`
read: a header line naming the fields (with units, `memory.used [MiB]`, and the names a driver
prints for what was asked, `clocks.current.sm` for `clocks.sm`), the per-reason columns of the
clock event reasons where the bitmask is [N/A], and the power and PCIe fields of other drivers
(`power.draw.average`, `power.limit`, `pcie.link.gen.current`).

The probe never meets these: it asks `--format=csv,noheader,nounits` for the fields it names.
Reading them is kept here, off the box, so that every poll's upload stays small (DESIGN §6);
the captures under tests/data (other projects' exporters saved them so) are read through it.
"""

from __future__ import annotations

import re

from gpuwatch.remote.box import names as probe

ALIASES = {"clocks.current.sm": "clocks.sm", "used_memory": "used_gpu_memory"}
"""Names a header prints for a field the probe asks by another."""
ALSO = {"power.draw": ("power.draw.average", "power.draw.instant"),
        "enforced.power.limit": ("power.limit",),
        "pcie.link.gen.gpucurrent": ("pcie.link.gen.current",)}
"""Where a row lacks a field, the same reading under another name: power.draw.instant/average
on newer drivers, power.limit, the PCIe generation before R550."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def is_field_name(cell: str) -> bool:
    """A header cell of nvidia-smi's CSV: 'index', 'memory.used [MiB]'."""
    name, bracket, unit = cell.partition(" [")
    if bracket and (not unit.endswith("]") or "]" in unit[:-1]):
        return False
    return bool(_NAME.match(name))


def canonical(header: str) -> str:
    """'memory.used [MiB]' → 'memory.used'; an alias → the asked name; the throttle family →
    the event family."""
    name = header.split(" [", 1)[0].strip()
    name = ALIASES.get(name, name)
    return name.replace("clocks_throttle_reasons.", "clocks_event_reasons.")


def reasons_mask(row: dict[str, str]) -> str | None:
    """The active reasons as the bitmask the probe reads, from the per-reason columns
    ('Active' / 'Not Active'); None where there are none."""
    named = [(bit, name) for bit, name in probe.REASON_BITS
             if "clocks_event_reasons." + name in row]
    if not named:
        return None
    return hex(sum(bit for bit, name in named
                   if row["clocks_event_reasons." + name] == "Active"))


def rows(text: str, fields: list[str] | None = None) -> list[dict[str, str]]:
    """A capture's rows by canonical field name: its header names them (else `fields`)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and all(is_field_name(cell.strip()) for cell in lines[0].split(",")):
        fields = [cell.strip() for cell in lines.pop(0).split(",")]
    if fields is None:
        return []
    out = probe.parse_smi_csv("\n".join(lines), [canonical(f) for f in fields])
    for row in out:
        for field, others in ALSO.items():
            if probe.smi_value(row.get(field, "")) is None:
                found = next((row[o] for o in others if probe.smi_value(row.get(o, ""))), None)
                if found is not None:
                    row[field] = found
        if probe.smi_value(row.get("clocks_event_reasons.active", "")) is None:
            mask = reasons_mask(row)
            if mask is not None:
                row["clocks_event_reasons.active"] = mask
    return out


def gpu_rows(text: str, fields: list[str] | None = None) -> list[dict[str, object]]:
    return [probe.gpu_row(row) for row in rows(text, fields)]


def app_rows(text: str, fields: list[str] | None = None) -> list[dict[str, object]]:
    return [probe.app_row(row) for row in rows(text, fields)]
