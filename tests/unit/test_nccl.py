"""NCCL watchdog lines read by their format (remote/findings/nccl.py), and a run that died of an
NCCL timeout diagnosed with the operation, sequence number, timeout and the rank to look at.

The lines are written here by the formats of PyTorch's ProcessGroupNCCL.cpp (1.x: no SeqNum;
2.1: NumelIn/NumelOut; 2.2+: torchrun's `[rankN]:` prefix and glog's header; 2.3+: the process
group in the rank's bracket, and the "Timeout at NCCL work" progress line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from findings_helpers import Watched, host_config
from gpuwatch.remote.findings.nccl import parse_line, read
from gpuwatch.remote.sim import Box, h100_sxm, training_process
from hypothesis import given
from hypothesis import strategies as st

V1 = ("[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1806990 milliseconds before "
      "timing out.")
V21 = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=668, "
       "OpType=ALLREDUCE, NumelIn=52, NumelOut=52, Timeout(ms)=600000) ran for 600097 "
       "milliseconds before timing out.")
V23 = ("[rank3]:[E1113 10:12:31.861530 2291 ProcessGroupNCCL.cpp:616] [PG 0 (default_pg) "
       "Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
       "OpType=_ALLGATHER_BASE, NumelIn=1048576, NumelOut=4194304, Timeout(ms)=600000) ran "
       "for 600355 milliseconds before timing out.")
PROGRESS = ("[rank2]:[E1113 10:12:31.9 2291 ProcessGroupNCCL.cpp:1664] [PG 0 Rank 2] Timeout at "
            "NCCL work: 669, last enqueued NCCL work: 669, last completed NCCL work: 667.")


@pytest.mark.parametrize(("line", "want"), [
    (V1, (0, None, "BROADCAST", 1800000, 1806990, None)),
    (V21, (1, 668, "ALLREDUCE", 600000, 600097, None)),
    (V23, (3, 5, "_ALLGATHER_BASE", 600000, 600355, None)),
    (PROGRESS, (2, 669, None, None, None, 667)),
    ("step 100 loss 0.2", None),
    ("NCCL WARN Cuda failure 'out of memory'", None),
])
def test_each_version_of_the_line(line: str, want: tuple[object, ...] | None) -> None:
    got = parse_line(line)
    assert (None if got is None else (got.rank, got.seq, got.op, got.timeout_ms, got.ran_ms,
                                      got.completed)) == want


def log_of_four_ranks() -> str:
    """torchrun's merged output: ranks 0, 1 and 3 time out in ALLREDUCE #669; rank 2 says no
    more after its step 1000 line (it is stuck in its dataloader)."""
    lines = [f"[rank{r}]:step 1000 loss 0.{40 + r}" for r in range(4)]
    for r in (0, 1, 3):
        lines.append(f"[rank{r}]:[E ProcessGroupNCCL.cpp:616] [PG 0 (default_pg) Rank {r}] "
                     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=669, "
                     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                     f"60{r}311 milliseconds before timing out.")
    return "\n".join(lines) + "\n"


def test_the_rank_that_logged_no_timeout_is_named() -> None:
    ev = read({"log": log_of_four_ranks()})
    assert ev is not None
    assert (ev["op"], ev["seq"], ev["timeout_ms"], ev["rank"]) == ("ALLREDUCE", 669, 600000, 0)
    assert ev["lagging_rank"] is None and ev["silent_ranks"] == [2]
    assert ev["said"].startswith("rank 0's NCCL watchdog timed out waiting for ALLREDUCE #669 "
                                 "after 600 s (its timeout 600 s); rank 2 logged no timeout")


def test_the_lagging_rank_of_several_ranks_logs() -> None:
    """One log per rank (no prefix): the rank whose last collective lags is named."""
    logs = {"rank0.log": V21.replace("[Rank 1]", "[Rank 0]"), "rank1.log": V21,
            "rank2.log": PROGRESS.split("]:", 1)[1]}
    ev = read(logs)
    assert ev is not None and ev["ranks"] == {"0": 668, "1": 668, "2": 667}
    assert (ev["lagging_rank"], ev["lagging_seq"]) == (2, 667)
    assert "rank 2 lags (its last collective #667)" in ev["said"]


def test_no_timeout_line_says_nothing() -> None:
    assert read({"log": PROGRESS.replace("Timeout at", "Exception at") + "\nstep 3\n"}) is None
    assert read({}) is None


ops = st.sampled_from(["ALLREDUCE", "BROADCAST", "_ALLGATHER_BASE", "REDUCE_SCATTER", "SEND"])


@given(st.integers(0, 10**6), st.integers(0, 10**9), ops, st.integers(1, 10**8),
       st.integers(0, 10**9), st.booleans(), st.sampled_from(["", "[rank7]:[E x.cpp:1] "]),
       st.sampled_from(["Rank", "PG 0 Rank", "PG ID 0 PG GUID 0(default_pg) Rank"]))
def test_a_line_of_the_format_reads_back(rank: int, seq: int, op: str, timeout: int, ran: int,
                                         numel: bool, prefix: str, bracket: str) -> None:
    extra = ", NumelIn=3, NumelOut=3" if numel else ""
    line = (f"{prefix}[{bracket} {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType={op}{extra}, Timeout(ms)={timeout}) ran for {ran} "
            "milliseconds before timing out.")
    got = parse_line(line)
    assert got is not None
    assert (got.rank, got.seq, got.op, got.timeout_ms, got.ran_ms) == (rank, seq, op, timeout,
                                                                       ran)


@given(st.text(max_size=300))
def test_any_text_is_read_without_raising(text: str) -> None:
    parse_line(text)
    ev = read({"a": text, "b": "Watchdog caught collective operation timeout: " + text})
    assert ev is None or isinstance(ev["said"], str)


def test_a_run_dead_of_an_nccl_timeout_is_diagnosed_with_its_rank(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    work = tmp_path / "run"
    work.mkdir()
    box.add_process(training_process(600, workdir=str(work), nohup=True))
    w = Watched(box, host_config(f'[hosts.gpu1.runs.llama]\nprocess = "train.py"\n'
                                 f'workdir = "{work}"\nlog = "train.log"\n'))
    (work / "train.log").write_text("[rank0]:step 999\n")
    w.poll()
    (work / "train.log").write_text(log_of_four_ranks())
    box.remove_process(600)
    w.poll()
    dead = w.one("run.dead")
    d = w.history.deaths["llama"]
    assert d.cause == "exception" and d.evidence["kind"] == "nccl_timeout"
    assert d.evidence["nccl"]["silent_ranks"] == [2]
    assert "rank 0's NCCL watchdog timed out waiting for ALLREDUCE #669 after 600 s" \
        in dead.message
    assert "rank 2 logged no timeout" in dead.message
