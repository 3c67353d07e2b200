"""VRAM zombies (U11): GPU memory held by something that is not doing any work.

A "zombie holder" is one of:

- ``defunct``: a process in state Z that the driver still lists with GPU memory. It cannot be
  signalled (it is already dead); its parent must reap it, so `parent_pid` names the process to
  signal (None when the parent is init: then only the driver, a GPU reset or a reboot frees it).
- ``orphaned``: a process holding GPU memory (a compute app, or a /dev/nvidiaN fd) that was
  left behind by a dead run: re-parented to init (or a subreaper) and not a session leader, or
  its run's other processes vanished — and its GPU has sat idle for several polls. A run
  started with ``setsid nohup`` also has ppid 1, but it leads its own session: not flagged for
  that alone (seed 000); nor is a shell's job (``nohup python train.py &`` with job control: a
  process group of its own) left running at logout. torchrun (torch 2.11) starts each rank in
  a session of its own: a rank whose parent is init and whose environment has
  TORCHELASTIC_RUN_ID is one its torchrun left behind (seen on a real H100).
- ``invisible``: a pid nvidia-smi lists that this box's /proc does not show (another PID
  namespace: a container, or a dead container's context) on an idle GPU nobody visible holds.
  Not signallable from here: restart the container (or reset the GPU).
- ``unattributed``: GPU memory in use on an idle GPU with no process visible at all, neither
  in the driver's list nor holding /dev/nvidiaN. Not signallable.

Never a live run's process: a configured run with a process that is not itself left behind
protects all its processes and their descendants (a run gpuwatch only discovered,
protects nothing: its processes are judged like any other). Everything but ``defunct``
needs the GPU idle (``idle_util_pct``) over ``sustain_polls`` snapshots (U21: never one
snapshot), which also rules out a neighbour container's busy job and a process caught mid-exit,
and ``orphaned`` and ``invisible`` need the holder itself seen holding in each of them.

Identity for actions: (pid, start_ticks) with the snapshot's boot id (DESIGN §4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..model.history import HostHistory
from ..model.processes import DETACH_SERVERS, ZombieHolder, ancestry
from ..model.snapshot import HostSnapshot, ProcessInfo
from ..units import mib
from .base import recent

__all__ = ["REASONS", "ZombieHolder", "left_behind_runs", "zombie_holders"]

SUBREAPERS = frozenset({"systemd", "init", "tini", "dumb-init", "docker-init", "s6-svscan",
                        "runsvdir", "supervisord"})
"""comm of what an orphan is re-parented to besides pid 1 (PR_SET_CHILD_SUBREAPER)."""

REASONS = ("defunct", "orphaned", "invisible", "unattributed")


def _gpus_held(proc: ProcessInfo) -> set[int]:
    """GPU indexes a process holds: the driver's attribution, else its /dev/nvidiaN minors
    (minor N is GPU N on a stock driver install)."""
    held = set(proc.nvidia_devs or ())
    if proc.gpu_index is not None:
        held.add(proc.gpu_index)
    return held


def _holds_gpu(proc: ProcessInfo) -> bool:
    return bool(proc.gpu_mem_mib) or proc.gpu_index is not None or bool(proc.nvidia_devs)


def _left_behind(proc: ProcessInfo, table: Mapping[int, ProcessInfo],
                 earlier: Mapping[tuple[int, int], ProcessInfo]) -> str | None:
    """Why this process looks abandoned by its parent, or None when it does not."""
    if proc.zombie:
        return None
    if any(a.comm.startswith(DETACH_SERVERS) for a in ancestry(proc, table)):
        return None  # under tmux/screen: detached on purpose
    if proc.pgrp == proc.pid and proc.session != proc.pid and not proc.elastic_rank:
        # A job of an interactive shell (`nohup python train.py &`): job control gave it a
        # process group of its own, and after logout it is re-parented to init without
        # leading a session. A rank left by its launcher is in the launcher's group.
        return None
    before = earlier.get((proc.pid, proc.start_ticks))
    if before is not None and before.ppid != proc.ppid and before.ppid not in table:
        return f"its parent {before.ppid} exited and it was re-parented to {proc.ppid}"
    parent = table.get(proc.ppid)
    to_init = proc.ppid == 1 or (parent is not None and parent.comm in SUBREAPERS)
    if to_init and proc.session != proc.pid:  # setsid nohup: a session leader, on purpose
        return f"its parent is {'init' if proc.ppid == 1 else parent and parent.comm} " \
               "and it does not lead its own session (not a setsid launch)"
    if to_init and proc.elastic_rank:  # torchrun gives each rank a session of its own
        return f"it is a torchrun rank (TORCHELASTIC_RUN_ID) and its parent is " \
               f"{'init' if proc.ppid == 1 else parent and parent.comm}: its torchrun is gone"
    return None


def _protected(snap: HostSnapshot, table: Mapping[int, ProcessInfo],
               earlier: Mapping[tuple[int, int], ProcessInfo],
               seen_before: Mapping[str, set[tuple[int, int]]]) -> set[int]:
    """Pids of live runs and their descendants: never zombies.

    A run is live unless every process it has now is left behind AND some process it had
    earlier (this boot) is gone: its other processes vanished and these stayed."""
    members: dict[str, list[ProcessInfo]] = {}
    configured = {r.name for r in snap.runs if getattr(r, "discovered", None) is None}
    for sample in snap.runs:
        if sample.name not in configured:
            continue  # discovered runs are gpuwatch's guess, not the user's word
        for pid in sample.pids:
            if pid in table:
                members.setdefault(sample.name, []).append(table[pid])
    for proc in table.values():
        if proc.run in configured and proc not in members.get(proc.run, []):
            members.setdefault(proc.run, []).append(proc)
    live: set[int] = set()
    for name, procs in members.items():
        now = {(p.pid, p.start_ticks) for p in procs}
        vanished = bool(seen_before.get(name, set()) - now)
        # A run's processes include their descendants (probe.match_runs): a rank's worker is
        # left behind with its rank, so only the tops of the run's trees are judged.
        pids = {p.pid for p in procs}
        tops = [p for p in procs if p.ppid not in pids]
        abandoned = vanished and all(_left_behind(p, table, earlier) for p in tops)
        if not abandoned:
            live.update(p.pid for p in procs)
    protected = set(live)
    for proc in table.values():
        if any(a.pid in live for a in ancestry(proc, table)):
            protected.add(proc.pid)
    return protected


def _idle(snaps: list[HostSnapshot], gpu: int, pct: float) -> bool:
    for snap in snaps:
        sample = next((g for g in snap.gpus if g.index == gpu), None)
        if sample is None or sample.util_pct is None or sample.util_pct > pct:
            return False
    return True


def _held_throughout(proc: ProcessInfo, window: list[HostSnapshot]) -> bool:
    """The same process (pid and start time) held a GPU in every snapshot of the window: an
    idle GPU says nothing of a holder that was not there yet. On a real H100 a rank orphaned
    between two polls was flagged on its first sighting, because the polls before it (an idle
    GPU, and one caught between a run's steps) were idle: a run started in a `( ... &)`
    subshell also has ppid 1 and no session of its own, and sits idle through its CUDA
    start-up (U21: never one snapshot)."""
    for snap in window[:-1]:
        if not any(p.pid == proc.pid and p.start_ticks == proc.start_ticks and _holds_gpu(p)
                   for p in snap.processes):
            return False
    return True


def _listed_throughout(pid: int, gpu: int, window: list[HostSnapshot]) -> bool:
    """The driver listed this pid on this GPU in every snapshot of the window."""
    return all(any(a.pid == pid and a.gpu_index == gpu for a in snap.gpu_processes)
               for snap in window[:-1])


def _gpu_processes_ok(snap: HostSnapshot) -> bool:
    return "gpus.apps" not in snap.section_errors and "gpus" not in snap.section_errors


# ---------------------------------------------------------------- the judgement

def zombie_holders(history: HostHistory) -> list[ZombieHolder]:
    """Every VRAM zombie on the host now (U11), defunct first; [] without a current poll."""
    snap = history.current
    if snap is None or "processes" in snap.section_errors:
        return []
    th = history.thresholds
    window = recent(history, max(2, th.sustain_polls))  # U21: never one snapshot, even
    sustained = len(window) >= max(2, th.sustain_polls)  # with sustain_polls = 1
    table = {p.pid: p for p in snap.processes}
    earlier: dict[tuple[int, int], ProcessInfo] = {}
    seen_before: dict[str, set[tuple[int, int]]] = {}
    for old in list(history.snapshots)[:-1]:
        if old.boot_id != snap.boot_id:
            continue
        for p in old.processes:
            earlier[(p.pid, p.start_ticks)] = p
            if p.run is not None:
                seen_before.setdefault(p.run, set()).add((p.pid, p.start_ticks))
        old_table = {p.pid: p for p in old.processes}
        for sample in old.runs:
            for pid in sample.pids:
                if pid in old_table:
                    seen_before.setdefault(sample.name, set()).add(
                        (pid, old_table[pid].start_ticks))
    protected = _protected(snap, table, earlier, seen_before)
    idle_pct = th.idle_util_pct

    def configured_run(proc: ProcessInfo) -> str | None:
        """The configured run a holder belonged to; a run discovery made of the holder itself
        (left_behind_runs) is no owner to name."""
        series = history.runs.get(proc.run) if proc.run else None
        return proc.run if series is None or getattr(series, "discovery", None) is None \
            else None

    out: list[ZombieHolder] = []

    # defunct: dead, unreaped, and the driver still charges it memory
    for proc in snap.processes:
        if not proc.zombie or proc.pid in protected or not _holds_gpu(proc):
            continue
        parent = table.get(proc.ppid)
        reaper = None if proc.ppid <= 1 or parent is None else proc.ppid
        todo = (f"its parent {reaper} ({parent.comm if parent else '?'}) has not reaped it: "
                f"signal the parent" if reaper is not None else
                "its parent is init, so only the driver letting go, a GPU reset or a reboot "
                "frees it")
        out.append(ZombieHolder(
            proc.pid, proc.start_ticks, proc.user, proc.gpu_index, proc.gpu_mem_mib, proc.cmd,
            "defunct", False,
            f"pid {proc.pid} is defunct yet holds GPU memory; {todo}",
            parent_pid=reaper, run=configured_run(proc)))

    # orphaned: left behind by its parent or its run, on a GPU idle for several polls
    if sustained:
        for proc in snap.processes:
            if proc.zombie or proc.pid in protected or not _holds_gpu(proc):
                continue
            why = _left_behind(proc, table, earlier)
            gpus = _gpus_held(proc)
            if why is None or not gpus or not all(_idle(window, g, idle_pct) for g in gpus) \
                    or not _held_throughout(proc, window):
                continue
            gpu = proc.gpu_index if proc.gpu_index is not None else min(gpus)
            owner = configured_run(proc)
            run = f" of run {owner}" if owner else ""
            out.append(ZombieHolder(
                proc.pid, proc.start_ticks, proc.user, gpu, proc.gpu_mem_mib, proc.cmd,
                "orphaned", True,
                f"pid {proc.pid}{run} holds GPU {gpu} memory, {why}, and the GPU has been idle "
                f"for {len(window)} polls: kill it to free the memory", run=owner))

    if not sustained or not _gpu_processes_ok(snap):
        return out

    visible_holders: dict[int, set[int]] = {}
    for proc in snap.processes:
        for g in _gpus_held(proc):
            visible_holders.setdefault(g, set()).add(proc.pid)

    # invisible: the driver lists a pid this /proc does not have (another PID namespace)
    listed: set[int] = set()
    for app in snap.gpu_processes:
        if app.gpu_index is not None:
            listed.add(app.gpu_index)
        if app.pid in table or app.gpu_index is None:
            continue
        gpu = app.gpu_index
        if visible_holders.get(gpu) or not _idle(window, gpu, idle_pct):
            continue  # someone here uses that GPU: the pid may be their host-side alias
        if not _listed_throughout(app.pid, gpu, window):
            continue  # first seen now: a neighbour container's job may be starting up
        out.append(ZombieHolder(
            app.pid, None, None, gpu, app.gpu_mem_mib, app.process_name or "?",
            "invisible", False,
            f"nvidia-smi lists pid {app.pid} on idle GPU {gpu} but /proc here cannot see it "
            "(another PID namespace): restart the container that owns it, or reset the GPU"))

    # unattributed: memory in use, no process anywhere
    for dev in snap.gpus:
        if dev.mig or dev.index in listed or visible_holders.get(dev.index):
            continue
        used = dev.mem_used_mib
        if used is None or used < th.zombie_unattributed_mib:
            continue
        if not _idle(window, dev.index, idle_pct) or not all(
                _mem_used(s, dev.index) >= th.zombie_unattributed_mib for s in window):
            continue
        unread = snap.process_counts.fd_unreadable if snap.process_counts else 0
        caveat = (f" ({unread} processes' fds were unreadable: run the probe as root to see "
                  "them)" if unread else "")
        out.append(ZombieHolder(
            None, None, None, dev.index, used, "", "unattributed", False,
            f"GPU {dev.index} has {mib(used)} in use but no process holds it{caveat}: a dead "
            "container or crashed run left a context — restart the container or reset the "
            "GPU"))
    return out


def _mem_used(snap: HostSnapshot, gpu: int) -> int:
    sample = next((g for g in snap.gpus if g.index == gpu), None)
    return -1 if sample is None or sample.mem_used_mib is None else sample.mem_used_mib


def left_behind_runs(history: HostHistory, holders: Iterable[ZombieHolder]) -> frozenset[str]:
    """The discovered runs whose every live process is one of `holders`: an orphaned
    rank of a dead DDP job has a cwd and a script, so discovery groups it as a run, which read
    "running" beside the finding that it is a zombie (U11); and one whose processes gpuwatch
    reaped (RunSeries.reaped, kept in the store, so a cron `--once` after `gpuwatch reap`
    knows it too). A configured run is never one: it protects its processes, so none of them
    is a holder."""
    now = history.current
    if now is None:
        return frozenset()
    held = {z.pid for z in holders if z.pid is not None}
    out = set()
    for sample in now.runs:
        series = history.runs.get(sample.name)
        if series is None or series.discovery is None:
            continue
        # Its processes reaped (`z`, `gpuwatch reap`), it is gone, not a run that died: on a
        # real H100 it read "dead", killed, with the dead run's leftover checkpoint reported
        # a second time under its name. Only a reap says so: a run that vanishes by itself
        # after being taken for a zombie is reported dead (its death may be an OOM kill).
        gone = series.reaped if not sample.pids else set(sample.pids) <= held
        if gone:
            out.add(sample.name)
    return frozenset(out)

