"""Why a Slurm job ended or waits, in words; the time-limit warning; a job linked to its run
by SLURM_JOB_ID (remote/sources/slurm_why.py, slurm_link.py). The real jobs behind these causes
are in tests/integration/test_slurm_jobs.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gpuwatch.remote.config.schema import HostConfig, SlurmConfig
from gpuwatch.remote.model.discovery import Discovery
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.model.history import HostHistory
from gpuwatch.remote.model.series import RunSeries
from gpuwatch.remote.model.slurm_job import Job, JobRun
from gpuwatch.remote.sources.slurm_link import host_of, link, node_hosts
from gpuwatch.remote.sources.slurm_why import judge, time_limit_finding

NOW = 1_800_000_000.0
BASE = Job(job_id="42", name="train", user="me", state="RUNNING", start_at=NOW - 3000,
           end_at=NOW + 600, time_limit_s=3600.0, elapsed_s=3000.0, nodes=("gpu01",),
           node_list="gpu01", req_mem_mib=1024.0, workdir="/w", stdout="/w/slurm-42.out")


@pytest.mark.parametrize(("changes", "cause", "words", "severity"), [
    ({"state": "TIMEOUT", "elapsed_s": 3600.0}, "timeout", "killed at its 1 h time limit",
     Severity.CRITICAL),
    ({"state": "OUT_OF_MEMORY", "max_rss_mib": 2048.0}, "out_of_memory",
     "held 2.0 GiB of the 1.0 GiB it asked for", Severity.CRITICAL),
    ({"state": "FAILED", "signal": 9, "max_rss_mib": 1000.0}, "out_of_memory",
     "killed for exceeding its memory", Severity.CRITICAL),
    ({"state": "FAILED", "signal": 9, "max_rss_mib": 10.0}, "failed", "killed by SIGKILL",
     Severity.CRITICAL),
    ({"state": "FAILED", "exit_code": 3}, "failed", "exited with code 3", Severity.CRITICAL),
    ({"state": "NODE_FAIL"}, "node_fail", "its node gpu01 failed", Severity.CRITICAL),
    ({"state": "PREEMPTED"}, "preempted", "preempted by a higher-priority job", Severity.WARNING),
    ({"state": "CANCELLED", "cancelled_by": "me"}, "cancelled", "cancelled by me", Severity.INFO),
    ({"state": "CANCELLED", "cancelled_by": "root"}, "cancelled", "cancelled by root",
     Severity.WARNING),
    ({"state": "COMPLETED", "exit_code": 0}, "completed", "finished after 50 min", None),
    ({"state": "PENDING", "reason": "QOSMaxGRESPerUser", "start_at": None}, "pending",
     "per-user GPU limit", None),
    ({"state": "PENDING", "reason": "Priority", "start_at": NOW + 3600}, "pending",
     "expected to start", None),
    ({"state": "PENDING", "reason": "DependencyNeverSatisfied"}, "pending",
     "will never start", Severity.WARNING),
])
def test_each_end_in_words(changes: dict[str, object], cause: str, words: str,
                           severity: Severity | None) -> None:
    view = judge(replace(BASE, **changes), None, NOW, 60)  # type: ignore[arg-type]
    assert view.cause == cause and view.why is not None and words in view.why
    got = [f.severity for f in view.findings if f.code != "job.time_limit"]
    assert got == ([severity] if severity is not None else [])


def test_time_limit_warns_when_the_checkpoint_is_older_than_the_time_left() -> None:
    old = JobRun(host="gpu01", run="train", checkpoint_at=NOW - 1200)
    warn = time_limit_finding(BASE, old, NOW, 1800)
    assert warn is not None and warn.severity is Severity.WARNING
    assert warn.evidence["at_risk_s"] == 1800 and "--signal=USR1" in warn.message
    fresh = replace(old, checkpoint_at=NOW - 60)
    assert time_limit_finding(BASE, fresh, NOW, 1800) is None  # saves before the limit
    assert time_limit_finding(BASE, old, NOW, 300) is None  # not yet within the window
    none = time_limit_finding(BASE, replace(old, checkpoint_at=None), NOW, 1800)
    assert none is not None and "has no checkpoint" in none.message
    blind = time_limit_finding(BASE, None, NOW, 1800)
    assert blind is not None and blind.severity is Severity.INFO
    assert time_limit_finding(replace(BASE, time_limit_s=None, end_at=None), old, NOW,
                              1800) is None


def _history(host: str, series: RunSeries) -> HostHistory:
    history = HostHistory(host)
    history.runs[series.name] = series
    return history


def test_a_job_links_to_the_run_whose_processes_carry_its_job_id() -> None:
    theirs = RunSeries("other")
    theirs.discovery = Discovery(name="other", key=("/w", "train.py"), alive=True, cwd="/w",
                                 env=(("SLURM_JOB_ID", "41"),))
    ours = RunSeries("train")
    ours.discovery = Discovery(name="train", key=("/x", "train.py"), alive=True, cwd="/x",
                               env=(("PATH", "/bin"), ("SLURM_JOB_ID", "42")))
    histories = {"gpu01": _history("gpu01", theirs)}
    histories["gpu01"].runs["train"] = ours
    config = SlurmConfig(host="login1")
    known = (HostConfig(name="gpu01", ssh="gpu01"),)
    got = link(BASE, histories, lambda node: host_of(config, node, known))
    assert got is not None and (got.host, got.run) == ("gpu01", "train")
    assert link(replace(BASE, job_id="43"), histories,
                lambda node: host_of(config, node, known)) is None


def test_running_jobs_nodes_become_hosts_once() -> None:
    jobs = [BASE, replace(BASE, job_id="43", nodes=("gpu01", "gpu02")),
            replace(BASE, job_id="44", state="PENDING", nodes=("gpu09",))]
    added = node_hosts(SlurmConfig(host="login1", nodes="me@{node}.hpc"), jobs,
                       (HostConfig(name="gpu02", ssh="gpu02"),))
    assert [(h.name, h.ssh) for h in added] == [("gpu01", "me@gpu01.hpc")]
    here = node_hosts(SlurmConfig(host="local", nodes="local"), jobs, ())
    assert [(h.name, h.ssh) for h in here] == [("local", "local")]
