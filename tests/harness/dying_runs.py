"""A training run on a simulated box, watched as the TUI watches it (findings_helpers' Watched),
for the tests of why a run died: the box, the run running, and the death a poll found."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from findings_helpers import Watched, host_config
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.sim import Box, h100_sxm, training_process


def box_at(tmp_path: Path, gpus: int = 2, **kwargs: object) -> Box:
    return Box(tmp_path / "box", h100_sxm(gpus), btime=int(time.time()) - 86_400,
               uptime_s=86_400.0, **kwargs)  # type: ignore[arg-type]


def running(tmp_path: Path, box: Box, *, pid: int = 600, cgroup: str = "/", gpu: int = 0,
            **keys: str) -> Watched:
    work = tmp_path / "run"
    work.mkdir(exist_ok=True)
    (work / "train.log").write_text("step 1 loss 2.3\n")
    box.add_process(replace(training_process(pid, workdir=str(work), gpu=gpu, nohup=True),
                            cgroup=cgroup))
    box.add_compute_app(gpu, pid, "python", 30_000)
    lines = ["[hosts.gpu1.runs.llama]", 'process = "train.py"', f'workdir = "{work}"',
             'log = "train.log"'] + [f'{k} = "{v}"' for k, v in keys.items()]
    w = Watched(box, host_config("\n".join(lines) + "\n"))
    w.poll()
    assert w.history.runs["llama"].status == "running" and w.findings == []
    return w


def dead(w: Watched) -> tuple[str, dict]:
    f = w.one("run.dead")
    assert f.severity == Severity.CRITICAL and f.run == "llama"
    return f.evidence["cause"], f.evidence["diagnosis"]["evidence"]
