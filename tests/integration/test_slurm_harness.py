"""The real Slurm of the tests (tests/harness/slurm.py) is up: a batch job runs on its one node
and accounting (slurmdbd on MariaDB) records how it ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def test_a_batch_job_runs_and_accounting_records_it(slurm_cluster: Any, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hello from $SLURM_JOB_ID\n")
    job = slurm_cluster.sbatch(script, "-J", "harness-smoke")
    slurm_cluster.wait_for(f"job {job} recorded as COMPLETED",
                           lambda: slurm_cluster.sacct_state(job) == "COMPLETED")
    assert (tmp_path / f"slurm-{job}.out").read_text() == f"hello from {job}\n"
    nodes = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()
    assert nodes == [slurm_cluster.node]
