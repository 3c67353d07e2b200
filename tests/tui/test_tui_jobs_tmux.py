"""The real `gpuwatch` against the real Slurm (tests/harness/slurm.py), in a real terminal at
80×24 (tmux): `J` shows the jobs with their state and cause in words, `r` on the failed job asks
first and requeues it through the scheduler, and the screen then shows it pending or running
(the TUI's own rounds of the scheduler, every interval). Under CI=true a missing Slurm or tmux
fails, never skips."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from harness.tmux import Tmux, gpuwatch_in_tmux

pytestmark = [pytest.mark.slow]

JOB = """#!/bin/sh
# The first run fails (exit 3); once requeued (SLURM_RESTART_COUNT 1) it runs on.
if [ "${SLURM_RESTART_COUNT:-0}" = "0" ]; then
    echo "first try: failing"
    exit 3
fi
echo "requeued: running"
exec sleep 600
"""


def job_rows(screen: str) -> list[str]:
    """The jobs table's rows, top to bottom (each starts with its job id)."""
    lines = screen.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["job"])
    rows = []
    for line in lines[head + 1:]:
        if not re.match(r"\s*\d+(_\d+)?\s", line):
            break
        rows.append(line)
    return rows


def row_of(screen: str, job: str) -> str:
    return next((r for r in job_rows(screen) if r.split()[0] == job), "")


def test_j_shows_the_jobs_and_r_requeues_the_failed_one_at_80x24(
        slurm_cluster: Any, tmp_path: Path) -> None:
    cluster = slurm_cluster
    folder = tmp_path / "flaky"
    folder.mkdir()
    script = folder / "job.sh"
    script.write_text(JOB)
    job = cluster.sbatch(script, "-J", "flaky")
    cluster.wait_for("the job failed in accounting", lambda: cluster.sacct_state(job) == "FAILED",
                     timeout=120)
    config = tmp_path / "config.toml"
    config.write_text("""
interval = 2

[slurm]
host = "local"
nodes = "local"

[hosts.local]
ssh = "local"
""")
    env = {"SLURM_CONF": str(cluster.conf), "GPUWATCH_CONFIG": str(config)}
    try:
        with gpuwatch_in_tmux(tmp_path, [], env=env, label="jobs", size=(80, 24)) as tmux:
            drive(tmux, job)
    finally:
        cluster.run(["scancel", job], check=False)


def drive(tmux: Tmux, job: str) -> None:
    tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view", 60)
    tmux.keys("J")
    screen = tmux.wait(lambda s: "FAILED" in row_of(s, job), f"job {job} FAILED", 60)
    assert screen.lstrip().startswith("jobs on local · Slurm ")
    assert all(len(line.rstrip()) <= 80 for line in screen.splitlines())
    row = row_of(screen, job)
    assert "exited with code 3" in row or "exited with" in screen, screen
    # to its row (the cursor starts on the first), then the detail pane names it
    for _ in range(job_rows(screen).index(row)):
        tmux.keys("j", pause=0.1)
    tmux.wait(lambda s: f"job {job} (flaky)" in s, f"job {job} selected")
    tmux.keys("r")
    asked = tmux.wait(lambda s: f"Requeue job {job} on local?" in s, "the confirmation")
    assert f"requeue job {job} (flaky), FAILED" in asked and "scontrol requeue" in asked, asked
    tmux.keys("y")
    tmux.wait(lambda s: any(state in row_of(s, job) for state in ("PENDING", "RUNNING")),
              f"job {job} pending or running again", 90)
    tmux.keys("Escape")
    tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view")
    tmux.keys("q", pause=0)
    tmux.wait_for("GPUWATCH-EXITED-0", 30)
