"""Why did a run die? (U3: a vanished process is not always an OOM.)

When a run's processes vanish between two polls, `diagnose` weighs what the two snapshots say,
most authoritative first, and returns one cause with the evidence behind it:

1. ``reboot``      the boot id changed (or the uptime is shorter than the gap): U3's most-missed
                   cause, nothing in the log says so.
2. ``oom_cgroup``  the oom_kill counter in ``memory.events`` of the run's own cgroup (its
                   processes', not the probe's: a Docker or Slurm job lives in another) rose
                   (U41: authoritative, whatever host ``free`` said); or a kernel OOM report
                   names one of the run's pids and says a memory cgroup's limit was hit (its
                   path and limit in the evidence).
3. ``oom_kernel``  a kernel OOM-kill line names one of the run's pids (U9).
4. ``xid``         an NVIDIA Xid was logged since the last poll that names one of the run's pids,
                   or names no process and is on the run's GPU (U22); an Xid that names another
                   process is that process's (an MMU fault, Xid 31), unless it says the GPU
                   itself is dead (DEAD_GPU_XIDS).
   ``gpu_lost``    no Xid line, but in the same poll a GPU of the run vanished from the list, or
                   the driver stopped answering (nvidia-smi hung, GPU lost, driver gone, U22).
5. ``exception``   the log's tail ends in a Traceback, CUDA out of memory or an NCCL timeout
                   (seed 002); the line is quoted.
6. ``sighup``      it was tty-bound, SIGHUP not ignored, not under tmux/screen, and its session
                   is gone (seed 000: it died with the SSH session).
7. ``killed``      every check above could be made and none fired: the process was signalled
                   (SIGKILL by a person, a too-wide pkill, U3) — or exited without a done marker.
                   Certain where gpuwatch's launch wrapper recorded 128+N (signal N).
   ``exited``      the launch wrapper of a run gpuwatch relaunched recorded a plain non-zero exit
                   status and nothing above says more.
8. ``unknown``     some check could not be made (kernel log unreadable, no cgroup counter...):
                   the evidence lists which.

A recorded exit status (series.exit_code) is in the evidence of every verdict; it decides 7/8
and comes before a stale crash line and the terminal (a relaunched run is detached).
A finished run (done marker, exit status 0, the framework's own end: series.finished_by, seed
004) is not a death and is never diagnosed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..model.death import (
    CAUSES,
    EXCEPTION_PATTERNS,
    TAIL_LINES,
    TRACEBACK,
    Diagnosis,
    crash_line,
)
from ..model.history import Departure
from ..model.processes import dies_with_session
from ..model.snapshot import HostSnapshot, KernelEvent, same_gpu_ids
from ..model.xid_catalog import xid_advice
from . import nccl

__all__ = ["CAUSES", "DEAD_GPU_XIDS", "EXCEPTION_PATTERNS", "TAIL_LINES",
           "TRACEBACK", "Diagnosis", "crash_line", "diagnose", "diagnose_departure",
           "new_kernel_events", "xid_gpu"]


DEAD_GPU_XIDS = (48, 79)
"""U22: a double-bit ECC error or a GPU fallen off the bus takes every process on the GPU with
it, whichever one the driver's line happens to name."""



# ---------------------------------------------------------------- evidence readers

def gpu_loss(before: HostSnapshot, now: HostSnapshot,
             gpus: set[int]) -> tuple[dict[str, Any] | None, bool]:
    """(Evidence that the run's GPUs went away between `before` and `now`, or None; whether it
    is strong). Strong: a GPU the run held (by uuid or bus id, as `before` listed it; every GPU
    where its GPUs are not known) is missing from `now`'s list, said lost or not. Weak: the
    whole driver stopped answering (a timeout, the driver gone) in this very poll; not a
    timeout where persistence mode was off, which is the GPUs initialising again after the
    run's own exit (seconds), not a wedged driver."""
    err = now.gpu_error
    held = [g for g in before.gpus if not gpus or g.index in gpus]
    if err is None or err.kind == "gpu_lost":
        gone = [g for g in held if not any(same_gpu_ids(g.uuid, g.pci_bus_id, g.index, h)
                                           for h in now.gpus)]
        if gone:
            return {"gpu_error": err.kind if err else None,
                    "message": err.message if err else "GPU " + ", ".join(
                        str(g.index) for g in gone) + " no longer listed",
                    "gpus": [g.index for g in gone], "pci": [g.pci_bus_id for g in gone]}, True
        return None, False
    slow_start = err is not None and err.kind == "timeout" and any(
        g.persistence is False for g in before.gpus)
    # model.GPU_ERRORS: a failure of the whole driver; a lost GPU is one GPU's (above)
    if err is not None and err.meaning.wedged and not slow_start and (
            before.gpu_error is None or not before.gpu_error.meaning.wedged):
        return {"gpu_error": err.kind, "message": err.message,
                "gpus": sorted(gpus) if gpus else [g.index for g in before.gpus]}, False
    return None, False


def new_kernel_events(before: HostSnapshot | None, now: HostSnapshot) -> list[KernelEvent]:
    """Kernel events in `now` that `before` did not have (same boot; dedupe by time and
    message, U22). After a reboot every event of the new boot is new."""
    if before is None:
        return list(now.kernel_events)
    if before.boot_id != now.boot_id:
        return list(now.kernel_events)
    if "kernel" in before.section_errors:  # the last poll could not read it: go by time
        since = before.taken_at
        return [e for e in now.kernel_events
                if since is None or e.at is None or e.at >= since - 1.0]
    seen = {_event_key(e) for e in before.kernel_events}
    return [e for e in now.kernel_events if _event_key(e) not in seen]


def _event_key(e: KernelEvent) -> tuple[Any, ...]:
    return (e.kind, e.since_boot_s, None if e.at is None else round(e.at, 3), e.xid, e.pid,
            e.pci, e.message)



# ---------------------------------------------------------------- the verdict

def diagnose(before: HostSnapshot, now: HostSnapshot, pids: Sequence[int], *,
             tail: str | None = None, log_changed: bool | None = None,
             gpus: Iterable[int] = (), exit_code: int | None = None) -> Diagnosis:
    """Why the processes `pids` (alive in `before`) are gone in `now`.

    tail: the run's log tail as last read; log_changed: whether the log was written since the
    poll that saw them alive (None: unknown); gpus: the GPU indexes they held; exit_code: the
    status gpuwatch's launch wrapper recorded (a run it relaunched), None where there is none."""
    at = now.taken_at
    pids = tuple(pids)
    gap = (now.taken_at - before.taken_at
           if now.taken_at is not None and before.taken_at is not None else None)

    def verdict(cause: str, **evidence: Any) -> Diagnosis:
        evidence.setdefault("pids", list(pids))
        if exit_code is not None:
            evidence.update(exit_status_evidence(exit_code))
        return Diagnosis(cause, evidence, at, pids)

    # 1. reboot
    if before.boot_id and now.boot_id and before.boot_id != now.boot_id:
        return verdict("reboot", boot_id_before=before.boot_id, boot_id_now=now.boot_id,
                       uptime_s=now.uptime_s)
    if gap is not None and now.uptime_s is not None and now.uptime_s < gap:
        return verdict("reboot", uptime_s=now.uptime_s, poll_gap_s=gap,
                       boot_id_now=now.boot_id)

    unchecked: list[str] = []
    events = new_kernel_events(before, now)
    kernel_ok = "kernel" not in now.section_errors
    if not kernel_ok:
        unchecked.append("kernel log (" + now.section_errors["kernel"] + ")")
    ooms = [e for e in events if e.kind == "oom"]
    named = [e for e in ooms if e.pid in pids]

    # 2. the counter of the run's own cgroup (U41), or a memory cgroup's OOM report naming it
    rise, counted = cgroup_oom(before, now, pids)
    if rise is not None:
        if named:
            rise["killed_pid"], rise["killed_name"] = named[0].pid, named[0].name
        return verdict("oom_cgroup", **rise)
    if not counted:
        unchecked.append("cgroup oom_kill counter")
    memcg = [e for e in named if e.memcg]
    if memcg:
        e = memcg[0]
        return verdict("oom_cgroup", pid=e.pid, name=e.name, cgroup=e.cgroup,
                       memory_max_bytes=e.limit_bytes, at=e.at)

    # 3. a kernel OOM line naming the run's pid
    if named:
        e = named[0]
        return verdict("oom_kernel", pid=e.pid, name=e.name, memcg=e.memcg, at=e.at)

    # 4. an Xid since the last poll, the run's own
    wanted = set(gpus)
    xids = run_xids([e for e in events if e.kind == "xid"], pids, wanted, before, now)
    if xids:
        e = xids[-1]
        advice = xid_advice(e.xid) if e.xid is not None else None  # the catalog's action
        return verdict("xid", xid=e.xid, pci=e.pci, gpu=xid_gpu(e, now, before), pid=e.pid,
                       name=e.name, message=e.message, at=e.at,
                       xid_name=advice.name if advice else None,
                       action=advice.action.bucket if advice and advice.action else None,
                       advice=advice.words() if advice else None)

    # 4b. no Xid line (a kernel log we cannot read, or none written), but a GPU of the run fell
    # out of the list in this very poll (U22)
    lost, strong = gpu_loss(before, now, wanted)
    if lost is not None and strong:
        return verdict("gpu_lost", **lost)

    # 5. the log says how it ended
    crash = crash_line(tail)
    if crash is not None and log_changed is not False:
        return verdict("exception", kind=crash[0], line=crash[1], **_nccl(crash[0], tail))
    if tail is None and log_changed is not False:  # unchanged since alive: nothing new in it
        unchecked.append("log tail")

    # 5b. the driver stopped answering in the same poll: weaker than the run's own last words
    if lost is not None:
        return verdict("gpu_lost", **lost)

    # 6. the status its launch wrapper recorded: certain, and a detached run has no terminal
    if exit_code is not None:
        more = {"unchecked": unchecked} if unchecked else {}
        signalled = 128 < exit_code < 128 + 65  # 255: sys.exit(-1), an exit, not a signal
        return verdict("killed" if signalled else "exited", **more)

    # 6b. it died with its terminal
    old_table = {p.pid: p for p in before.processes}
    sessions_now = {p.session for p in now.processes}
    hup = [old_table[p] for p in pids
           if p in old_table and dies_with_session(old_table[p], old_table)]
    if hup and all(p.session not in sessions_now for p in hup):
        first = hup[0]
        return verdict("sighup", tty_nr=first.tty_nr, session=first.session,
                       sighup_ignored=first.sighup_ignored)

    # 7./8. nothing else to go on
    if crash is not None:  # an error line from before the last poll: a weak hint only
        return verdict("exception", kind=crash[0], line=crash[1], stale=True,
                       **_nccl(crash[0], tail))
    if unchecked:
        return verdict("unknown", unchecked=unchecked)
    return verdict("killed", checked=["boot id", "cgroup oom_kill", "kernel OOM lines", "Xid",
                                      "log tail", "controlling tty"])


def _nccl(kind: str, tail: str | None) -> dict[str, Any]:
    """An NCCL timeout's operation, sequence number, timeout and ranks (nccl.read), as the
    verdict's `nccl` evidence; nothing for another crash."""
    found = nccl.read({"log": tail}) if kind == "nccl_timeout" and tail else None
    return {"nccl": found} if found else {}


def signal_name(number: int) -> str:
    import signal  # only for a death with a recorded status

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_status_evidence(code: int) -> dict[str, Any]:
    """A shell's exit status in words: 128+N is signal N (137: SIGKILL, the OOM killer's and
    kill -9's; U9), anything else the process's own exit code."""
    if 128 < code < 128 + 65:
        return {"exit_code": code, "signal": code - 128, "signal_name": signal_name(code - 128)}
    return {"exit_code": code, "signal": None}


def run_cgroups(snap: HostSnapshot, pids: Sequence[int]) -> list[str]:
    """The memory cgroups the processes `pids` lived in, as `snap` read them."""
    table = {p.pid: p for p in snap.processes}
    paths: list[str] = []
    for pid in pids:
        proc = table.get(pid)
        if proc is not None and proc.cgroup and proc.cgroup not in paths:
            paths.append(proc.cgroup)
    return paths


def cgroup_oom(before: HostSnapshot, now: HostSnapshot, pids: Sequence[int]
               ) -> tuple[dict[str, Any] | None, bool]:
    """(evidence that the oom_kill counter of a cgroup of the run's rose between the two polls,
    or None; whether any such counter could be compared). The run's cgroups, not the probe's
    own: a run in a Docker or Slurm cgroup is OOM-killed there (U41)."""
    if before.cgroup is None or now.cgroup is None:
        return None, False
    counted = False
    for path in run_cgroups(before, pids):
        old, new = before.cgroup.counter(path), now.cgroup.counter(path)
        if old is None or new is None or old.oom_kill is None or new.oom_kill is None:
            continue
        counted = True
        if new.oom_kill > old.oom_kill:
            return {"oom_kill_before": old.oom_kill, "oom_kill_now": new.oom_kill,
                    "cgroup": path, "memory_max_bytes": new.memory_max_bytes}, True
    return None, counted


def run_xids(xids: list[KernelEvent], pids: Sequence[int], gpus: set[int],
             before: HostSnapshot, now: HostSnapshot) -> list[KernelEvent]:
    """The Xids that may have killed the processes `pids`: those that name one of them; else
    those that name no process (or say the GPU is dead) on one of `gpus` — on any GPU when
    `gpus` or the Xid's GPU is not known. An Xid that names another process is that
    process's: an MMU fault (Xid 31) in someone's browser on a shared GPU kills no run."""
    ours = [e for e in xids if e.pid is not None and e.pid in pids]
    if ours:
        return ours
    anyone = [e for e in xids if e.pid is None or e.xid in DEAD_GPU_XIDS]
    if not gpus:
        return anyone
    on_ours = [e for e in anyone if xid_gpu(e, now, before) in gpus]
    return on_ours or [e for e in anyone if xid_gpu(e, now, before) is None]


def xid_gpu(event: KernelEvent, snap: HostSnapshot,
            earlier: HostSnapshot | None = None) -> int | None:
    """The GPU index an Xid names: NVRM prints "0000:3b:00" (domain:bus:device), nvidia-smi
    "00000000:3B:00.0"; None when no GPU of the snapshot matches (nor of `earlier`'s, which
    still listed a GPU that has since fallen off the bus)."""
    found = _xid_gpu(event, snap)
    return found if found is not None or earlier is None else _xid_gpu(event, earlier)


def _xid_gpu(event: KernelEvent, snap: HostSnapshot) -> int | None:
    if not event.pci:
        return None
    parts = event.pci.lower().split(":")
    if len(parts) < 3:
        return None
    try:  # box text: "0000:3b:00" by the driver, anything of [0-9a-f:.] by the pattern
        want = (int(parts[-3], 16), parts[-2], parts[-1].split(".")[0])
    except ValueError:
        return None
    for gpu in snap.gpus:
        bus = (gpu.pci_bus_id or "").lower().split(":")
        if len(bus) < 3:
            continue
        try:
            have = (int(bus[-3], 16), bus[-2], bus[-1].split(".")[0])
        except ValueError:
            continue
        if have == want:
            return gpu.index
    return None


def diagnose_departure(departure: Departure) -> Diagnosis:
    """Why a run (or some of its ranks, seed 002) vanished between its two snapshots."""
    d = diagnose(departure.before, departure.now, departure.pids, tail=departure.tail,
                 log_changed=departure.log_changed, gpus=set(departure.gpus),
                 exit_code=departure.exit_code)
    if departure.rank_of is None:
        return d
    return Diagnosis(d.cause, dict(d.evidence, **departure.rank_of), d.at, d.pids)

