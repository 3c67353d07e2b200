"""A snapshot's process table read as a tree: descendants, the GPUs processes hold, a
multi-process run's ranks. Pure functions of one HostSnapshot, used by the history (which runs
died, and which of their ranks) and by the rules. Also what a VRAM zombie holder is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .snapshot import HostSnapshot, ProcessInfo


def process_table(snap: HostSnapshot) -> dict[int, ProcessInfo]:
    return {p.pid: p for p in snap.processes}


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
