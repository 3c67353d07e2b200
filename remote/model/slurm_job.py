"""A Slurm job as gpuwatch keeps it, and one round of the scheduler's word (docs/slurm.md).

Plain data with units in the names (DESIGN §2): what squeue said of a live job, or sacct of one
that ended, read by remote/sources/slurm_parse.py; why it ended, in words, and the findings of
one round (remote/sources/slurm_why.py); the run it is linked to on its node (remote/watch/jobs.py).
`None` where the scheduler did not say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .finding import Finding

ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
         "CANCELLED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT")
"""Base states of a job that is over (what sacct reports for the jobs that ended)."""
LIVE = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
        "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
        "RESV_DEL_HOLD")


@dataclass(frozen=True, slots=True)
class Job:
    """One job (one array task: an array's tasks are jobs of one `array_job_id`)."""

    job_id: str
    """The id a person types: `1234`, or `1234_7` for an array's task."""
    name: str
    user: str | None
    state: str
    """The base state, upper case: RUNNING, PENDING, TIMEOUT, OUT_OF_MEMORY, CANCELLED..."""
    reason: str | None = None
    """Why it is pending (Resources, Priority, Dependency, JobHeldUser...); None when none."""
    partition: str | None = None
    account: str | None = None
    submit_at: float | None = None
    start_at: float | None = None
    """When it started; for a pending job the scheduler's expected start, if it has one."""
    end_at: float | None = None
    """When it ended; for a running job when its time limit ends it."""
    time_limit_s: float | None = None
    """None: no limit (UNLIMITED)."""
    elapsed_s: float | None = None
    nodes: tuple[str, ...] = ()
    """Its nodes, the node list expanded (node[01-02] is node01, node02)."""
    node_list: str | None = None
    """The node list as the scheduler wrote it."""
    exit_code: int | None = None
    signal: int | None = None
    """The signal that ended its batch script, when one did (the `:9` of sacct's `0:9`)."""
    cancelled_by: str | None = None
    """Who cancelled it (a user name, or `uid N` when only the number is known)."""
    req_mem_mib: float | None = None
    """The memory it asked for, per node (`--mem`), in MiB."""
    max_rss_mib: float | None = None
    """The largest resident memory of any of its steps, in MiB (sacct's MaxRSS)."""
    workdir: str | None = None
    stdout: str | None = None
    """Its StdOut file, a path on its node (the log)."""
    array_job_id: str | None = None
    array_task_id: str | None = None
    restarts: int | None = None
    """How many times it was requeued."""
    source: str = "squeue"
    """squeue (a live job) | sacct (one that ended, from accounting)."""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING")

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")


@dataclass(frozen=True, slots=True)
class JobRun:
    """The run a job is linked to: on which host, by which run's processes."""

    host: str
    run: str
    pids: tuple[int, ...] = ()
    log: str | None = None
    checkpoint_at: float | None = None
    """The mtime of its latest checkpoint, epoch s (None: none seen)."""
    last_step: int | None = None
    last_loss: float | None = None
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "run": self.run, "pids": list(self.pids), "log": self.log,
                "checkpoint_at": self.checkpoint_at, "last_step": self.last_step,
                "last_loss": self.last_loss, "status": self.status}


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with what gpuwatch says of it: the cause of its end in words, its run."""

    job: Job
    why: str | None = None
    """Why it ended (or why it waits), one sentence; None for a job running fine."""
    cause: str | None = None
    """The cause as a word: timeout, out_of_memory, node_fail, preempted, cancelled, failed,
    completed, pending... (docs/slurm.md)."""
    run: JobRun | None = None
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        j = self.job
        return {
            "job_id": j.job_id, "name": j.name, "user": j.user, "state": j.state,
            "reason": j.reason, "partition": j.partition, "account": j.account,
            "submit_at": j.submit_at, "start_at": j.start_at, "end_at": j.end_at,
            "time_limit_s": j.time_limit_s, "elapsed_s": j.elapsed_s, "nodes": list(j.nodes),
            "exit_code": j.exit_code, "signal": j.signal, "cancelled_by": j.cancelled_by,
            "req_mem_mib": j.req_mem_mib, "max_rss_mib": j.max_rss_mib, "workdir": j.workdir,
            "stdout": j.stdout, "array_job_id": j.array_job_id,
            "array_task_id": j.array_task_id, "source": j.source, "cause": self.cause,
            "why": self.why, "run": self.run.to_json() if self.run else None,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass(frozen=True, slots=True)
class JobsReport:
    """One round of the scheduler: every job of the user it saw, or why it saw none."""

    host: str
    """The login host asked (`local`: this machine)."""
    ok: bool
    polled_at: float
    version: str | None = None
    """The Slurm version the login host reported (`22.05.8`)."""
    via: str | None = None
    """How the live jobs were read: `squeue --json` or `squeue --format`."""
    jobs: tuple[JobView, ...] = ()
    error: Mapping[str, str] | None = None
    """{kind, message} when the round failed (kinds as a host's, `probe` for a bad answer)."""
    problems: tuple[str, ...] = field(default_factory=tuple)
    """Lines of the answer that could not be read (each says which and why); the rest stands."""

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "polled_at": self.polled_at,
                "version": self.version, "via": self.via,
                "error": dict(self.error) if self.error else None,
                "problems": list(self.problems), "jobs": [v.to_json() for v in self.jobs]}

    def job(self, job_id: str) -> JobView | None:
        return next((v for v in self.jobs if v.job.job_id == job_id), None)
