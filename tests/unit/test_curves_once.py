"""The curves' findings through `gpuwatch --once`, with the store in between: a cron job that
polls every few minutes catches a NaN, a spike, a rising loss, a rising eval loss in the poll
that brings it (the trackers' state carried over, the old points not judged again), and a real
process that stops writing while it stays alive is run.hung."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from curves_data import Replay
from gpuwatch.remote.report import load_schema
from harness.cli import gpuwatch

LOUD = {"warning", "critical"}


def config(work: Path, script: str, thresholds: str = "") -> str:
    return (f'[hosts.me]\nssh = "local"\n[hosts.me.runs.mlp]\nprocess = "{script}"\n'
            f'workdir = "{work}"\nevents = "runs"\n' + thresholds)


def once(tmp_path: Path, conf: str) -> dict:
    out = gpuwatch(tmp_path, "--once", "--json", config=conf)
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, load_schema())
    return doc


def curve_findings(doc: dict) -> list[dict]:
    return [f for f in doc["hosts"][0]["findings"] if f.get("run") == "mlp"]


def _nan(r: Replay) -> None:
    r.edit("train/loss", lambda s, v: math.nan if s == 450 else v)


def _spike(r: Replay) -> None:
    r.edit("train/loss", lambda s, v: 10 * v if s == 450 else v)


def _rise(r: Replay) -> None:  # from step 400, up by 1.0 by step 600 (the loss is ~0.1)
    r.edit("train/loss", lambda s, v: v + max(0, s - 400) / 200)


def _overfit(r: Replay) -> None:  # eval loss +15 % an evaluation from step 400
    r.edit("eval/loss", lambda s, v: v * (1 + 0.15 * max(0, (s - 400) // 20)))


ANOMALIES = {"run.loss_nan": (_nan, "critical", 450), "run.loss_spike": (_spike, "info", 450),
             "run.diverging": (_rise, None, None), "run.overfitting": (_overfit, "warning", None)}


@pytest.mark.parametrize("code", list(ANOMALIES))
def test_an_anomaly_between_two_cron_polls(tmp_path: Path, code: str) -> None:
    """The MLP's curve, its first 5/8 healthy in one cron poll, the rest with the anomaly in
    the next: caught there, from the trackers' state the store kept."""
    change, severity, step = ANOMALIES[code]
    work = tmp_path / "work"
    replay = Replay("mlp_digits", work)
    change(replay)
    script = work / "gw_mlp_job.py"
    script.write_text("import time\nwhile True: time.sleep(1)\n")
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        conf = config(work, "gw_mlp_job.py")
        replay.upto(len(replay) * 5 // 8)  # the first 5/8 of the steps: healthy
        first = once(tmp_path, conf)
        assert not [f for f in curve_findings(first) if f["severity"] in LOUD]
        (run,) = first["hosts"][0]["runs"]
        assert run["series"]["train/loss"]["last_step"] == replay.events[replay.written - 1][0]
        replay.upto(len(replay))  # the rest, with the anomaly
        second = once(tmp_path, conf)
        (found,) = [f for f in curve_findings(second) if f["code"] == code]
        assert severity is None or found["severity"] == severity
        assert step is None or found["evidence"]["step"] == step
        assert found["evidence"]["tag"] in ("train/loss", "eval/loss")
        assert second["hosts"][0]["runs"][0]["series"]["train/loss"]["points"] == 600
        if code == "run.loss_nan":
            assert found["evidence"]["last_finite_step"] == 449
            assert found["evidence"]["value"] == "nan"
    finally:
        proc.kill()
        proc.wait()


WRITER = """
import sys, time
from tensorboardX import SummaryWriter
w = SummaryWriter(sys.argv[1])
for step in range(1, 41):
    w.add_scalar("loss", 2.0 / step ** 0.5, step)
    time.sleep(0.05)
w.close()
open(sys.argv[2], "w").close()
while True:  # stuck: alive, writing nothing (a collective that never returns)
    time.sleep(1)
"""


def test_a_real_process_that_stops_writing_is_hung(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = work / "gw_hang_job.py"
    script.write_text(WRITER)
    ready = work / "ready"
    proc = subprocess.Popen([sys.executable, str(script), str(work / "runs"), str(ready)],
                            start_new_session=True)
    try:
        deadline = time.time() + 60
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert ready.exists()
        conf = config(work, "gw_hang_job.py",
                      "[thresholds]\nhung_min_s = 4\nhung_factor = 10\n")
        first = once(tmp_path, conf)
        assert "run.hung" not in [f["code"] for f in curve_findings(first)]
        time.sleep(5)
        second = once(tmp_path, conf)
        (hung,) = [f for f in curve_findings(second) if f["code"] == "run.hung"]
        assert hung["severity"] == "critical" and hung["evidence"]["step"] == 40
        assert hung["evidence"]["states"] and hung["evidence"]["quiet_s"] >= 4
        assert "every process is alive but its last step, 40" in hung["message"]
        assert second["hosts"][0]["runs"][0]["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
