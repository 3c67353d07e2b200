"""Why a Slurm job ended, or waits, in words; the findings of a job; the time limit before it
bites (docs/slurm.md).

`judge(job, run, now, warn_before_s)` turns a job (what squeue or sacct said) and the run it is
linked to (its latest checkpoint) into a JobView: the cause as a word, one sentence a person can
act on, and job-level findings (`job.*` codes). Pure: no I/O; the clock is an argument.
"""

from __future__ import annotations

import datetime as dt
import signal as signals

from ..model.finding import Finding, Severity
from ..model.slurm_job import Job, JobRun, JobView
from ..units import duration, mib

OOM_SHARE = 0.9
"""A job killed by signal 9 whose largest step held at least this share of its --mem was
killed for its memory (task/none + OverMemoryKill ends it FAILED with signal 9, not
OUT_OF_MEMORY as task/cgroup does)."""

PENDING_WORDS = {
    "Resources": "waiting for resources (nodes, GPUs or memory to free up)",
    "Priority": "higher-priority jobs are ahead of it",
    "Dependency": "waiting for the job it depends on",
    "DependencyNeverSatisfied": "its dependency can never be met (the job it waits for failed): "
                                "it will never start; scancel it or change --dependency",
    "JobHeldUser": "held by its user (scontrol release JOB lets it go)",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "its --begin time has not come",
    "QOSMaxGRESPerUser": "its QOS's per-user GPU limit is reached (your other jobs hold them)",
    "QOSMaxJobsPerUserLimit": "its QOS's per-user limit of running jobs is reached",
    "QOSMaxCpuPerUserLimit": "its QOS's per-user CPU limit is reached",
    "AssocGrpGRES": "its account's GPU limit is reached",
    "AssocGrpCpuLimit": "its account's CPU limit is reached",
    "AssocMaxJobsLimit": "its account's limit of running jobs is reached",
    "ReqNodeNotAvail": "a node it asked for is not available (down, drained or reserved)",
    "PartitionTimeLimit": "its time limit is over the partition's: it will never start as it is",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionDown": "its partition is down",
    "Reservation": "waiting for its reservation to start",
    "launch failed requeued held": "its launch failed; it was requeued and held",
    "BadConstraints": "its constraints cannot be met by any node",
}
"""A pending reason in words (squeue's REASON column); one not here is shown as it is."""
NEVER_STARTS = ("DependencyNeverSatisfied", "PartitionTimeLimit", "PartitionNodeLimit",
                "BadConstraints")


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _at(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _after(job: Job) -> str:
    return f" after {duration(job.elapsed_s)}" if job.elapsed_s is not None else ""


def _nodes(job: Job) -> str:
    return ", ".join(job.nodes) or job.node_list or "its node"


def cause_of(job: Job) -> tuple[str | None, str | None, Severity | None]:
    """(cause word, the sentence, how bad) of how a job ended or why it waits; Nones for a job
    that runs."""
    state = job.state
    if state == "COMPLETED":
        return "completed", f"finished{_after(job)} (exit 0)", None
    if state == "TIMEOUT":
        limit = duration(job.time_limit_s) if job.time_limit_s is not None else "its"
        return ("timeout", f"killed at its {limit} time limit{_after(job)}; what it did since "
                "its last checkpoint is lost: ask for more time (--time), checkpoint on warning "
                "(--signal=USR1@600) or save more often", Severity.CRITICAL)
    if state == "OUT_OF_MEMORY" or _killed_for_memory(job):
        return "out_of_memory", _memory_words(job), Severity.CRITICAL
    if state == "NODE_FAIL":
        return ("node_fail", f"its node {_nodes(job)} failed{_after(job)}: the job did nothing "
                "wrong; requeue it (scontrol requeue) and look at the node", Severity.CRITICAL)
    if state == "PREEMPTED":
        return ("preempted", f"preempted by a higher-priority job{_after(job)}: it is requeued "
                "if it allows it (--requeue), else resubmit it", Severity.WARNING)
    if state == "CANCELLED":
        who = job.cancelled_by
        own = who is not None and job.user is not None and who == job.user
        by = f" by {who}" if who else ""
        cancelled = Severity.INFO if own or who is None else Severity.WARNING
        return "cancelled", f"cancelled{by}{_after(job)}", cancelled
    if state == "FAILED":
        if job.signal:
            return ("failed", f"killed by {_signal_name(job.signal)}{_after(job)}",
                    Severity.CRITICAL)
        code = job.exit_code
        return ("failed", f"exited with code {code if code is not None else '?'}{_after(job)}: "
                "its log says why", Severity.CRITICAL)
    if state == "BOOT_FAIL":
        return "boot_fail", f"its node {_nodes(job)} failed to boot", Severity.CRITICAL
    if state == "DEADLINE":
        return "deadline", "ended at its --deadline", Severity.WARNING
    if job.pending:
        reason = job.reason or "no reason given yet"
        words = PENDING_WORDS.get(reason, reason)
        start = (f"; expected to start {_at(job.start_at)}"
                 if job.start_at and job.reason not in NEVER_STARTS else "")
        severity = Severity.WARNING if job.reason in NEVER_STARTS else None
        return "pending", f"pending: {words}{start}", severity
    return None, None, None


def _killed_for_memory(job: Job) -> bool:
    return (job.state in ("FAILED", "CANCELLED") and job.signal == signals.SIGKILL
            and job.max_rss_mib is not None and job.req_mem_mib is not None
            and job.max_rss_mib >= OOM_SHARE * job.req_mem_mib)


def _memory_words(job: Job) -> str:
    held = (f": its largest step held {mib(job.max_rss_mib)} of the {mib(job.req_mem_mib)} it "
            "asked for (--mem)" if job.max_rss_mib is not None and job.req_mem_mib is not None
            else (f" ({mib(job.req_mem_mib)} asked for with --mem)"
                  if job.req_mem_mib is not None else ""))
    return (f"killed for exceeding its memory{_after(job)}{held}; ask for more (--mem) or hold "
            "less (smaller batches, fewer dataloader workers)")


CODES = {"timeout": "job.timeout", "out_of_memory": "job.out_of_memory",
         "node_fail": "job.node_fail", "preempted": "job.preempted", "cancelled": "job.cancelled",
         "failed": "job.failed", "boot_fail": "job.boot_fail", "deadline": "job.deadline",
         "pending": "job.never_starts"}
"""A cause's finding code (docs/slurm.md)."""


def time_limit_finding(job: Job, run: JobRun | None, now: float,
                       warn_before_s: float) -> Finding | None:
    """A running job within `warn_before_s` of its time limit whose latest checkpoint is older
    than the time it has left: the work since that checkpoint is lost at the limit."""
    if not job.running or job.end_at is None or job.time_limit_s is None:
        return None
    left = job.end_at - now
    if left > warn_before_s or left < 0:
        return None
    helps = ("checkpoint on Slurm's warning (sbatch --signal=USR1@600 and save on SIGUSR1), let "
             "it come back (--requeue, resuming from its checkpoint), or save more often")
    evidence: dict[str, object] = {"job": job.job_id, "time_left_s": round(left),
                                   "time_limit_s": job.time_limit_s}
    if run is None:
        return Finding("job.time_limit", Severity.INFO,
                       f"job {job.job_id} ({job.name}) reaches its time limit in "
                       f"{duration(left)}; gpuwatch sees none of its checkpoints (no run linked "
                       f"to it); {helps}", evidence=evidence, subject=job.job_id)
    if run.checkpoint_at is None:
        at_risk = job.elapsed_s
        evidence.update(checkpoint_age_s=None, at_risk_s=at_risk)
        return Finding("job.time_limit", Severity.WARNING,
                       f"job {job.job_id} ({job.name}) is killed at its time limit in "
                       f"{duration(left)} and has no checkpoint: all "
                       f"{duration((at_risk or 0) + left)} of its work is lost then; {helps}",
                       run=run.run, evidence=evidence, subject=job.job_id)
    age = max(0.0, now - run.checkpoint_at)
    if age <= left:
        return None
    evidence.update(checkpoint_age_s=round(age), at_risk_s=round(age + left))
    return Finding("job.time_limit", Severity.WARNING,
                   f"job {job.job_id} ({job.name}) is killed at its time limit in "
                   f"{duration(left)}; its last checkpoint is {duration(age)} old, so about "
                   f"{duration(age + left)} of work is lost then; {helps}",
                   run=run.run, evidence=evidence, subject=job.job_id)


def judge(job: Job, run: JobRun | None, now: float, warn_before_s: float) -> JobView:
    """A job with its cause in words, its run and its findings."""
    cause, why, severity = cause_of(job)
    findings: list[Finding] = []
    if severity is not None and cause is not None:
        findings.append(Finding(CODES.get(cause, f"job.{cause}"), severity,
                                f"job {job.job_id} ({job.name}) {why}",
                                run=run.run if run else None,
                                evidence=_evidence(job), subject=job.job_id))
    limit = time_limit_finding(job, run, now, warn_before_s)
    if limit is not None:
        findings.append(limit)
    return JobView(job=job, why=why, cause=cause, run=run, findings=tuple(findings))


def _evidence(job: Job) -> dict[str, object]:
    out: dict[str, object] = {"job": job.job_id, "state": job.state}
    for name in ("exit_code", "signal", "elapsed_s", "time_limit_s", "max_rss_mib",
                 "req_mem_mib", "cancelled_by", "reason"):
        value = getattr(job, name)
        if value is not None:
            out[name] = value
    if job.nodes:
        out["nodes"] = list(job.nodes)
    return out
