"""A Slurm job's actions, planned: what is hit, whether it is refused, what verifies it
(docs/slurm.md#actions).

`gpuwatch job requeue|cancel` and the TUI's jobs screen (`r`, `c`) both plan here, so that the
dialog and the verb show the same job in the same words and refuse the same things; the pipeline
(remote/watch/jobs.py) sends the action (SlurmSource.act: its own bounded call on the login
host), audits it and verifies it by the next rounds of the scheduler, never by the command's exit
status alone. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model.slurm_job import ENDED, Job
from .slurm import action_command

KINDS = ("requeue", "cancel")


@dataclass(frozen=True, slots=True)
class JobPlan:
    """An action on one job, as it will be sent (or why it will not be)."""

    kind: str
    """requeue | cancel"""
    job_id: str
    job: Job | None
    """The job as the scheduler last listed it (None: it does not list it)."""
    refusal: str | None = None
    """Why it is not sent, one sentence; None: it may be."""

    @property
    def command(self) -> str:
        """The command run on the login host (scontrol requeue / scancel)."""
        return action_command(self.kind, self.job_id)

    @property
    def target(self) -> list[dict[str, str | None]]:
        """What the audit log records as its target."""
        return [{"job": self.job_id, "name": self.job.name if self.job else None}]

    def describe(self) -> str:
        """The job as it will be hit: id, name, state, nodes, user, and the command."""
        job = self.job
        if job is None:
            return f"{self.kind} job {self.job_id}"
        nodes = ", ".join(job.nodes) or job.node_list or "no node"
        return (f"{self.kind} job {job.job_id} ({job.name}), {job.state}, on {nodes}, user "
                f"{job.user or '?'}: {self.command.removesuffix(' 2>&1')}")


def refusal(kind: str, job: Job | None, job_id: str) -> str | None:
    """Why an action on a job is refused (None: it is not): a job the scheduler does not list,
    a cancel of a job that ended, a requeue of a pending one."""
    if job is None:
        return f"the scheduler has no job {job_id} of yours (ended long ago, or another user's?)"
    if kind == "cancel" and job.state in ENDED:
        return f"job {job_id} has already ended ({job.state}): nothing to cancel"
    if kind == "requeue" and job.pending:
        return f"job {job_id} is already pending: nothing to requeue"
    return None


def plan_job(kind: str, job_id: str, jobs: Iterable[Job], *, readonly: bool = False) -> JobPlan:
    """The plan of `kind` on job `job_id`, from the jobs the scheduler listed last. Raises
    ValueError for an unknown action or a job id that is not one (action_command's)."""
    action_command(kind, job_id)
    job = next((j for j in jobs if j.job_id == job_id), None)
    why = refusal(kind, job, job_id)
    if why is None and readonly:
        why = "gpuwatch is read-only here (--readonly or readonly = true)"
    return JobPlan(kind, job_id, job, why)


def can(kind: str, job: Job) -> bool:
    """Whether `kind` would be sent for this job (a key is greyed out where not)."""
    return refusal(kind, job, job.job_id) is None


def verified(kind: str, before: Job, after: Job | None) -> bool:
    """Whether a round after the action shows it done: a cancelled job ended; a requeued job
    pending or running again (a job that was running: requeued, its restarts counted up)."""
    if after is None:
        return False
    if kind == "cancel":
        return after.state in ENDED
    return (after.pending or after.running) and (
        before.state in ENDED or after.pending or (after.restarts or 0) > (before.restarts or 0))
