"""Real Slurm jobs, read by `gpuwatch --once --json` with `[slurm]`: each job's cause in words,
the time-limit warning before the limit, the jobs' run on their node (tests/harness/slurm.py
runs the Slurm; tests/harness/slurm_train.py is the training script every job runs).

Five jobs go in at once (the cluster oversubscribes its two cores): one that finishes, one
killed at a 1-minute time limit, one that outgrows `--mem=100M` (enforced here by
OverMemoryKill: there is no cgroup with task/none), one scancel'ed, one held and one pending
behind the held one. The time-limit job's run is configured on host `local` (the node is this
machine), so its checkpoints are seen and the warning can say the work at risk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.config.schema import SlurmConfig
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sources.slurm import SlurmSource
from gpuwatch.remote.sources.slurm_why import judge

pytestmark = pytest.mark.slow

TRAIN = Path(__file__).resolve().parents[1] / "harness" / "slurm_train.py"


@dataclass
class Jobs:
    cluster: Any
    root: Path
    ids: dict[str, str]
    config: Path


def _submit(cluster: Any, root: Path, name: str, *options: str, args: str) -> str:
    folder = root / name
    folder.mkdir()
    script = folder / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {TRAIN} {args}\n")
    return str(cluster.sbatch(script, "-J", name, *options))


@pytest.fixture(scope="module")
def jobs(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    cluster = slurm_cluster
    root = tmp_path_factory.mktemp("slurm-jobs")
    ids = {
        "fin": _submit(cluster, root, "fin", args="--steps 4 --step-s 0.3 --save-every 2"),
        # one checkpoint at 3 s, then none: older than the time left well before the limit
        "tl": _submit(cluster, root, "tl", "--time=1",
                      args="--steps 1000 --step-s 1 --save-every 3 --save-until 3"),
        "oom": _submit(cluster, root, "oom", "--mem=100M",
                       args="--steps 200 --step-s 0.5 --grow-mib 20"),
        "can": _submit(cluster, root, "can", args="--steps 1000 --step-s 1"),
        "held": _submit(cluster, root, "held", "--hold", args="--steps 2"),
    }
    ids["dep"] = _submit(cluster, root, "dep", f"--dependency=afterok:{ids['held']}",
                         args="--steps 2")
    cluster.wait_for("job can running", lambda: cluster.job_field(ids["can"], "JobState")
                     == "RUNNING", timeout=60)
    cluster.run(["scancel", ids["can"]])
    config = root / "config.toml"
    tl = root / "tl"
    config.write_text(f"""
[slurm]
host = "local"
nodes = "local"
warn_before_limit_s = 59

[hosts.local]
ssh = "local"

[hosts.local.runs.tl]
workdir = "{tl}"
process = "slurm_train.py"
log = "slurm-{ids['tl']}.out"
checkpoints = "checkpoints/step-*.pt"
metrics = ["metrics.jsonl"]
""")
    yield Jobs(cluster, root, ids, config)
    cluster.cancel_all()


def _once(jobs: Jobs) -> dict[str, Any]:
    env = jobs.cluster.env()
    env["GPUWATCH_CONFIG"] = str(jobs.config)
    out = subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "--once", "--json"],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode in (0, 1), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _job(doc: dict[str, Any], job_id: str) -> dict[str, Any]:
    found = [j for j in doc["jobs"]["jobs"] if j["job_id"] == job_id]
    assert found, f"job {job_id} not in {[j['job_id'] for j in doc['jobs']['jobs']]}"
    return found[0]


def test_the_time_limit_warning_fires_before_the_limit(jobs: Jobs) -> None:
    tl = jobs.ids["tl"]
    seen: dict[str, Any] = {}

    def warned() -> bool:
        doc = _once(jobs)
        job = _job(doc, tl)
        assert job["state"] in ("PENDING", "RUNNING", "COMPLETING"), \
            f"the job ended before any warning: {job}"
        # before its one checkpoint the warning says it has none; after, once that checkpoint
        # is older than the time left, it says the work at risk
        found = [f for f in job["findings"] if f["code"] == "job.time_limit"
                 and f["evidence"].get("checkpoint_age_s") is not None]
        if found and job["state"] == "RUNNING":
            seen.update(doc=doc, job=job, finding=found[0])
            return True
        return False

    jobs.cluster.wait_for("the time-limit warning", warned, timeout=120, step=2)
    job, finding = seen["job"], seen["finding"]
    assert finding["severity"] == "warning"
    assert job["run"]["host"] == "local" and job["run"]["run"] == "tl"
    assert job["run"]["checkpoint_at"] is not None
    evidence = finding["evidence"]
    assert evidence["checkpoint_age_s"] > evidence["time_left_s"] > 0
    assert "is killed at its time limit in" in finding["message"]
    assert "--signal=USR1" in finding["message"]
    import jsonschema

    jsonschema.validate(seen["doc"], load_schema())


def _ended(jobs: Jobs) -> bool:
    return all(jobs.cluster.sacct_state(jobs.ids[n]) not in ("", "RUNNING", "PENDING")
               for n in ("fin", "tl", "oom", "can"))


def test_each_job_reads_its_cause_in_words(jobs: Jobs) -> None:
    jobs.cluster.wait_for("the four jobs ended in accounting", lambda: _ended(jobs),
                          timeout=240, step=3)
    doc = _once(jobs)
    ids = jobs.ids
    fin, tl, oom, can = (_job(doc, ids[n]) for n in ("fin", "tl", "oom", "can"))
    held, dep = _job(doc, ids["held"]), _job(doc, ids["dep"])
    assert doc["jobs"]["ok"] and doc["jobs"]["version"].startswith(("2", "3"))
    assert (fin["state"], fin["cause"]) == ("COMPLETED", "completed")
    assert fin["why"].startswith("finished after") and fin["nodes"] == [jobs.cluster.node]
    assert (tl["state"], tl["cause"]) == ("TIMEOUT", "timeout")
    assert tl["why"].startswith("killed at its 60 s time limit after")
    assert [f["code"] for f in tl["findings"]] == ["job.timeout"]
    # task/none + OverMemoryKill: FAILED by signal 9, MaxRSS past the request
    assert oom["cause"] == "out_of_memory" and oom["req_mem_mib"] == 100
    assert oom["max_rss_mib"] >= 90
    assert "of the 100.0 MiB it asked for (--mem)" in oom["why"]
    assert (can["state"], can["cause"]) == ("CANCELLED", "cancelled")
    assert can["why"].startswith("cancelled by root")
    assert (held["state"], held["reason"]) == ("PENDING", "JobHeldUser")
    assert "held by its user" in held["why"]
    assert (dep["state"], dep["reason"]) == ("PENDING", "Dependency")
    assert "waiting for the job it depends on" in dep["why"]
    assert Path(fin["stdout"]).read_text().startswith(f"job {ids['fin']} starting")
    import jsonschema

    jsonschema.validate(doc, load_schema())


def test_the_format_path_reads_the_same_causes(jobs: Jobs) -> None:
    jobs.cluster.wait_for("the four jobs ended in accounting", lambda: _ended(jobs),
                          timeout=240, step=3)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(jobs.cluster.conf)
    try:
        by_json = SlurmSource(SlurmConfig(host="local")).poll_sync()
        by_format = SlurmSource(SlurmConfig(host="local"), use_json=False).poll_sync()
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF")
        else:
            os.environ["SLURM_CONF"] = old
    assert (by_json.via, by_format.via) == ("squeue --json", "squeue --format")
    assert by_format.problems == () and by_json.problems == ()

    def causes(answer: Any) -> dict[str, tuple[str, str | None, str | None]]:
        return {j.job_id: (j.state, j.reason, judge(j, None, answer.now, 60).cause)
                for j in answer.jobs if j.job_id in jobs.ids.values()}

    assert causes(by_format) == causes(by_json)
    assert len(causes(by_json)) == len(jobs.ids)


def _verb(jobs: Jobs, *args: str) -> subprocess.CompletedProcess[str]:
    env = jobs.cluster.env()
    env["GPUWATCH_CONFIG"] = str(jobs.config)
    return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "job", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


def _audit(jobs: Jobs) -> list[tuple[str, str, str]]:
    from gpuwatch.remote.store import Store

    with Store.open() as store:
        return [(e.action, e.phase, e.outcome) for e in store.audit_log("local")
                if e.action.startswith("job ")]


def test_requeue_brings_the_timed_out_job_back_and_cancel_ends_it(jobs: Jobs) -> None:
    jobs.cluster.wait_for("the four jobs ended in accounting", lambda: _ended(jobs),
                          timeout=240, step=3)
    tl = jobs.ids["tl"]
    before = len(_audit(jobs))
    unconfirmed = _verb(jobs, "requeue", tl)  # no terminal, no --yes: nothing is sent
    assert unconfirmed.returncode == 1 and "pass --yes" in unconfirmed.stderr
    assert len(_audit(jobs)) == before
    done = _verb(jobs, "requeue", tl, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"requeue job {tl} (tl), TIMEOUT, on {jobs.cluster.node}" in done.stdout
    assert "verified: job" in done.stdout
    assert jobs.cluster.job_field(tl, "JobState") in ("PENDING", "RUNNING", "REQUEUED")
    # the next --once round sees it live again, its cause no longer a timeout
    job = _job(_once(jobs), tl)
    assert job["state"] in ("PENDING", "RUNNING") and job["cause"] != "timeout"
    gone = _verb(jobs, "cancel", tl, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "verified: job" in gone.stdout and "CANCELLED" in gone.stdout
    again = _verb(jobs, "cancel", jobs.ids["fin"], "--yes")
    assert again.returncode == 1 and "has already ended (COMPLETED)" in again.stdout
    assert _audit(jobs)[before:] == [
        ("job requeue", "execute", "sent"), ("job requeue", "verify", "verified"),
        ("job cancel", "execute", "sent"), ("job cancel", "verify", "verified"),
        ("job cancel", "execute", "refused")]
