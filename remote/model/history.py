"""What the rules see of one host: its bounded history of snapshots, its runs' series, the
GPUs it has shown, the deaths the evaluation diagnosed. `record` folds a poll in (state only);
the findings' evaluation reads it and the pipeline (watch/landing.py) applies what it decided."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config.thresholds import HISTORY_LEN, Thresholds
from .ack import Ack
from .death import Diagnosis
from .finding import Finding
from .processes import ZombieHolder, gpus_of, one_job, ranks, with_cpu_pct
from .series import RunSeries
from .snapshot import GpuError, HostSnapshot, Scalars, same_gpu_ids

__all__ = ["HISTORY_LEN", "Departure", "HostHistory", "PollFailure", "same_gpu"]


@dataclass(frozen=True, slots=True)
class PollFailure:
    """A poll that did not return a snapshot."""

    kind: str
    message: str
    at: float


@dataclass(frozen=True, slots=True)
class Departure:
    """A run (or some ranks of it) gone between two polls, with what its diagnosis reads:
    remote/findings/diagnosis.py's `diagnose(before, now, pids, ...)`."""

    run: str
    before: HostSnapshot
    now: HostSnapshot
    pids: tuple[int, ...]
    tail: str | None
    log_changed: bool | None
    gpus: frozenset[int]
    exit_code: int | None
    rank_of: Mapping[str, Any] | None = None
    """For a rank that died while others live on (seed 002): the survivors and how many ranks
    there were, added to the diagnosis's evidence; None for the whole run."""


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
    departures: dict[str, Departure] = field(default_factory=dict)
    """Runs (key: name) and ranks (key: "rank:" + name) seen to vanish by `record` and not yet
    diagnosed: remote/findings' evaluation decides why (diagnosis.py) and the pipeline moves
    its verdicts into `deaths` / `rank_deaths` (Evaluation.apply), which empties this."""
    findings: list[Finding] = field(default_factory=list)
    """What `evaluate` found at the latest poll (the store keeps their first/last seen)."""
    zombies: list[ZombieHolder] | None = None
    """The VRAM zombie holders `evaluate` found at the latest poll (zombies.py); None once
    another poll is recorded, until it is evaluated."""
    left_behind: frozenset[str] = frozenset()
    """Discovered runs whose every live process is a VRAM zombie holder (U11): what a dead run
    left behind, not a run of its own (its cwd and script made discovery group it). Shown as
    left behind rather than running; its own findings give way to gpu.vram_zombie."""
    curve_tags: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    """Each configured run's (loss_tag, eval_tag) where the config names them."""
    acks: dict[str, list[Ack]] = field(default_factory=dict)
    """Per run, the deaths a person acknowledged or asked for (model/ack.py), oldest first:
    the pipeline reads them from the store before each judgement (another process's
    `gpuwatch ack` counts at the next poll)."""
    expects_gpus: bool = False
    """The config names runs on this host: a GPU query that cannot run here (no nvidia-smi on
    the PATH of SSH commands) is a GPU failure, never "no GPU" (U22, U17)."""
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
            # snapshots of a run with a 2 GB event file do not hold it twice (the soak's lesson).
            self.snapshots[-1] = _without_scalars(before)
        snapshot = with_cpu_pct(before, snapshot)  # each process's CPU% since `before`
        snapshot = self._gpus_expected(snapshot)
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

    def _gpus_expected(self, snapshot: HostSnapshot) -> HostSnapshot:
        """U22, U17: a GPU tool missing on a host that had GPUs (or whose config names runs)
        is a failed GPU query, said the same in every output (gpu_error, gpu.query_failed,
        gpu_query_ok 0), never "no GPU"."""
        if snapshot.gpu_error is not None or snapshot.gpu_tool_missing is None \
                or not (self.known_gpus or self.expects_gpus):
            return snapshot
        return replace(snapshot, gpu_error=GpuError("not_found", snapshot.gpu_tool_missing,
                                                    snapshot.gpu_query_s, False))

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
        """U3, seed 002: note the runs (and ranks) that vanished since `before`, with what a
        diagnosis needs; the evaluation diagnoses them (Departure)."""
        self.new_deaths = set()
        for name, series in self.runs.items():
            if series.status != "dead":
                self.deaths.pop(name, None)
                self.departures.pop(name, None)
            if series.status != "running":
                self.rank_deaths.pop(name, None)
                self.departures.pop("rank:" + name, None)
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
            if not sample.pids or known.status == "dead":
                self.departures[sample.name] = Departure(
                    sample.name, before, now, tuple(prev.pids), known.tail, log_changed,
                    frozenset(gpus_of(prev.pids, before)), known.exit_code())
                self.new_deaths.add(sample.name)
                continue
            run_ranks = ranks(prev.pids, before)
            dead_ranks, survivors = one_job(
                [pid for pid in run_ranks if pid in gone],
                [pid for pid in run_ranks if pid not in gone], prev.pids, before)
            if len(run_ranks) >= 2 and dead_ranks and survivors:
                self.departures["rank:" + sample.name] = Departure(
                    sample.name, before, now, tuple(dead_ranks), known.tail, log_changed,
                    frozenset(gpus_of(dead_ranks, before)), None,
                    rank_of={"survivors": survivors, "ranks_before": len(run_ranks)})
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


def same_gpu(known: Mapping[str, Any], gpu: Any) -> bool:
    """Whether a remembered GPU ({"index", "uuid", "pci"}) is this listed one (same_gpu_ids)."""
    return same_gpu_ids(known.get("uuid"), known.get("pci"), known.get("index"), gpu)
