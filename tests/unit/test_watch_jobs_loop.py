"""The scheduler's rounds while polling (FleetWatch.start, as the TUI and `gpuwatch watch` poll):
a round every interval on a task of its own, a failed round the jobs report's error (the loop
goes on), a running job's new node joins the hosts being polled, stop() ends the task. The
scheduler and the hosts are stand-ins (the real Slurm drives tests/integration/test_slurm_jobs.py
and tests/tui/test_tui_jobs_tmux.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import tui_fixtures as fx
from gpuwatch.remote.config.schema import Config, HostConfig, SlurmConfig
from gpuwatch.remote.model.slurm_job import Job, JobsReport
from gpuwatch.remote.sources.slurm import Answer, SlurmError
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome
from harness.waiting import wait_for_async

RUNNING = Job("7", "train", "me", "RUNNING", start_at=fx.NOW - 60, end_at=fx.NOW + 3600,
              time_limit_s=3660, elapsed_s=60, nodes=("node7",))


class Hosts:
    """Every poll of a host fails at once (the rounds of the jobs are what is tested)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def memory(self, host: HostConfig) -> dict[str, Any]:
        return {}

    def restore(self, host: HostConfig, memory: object) -> None:
        pass

    async def poll(self, host: HostConfig, runs: Any = None) -> PollOutcome:
        self.calls[host.name] += 1
        await asyncio.sleep(0)
        return fx.failed(host, fx.NOW)


class Scheduler:
    """Answers rounds from a script: an Answer, a SlurmError (the login host down) or another
    exception (a bug of a round's own); the last one goes on."""

    def __init__(self, script: list[Answer | Exception]) -> None:
        self.script = script
        self.rounds = 0

    async def poll(self) -> Answer:
        said = self.script[min(self.rounds, len(self.script) - 1)]
        self.rounds += 1
        if isinstance(said, Exception):
            raise said
        return said


def answer(*jobs: Job) -> Answer:
    return Answer(jobs, "22.05.8", "squeue --json", "me", fx.NOW)


async def test_jobs_are_asked_every_interval_errors_kept_and_stop_ends_the_task() -> None:
    config = Config(interval=0.05, hosts=(HostConfig(name="login", ssh="login"),),
                    slurm=SlurmConfig(host="login1"))
    hosts = Hosts()
    with Store.open(":memory:") as store:
        fleet = FleetWatch(config, store, role="tui", collector=hosts)  # type: ignore[arg-type]
        assert fleet.jobs is not None
        scheduler = Scheduler([answer(RUNNING), SlurmError("unreachable", "login1 is down"),
                               RuntimeError("a bug of its own"), answer(RUNNING)])
        fleet.jobs.source = scheduler  # type: ignore[assignment]
        reports: list[JobsReport] = []
        fleet.listen(lambda _r: None, on_jobs=reports.append)
        fleet.start()
        try:
            await wait_for_async(lambda: len(reports) >= 4, what="four rounds of the scheduler")
            first, down, broken, back = reports[:4]
            assert first.ok and [v.job.job_id for v in first.jobs] == ["7"]
            assert not down.ok and down.error == {"kind": "unreachable",
                                                  "message": "login1 is down"}
            assert not broken.ok and broken.error is not None
            assert "a bug of its own" in broken.error["message"]
            assert back.ok  # the loop went on
            assert fleet.jobs.report is reports[-1]  # the pipeline holds the latest round
            # the running job's node: a host from the first round on, polled on its own loop
            assert "node7" in fleet.names
            await wait_for_async(lambda: hosts.calls["node7"] >= 2, what="node7 polled")
            task = fleet._jobs_task
            assert task is not None
        finally:
            await fleet.stop()
        assert task.done() and fleet._jobs_task is None
        assert not fleet.polling


async def test_paused_asks_only_when_told_and_r_asks_at_once() -> None:
    config = Config(interval=3600.0, hosts=(HostConfig(name="login", ssh="login"),),
                    slurm=SlurmConfig(host="login1"))
    with Store.open(":memory:") as store:
        fleet = FleetWatch(config, store, role="tui", collector=Hosts())  # type: ignore[arg-type]
        assert fleet.jobs is not None
        scheduler = Scheduler([answer()])
        fleet.jobs.source = scheduler  # type: ignore[assignment]
        fleet.start()
        try:
            await wait_for_async(lambda: scheduler.rounds == 1, what="the first round")
            fleet.poll_now()  # R: every host, and the scheduler, now (not in an hour)
            await wait_for_async(lambda: scheduler.rounds == 2, what="a round on R")
            fleet.pause()
            fleet.poll_now(through_pause=True)  # R while paused: once
            await wait_for_async(lambda: scheduler.rounds == 3, what="a round on R, paused")
        finally:
            await fleet.stop()
