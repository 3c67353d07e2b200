"""Findings about the host as a whole (host.*): reachable, rebooted, its cgroup's OOM kills and
CPU quota, logind killing user processes."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.finding import Finding, Severity
from ..model.history import HostHistory
from ..model.processes import descendants
from ..model.snapshot import HostSnapshot
from ..units import duration, size
from .base import (
    rule,
    sustained,
)
from .diagnosis import new_kernel_events


@rule({"host.unreachable": ("U3", "U17")})
def host_unreachable(history: HostHistory) -> Iterable[Finding]:
    """U3, U17: a failed poll is not a dead run; say what failed and keep the last data."""
    failure = history.failure
    if failure is None:
        return
    stale = (f"; last good data is {duration(failure.at - history.last_ok_at)} old"
             if history.last_ok_at is not None else "")
    yield Finding(
        "host.unreachable", Severity.CRITICAL,
        f"{history.name} could not be polled ({failure.kind}): {failure.message}{stale}",
        evidence={"kind": failure.kind, "last_ok_at": history.last_ok_at, "at": failure.at})


@rule({"host.rebooted": ("U3",)})
def host_rebooted(history: HostHistory) -> Iterable[Finding]:
    """U3: a reboot is the most-missed cause of a vanished run: nothing in its log says so."""
    now, before = history.current, history.previous
    if now is None or before is None or not now.boot_id or not before.boot_id:
        return
    if now.boot_id != before.boot_id:
        up = f" {duration(now.uptime_s)} ago" if now.uptime_s is not None else ""
        yield Finding(
            "host.rebooted", Severity.WARNING,
            f"{history.name} rebooted{up} (boot id changed); runs that were on it died with it "
            "— check they were relaunched",
            evidence={"boot_id_before": before.boot_id, "boot_id_now": now.boot_id,
                      "uptime_s": now.uptime_s})



@rule({"host.kill_user_processes": ("seed 000",)})
def host_kill_user_processes(history: HostHistory) -> Iterable[Finding]:
    """Seed 000: logind's KillUserProcesses=yes kills every process of a session at logout —
    tmux and nohup included."""
    now = history.current
    if now is None or not now.kill_user_processes:
        return
    yield Finding(
        "host.kill_user_processes", Severity.WARNING,
        f"{history.name} has logind KillUserProcesses=yes: logging out kills even tmux and "
        "nohup runs — start runs with `systemd-run --user --scope` after `loginctl "
        "enable-linger`, or set KillUserProcesses=no",
        evidence={"kill_user_processes": True})



@rule({"host.cgroup_oom": ("U41",)})
def host_cgroup_oom(history: HostHistory) -> Iterable[Finding]:
    """U41: the cgroup's memory.events oom_kill counter rose since the previous poll (same boot,
    same cgroup): the authoritative 'was something OOM-killed here', whatever free says."""
    now, before = history.current, history.previous
    if now is None or before is None or now.boot_id != before.boot_id:
        return
    if now.cgroup is None or before.cgroup is None or now.cgroup.path != before.cgroup.path:
        return
    old, new = before.cgroup.oom_kill, now.cgroup.oom_kill
    if old is None or new is None or new <= old:
        return
    victims = [e for e in new_kernel_events(before, now) if e.kind == "oom"]
    who = (f" (the kernel log names pid {victims[-1].pid} {victims[-1].name})"
           if victims else "")
    limit = now.cgroup.memory_max_bytes
    yield Finding(
        "host.cgroup_oom", Severity.CRITICAL,
        f"the memory cgroup OOM-killed {new - old} process(es) since the last poll{who}"
        + (f" at its {size(limit)} limit" if limit else "")
        + ": lower num_workers or the per-worker footprint, or rent more memory",
        evidence={"oom_kill_before": old, "oom_kill_now": new, "cgroup": now.cgroup.path,
                  "memory_max_bytes": limit,
                  "memory_current_bytes": now.cgroup.memory_current_bytes,
                  "victims": [{"pid": e.pid, "name": e.name} for e in victims]})


@rule({"host.cpu_oversubscribed": ("U40",)})
def host_cpu_oversubscribed(history: HostHistory) -> Iterable[Finding]:
    """U40: a run's threads (its processes and their children) exceed cpu_oversubscribed_ratio
    × the cgroup's vCPU quota in every one of the last sustain_polls snapshots: torch/OpenMP
    sized their pools to the host's cores, not the slice."""
    th = history.thresholds
    now = history.current
    if now is None or now.cgroup is None or not now.cgroup.cpus:
        return
    for sample in now.runs:
        if not sample.pids:
            continue

        def threads(snap: HostSnapshot, name: str = sample.name) -> int:
            run = next((r for r in snap.runs if r.name == name), None)
            return 0 if run is None else sum(p.threads for p in descendants(run.pids, snap))

        def over(snap: HostSnapshot) -> bool:
            cpus = snap.cgroup.cpus if snap.cgroup is not None else None
            return cpus is not None and cpus > 0 and \
                threads(snap) > th.cpu_oversubscribed_ratio * cpus

        snaps = sustained(history, over)
        if snaps is None:
            continue
        cpus = now.cgroup.cpus
        n = threads(now)
        yield Finding(
            "host.cpu_oversubscribed", Severity.WARNING,
            f"run {sample.name} runs {n} threads on a {cpus:g}-vCPU cgroup quota "
            f"({n / cpus:.0f}×; the host shows {now.ncpu or '?'} cores): cap the pools — "
            f"export OMP_NUM_THREADS={max(1, int(cpus))} MKL_NUM_THREADS={max(1, int(cpus))} "
            "before launch",
            run=sample.name,
            evidence={"threads": n, "cgroup_cpus": cpus, "host_cpus": now.ncpu,
                      "polls": len(snaps)})
