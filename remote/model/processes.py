"""A snapshot's process table read as a tree: descendants, the GPUs processes hold, a
multi-process run's ranks. Pure functions of one HostSnapshot, used by the history (which runs
died, and which of their ranks) and by the rules; each process's CPU% between two snapshots.
Also what a VRAM zombie holder is."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .snapshot import HostSnapshot, ProcessInfo

DETACH_SERVERS = ("tmux", "screen", "SCREEN")
"""The terminal multiplexers whose sessions outlive an SSH session (U2, seed 000)."""


def process_table(snap: HostSnapshot) -> dict[int, ProcessInfo]:
    return {p.pid: p for p in snap.processes}


def ancestry(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> list[ProcessInfo]:
    """The parent, its parent, ... as far as the process table reaches (loop-safe)."""
    chain, seen = [], {proc.pid}
    parent = table.get(proc.ppid)
    while parent is not None and parent.pid not in seen:
        seen.add(parent.pid)
        chain.append(parent)
        parent = table.get(parent.ppid)
    return chain


def dies_with_session(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> bool:
    """Seed 000: dies when its terminal hangs up (the SSH session that started it drops) — a
    controlling tty, SIGHUP neither ignored (nohup) nor caught, and no tmux/screen above it
    (setsid leaves no tty: tty_nr 0). THE one definition: run.sighup_risk, the diagnosis of a
    death, and a relaunch's verification all ask it."""
    if not proc.has_tty or proc.sighup_ignored or proc.sighup_caught:
        return False
    return not any(a.comm.startswith(DETACH_SERVERS) for a in ancestry(proc, table))


def descendants(pids: Iterable[int], snap: HostSnapshot) -> list[ProcessInfo]:
    """The processes `pids` and everything below them in the snapshot's table."""
    table = process_table(snap)
    children: dict[int, list[int]] = {}
    for p in snap.processes:
        children.setdefault(p.ppid, []).append(p.pid)
    out, stack, seen = [], [p for p in pids if p in table], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(table[pid])
        stack.extend(children.get(pid, ()))
    return out


def gpus_of(pids: Iterable[int], snap: HostSnapshot) -> set[int]:
    """GPU indexes the processes (and their children) hold: the driver's attribution, else
    their /dev/nvidiaN minors."""
    gpus: set[int] = set()
    for p in descendants(pids, snap):
        if p.gpu_index is not None:
            gpus.add(p.gpu_index)
        gpus.update(p.nvidia_devs or ())
    known = {g.index for g in snap.gpus}
    return gpus & known if known else gpus


def ranks(pids: Iterable[int], snap: HostSnapshot) -> list[int]:
    """Seed 002: the run's processes that are ranks, not dataloader workers. A rank holds a
    CUDA context (the driver lists it); without the driver's list, a process with /dev/nvidia*
    open, else any, whose parent is not a run process with the same command line (a forked
    worker has its parent's, and its open files too)."""
    table = process_table(snap)
    procs = [table[p] for p in pids if p in table]
    listed = [p.pid for p in procs if p.gpu_index is not None]
    if listed:
        return listed
    run_pids = {p.pid for p in procs}
    forked = {p.pid for p in procs if p.ppid in run_pids and table[p.ppid].cmd == p.cmd}
    # A run's processes include all its descendants (probe.match_runs): a helper it starts
    # (a tracker's service, a git call) is no rank. Those with /dev/nvidia* open are.
    holding = [p.pid for p in procs if p.nvidia_devs and p.pid not in forked]
    return holding or [p.pid for p in procs if p.pid not in forked]


def one_job(dead: list[int], alive: list[int], pids: Iterable[int],
             snap: HostSnapshot) -> tuple[list[int], list[int]]:
    """Seed 002 needs the dead rank and the survivors to be ranks of one job: the dead ranks
    that share a launcher (the top of their tree among the run's processes) or a session with
    a survivor, and those survivors. Two `train.py` a loose `process` pattern matched in two
    folders are two jobs: one ending leaves the other no collective to hang in."""
    table = process_table(snap)
    members = set(pids)

    def job(pid: int) -> set[tuple[str, int]]:
        top, seen = pid, {pid}
        while top in table and table[top].ppid in members and table[top].ppid not in seen:
            top = table[top].ppid
            seen.add(top)
        return {("launcher", top)} | ({("session", table[pid].session)} if pid in table else set())

    jobs = {pid: job(pid) for pid in [*dead, *alive]}
    return ([d for d in dead if any(jobs[d] & jobs[a] for a in alive)],
            [a for a in alive if any(jobs[d] & jobs[a] for d in dead)])


MIN_CPU_SPAN_S = 0.5
"""The shortest span between two polls that CPU% is worked out over: the box counts CPU time in
clock ticks (10 ms), so a shorter span says more about the ticks than about the process."""


def cpu_pct(before_s: float | None, now_s: float | None, span_s: float | None,
            cap: float | None = None) -> float | None:
    """CPU% of one process over `span_s` seconds in which its CPU time went from before_s to
    now_s (100 = one core busy throughout), at most `cap`. None where a figure is missing, the
    span too short, or the CPU time went back (not the same process: a figure made of it
    would be garbage)."""
    if before_s is None or now_s is None or span_s is None or not span_s >= MIN_CPU_SPAN_S:
        return None
    used = now_s - before_s
    if not used >= 0:
        return None
    pct = 100.0 * used / span_s
    if not math.isfinite(pct):
        return None
    return min(pct, cap) if cap is not None else pct


def with_cpu_pct(before: HostSnapshot | None, now: HostSnapshot) -> HostSnapshot:
    """`now`, its processes' cpu_pct set from the CPU time each used since `before` over the
    box's uptime between the two process tables. A process is the same one only with the same
    pid AND start time on the same boot (pids are reused); any other is seen for the first
    time (None). Capped at 100 per core of the box: reading the table takes a moment, so a
    process busy on every core can come out a little over."""
    if before is None or not now.processes:
        return now
    span = None
    if before.boot_id == now.boot_id and before.processes_uptime_s is not None \
            and now.processes_uptime_s is not None:
        span = now.processes_uptime_s - before.processes_uptime_s
    seen = {(p.pid, p.start_ticks): p.cpu_s for p in before.processes} if span else {}
    cap = 100.0 * now.ncpu if now.ncpu is not None and now.ncpu > 0 else None
    procs = tuple(
        replace(p, cpu_pct=pct) if (pct := cpu_pct(seen.get((p.pid, p.start_ticks)), p.cpu_s,
                                                    span, cap)) != p.cpu_pct else p
        for p in now.processes)
    changed = any(a is not b for a, b in zip(procs, now.processes, strict=True))
    return replace(now, processes=procs) if changed else now


@dataclass(frozen=True, slots=True)
class ZombieHolder:
    """One holder of VRAM that does no work, and how (or whether) it can be freed."""

    pid: int | None  # None: `unattributed` (memory with no process at all)
    start_ticks: int | None  # None: not visible in /proc (invisible, unattributed)
    user: str | None
    gpu_index: int | None
    gpu_mem_mib: int | None  # None: holds /dev/nvidiaN but the driver gave no figure
    cmd: str
    reason: str  # one of REASONS
    signallable: bool  # False: signalling this pid cannot free it (see explanation)
    explanation: str  # one sentence: what we saw and what to do
    parent_pid: int | None = None  # defunct: the parent that must reap it (None: init)
    run: str | None = None  # the configured run it belonged to, if any

    @property
    def key(self) -> tuple[int | None, int | None, int | None]:
        return (self.pid, self.start_ticks, self.gpu_index)

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "user": self.user,
                "gpu": self.gpu_index, "gpu_mem_mib": self.gpu_mem_mib, "cmd": self.cmd,
                "reason": self.reason, "signallable": self.signallable,
                "explanation": self.explanation, "parent_pid": self.parent_pid,
                "run": self.run}
