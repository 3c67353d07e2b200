"""Findings: what is wrong on a host and what to do, as pure functions of its history.

Every rule takes the host's history (this poll and the ones before, plus what the store carried
over from earlier runs) and returns findings: a code, a severity, one sentence a person can act
on, and the numbers behind it. No SSH, no Textual: every rule is testable on plain data. Each rule
names the gotcha of seeds/003 it encodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..model.series import RunSeries
from ..model.snapshot import GPU_ERRORS, Scalars, same_gpu_ids
from .diagnosis import (
    Diagnosis,
    ancestry,
    diagnose,
    hup_exposed,
    new_kernel_events,
    xid_gpu,
)

if TYPE_CHECKING:
    from ..model.snapshot import HostSnapshot, ProcessInfo, RunSample


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @classmethod
    def parse(cls, name: str) -> Severity:
        return cls[name.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong, in one sentence, with the evidence behind it."""

    code: str
    severity: Severity
    message: str
    gpu: int | None = None
    run: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    subject: str | None = None
    """What else tells two findings of one code apart (a disk's path); not in the JSON."""

    @property
    def key(self) -> tuple[str, int | None, str | None, str | None]:
        """What makes two findings the same across polls (for first seen / cleared)."""
        return (self.code, self.gpu, self.run, self.subject)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity.label,
                               "message": self.message}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.run is not None:
            out["run"] = self.run
        out["evidence"] = dict(self.evidence)
        return out


@dataclass(frozen=True, slots=True)
class PollFailure:
    """A poll that did not return a snapshot."""

    kind: str
    message: str
    at: float


HISTORY_LEN = 64
"""Snapshots kept per host in memory: enough for 'sustained over several polls' rules."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every number a rule compares against, in one place (config: `[thresholds]`).

    "Sustained" rules (U21: never judge on one snapshot) need `sustain_polls` snapshots in a
    row, of one boot, spanning no more than `sustain_window_s`. A `--once` from cron holds the
    previous stored snapshot plus the current one, so the default of 2 works there; a cron
    interval longer than the window makes those rules go quiet rather than guess.
    """

    sustain_polls: int = 2
    """Snapshots in a row a sustained condition must hold in (2 = the previous and this one)."""
    sustain_window_s: float = 3600.0
    """The longest span those snapshots may cover (older evidence is not 'sustained')."""
    util_busy_pct: float = 90.0
    """U21: utilization at or above this counts as 'the GPU says it is busy'."""
    clock_low_ratio: float = 0.5
    """U21: SM clock under this share of its max while busy: util without clock."""
    power_low_ratio: float = 0.3
    """U21: power under this share of its limit while busy: util without work."""
    idle_util_pct: float = 5.0
    """U38, U11: utilization at or below this counts as idle."""
    idle_while_running_s: float = 600.0
    """U38/U24: a running run's GPUs idle at least this long → gpu.idle_while_running."""
    zombie_unattributed_mib: int = 512
    """U11: memory used on a GPU with no holder visible, above this, is somebody's context."""
    stalled_s: float = 1800.0
    """U43: no step, event, log or checkpoint progress for this long → run.stalled."""
    log_buffered_s: float = 600.0
    """U43: log silent this long while steps/checkpoints advance → run.log_buffered."""
    events_grace_s: float = 900.0
    """U39: a run running this long with no event file / no scalars → run.events_empty."""
    ckpt_overdue_factor: float = 3.0
    """Seed 001: no checkpoint for this many of the run's own cadences → ckpt.overdue."""
    ckpt_overdue_min_s: float = 1800.0
    """…and never before this long (a 1-minute cadence would cry wolf)."""
    disk_low_pct: float = 5.0
    """U6: free bytes under this share of the filesystem → disk.low."""
    disk_low_bytes: int = 10 * 2**30
    """U6: …or under this many bytes, whichever is larger (a checkpoint must still fit)."""
    disk_critical_pct: float = 1.0
    """U6: under this share free, disk.low is critical (torch.save is about to fail)."""
    inodes_low_pct: float = 5.0
    """U7: free inodes under this share → disk.inodes_low."""
    inodes_critical_pct: float = 1.0
    """U7: under this share of inodes free, disk.inodes_low is critical."""
    disk_full_hours: float = 24.0
    """U6: at the growth rate seen over the history, full within this many hours."""
    disk_full_min_span_s: float = 300.0
    """U6: growth is only measured over at least this span of history."""
    cpu_oversubscribed_ratio: float = 4.0
    """U40: a run's threads over this many times the cgroup's vCPU quota."""
    throttle_reasons: tuple[str, ...] = (
        "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
        "hw_power_brake_slowdown")
    """U23: the clocks-event reasons that steal performance (not gpu_idle, sync_boost...)."""
    throttle_info_only: tuple[str, ...] = ("sw_power_cap",)
    """U23: reasons that alone are only info (a GPU at its power cap under full load)."""
    tmp_stale_s: float = 600.0
    """U6: a partial checkpoint untouched this long is a failed save, not one in progress."""
    persistence_slow_s: float = 2.0
    """A GPU query at least this slow with persistence mode off: gpu.persistence_off is a
    warning (the re-initialisation is what costs), else only info."""
    xid_critical: tuple[int, ...] = (48, 79)
    """U22: Xids of a dead GPU: re-rent (48 double-bit ECC, 79 fallen off the bus)."""


@dataclass
class HostHistory:
    """What the rules see of one host. Bounded: the newest HISTORY_LEN snapshots."""

    name: str
    snapshots: deque[HostSnapshot] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    failure: PollFailure | None = None
    """Set when the latest poll failed (the snapshots are then stale, not gone)."""
    last_ok_at: float | None = None
    runs: dict[str, RunSeries] = field(default_factory=dict)
    """Each run's series, offsets and liveness, fed by every good poll."""
    thresholds: Thresholds = field(default_factory=Thresholds)
    """What the rules compare against (the config's `[thresholds]`)."""
    deaths: dict[str, Diagnosis] = field(default_factory=dict)
    """U3: why each dead run died, decided on the poll that saw it go and kept (and stored)
    while it stays dead, so a cron `--once` reports it once and the TUI can show it later."""
    rank_deaths: dict[str, Diagnosis] = field(default_factory=dict)
    """Seed 002: a rank of a multi-process run that died while the others live on."""
    new_deaths: set[str] = field(default_factory=set)
    """Runs (and rank deaths) first seen at the latest poll: run.dead is critical then."""
    findings: list[Finding] = field(default_factory=list)
    """What `evaluate` found at the latest poll (the store keeps their first/last seen)."""
    zombies: list[Any] | None = None
    """The VRAM zombie holders `evaluate` found at the latest poll (zombies.py); None once
    another poll is recorded, until it is evaluated."""
    left_behind: frozenset[str] = frozenset()
    """Discovered runs whose every live process is a VRAM zombie holder (U11): what a dead run
    left behind, not a run of its own (its cwd and script made discovery group it). Shown as
    left behind rather than running; its own findings give way to gpu.vram_zombie."""
    known_gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The GPUs this host has shown since it last booted, by uuid (else bus id, else index):
    {"index", "uuid", "pci", "name"}. Kept in the store, so that a cron `--once` knows a box
    had 8 GPUs when it lists 7 (gpu.lost) or none (gpu.query_failed is critical)."""

    def restore_deaths(self, deaths: Mapping[str, Mapping[str, Any]],
                       rank_deaths: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Diagnoses the store kept from earlier polls (`Diagnosis.state()` each)."""
        for target, table in ((self.deaths, deaths), (self.rank_deaths, rank_deaths or {})):
            for name, state in table.items():
                d = Diagnosis.from_state(state)
                if d is not None:
                    target[name] = d

    @property
    def current(self) -> HostSnapshot | None:
        return self.snapshots[-1] if self.snapshots and self.failure is None else None

    @property
    def previous(self) -> HostSnapshot | None:
        if self.failure is not None:
            return self.snapshots[-1] if self.snapshots else None
        return self.snapshots[-2] if len(self.snapshots) > 1 else None

    def record(self, snapshot: HostSnapshot, at: float, *, runs: bool = True) -> None:
        """A good poll that ended at `at` (this machine's clock: boxes' clocks drift).
        runs=False for a snapshot whose run data is already in `runs` (restored from the store)."""
        self.zombies = None  # of the last evaluate: stale now
        before = self.snapshots[-1] if self.snapshots else None
        if before is not None and before.runs:
            # Its new points are in self.runs already: keep a token, not the columns, so 64
            # snapshots of a run with a 2 GB event file do not hold it twice (issue 7's soak).
            self.snapshots[-1] = _without_scalars(before)
        self.snapshots.append(snapshot)
        self.failure = None
        self.last_ok_at = at
        self._note_gpus(before, snapshot)
        if runs:
            old_logs = {name: (s.log_seen and list(s.log_seen)) for name, s in self.runs.items()}
            for sample in snapshot.runs:
                series = self.runs.get(sample.name)
                if series is None:
                    series = self.runs[sample.name] = RunSeries(sample.name)
                started = [p.started_at for p in snapshot.processes
                           if p.pid in sample.pids and p.started_at is not None]
                series.update(sample, snapshot.taken_at, min(started, default=None))
            self._note_deaths(before, snapshot, old_logs)

    def _note_gpus(self, before: HostSnapshot | None, now: HostSnapshot) -> None:
        """Remember the GPUs seen. A reboot starts the list anew (the box's GPUs are then
        what it lists; host.rebooted says it rebooted); a failed query adds nothing."""
        if before is not None and before.boot_id and now.boot_id \
                and before.boot_id != now.boot_id:
            self.known_gpus = {}
        for g in now.gpus:
            seen = {"index": g.index, "uuid": g.uuid, "pci": g.pci_bus_id, "name": g.name,
                    "persistence": g.persistence}
            key = next((k for k, known in self.known_gpus.items() if same_gpu(known, g)), None)
            if key is not None:  # one GPU whatever a poll could not say of it (a uuid N/A)
                known = self.known_gpus[key]
                self.known_gpus[key] = {k: seen[k] if seen[k] is not None else known.get(k)
                                        for k in seen}
            else:
                self.known_gpus[g.uuid or g.pci_bus_id or f"index {g.index}"] = seen
        if len(self.known_gpus) > 256:  # bounded: a box does not have more
            self.known_gpus = dict(list(self.known_gpus.items())[-256:])

    def restore_known_gpus(self, value: object) -> None:
        """What known_gpus was at the last run (the store's host counters); malformed: none."""
        if not isinstance(value, Mapping):
            return
        for key, gpu in list(value.items())[:256]:
            if isinstance(key, str) and isinstance(gpu, Mapping) \
                    and isinstance(gpu.get("index"), int) and not isinstance(gpu["index"], bool):
                self.known_gpus[key] = {k: gpu.get(k) if isinstance(gpu.get(k), str | int)
                                        else None for k in ("index", "uuid", "pci", "name",
                                                            "persistence")}

    def _note_deaths(self, before: HostSnapshot | None, now: HostSnapshot,
                     old_logs: Mapping[str, Any]) -> None:
        """U3, seed 002: diagnose the runs (and ranks) that vanished since `before`."""
        self.new_deaths = set()
        for name, series in self.runs.items():
            if series.status != "dead":
                self.deaths.pop(name, None)
            if series.status != "running":
                self.rank_deaths.pop(name, None)
        if before is None:
            return
        old_runs = {r.name: r for r in before.runs}
        old_table = {p.pid: p for p in before.processes}
        new_table = {p.pid: p for p in now.processes}
        same_boot = before.boot_id == now.boot_id

        def alive(pid: int) -> bool:
            old, new = old_table.get(pid), new_table.get(pid)
            if not same_boot or new is None or new.zombie:
                return False
            return old is None or old.start_ticks == new.start_ticks

        for sample in now.runs:
            prev = old_runs.get(sample.name)
            known = self.runs.get(sample.name)
            if prev is None or not prev.pids or known is None or known.status == "finished":
                continue  # seed 004: a finished run is not a dead one (series.finished_by)
            gone = [pid for pid in prev.pids if not alive(pid) or pid not in sample.pids]
            if not gone:
                continue
            seen = old_logs.get(sample.name)
            log_changed = None if sample.log is None or not seen else (
                [sample.log.bytes, sample.log.mtime] != seen)
            gpus = _gpus_of(prev.pids, before)
            if not sample.pids or known.status == "dead":
                self.deaths[sample.name] = diagnose(
                    before, now, prev.pids, tail=known.tail, log_changed=log_changed, gpus=gpus,
                    exit_code=known.exit_code())
                self.new_deaths.add(sample.name)
                continue
            ranks = _ranks(prev.pids, before)
            dead_ranks, survivors = _one_job(
                [pid for pid in ranks if pid in gone], [pid for pid in ranks if pid not in gone],
                prev.pids, before)
            if len(ranks) >= 2 and dead_ranks and survivors:
                d = diagnose(before, now, dead_ranks, tail=known.tail, log_changed=log_changed,
                             gpus=_gpus_of(dead_ranks, before))
                evidence = dict(d.evidence, survivors=survivors, ranks_before=len(ranks))
                self.rank_deaths[sample.name] = Diagnosis(d.cause, evidence, d.at, d.pids)
                self.new_deaths.add("rank:" + sample.name)

    def record_failure(self, failure: PollFailure) -> None:
        self.failure = failure
        self.zombies = None


def _thin(scalars: Mapping[str, Scalars]) -> dict[str, Scalars]:
    """Each tag's last point only: enough to say new points came, not to hold them."""
    return {tag: Scalars(s.steps[-1:], s.values[-1:],
                         s.wall_times[-1:] if s.wall_times is not None else None)
            for tag, s in scalars.items()}


def _without_scalars(snapshot: HostSnapshot) -> HostSnapshot:
    runs = tuple(
        replace(r, event_files=tuple(replace(f, scalars=_thin(f.scalars)) for f in r.event_files),
                metrics=tuple(replace(m, scalars=_thin(m.scalars)) for m in r.metrics))
        for r in snapshot.runs)
    return replace(snapshot, runs=runs)


Rule = Callable[[HostHistory], Iterable[Finding]]


def _live_runs(history: HostHistory) -> Iterator[tuple[HostSnapshot, float, RunSample]]:
    """This poll's runs that have processes, with the snapshot (ages use the box's clock, so a
    snapshot without one yields nothing)."""
    now = history.current
    if now is None or now.taken_at is None:
        return
    at = now.taken_at
    for sample in now.runs:
        if sample.pids:
            yield now, at, sample


# ---------------------------------------------------------------- process-table helpers

def _table(snap: HostSnapshot) -> dict[int, ProcessInfo]:
    return {p.pid: p for p in snap.processes}


def _descendants(pids: Iterable[int], snap: HostSnapshot) -> list[ProcessInfo]:
    """The processes `pids` and everything below them in the snapshot's table."""
    table = _table(snap)
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


def _gpus_of(pids: Iterable[int], snap: HostSnapshot) -> set[int]:
    """GPU indexes the processes (and their children) hold: the driver's attribution, else
    their /dev/nvidiaN minors."""
    gpus: set[int] = set()
    for p in _descendants(pids, snap):
        if p.gpu_index is not None:
            gpus.add(p.gpu_index)
        gpus.update(p.nvidia_devs or ())
    known = {g.index for g in snap.gpus}
    return gpus & known if known else gpus


def _ranks(pids: Iterable[int], snap: HostSnapshot) -> list[int]:
    """Seed 002: the run's processes that are ranks, not dataloader workers. A rank holds a
    CUDA context (the driver lists it); without the driver's list, a process with /dev/nvidia*
    open, else any, whose parent is not a run process with the same command line (a forked
    worker has its parent's, and its open files too)."""
    table = _table(snap)
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


def _one_job(dead: list[int], alive: list[int], pids: Iterable[int],
             snap: HostSnapshot) -> tuple[list[int], list[int]]:
    """Seed 002 needs the dead rank and the survivors to be ranks of one job: the dead ranks
    that share a launcher (the top of their tree among the run's processes) or a session with
    a survivor, and those survivors. Two `train.py` a loose `process` pattern matched in two
    folders are two jobs: one ending leaves the other no collective to hang in."""
    table = _table(snap)
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


def _run_procs(sample: RunSample, snap: HostSnapshot) -> list[ProcessInfo]:
    table = _table(snap)
    pids = set(sample.pids) | {p.pid for p in snap.processes if p.run == sample.name}
    return [table[p] for p in sorted(pids) if p in table]


def _gpu(snap: HostSnapshot, index: int) -> Any:
    return next((g for g in snap.gpus if g.index == index), None)


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n:,.0f} MiB"


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**30:,.1f} GiB"


def _dur(s: float) -> str:
    if s >= 5400:
        return f"{s / 3600:.1f} h"
    if s >= 90:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def recent(history: HostHistory, n: int | None = None,
           window_s: float | None = None) -> list[HostSnapshot]:
    """The newest snapshots for a 'sustained' judgement (U21: never one snapshot): at most n
    (default sustain_polls), of the current boot, none older than window_s before the newest.
    Fewer than n come back when the history cannot show that many — then nothing is sustained.
    Empty when the latest poll failed."""
    th = history.thresholds
    n = th.sustain_polls if n is None else n
    window_s = th.sustain_window_s if window_s is None else window_s
    now = history.current
    if now is None:
        return []
    out: list[HostSnapshot] = []
    for snap in reversed(history.snapshots):
        if len(out) >= n:
            break
        if snap.boot_id != now.boot_id:
            break
        if (now.taken_at is not None and snap.taken_at is not None
                and now.taken_at - snap.taken_at > window_s):
            break
        out.append(snap)
    return out[::-1]


def sustained(history: HostHistory, test: Callable[[HostSnapshot], bool],
              n: int | None = None) -> list[HostSnapshot] | None:
    """The last n snapshots when `test` holds in every one of them, else None."""
    n = history.thresholds.sustain_polls if n is None else n
    snaps = recent(history, n)
    if len(snaps) < max(1, n) or not all(test(s) for s in snaps):
        return None
    return snaps


def host_unreachable(history: HostHistory) -> Iterable[Finding]:
    """U3, U17: a failed poll is not a dead run; say what failed and keep the last data."""
    failure = history.failure
    if failure is None:
        return
    stale = (f"; last good data is {failure.at - history.last_ok_at:.0f} s old"
             if history.last_ok_at is not None else "")
    yield Finding(
        "host.unreachable", Severity.CRITICAL,
        f"{history.name} could not be polled ({failure.kind}): {failure.message}{stale}",
        evidence={"kind": failure.kind, "last_ok_at": history.last_ok_at, "at": failure.at})


def host_rebooted(history: HostHistory) -> Iterable[Finding]:
    """U3: a reboot is the most-missed cause of a vanished run: nothing in its log says so."""
    now, before = history.current, history.previous
    if now is None or before is None or not now.boot_id or not before.boot_id:
        return
    if now.boot_id != before.boot_id:
        up = f" {now.uptime_s / 60:.0f} min ago" if now.uptime_s is not None else ""
        yield Finding(
            "host.rebooted", Severity.WARNING,
            f"{history.name} rebooted{up} (boot id changed); runs that were on it died with it "
            "— check they were relaunched",
            evidence={"boot_id_before": before.boot_id, "boot_id_now": now.boot_id,
                      "uptime_s": now.uptime_s})


# ---------------------------------------------------------------- GPUs

def slow_start_likely(history: HostHistory) -> bool:
    """Whether the host's GPUs were last seen without persistence mode: a GPU query that
    times out is then likely their re-initialisation (seconds), not a hung driver."""
    return any(g.get("persistence") is False for g in history.known_gpus.values())


def same_gpu(known: Mapping[str, Any], gpu: Any) -> bool:
    """Whether a remembered GPU ({"index", "uuid", "pci"}) is this listed one (same_gpu_ids)."""
    return same_gpu_ids(known.get("uuid"), known.get("pci"), known.get("index"), gpu)




def _known_gpu_text(gpu: Mapping[str, Any]) -> str:
    return f"GPU {gpu.get('index')}" + (f" ({gpu['pci']})" if gpu.get("pci") else "")


def gpu_query_failed(history: HostHistory) -> Iterable[Finding]:
    """U22, U17: GPUs that cannot be read are not "no GPU". Critical where the host had GPUs
    (its history, or /dev/nvidia* on the box): a cron job at 3 am must not call it healthy."""
    now = history.current
    err = now.gpu_error if now is not None else None
    if err is None or err.kind in ("driver_mismatch", "gpu_lost"):
        return
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
            g = _gpu(snap, index)
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
            f"polls ({_dur(span)}): it is underfed or throttled, not busy — check its throttle "
            "reasons and the input pipeline",
            gpu=gpu.index,
            evidence={"polls": len(snaps), "span_s": span,
                      "util_pct": [_gpu(x, gpu.index).util_pct for x in snaps],
                      "sm_clock_mhz": [_gpu(x, gpu.index).sm_clock_mhz for x in snaps],
                      "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
                      "power_w": [_gpu(x, gpu.index).power_w for x in snaps],
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
            g = _gpu(snap, gpu.index)
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
        meaning = XID_MEANING.get(worst or -1, "see NVIDIA's Xid catalog")
        where = f"GPU {gpu}" if gpu is not None else (
            found[-1].pci if found and found[-1].pci else "a GPU")
        todo = ("the GPU is dead — stop the instance and re-rent another box" if dead else
                "check the run's log; repeated Xids on one GPU mean hardware")
        yield Finding(
            "gpu.xid", Severity.CRITICAL if dead else Severity.WARNING,
            f"{where} logged Xid {', '.join(map(str, codes))} ({meaning}): {todo}",
            gpu=gpu,
            evidence={"xids": codes, "count": len(found) + len(extra),
                      "pci": found[-1].pci if found else None,
                      "pids": sorted({e.pid for e in found if e.pid is not None}),
                      "messages": [e.message for e in found[-3:]],
                      "at": [e.at for e in found[-3:]]})


def gpu_vram_zombie(history: HostHistory) -> Iterable[Finding]:
    """U11: VRAM held by a process that is defunct, orphaned from a dead run, in another PID
    namespace, or by nobody visible (see remote/findings/zombies.py); one finding per GPU."""
    from .zombies import zombie_holders

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
            f"{where}: {_mib(mib) if mib else 'memory'} held by "
            + (f"pid {first.pid} ({first.reason})" if first.pid is not None
               else "no visible process") + f"{more}: {first.explanation}",
            gpu=gpu,
            evidence={"holders": [z.to_json() for z in holders], "mem_mib": mib,
                      "signallable": [z.pid for z in holders if z.signallable]})


def gpu_idle_while_running(history: HostHistory) -> Iterable[Finding]:
    """U38, U24: a run is alive but its GPUs sat near 0% util for idle_while_running_s (and at
    least sustain_polls polls). Steps still advancing: data-bound; not: hung or waiting."""
    th = history.thresholds
    for now, _at, sample in _live_runs(history):
        for gpu in sorted(_gpus_of(sample.pids, now)):
            idle: list[HostSnapshot] = []
            for snap in reversed(history.snapshots):
                if snap.boot_id != now.boot_id:
                    break
                run = next((r for r in snap.runs if r.name == sample.name), None)
                g = _gpu(snap, gpu)
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
                f"GPU {gpu} of run {sample.name} has been near 0% util for {_dur(span)} "
                f"while the run is alive; {todo}",
                gpu=gpu, run=sample.name,
                evidence={"span_s": span, "polls": len(idle), "steps_advancing": stepping,
                          "util_pct": [_gpu(x, gpu).util_pct for x in idle]})


# ---------------------------------------------------------------- runs

def run_dead(history: HostHistory) -> Iterable[Finding]:
    """U3: a run seen running whose processes are all gone (and no done marker, seed 004).
    Critical on the poll that saw it die, a warning while it stays dead; the diagnosis
    (history.deaths) says why."""
    if history.current is None:
        return
    for name, series in history.runs.items():
        if series.status != "dead":
            continue
        d = history.deaths.get(name)
        new = name in history.new_deaths
        if getattr(series, "discovery", None) is not None:
            # issue 8: a process gpuwatch only discovered has no done marker, so a normal
            # exit looks like a kill: report it only with evidence of a death, as a warning
            if d is None or (d.cause in ("killed", "unknown")
                             and d.evidence.get("exit_code") is None):
                continue  # a status its relaunch's wrapper recorded is evidence enough
            new = False
        risk = series.work_at_risk_s()
        lost = f"; {_dur(risk)} of work since its last checkpoint is lost" if risk else ""
        why = d.summary if d is not None else "it died before gpuwatch could see why"
        yield Finding(
            "run.dead", Severity.CRITICAL if new else Severity.WARNING,
            f"run {name} is dead: {why}{lost} — fix the cause, then relaunch it from its "
            "latest checkpoint",
            run=name,
            evidence={"cause": d.cause if d else "unknown",
                      "diagnosis": d.to_json() if d else None, "died_at": d.at if d else None,
                      "pids": list(d.pids) if d else [], "new": new,
                      "latest_checkpoint": series.latest_checkpoint.path
                      if series.latest_checkpoint else None, "work_lost_s": risk})


def run_rank_dead(history: HostHistory) -> Iterable[Finding]:
    """Seed 002: one rank of a multi-process (DDP) run died while the others live on. The
    survivors will hang in the next collective until the NCCL timeout (often 30 min or
    more), holding their GPUs: critical while it lasts."""
    if history.current is None:
        return
    for name, d in history.rank_deaths.items():
        series = history.runs.get(name)
        if series is not None and getattr(series, "discovery", None) is not None:
            continue  # issue 8: a discovered run's grouping is a guess; a rank may just end
        survivors = d.evidence.get("survivors", [])
        yield Finding(
            "run.rank_dead", Severity.CRITICAL,
            f"run {name}: rank pid {', '.join(map(str, d.pids))} died ({d.summary}) while "
            f"{len(survivors)} other rank(s) live on and will hang until the NCCL timeout — "
            "kill the whole run and relaunch it from its latest checkpoint",
            run=name, evidence={"cause": d.cause, "diagnosis": d.to_json(), "died_at": d.at,
                                "dead_pids": list(d.pids), "survivors": survivors})


def run_sighup_risk(history: HostHistory) -> Iterable[Finding]:
    """Seed 000: a run process with a controlling terminal, SIGHUP neither ignored (nohup) nor
    caught, and no tmux/screen above it (setsid would have left it without a tty) dies when
    the SSH session that started it ends."""
    now = history.current
    if now is None:
        return
    table = _table(now)
    for sample in now.runs:
        exposed = [p for p in _run_procs(sample, now) if hup_exposed(p, table)]
        if not exposed:
            continue
        chain = [a.comm for a in ancestry(exposed[0], table)]
        yield Finding(
            "run.sighup_risk", Severity.WARNING,
            f"run {sample.name} (pid {exposed[0].pid}) is tied to a terminal without nohup, "
            "tmux or setsid: it dies when that SSH session drops — relaunch it detached "
            "(tmux, or setsid nohup ... &) at its next checkpoint",
            run=sample.name,
            evidence={"pids": [p.pid for p in exposed], "tty_nr": exposed[0].tty_nr,
                      "session": exposed[0].session, "ancestry": chain})


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


def _started(procs: Iterable[ProcessInfo]) -> float | None:
    times = [p.started_at for p in procs if p.started_at is not None]
    return min(times) if times else None


def _artifact_mtimes(sample: RunSample) -> dict[str, float]:
    out: dict[str, float] = {}
    files = [f.mtime for f in sample.event_files if f.error is None]
    if files:
        out["events"] = max(files)
    metrics = [m.mtime for m in sample.metrics if m.mtime is not None and m.error is None]
    if metrics:
        out["metrics"] = max(metrics)
    latest = sample.latest_checkpoint
    if latest is not None:
        out["checkpoint"] = latest.mtime
    return out


def run_progress(history: HostHistory) -> Iterable[Finding]:
    """U43: run.stalled — alive, but no log, event, metric or checkpoint write for stalled_s
    (seed 002: survivors of a dead rank look exactly like this). run.log_buffered — the log
    silent for log_buffered_s while events/metrics/checkpoints were written well after it:
    block-buffered stdout, not a dead run. Both are ages on the box's clock: no history needed."""
    th = history.thresholds
    for now, at, sample in _live_runs(history):
        procs = _run_procs(sample, now)
        started = _started(procs)
        up = at - started if started is not None else None
        arts = _artifact_mtimes(sample)
        log_mtime = sample.log.mtime if sample.log is not None else None
        times = list(arts.values()) + ([log_mtime] if log_mtime is not None else [])
        if not times:
            continue
        quiet = at - max(times)
        if quiet >= th.stalled_s and (up is None or up >= th.stalled_s):
            only_log = not arts
            yield Finding(
                "run.stalled", Severity.WARNING,
                f"run {sample.name} is alive but has written nothing for {_dur(quiet)}"
                + (" (only its log is watched: it may just be block-buffered)"
                   if only_log else "")
                + " — it is likely hung (a dead rank leaves the others waiting in NCCL): "
                "check its log and py-spy dump, then kill and relaunch",
                run=sample.name,
                evidence={"quiet_s": quiet, "log_age_s": None if log_mtime is None
                          else at - log_mtime,
                          "artifact_age_s": {k: at - v for k, v in arts.items()},
                          "uptime_s": up})
            continue
        if log_mtime is None or not arts:
            continue
        log_age = at - log_mtime
        newest_kind, newest = max(arts.items(), key=lambda kv: kv[1])
        if log_age >= th.log_buffered_s and newest - log_mtime >= th.log_buffered_s:
            yield Finding(
                "run.log_buffered", Severity.INFO,
                f"run {sample.name}'s log has been silent for {_dur(log_age)} while its "
                f"{newest_kind} was written {_dur(at - newest)} ago: stdout is "
                "block-buffered, the run is fine — next time launch with python -u or "
                "PYTHONUNBUFFERED=1",
                run=sample.name,
                evidence={"log_age_s": log_age, "newest": newest_kind,
                          "newest_age_s": at - newest})


def run_events_empty(history: HostHistory) -> Iterable[Finding]:
    """U39: events are configured but, after events_grace_s of the run being alive, there is no
    event file there or none holds a scalar: the writer logs somewhere else."""
    th = history.thresholds
    for now, at, sample in _live_runs(history):
        if sample.events_path is None:
            continue
        started = _started(_run_procs(sample, now))
        if started is None or at - started < th.events_grace_s:
            continue
        if any(f.pending for f in sample.event_files):
            continue  # still reading a big file
        series = history.runs.get(sample.name)
        has_scalars = bool(series and series.event_series)
        if sample.event_files and has_scalars:
            continue
        error = sample.errors.get("events")
        what = ("no event file" if not sample.event_files else
                f"{len(sample.event_files)} event file(s) without a scalar")
        yield Finding(
            "run.events_empty", Severity.WARNING,
            f"run {sample.name} has run {_dur(at - started)} but {sample.events_path} "
            f"holds {what}{f' ({error})' if error else ''}: its writer logs elsewhere — check "
            "SummaryWriter(log_dir=...) against the configured events path",
            run=sample.name,
            evidence={"events_path": sample.events_path, "files": len(sample.event_files),
                      "error": error, "uptime_s": at - started})


def ckpt_overdue(history: HostHistory) -> Iterable[Finding]:
    """Seed 001: no checkpoint for ckpt_overdue_factor × the run's own cadence (the median gap
    of its last checkpoints), and at least ckpt_overdue_min_s: a crash now loses all that."""
    th = history.thresholds
    for _now, at, sample in _live_runs(history):
        series = history.runs.get(sample.name)
        if series is None:
            continue
        cadence, latest = series.cadence_s, series.latest_checkpoint
        if cadence is None or latest is None:
            continue
        age = at - latest.mtime
        limit = max(th.ckpt_overdue_factor * cadence, th.ckpt_overdue_min_s)
        if age < limit:
            continue
        yield Finding(
            "ckpt.overdue", Severity.WARNING,
            f"run {sample.name} last checkpointed {_dur(age)} ago, {age / cadence:.1f}× its "
            f"usual {_dur(cadence)}: a crash now loses all of that — check it still makes "
            "progress and that the checkpoint disk is not full",
            run=sample.name,
            evidence={"age_s": age, "cadence_s": cadence, "latest": latest.path,
                      "work_at_risk_s": series.work_at_risk_s(at)})


def ckpt_tmp_leftover(history: HostHistory) -> Iterable[Finding]:
    """U6: a `*.tmp` / `*.partial` / `tmp*` beside the checkpoints that nobody writes any more
    (untouched for tmp_stale_s, or the run is not running): a save that failed, often on a
    full disk, and space worth freeing."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    for sample in now.runs:
        stale = [c for c in sample.leftovers
                 if not sample.pids or now.taken_at is None
                 or now.taken_at - c.mtime >= th.tmp_stale_s]
        if not stale:
            continue
        total = sum(c.bytes for c in stale)
        yield Finding(
            "ckpt.tmp_leftover", Severity.WARNING,
            f"run {sample.name} has {len(stale)} partial checkpoint(s) ({_gib(total)}, e.g. "
            f"{stale[0].path}) left by a failed save — check the disk is not full, then delete "
            "them",
            run=sample.name,
            evidence={"paths": [c.path for c in stale], "bytes": total})


# ---------------------------------------------------------------- disks

def _fs_checkpoint_bytes(now: HostSnapshot, mount: str | None) -> int:
    """The biggest latest checkpoint of a run on this filesystem: the next save needs that."""
    if not mount:
        return 0
    mounts = sorted({d.mount for d in now.disks if d.mount}, key=len, reverse=True)
    biggest = 0
    for sample in now.runs:
        latest = sample.latest_checkpoint
        if latest is None:
            continue
        home = next((m for m in mounts if latest.path == m or latest.path.startswith(
            m.rstrip("/") + "/")), None)
        if home == mount:
            biggest = max(biggest, latest.bytes)
    return biggest


def disk_low(history: HostHistory) -> Iterable[Finding]:
    """U6, U7: free bytes under disk_low_pct of the filesystem or under disk_low_bytes
    (warning); under disk_critical_pct, or too little for the next checkpoint of a run on it
    (critical: torch.save is about to fail). Free inodes likewise (disk.inodes_low)."""
    th = history.thresholds
    now = history.current
    if now is None:
        return
    seen: set[str] = set()
    for disk in now.disks:
        fs = disk.mount or disk.path
        if disk.error or fs in seen:
            continue
        seen.add(fs)
        if disk.bytes_total and disk.bytes_free is not None:
            pct = 100.0 * disk.bytes_free / disk.bytes_total
            need = _fs_checkpoint_bytes(now, disk.mount)
            critical = pct < th.disk_critical_pct or (need and disk.bytes_free < need)
            if critical or pct < th.disk_low_pct or disk.bytes_free < th.disk_low_bytes:
                fits = (f"; the next {_gib(need)} checkpoint will not fit" if need
                        and disk.bytes_free < need else "")
                yield Finding(
                    "disk.low", Severity.CRITICAL if critical else Severity.WARNING,
                    f"{fs} has {_gib(disk.bytes_free)} free ({pct:.1f}%){fits}: free space "
                    "now — delete old checkpoints and *.tmp partials or move them off",
                    subject=fs,
                    evidence={"path": disk.path, "mount": disk.mount,
                              "bytes_free": disk.bytes_free, "bytes_total": disk.bytes_total,
                              "free_pct": round(pct, 2), "next_checkpoint_bytes": need})
        if disk.inodes_total and disk.inodes_free is not None:
            ipct = 100.0 * disk.inodes_free / disk.inodes_total
            if ipct < th.inodes_low_pct:
                yield Finding(
                    "disk.inodes_low", Severity.CRITICAL if ipct < th.inodes_critical_pct
                    else Severity.WARNING,
                    f"{fs} has {disk.inodes_free:,} inodes free ({ipct:.1f}%): writes will fail "
                    "with 'No space left on device' whatever df -h says — delete or tar up "
                    "small files (per-sample outputs, caches)",
                    subject=fs,
                    evidence={"path": disk.path, "mount": disk.mount,
                              "inodes_free": disk.inodes_free,
                              "inodes_total": disk.inodes_total, "free_pct": round(ipct, 2)})


def disk_full_soon(history: HostHistory) -> Iterable[Finding]:
    """U6: at the growth rate seen over the history (at least disk_full_min_span_s of it:
    with cron `--once`, the stored previous poll and this one), the filesystem fills within
    disk_full_hours. Critical within an hour."""
    th = history.thresholds
    now = history.current
    if now is None or now.taken_at is None:
        return
    for disk in now.disks:
        if disk.error or disk.bytes_free is None:
            continue
        first = None
        for snap in history.snapshots:
            old = next((d for d in snap.disks if d.path == disk.path and d.mount == disk.mount
                        and d.bytes_free is not None), None)
            if old is not None and snap.taken_at is not None \
                    and now.taken_at - snap.taken_at >= th.disk_full_min_span_s:
                first = (snap.taken_at, old.bytes_free)
                break
        if first is None:
            continue
        span = now.taken_at - first[0]
        used = first[1] - disk.bytes_free  # type: ignore[operator]
        if used <= 0:
            continue
        rate = used / span
        hours = disk.bytes_free / rate / 3600
        if hours >= th.disk_full_hours:
            continue
        fs = disk.mount or disk.path
        yield Finding(
            "disk.full_soon", Severity.CRITICAL if hours < 1 else Severity.WARNING,
            f"{fs} fills in about {hours:.1f} h at the last {_dur(span)}'s rate "
            f"({_gib(rate * 3600)}/h): free space or cap the checkpoints kept before "
            "torch.save fails",
            subject=fs,
            evidence={"path": disk.path, "mount": disk.mount, "bytes_free": disk.bytes_free,
                      "bytes_per_hour": rate * 3600, "hours_left": hours, "span_s": span})


# ---------------------------------------------------------------- host

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
        + (f" at its {_gib(limit)} limit" if limit else "")
        + ": lower num_workers or the per-worker footprint, or rent more memory",
        evidence={"oom_kill_before": old, "oom_kill_now": new, "cgroup": now.cgroup.path,
                  "memory_max_bytes": limit,
                  "memory_current_bytes": now.cgroup.memory_current_bytes,
                  "victims": [{"pid": e.pid, "name": e.name} for e in victims]})


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
            return 0 if run is None else sum(p.threads for p in _descendants(run.pids, snap))

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


def run_code_changed(history: HostHistory) -> Iterable[Finding]:
    """U2, U42: the script a run process executes was modified on disk after the process
    started: the running code is not the code on disk (bash re-reads scripts mid-run; Python
    tracebacks will show the new lines)."""
    now = history.current
    if now is None:
        return
    for sample in now.runs:
        changed = [p for p in _run_procs(sample, now)
                   if p.script_mtime is not None and p.started_at is not None
                   and p.script_mtime > p.started_at + 2.0]  # btime is whole seconds
        if not changed:
            continue
        p = changed[0]
        late = (p.script_mtime or 0.0) - (p.started_at or 0.0)
        bash = p.comm in ("bash", "sh", "dash", "zsh")
        effect = ("bash reads scripts as it goes and may re-run or skip blocks" if bash else
                  "the run still executes the old code")
        yield Finding(
            "run.code_changed", Severity.WARNING,
            f"run {sample.name}: {p.script} changed on disk {_dur(late)}"
            f" after pid {p.pid} started — {effect}; version the file instead of overwriting "
            "it, and restart the run if the change must apply",
            run=sample.name,
            evidence={"pid": p.pid, "script": p.script, "script_mtime": p.script_mtime,
                      "started_at": p.started_at, "pids": [c.pid for c in changed]})


RULES: tuple[Rule, ...] = (
    host_unreachable, host_rebooted, host_kill_user_processes, host_cgroup_oom,
    host_cpu_oversubscribed, gpu_query_failed, gpu_driver_mismatch, gpu_lost,
    gpu_persistence_off,
    gpu_util_without_clock, gpu_throttled, gpu_xid, gpu_vram_zombie,
    gpu_idle_while_running, run_dead, run_rank_dead, run_sighup_risk, run_progress,
    run_events_empty, run_code_changed, ckpt_overdue, ckpt_tmp_leftover, disk_low,
    disk_full_soon)

CODES: dict[str, tuple[str, ...]] = {
    "host.unreachable": ("U3", "U17"), "host.rebooted": ("U3",),
    "host.kill_user_processes": ("seed 000",), "host.cgroup_oom": ("U41",),
    "host.cpu_oversubscribed": ("U40",), "gpu.util_without_clock": ("U21",),
    "gpu.throttled": ("U23",), "gpu.xid": ("U22",), "gpu.vram_zombie": ("U11",),
    "gpu.query_failed": ("U22", "U17"), "gpu.driver_mismatch": ("U22",), "gpu.lost": ("U22",),
    "gpu.persistence_off": ("U17",),
    "gpu.idle_while_running": ("U38", "U24"), "run.dead": ("U3",),
    "run.rank_dead": ("seed 002",), "run.sighup_risk": ("seed 000",),
    "run.stalled": ("U43", "seed 002"), "run.log_buffered": ("U43",),
    "run.events_empty": ("U39",), "run.code_changed": ("U2", "U42"),
    "ckpt.overdue": ("seed 001",), "ckpt.tmp_leftover": ("U6",), "disk.low": ("U6",),
    "disk.inodes_low": ("U7",), "disk.full_soon": ("U6",),
}
"""Every finding code and the gotchas it encodes (DESIGN §3)."""



def evaluate(history: HostHistory, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every finding of every rule, most severe first (also kept as history.findings)."""
    from .zombies import left_behind_runs, zombie_holders

    history.zombies = zombie_holders(history)
    if history.current is not None:  # a failed poll keeps what the last good one found
        history.left_behind = left_behind_runs(history, history.zombies)
    found = [f for rule in rules for f in rule(history)
             if f.run is None or f.run not in history.left_behind]
    found.sort(key=lambda f: (-f.severity, f.code, -1 if f.gpu is None else f.gpu, f.run or "",
                              f.subject or ""))
    history.findings = found
    return found


def worst(findings: Iterable[Finding]) -> Severity | None:
    return max((f.severity for f in findings), default=None)
