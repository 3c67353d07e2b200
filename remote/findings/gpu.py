"""Findings about the GPUs (gpu.*): unreadable, lost, throttled, busy without clock, Xids,
VRAM held by zombies, idle under a running run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..model.finding import Finding, Severity
from ..model.history import HostHistory, same_gpu
from ..model.processes import gpus_of
from ..model.snapshot import GPU_ERRORS, GpuSample, HostSnapshot
from ..model.xid_catalog import CATALOG, CATALOG_VERSION, xid_advice
from ..units import duration
from ..units import mib as mib_words
from .base import (
    gpu_at,
    live_runs,
    recent,
    rule,
    slow_start_likely,
    sustained,
)
from .diagnosis import new_kernel_events, xid_gpu
from .zombies import zombie_holders


def _known_gpu_text(gpu: Mapping[str, Any]) -> str:
    return f"GPU {gpu.get('index')}" + (f" ({gpu['pci']})" if gpu.get("pci") else "")


@rule({"gpu.query_failed": ("U22", "U17")})
def gpu_query_failed(history: HostHistory) -> Iterable[Finding]:
    """U22, U17: GPUs that cannot be read are not "no GPU". Critical where the host had GPUs
    (its history, or /dev/nvidia* on the box): a cron job at 3 am must not call it healthy."""
    now = history.current
    err = now.gpu_error if now is not None else None
    if err is None or err.kind in ("driver_mismatch", "gpu_lost"):
        return
    # GPUs this host is known to have: seen before, or /dev/nvidia* on the box. Runs in its
    # config alone (a GPU tool missing: gpu_error not_found) make it a warning: they may train
    # on CPUs.
    had = bool(history.known_gpus) or err.devices is True
    took = f" after {err.query_s:.1f} s" if err.query_s is not None else ""
    if err.kind == "timeout" and slow_start_likely(history):
        # Without persistence mode the GPUs initialise again once their last process exits,
        # which takes seconds: a slow query right after a run ended is that, not a hang.
        yield Finding(
            "gpu.query_failed", Severity.WARNING,
            f"nvidia-smi did not answer{took} on {history.name}, whose GPUs run without "
            f"persistence mode: each query after the last CUDA process exits initialises them "
            f"again; enable `nvidia-persistenced` (or `sudo nvidia-smi -pm 1`) — if it keeps "
            f"timing out, the driver may be hung (look for Xid lines in `dmesg`)",
            evidence={"kind": err.kind, "message": err.message, "query_s": err.query_s,
                      "had_gpus": len(history.known_gpus), "persistence": False})
        return
    what = {"timeout": "did not answer", "driver_not_loaded": "cannot reach the NVIDIA driver",
            "no_devices": "found no GPU"}.get(err.kind, "failed")
    yield Finding(
        "gpu.query_failed", Severity.CRITICAL if had else Severity.WARNING,
        f"the GPUs of {history.name} could not be read: nvidia-smi {what}{took} "
        f"({err.message}); {err.meaning.fix or GPU_ERRORS['failed'].fix}",
        evidence={"kind": err.kind, "message": err.message, "query_s": err.query_s,
                  "had_gpus": len(history.known_gpus), "dev_nvidia": err.devices})


@rule({"gpu.driver_mismatch": ("U22",)})
def gpu_driver_mismatch(history: HostHistory) -> Iterable[Finding]:
    """After an unattended driver upgrade the loaded kernel module and the new library differ:
    running CUDA processes go on, every new one (a relaunch too) fails until a reboot."""
    now = history.current
    err = now.gpu_error if now is not None else None
    if err is None or err.kind != "driver_mismatch":
        return
    yield Finding(
        "gpu.driver_mismatch", Severity.CRITICAL,
        f"the NVIDIA driver on {history.name} was upgraded under the running one ({err.message})"
        f": runs already on the GPUs may go on, but every new CUDA process, a relaunch too, "
        f"fails until the box is rebooted (or the nvidia kernel modules are reloaded)",
        evidence={"kind": err.kind, "message": err.message, "query_s": err.query_s})


@rule({"gpu.persistence_off": ("U17",)})
def gpu_persistence_off(history: HostHistory) -> Iterable[Finding]:
    """Persistence mode off: the driver tears the GPUs down when no process holds them, so
    every nvidia-smi or NVML start initialises them again (2 to 30 s on 8-GPU boxes, in public
    reports) and polls run into their deadline. Info, or a warning when this poll's GPU query
    was slow."""
    now = history.current
    if now is None:
        return
    off = [g.index for g in now.gpus if g.persistence is False]
    if not off:
        return
    took = now.gpu_query_s
    slow = took is not None and took >= history.thresholds.persistence_slow_s
    which = "every GPU" if len(off) == len(now.gpus) else "GPU " + ", ".join(map(str, off))
    cost = f" (this poll's GPU query took {took:.1f} s)" if took is not None else ""
    yield Finding(
        "gpu.persistence_off", Severity.WARNING if slow else Severity.INFO,
        f"persistence mode is off on {which} of {history.name}: each nvidia-smi or NVML call "
        f"initialises the GPUs again{cost}; run `sudo systemctl enable --now "
        f"nvidia-persistenced` (or `sudo nvidia-smi -pm 1`) on the box",
        evidence={"gpus": off, "gpu_query_s": took})


@rule({"gpu.lost": ("U22",)})
def gpu_lost(history: HostHistory) -> Iterable[Finding]:
    """U22: a GPU fell off the bus or is lost: fewer GPUs than this host had since it booted,
    or nvidia-smi's "Unable to determine the device handle" / "GPU is lost"."""
    now = history.current
    if now is None:
        return
    err = now.gpu_error
    if err is not None and err.kind != "gpu_lost":
        return  # nothing was listed: gpu.query_failed or gpu.driver_mismatch says why
    gone = [gpu for gpu in history.known_gpus.values()
            if not any(same_gpu(gpu, g) for g in now.gpus)]
    if not gone and err is None:
        return
    names = ", ".join(_known_gpu_text(g) for g in sorted(gone, key=lambda g: g["index"]))
    said = f" (nvidia-smi: {err.message})" if err is not None else ""
    subject = names or "a GPU"
    yield Finding(
        "gpu.lost", Severity.CRITICAL,
        f"{subject} of {history.name} is gone{said}: it fell off the bus or was lost, and what "
        f"ran on it is dead or stuck; it comes back only with a reboot — drain the box or "
        f"re-rent it if it happens again",
        gpu=gone[0]["index"] if len(gone) == 1 else None,
        evidence={"gone": gone, "listed": len(now.gpus), "had": len(history.known_gpus),
                  "lost_lines": list(err.lost) if err is not None else []})


def held_back(gpu: GpuSample) -> str:
    """Why a busy GPU runs slow, from its active clock-event reasons, and what lifts it: the
    reason named where the driver says one (U23), else the input pipeline (U21, U24)."""
    reasons = set(gpu.throttle_reasons or ())
    if "hw_power_brake_slowdown" in reasons:
        return ("the hardware power brake holds it back (the power supply or the chassis asked) "
                "— only the box's provider can lift it")
    if reasons & {"hw_thermal_slowdown", "sw_thermal_slowdown"}:
        temp = f" at {gpu.temp_c} °C" if gpu.temp_c is not None else ""
        return f"it is held back for heat{temp} — check the box's cooling and airflow"
    if "sw_power_cap" in reasons:
        limit = f" of {gpu.power_limit_w:.0f} W" if gpu.power_limit_w else ""
        return (f"it is held at its power limit{limit} (sw_power_cap) — `nvidia-smi -q -d "
                "POWER` shows the default and max limits; `sudo nvidia-smi -pl WATTS` raises it, "
                "or ask the box's owner")
    if "hw_slowdown" in reasons:
        return ("the board slows it down itself (hw_slowdown: power or heat) — `nvidia-smi -q -d "
                "PERFORMANCE` says which; if it stays, ask the box's provider")
    if gpu.throttle_reasons is None:
        return ("it is underfed or throttled, not busy — check its throttle reasons and the "
                "input pipeline")
    return ("nothing throttles it, so it is underfed, not busy — the input pipeline (data "
            "loader workers, CPU, disk) cannot keep it fed")


@rule({"gpu.util_without_clock": ("U21",)})
def gpu_util_without_clock(history: HostHistory) -> Iterable[Finding]:
    """U21: "100% util" means a kernel ran, not that the SMs were busy. Busy util with the SM
    clock or power far below max, in every one of the last sustain_polls snapshots (one
    snapshot never says so: with cron `--once`, the stored previous poll and this one)."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        def starved(snap: HostSnapshot, index: int = gpu.index) -> bool:
            g = gpu_at(snap, index)
            if g is None or g.util_pct is None or g.util_pct < th.util_busy_pct:
                return False
            clock, power = _clock_ratio(g), _power_ratio(g)
            return ((clock is not None and clock < th.clock_low_ratio)
                    or (power is not None and power < th.power_low_ratio))

        snaps = sustained(history, starved)
        if snaps is None:
            continue
        clock, power = _clock_ratio(gpu), _power_ratio(gpu)
        what = " and ".join(x for x in (
            f"its SM clock is {clock:.0%} of max" if clock is not None else "",
            f"its power {power:.0%} of the limit" if power is not None else "") if x)
        span = _span(snaps)
        yield Finding(
            "gpu.util_without_clock", Severity.WARNING,
            f"GPU {gpu.index} reports {gpu.util_pct:.0f}% util but {what} over {len(snaps)} "
            f"polls ({duration(span)}): {held_back(gpu)}",
            gpu=gpu.index,
            evidence={"polls": len(snaps), "span_s": span,
                      "util_pct": [gpu_at(x, gpu.index).util_pct for x in snaps],
                      "sm_clock_mhz": [gpu_at(x, gpu.index).sm_clock_mhz for x in snaps],
                      "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
                      "power_w": [gpu_at(x, gpu.index).power_w for x in snaps],
                      "power_limit_w": gpu.power_limit_w,
                      "clock_ratio": clock, "power_ratio": power})


def _clock_ratio(g: Any) -> float | None:
    if g.sm_clock_mhz is None or not g.sm_clock_max_mhz:
        return None
    return float(g.sm_clock_mhz / g.sm_clock_max_mhz)


def _power_ratio(g: Any) -> float | None:
    if g.power_w is None or not g.power_limit_w:
        return None
    return float(g.power_w / g.power_limit_w)


def _span(snaps: list[HostSnapshot]) -> float:
    first, last = snaps[0].taken_at, snaps[-1].taken_at
    return 0.0 if first is None or last is None else last - first


@rule({"gpu.throttled": ("U23",)})
def gpu_throttled(history: HostHistory) -> Iterable[Finding]:
    """U23: thermal / power-brake / hardware slowdowns steal 25–40% with no error. The reasons
    active in every one of the last sustain_polls snapshots; sw_power_cap alone is info (a GPU
    at its power cap under full load), anything thermal or hardware is a warning."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    for gpu in now.gpus:
        snaps = recent(history)
        if len(snaps) < max(1, th.sustain_polls):
            continue
        common: set[str] | None = None
        for snap in snaps:
            g = gpu_at(snap, gpu.index)
            active = set(g.throttle_reasons or ()) if g is not None else set()
            common = active if common is None else common & active
        reasons = sorted((common or set()) & set(th.throttle_reasons))
        if not reasons:
            continue
        info = set(reasons) <= set(th.throttle_info_only)
        hot = f" at {gpu.temp_c} °C" if gpu.temp_c is not None else ""
        clock = _clock_ratio(gpu)
        at = f", SM clock {clock:.0%} of max" if clock is not None else ""
        todo = ("normal at full load unless the clock is far below max" if info else
                "a tenant cannot fix cooling or power: expect 25-40% less throughput, or "
                "re-rent a healthier box")
        yield Finding(
            "gpu.throttled", Severity.INFO if info else Severity.WARNING,
            f"GPU {gpu.index} is throttled ({', '.join(reasons)}{hot}{at}) over {len(snaps)} "
            f"polls: {todo}",
            gpu=gpu.index,
            evidence={"reasons": reasons, "polls": len(snaps), "temp_c": gpu.temp_c,
                      "sm_clock_mhz": gpu.sm_clock_mhz, "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
                      "power_w": gpu.power_w, "power_limit_w": gpu.power_limit_w})


XID_MEANING = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing",
    45: "preemptive cleanup after another error",
    48: "double-bit ECC error: the GPU's memory is bad",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remapping",
    64: "ECC row remapping failure",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the application was killed",
    95: "uncontained ECC error: reset the GPU",
    119: "GSP RPC timeout: the GPU needs a reset",
    120: "GSP error: the GPU needs a reset",
}


@rule({"gpu.xid": ("U22",)})
def gpu_xid(history: HostHistory) -> Iterable[Finding]:
    """U22: NVIDIA Xids in the kernel log — only those new since the previous poll (same boot;
    deduplicated by time and message), so each is reported once. 48 and 79 (thresholds
    xid_critical) mean a dead GPU: critical, re-rent; the others are warnings."""
    now = history.current
    if now is None:
        return
    before = history.previous
    events = [e for e in new_kernel_events(before, now) if e.kind == "xid"]
    by_gpu: dict[int | None, list[Any]] = {}
    for e in events:
        by_gpu.setdefault(xid_gpu(e, now), []).append(e)
    # The probe lists only the last few Xid lines but counts them all: a code whose count
    # rose without a listed line (a burst of later ones pushed it out) still counts.
    old_counts = dict(before.xid_counts) if before is not None and before.boot_id == \
        now.boot_id and "kernel" not in before.section_errors else {}
    if before is not None and before.xid_counts_partial:
        # Its counts covered only the newest lines of a storm (the box sent them raw): a code
        # it had was reported then, and its count now rising is the older lines, not new ones.
        old_counts.update((c, n) for c, n in now.xid_counts.items() if c in old_counts)
    listed = {e.xid for e in events}
    unlisted = sorted(c for c, n in now.xid_counts.items()
                      if n > old_counts.get(c, 0) and c not in listed)
    if unlisted and not by_gpu:
        by_gpu[None] = []
    critical = set(history.thresholds.xid_critical)
    for gpu, found in by_gpu.items():
        extra = unlisted if len(by_gpu) == 1 else []
        codes = sorted({e.xid for e in found if e.xid is not None} | set(extra))
        dead = [c for c in codes if c in critical]
        worst = dead[0] if dead else codes[-1] if codes else None
        where = f"GPU {gpu}" if gpu is not None else (
            found[-1].pci if found and found[-1].pci else "a GPU")
        said = []
        for code in ([worst] if worst is not None else []) + [c for c in codes if c != worst]:
            advice = xid_advice(code)
            raw = next((e.message for e in reversed(found) if e.xid == code and e.message), None)
            said.append(advice.words() + (f" (the line: {raw[:120]})" if advice.action is None
                                          and raw else ""))
        pids = sorted({e.pid for e in found if e.pid is not None})
        run = _xid_run(now, pids, gpu)
        whose = f" (run {run})" if run else ""
        todo = (" — the GPU is dead: stop the instance and re-rent another box" if dead else "")
        yield Finding(
            "gpu.xid", Severity.CRITICAL if dead else Severity.WARNING,
            f"{where}{whose} logged " + "; ".join(said) + todo,
            gpu=gpu, run=run,
            evidence={"xids": codes, "count": len(found) + len(extra),
                      "pci": found[-1].pci if found else None, "pids": pids,
                      "actions": {str(c): CATALOG.get(c) for c in codes},
                      "catalog": CATALOG_VERSION,
                      "messages": [e.message for e in found[-3:]],
                      "at": [e.at for e in found[-3:]]})


def _xid_run(now: HostSnapshot, pids: list[int], gpu: int | None) -> str | None:
    """The run an Xid is about: the one whose process the line names (Xid 13, 31, 43 and
    others carry a pid), else the one whose process holds that GPU."""
    by_pid = {p.pid: p.run for p in now.processes if p.run}
    for pid in pids:
        if by_pid.get(pid):
            return by_pid[pid]
    if gpu is None:
        return None
    runs = {by_pid.get(app.pid) for app in now.gpu_processes if app.gpu_index == gpu} - {None}
    return next(iter(sorted(r for r in runs if r))) if len(runs) == 1 else None


@rule({"gpu.vram_zombie": ("U11",)})
def gpu_vram_zombie(history: HostHistory) -> Iterable[Finding]:
    """U11: VRAM held by a process that is defunct, orphaned from a dead run, in another PID
    namespace, or by nobody visible (see remote/findings/zombies.py); one finding per GPU."""
    per_gpu: dict[int | None, list[Any]] = {}
    for z in history.zombies if history.zombies is not None else zombie_holders(history):
        per_gpu.setdefault(z.gpu_index, []).append(z)
    for gpu, holders in per_gpu.items():
        mib = sum(z.gpu_mem_mib or 0 for z in holders)
        first = holders[0]
        more = f" (+{len(holders) - 1} more)" if len(holders) > 1 else ""
        where = f"GPU {gpu}" if gpu is not None else "a GPU"
        yield Finding(
            "gpu.vram_zombie", Severity.WARNING,
            f"{where}: {mib_words(mib) if mib else 'memory'} held by "
            + (f"pid {first.pid} ({first.reason})" if first.pid is not None
               else "no visible process") + f"{more}: {first.explanation}",
            gpu=gpu,
            evidence={"holders": [z.to_json() for z in holders], "mem_mib": mib,
                      "signallable": [z.pid for z in holders if z.signallable]})


@rule({"gpu.idle_while_running": ("U38", "U24")})
def gpu_idle_while_running(history: HostHistory) -> Iterable[Finding]:
    """U38, U24: a run is alive but its GPUs sat near 0% util for idle_while_running_s (and at
    least sustain_polls polls). Steps still advancing: data-bound; not: hung or waiting."""
    th = history.thresholds
    for now, _at, sample in live_runs(history):
        for gpu in sorted(gpus_of(sample.pids, now)):
            idle: list[HostSnapshot] = []
            for snap in reversed(history.snapshots):
                if snap.boot_id != now.boot_id:
                    break
                run = next((r for r in snap.runs if r.name == sample.name), None)
                g = gpu_at(snap, gpu)
                if run is None or not run.pids or g is None or g.util_pct is None \
                        or g.util_pct > th.idle_util_pct:
                    break
                idle.append(snap)
            idle.reverse()
            if len(idle) < max(2, th.sustain_polls):
                continue
            span = _span(idle)
            if span < th.idle_while_running_s:
                continue
            stepping = any(r.new_points() for snap in idle[1:] for r in snap.runs
                           if r.name == sample.name)
            todo = ("its steps still advance, so it is starved by data loading: raise "
                    "num_workers, pin_memory, prefetch" if stepping else
                    "and no new steps: it is hung or waiting — check its log or py-spy dump")
            yield Finding(
                "gpu.idle_while_running", Severity.WARNING,
                f"GPU {gpu} of run {sample.name} has been near 0% util for {duration(span)} "
                f"while the run is alive; {todo}",
                gpu=gpu, run=sample.name,
                evidence={"span_s": span, "polls": len(idle), "steps_advancing": stepping,
                          "util_pct": [gpu_at(x, gpu).util_pct for x in idle]})
