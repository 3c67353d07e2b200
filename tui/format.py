"""Small formatting helpers shared by the widgets: bars, sparklines, evidence in words (sizes
and durations are remote/units.py's, the one vocabulary of findings and panes).

Pure functions returning str or rich Text; nothing here touches Textual. Text from the box never
goes through markup here: callers build `Text` objects from it (STYLE 10), and pass it through
`visible` first, so its control characters and escape sequences show as `\x1b` and never reach
the terminal (STYLE 14).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence

from gpuwatch.remote.model.death import Diagnosis
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.units import duration, mib, size
from rich.cells import cell_len

__all__ = ["visible"]  # the one sanitiser (remote/textsafe.py), for the widgets

SEVERITY_GLYPH = {Severity.CRITICAL: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}
STATUS_GLYPH = {"ok": "●", "stale": "◌", "unreachable": "✗", "waiting": "…"}
"""A host's state: polled fine, old data, could not be polled (✗), not polled yet."""
RUN_GLYPH = {"running": "▶", "finished": "✓", "dead": "†", "unknown": "?", "left behind": "⊘"}
"""A run's status; a dead run is † so that it is never read as ✗, a host not polled."""

SPARK = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉█"

THROTTLE_MEANING = {
    # U23: what each active reason means for the person watching the run, short enough for a
    # narrow pane (the driver's own names are in docs/findings.md)
    "gpu_idle": "idle: clocks down, nothing to do",
    "applications_clocks_setting": "clocks set below max (application clocks)",
    "sw_power_cap": "power cap: at its power limit",
    "hw_slowdown": "HARDWARE SLOWDOWN: power brake or too hot",
    "hw_thermal_slowdown": "HARDWARE THERMAL SLOWDOWN: too hot",
    "hw_power_brake_slowdown": "HARDWARE POWER BRAKE: PSU or chassis",
    "sw_thermal_slowdown": "thermal slowdown: hot",
    "sync_boost": "sync boost: held to a slower GPU of its group",
    "display_clock_setting": "display clock setting",
}


FINDING_WORDS = {  # most important first: of two findings of one severity, the cell names it
    "run.dead": "run died", "run.rank_dead": "a rank died", "gpu.lost": "GPU lost",
    "gpu.query_failed": "GPUs unreadable", "gpu.driver_mismatch": "driver mismatch",
    "host.unreachable": "unreachable", "host.cgroup_oom": "OOM-killed",
    "run.loss_nan": "loss is NaN", "run.hung": "hung", "run.diverging": "diverging",
    "gpu.xid": "GPU error (Xid)", "run.stalled": "stalled", "gpu.vram_zombie": "VRAM zombie",
    "disk.full_soon": "disk full soon", "disk.low": "disk low", "disk.inodes_low": "inodes low",
    "host.rebooted": "rebooted", "gpu.util_without_clock": "busy, low clock",
    "gpu.throttled": "throttled", "gpu.idle_while_running": "GPU idle",
    "run.sighup_risk": "dies at logout", "host.kill_user_processes": "logout kills runs",
    "ckpt.overdue": "checkpoint overdue", "run.log_buffered": "log silent",
    "ckpt.tmp_leftover": "partial checkpoint", "run.events_empty": "no events",
    "run.code_changed": "code changed", "host.cpu_oversubscribed": "CPU oversubscribed",
    "gpu.persistence_off": "persistence off", "run.slowed": "slowed",
    "run.overfitting": "overfitting", "run.loss_spike": "loss spikes", "run.plateau": "plateau",
}
"""A finding's code in a few words, for a cell that names a host's worst problem."""


def finding_words(finding: Finding) -> str:
    """A finding in a few words: FINDING_WORDS', and for a dead run the cause where it is
    known ("run died: OOM-killed"), in the words of the diagnosis the host view shows whole."""
    words = FINDING_WORDS.get(finding.code, finding.code)
    said = finding.evidence.get("diagnosis") if finding.code == "run.dead" else None
    if isinstance(said, Mapping):
        diagnosis = Diagnosis.from_state(said)
        cause = diagnosis.words if diagnosis is not None else None
        if cause:
            words = f"{words}: {visible(cause)}"
    return words


PUNCTUATION = ":,;·("
"""What a cut leaves off the end of its last word ("driver mismatch…", not "mismatch:…")."""


def fit_words(text: str, width: int, suffix: str = "") -> str:
    """`text` then `suffix` ("+2") in `width` cells: where it is too long, whole words go from
    the end and "…" says so, the suffix kept; a word is cut only where it stands alone, and a
    number never (the words are ordered most important first)."""
    if cell_len(text + suffix) <= width:
        return text + suffix
    room = width - cell_len(suffix) - 1
    words = text.split(" ")
    while len(words) > 1 and cell_len(" ".join(words).rstrip(PUNCTUATION)) > room:
        words.pop()
    kept = " ".join(words)
    if len(words) > 1:
        kept = kept.rstrip(PUNCTUATION)
    elif cell_len(kept) > room:
        if any(c.isdigit() for c in kept):
            return "…" + suffix
        while kept and cell_len(kept) > room:
            kept = kept[:-1]
    return kept + "…" + suffix


def human_count(n: float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("", "k", "M", "G", "T"):
        if abs(value) < 1000 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}T"


human_age = duration
"""The one duration vocabulary (remote/units.py); this name is kept for tui/state.py and
screens/fleet.py until they import gpuwatch.remote.units themselves."""


def pct(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return max(0.0, min(100.0, 100.0 * part / whole))


def sparkline(values: Sequence[float | None], width: int, lo: float = 0.0,
              hi: float = 100.0) -> str:
    """The last `width` values as block characters on a fixed lo..hi scale (None: a blank)."""
    tail = list(values)[-width:] if width > 0 else []
    span = (hi - lo) or 1.0
    out = []
    for v in tail:
        if v is None or math.isnan(v):
            out.append(" ")
            continue
        idx = int((min(hi, max(lo, v)) - lo) / span * (len(SPARK) - 1) + 0.5)
        out.append(SPARK[idx])
    return "".join(out).rjust(width)


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar `width` cells wide filled to `fraction` (eighth-cell resolution)."""
    if fraction is None or width <= 0:
        return " " * max(0, width)
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part] if part else "")
    return text.ljust(width)[:width]


def level_char(value: float | None) -> str:
    """One block character for 0..100 (a GPU at a glance in the fleet table)."""
    if value is None:
        return "·"
    return SPARK[int(min(100.0, max(0.0, value)) / 100 * (len(SPARK) - 1) + 0.5)]


def ema(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: a debiased exponential moving average; non-finite values pass
    through unsmoothed (a NaN loss must stay visible), weight 0 is the raw series."""
    if weight <= 0:
        return list(values)
    out: list[float] = []
    last, n = 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight ** n))
    return out


# -- a finding's evidence, in words and numbers (never a Python dict on screen) --------------
UNIT_SUFFIXES = (("_mib", "mib"), ("_bytes", "bytes"), ("_pct", "pct"), ("_mhz", "mhz"),
                 ("_s", "s"), ("_at", "at"), ("_w", "w"), ("_c", "c"))
LIST_SHOWN = 6
"""Items of a list shown before "+N more"."""
WORDS_ID = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
"""A code's shape (sw_power_cap): lower-case words joined by underscores."""
CODE_KEYS = frozenset({"cause", "reason", "reasons", "throttle_reasons", "kind"})
"""Keys whose values are gpuwatch's own codes (sw_power_cap, oom_cgroup): shown as words. A
tag, a path or a command is shown as it is."""
KEY_WORDS = {"signallable": "pids a signal can free", "oom_kill_before": "OOM kills before",
              "oom_kill_now": "OOM kills now"}
"""Keys whose name alone does not say it to a person ("signallable 13767")."""


HIDDEN_KEYS = frozenset({"start_ticks", "explanation", "uid", "uuid"})
"""Evidence for the JSON and the store, not for a person: a pid's start in clock ticks, a
holder's explanation (the finding's sentence already says it), ids."""


def _unit_of(key: str) -> tuple[str, str | None]:
    if key == "bytes":
        return "size", "bytes"
    if key.startswith("bytes_"):  # bytes_free, bytes_total
        return key[len("bytes_"):], "bytes"
    if key in CODE_KEYS:
        return key, "code"
    if key == "at":  # an epoch: when it happened
        return key, "at"
    if key.endswith("_ratio"):  # clock_ratio 0.35: the clock at 35% of its maximum
        return key[: -len("_ratio")], "ratio"
    for suffix, unit in UNIT_SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], unit
    return key, None


def _value_words(value: object, unit: str | None) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "?"
    if isinstance(value, Mapping):
        return "(" + ", ".join(f"{_unit_of(k)[0].replace('_', ' ')} "
                               f"{_value_words(v, _unit_of(k)[1])}"
                               for k, v in _flat(value) if v is not None) + ")"
    if isinstance(value, list | tuple):
        shown = ", ".join(_value_words(v, unit) for v in value[:LIST_SHOWN])
        more = len(value) - LIST_SHOWN
        return shown + (f" (+{more} more)" if more > 0 else "")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if unit == "s":
            return duration(float(value))
        if unit == "at":
            return time.strftime("%H:%M:%S", time.localtime(value))
        if unit == "bytes":
            return size(value)
        if unit == "mib":
            return mib(value)
        if unit == "pct":
            return f"{value:.0f}%"
        if unit == "ratio":
            return f"{value * 100:.0f}% of max"
        if unit == "mhz":
            return f"{value:.0f} MHz"
        if unit == "w":
            return f"{value:.0f} W"
        if unit == "c":
            return f"{value:.0f}°C"
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if unit == "code" and isinstance(value, str) and WORDS_ID.fullmatch(value):
        return value.replace("_", " ")  # sw_power_cap, oom_cgroup: a code, said as words
    return str(value)


def _flat(evidence: Mapping[str, object]) -> list[tuple[str, object]]:
    """The (key, value) pairs, a nested mapping's pairs in its place ({"diagnosis": {"cause":
    ..., "evidence": {...}}} is read as its items), a pair said twice once."""
    out: list[tuple[str, object]] = []
    for key, value in evidence.items():
        if key in HIDDEN_KEYS:
            continue
        if isinstance(value, Mapping) and value:
            for pair in _flat(value):
                if pair not in out:
                    out.append(pair)
        elif (key, value) not in out:
            out.append((str(key), value))
    return out


def evidence_words(evidence: Mapping[str, object]) -> str:
    """A finding's evidence as "polls 2 · span 2 s · SM clock 724, 742 MHz": keys in words,
    values in their units (seconds as ages, MiB as GiB, epochs as clock times)."""
    parts = []
    for key, value in _flat(evidence):
        if value is None or value == [] or value == ():
            continue
        name, unit = _unit_of(key)
        name = KEY_WORDS.get(key, name.replace("_", " "))
        parts.append(f"{name} {_value_words(value, unit)}")
    return visible(" · ".join(parts))


# -- plot axes: integer steps, clock times -----------------------------------------------------
TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400)


def step_ticks(lo: float, hi: float, count: int) -> list[int]:
    """About `count` whole steps between lo and hi, at a round interval (1, 2, 5 x 10^n): a step
    axis never reads 21.8 or 42.5."""
    count = max(2, count)
    span = max(1.0, hi - lo)
    raw = span / (count - 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    interval = next((m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw),
                    10 * magnitude)
    interval = max(1, int(interval))
    first = math.ceil(lo / interval) * interval
    return list(range(int(first), int(hi) + 1, interval)) or [round(lo)]


def time_ticks(lo: float, hi: float, count: int) -> tuple[list[float], list[str]]:
    """About `count` clock times (epoch s) between lo and hi at a round interval, labelled as
    this computer's time of day: HH:MM, with seconds where the interval is under a minute."""
    count = max(2, count)
    raw = max(1.0, hi - lo) / (count - 1)
    interval = next((s for s in TIME_STEPS_S if s >= raw), TIME_STEPS_S[-1])
    first = math.ceil(lo / interval) * interval
    ticks = [float(t) for t in range(int(first), int(hi) + 1, interval)] or [lo]
    fmt = "%H:%M:%S" if interval < 60 else "%H:%M" if interval < 86400 else "%d %b"
    return ticks, [time.strftime(fmt, time.localtime(t)) for t in ticks]
