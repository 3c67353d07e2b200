"""The scheduler's round inside the pipeline: `[slurm]`'s jobs, their nodes polled as hosts,
each job joined to its run and judged (docs/slurm.md).

FleetWatch owns one JobsWatch when the config has `[slurm]`. A round asks the login host first
(remote/sources/slurm.py: one bounded call), adds the running jobs' nodes the config does not
poll yet as hosts (`[slurm] nodes`), polls every host as always, then links each job to its run
on its nodes (sources/slurm_link.py) and judges it (sources/slurm_why.py: the cause in words,
the time-limit warning). The result is one JobsReport, beside the hosts' reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..config.schema import HostConfig, SlurmConfig
from ..model.history import HostHistory
from ..model.slurm_job import JobsReport
from ..sources.slurm import Answer, SlurmError, SlurmSource
from ..sources.slurm_link import host_of, link, node_hosts
from ..sources.slurm_why import judge


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
