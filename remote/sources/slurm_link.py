"""A Slurm job joined to its run on its nodes (docs/slurm.md, "Jobs and runs").

A running job's nodes are hosts polled like any other (`[slurm] nodes`: an ssh target with
`{node}`, or `local`). On a node's host, the job's run is the one whose processes carry
`SLURM_JOB_ID=<the job>` in their environment (the probe reads a discovered run's environment,
remote/box/discover_found.py); failing that, the run whose log is the job's StdOut, or whose
working directory is the job's. Pure: reads the hosts' histories, changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config.schema import LOCAL, HostConfig, SlurmConfig
from ..model.history import HostHistory
from ..model.series import RunSeries
from ..model.slurm_job import Job, JobRun

LOSS_TAGS = ("loss", "train/loss", "train_loss", "training_loss")


def node_target(config: SlurmConfig, node: str) -> str:
    """How a job's node is reached: `local`, or the `nodes` template with the node filled."""
    return LOCAL if config.nodes == LOCAL else config.nodes.replace("{node}", node)


def node_hosts(config: SlurmConfig, jobs: tuple[Job, ...] | list[Job],
               known: tuple[HostConfig, ...]) -> list[HostConfig]:
    """The hosts to poll for the running jobs' nodes that the config does not already poll
    (by name or by ssh target); `local` once, named `local`."""
    have_names = {h.name for h in known}
    have_targets = {h.ssh for h in known}
    out: list[HostConfig] = []
    for job in jobs:
        if not job.running:
            continue
        for node in job.nodes:
            target = node_target(config, node)
            name = LOCAL if target == LOCAL else node
            if name in have_names or target in have_targets:
                continue
            have_names.add(name)
            have_targets.add(target)
            out.append(HostConfig(name=name, ssh=target, settings=config.settings))
    return out


def host_of(config: SlurmConfig, node: str, known: tuple[HostConfig, ...]) -> str | None:
    """The name of the host that polls a node (None: none does)."""
    target = node_target(config, node)
    for host in known:
        if host.name == node or host.ssh == target:
            return host.name
    return None


def _env(series: RunSeries) -> dict[str, str]:
    discovery = series.discovery
    if discovery is None and series.last_sample is not None:
        discovery = series.last_sample.discovered
    return dict(discovery.env or ()) if discovery is not None else {}


def _matches(job: Job, series: RunSeries) -> int:
    """How surely a run is the job's: 3 by SLURM_JOB_ID, 2 by the log, 1 by the folder."""
    env = _env(series)
    raw_id = job.job_id.split("_")[0]
    if env.get("SLURM_JOB_ID") in (raw_id, job.job_id) or (
            job.array_job_id and env.get("SLURM_ARRAY_JOB_ID") == job.array_job_id
            and env.get("SLURM_ARRAY_TASK_ID") == job.array_task_id):
        return 3
    sample = series.last_sample
    if job.stdout and sample is not None and sample.log is not None \
            and sample.log.path == job.stdout:
        return 2
    discovery = series.discovery
    if job.workdir and discovery is not None and discovery.cwd == job.workdir \
            and series.status == "running":
        return 1
    return 0


def link(job: Job, histories: Mapping[str, HostHistory],
         host_for: Callable[[str], str | None]) -> JobRun | None:
    """The run of a job on one of its nodes, the surest match first; None when none is seen."""
    best: tuple[int, str, RunSeries] | None = None
    for node in job.nodes:
        host = host_for(node)
        history = histories.get(host) if host is not None else None
        if history is None:
            continue
        for series in history.runs.values():
            score = _matches(job, series)
            if score and (best is None or score > best[0]):
                best = (score, history.name, series)
    if best is None:
        return None
    _score, host, series = best
    latest = series.latest_checkpoint
    sample = series.last_sample
    loss_tag = next((t for t in LOSS_TAGS if t in series.series), None)
    return JobRun(
        host=host, run=series.name, pids=tuple(series.pids),
        log=sample.log.path if sample is not None and sample.log is not None else job.stdout,
        checkpoint_at=latest.mtime if latest is not None else None,
        last_step=series.last_step(loss_tag) if loss_tag else None,
        last_loss=series.last_value(loss_tag) if loss_tag else None, status=series.status)
