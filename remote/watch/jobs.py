"""The scheduler's round inside the pipeline: `[slurm]`'s jobs, their nodes polled as hosts,
each job joined to its run and judged (docs/slurm.md).

FleetWatch owns one JobsWatch when the config has `[slurm]`. A round asks the login host first
(remote/sources/slurm.py: one bounded call), adds the running jobs' nodes the config does not
poll yet as hosts (`[slurm] nodes`), polls every host as always, then links each job to its run
on its nodes (sources/slurm_link.py) and judges it (sources/slurm_why.py: the cause in words,
the time-limit warning). The result is one JobsReport, beside the hosts' reports.

A job's actions (`gpuwatch job`, the TUI's jobs screen) are planned by sources/slurm_act.py and
sent, audited and verified here: one way for both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.schema import HostConfig, SlurmConfig
from ..model.history import HostHistory
from ..model.slurm_job import Job, JobsReport
from ..sources.slurm import Answer, SlurmError, SlurmSource
from ..sources.slurm_act import JobPlan, verified
from ..sources.slurm_link import host_of, link, node_hosts
from ..sources.slurm_why import judge

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What became of a job's action: sent (or verified), in one sentence."""

    ok: bool
    message: str
    error_kind: str | None = None
    """The action could not be sent at all (the login host's failure kind)."""
    job: Job | None = None
    """The job as the last round listed it (verify)."""


class JobsWatch:
    """One `[slurm]` table's rounds, and the latest JobsReport."""

    def __init__(self, config: SlurmConfig, *, accept_new_host_keys: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.source = SlurmSource(config, accept_new_host_keys=accept_new_host_keys)
        self.clock = clock
        self.answer: Answer | SlurmError | None = None
        self.report: JobsReport | None = None

    async def poll(self) -> Answer | SlurmError:
        try:
            self.answer = await self.source.poll()
        except SlurmError as exc:
            self.answer = exc
        return self.answer

    def poll_sync(self) -> Answer | SlurmError:
        try:
            self.answer = self.source.poll_sync()
        except SlurmError as exc:
            self.answer = exc
        return self.answer

    def new_hosts(self, known: tuple[HostConfig, ...]) -> list[HostConfig]:
        """The running jobs' nodes that no host polls yet."""
        if not isinstance(self.answer, Answer):
            return []
        return node_hosts(self.config, self.answer.jobs, known)

    def land(self, histories: Mapping[str, HostHistory],
             known: tuple[HostConfig, ...]) -> JobsReport:
        """The round's jobs, each linked to its run on its nodes and judged."""
        answer = self.answer
        if answer is None or isinstance(answer, SlurmError):
            error = ({"kind": answer.kind, "message": answer.message}
                     if isinstance(answer, SlurmError) else
                     {"kind": "probe", "message": "the scheduler was not asked yet"})
            self.report = JobsReport(host=self.config.host, ok=False, polled_at=self.clock(),
                                     error=error)
            return self.report
        views = []
        for job in answer.jobs:
            run = link(job, histories, lambda node: host_of(self.config, node, known)) \
                if job.running else None
            views.append(judge(job, run, answer.now, self.config.warn_before_limit_s))
        self.report = JobsReport(host=self.config.host, ok=True, polled_at=answer.now,
                                 version=answer.version, via=answer.via, jobs=tuple(views),
                                 problems=answer.problems)
        return self.report

    # -- a person's actions on a job (planned by sources/slurm_act.py) -----------------------
    def refused(self, plan: JobPlan, store: Store) -> None:
        """A refused plan, in the audit log (a script's `gpuwatch job` that did nothing)."""
        store.record_action(who=_who(), host=self.config.host, action=f"job {plan.kind}",
                            phase="execute", targets=plan.target, command=None,
                            outcome="refused", ok=False, message=plan.refusal or "refused")

    async def act(self, plan: JobPlan, store: Store) -> JobOutcome:
        """Send a confirmed plan: its own bounded call on the login host, audited. ok: the
        scheduler took it (exit 0); verify() says whether it happened."""
        kind, job_id = plan.kind, plan.job_id
        if plan.refusal is not None:
            return JobOutcome(False, f"cannot {kind}: {plan.refusal}")
        try:
            status, said = await self.source.act(kind, job_id)
        except SlurmError as exc:
            store.record_action(who=_who(), host=self.config.host, action=f"job {kind}",
                                phase="execute", targets=plan.target, command=plan.command,
                                outcome=exc.kind, ok=False, message=exc.message)
            return JobOutcome(False, f"{kind} of job {job_id} not sent: {exc.message}",
                              error_kind=exc.kind)
        ok = status == 0
        message = f"{kind} of job {job_id}: " + (said or ("sent" if ok else f"exit {status}"))
        store.record_action(who=_who(), host=self.config.host, action=f"job {kind}",
                            phase="execute", targets=plan.target, command=plan.command,
                            outcome="sent" if ok else "failed", ok=ok, message=message)
        return JobOutcome(ok, message)

    async def verify(self, plan: JobPlan, next_round: Callable[[], Awaitable[Answer | SlurmError]],
                     store: Store, rounds: int) -> JobOutcome:
        """THE verify loop of a job's action: up to `rounds` rounds of the scheduler after it
        (`next_round` brings one, waiting as its caller paces them) until one shows it done
        (slurm_act.verified), audited either way."""
        before = plan.job
        after: Job | None = None
        good = False
        for _ in range(rounds):
            answer = await next_round()
            if isinstance(answer, SlurmError):
                continue
            after = next((j for j in answer.jobs if j.job_id == plan.job_id), None)
            good = before is not None and verified(plan.kind, before, after)
            if good:
                break
        state = after.state if after is not None else "not listed"
        said = f"job {plan.job_id} is {state}" + (f" ({after.reason})" if after and after.reason
                                                  else "")
        store.record_action(who=_who(), host=self.config.host, action=f"job {plan.kind}",
                            phase="verify", targets=plan.target, command=None,
                            outcome="verified" if good else "not verified", ok=good,
                            message=said, at=time.time())
        return JobOutcome(good, said, job=after)


def _who() -> str:
    from ..actions.execute import who

    return who()
