"""The Slurm answer's readers (remote/sources/slurm_parse.py), by the format: property tests
that write each format from generated values and read them back, and bad input that becomes a
problem naming where, never an exception, with the good lines kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpuwatch.remote.config.schema import SlurmConfig
from gpuwatch.remote.sources.slurm import SlurmError, read_answer, round_command
from gpuwatch.remote.sources.slurm_parse import (
    MARK,
    SACCT_FIELDS,
    SEP,
    SQUEUE_FIELDS,
    duration_s,
    expand_nodes,
    memory_mib,
    sacct_lines,
    sections,
    squeue_format,
    squeue_json,
    stdout_path,
    version_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st

NOW = 1_800_000_000.0


# --------------------------------------------------------------------------------------------
# Small formats


def _write_duration(total: int, style: int) -> str:
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if days:
        return f"{days}-{h:02d}:{m:02d}:{s:02d}"
    if style == 0 or h:
        return f"{h:02d}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"  # squeue's short form under an hour


@given(st.integers(0, 400 * 86400), st.integers(0, 1))
def test_durations_read_back_as_written(total: int, style: int) -> None:
    assert duration_s(_write_duration(total, style)) == total


@pytest.mark.parametrize("text", ["UNLIMITED", "INFINITE", "Partition_Limit", "NOT_SET"])
def test_no_limit_is_none(text: str) -> None:
    assert duration_s(text) is None


@given(st.text(max_size=12).filter(lambda t: not t.strip().replace(":", "").replace("-", "")
                                   .isdigit()))
def test_any_text_is_a_duration_none_or_a_value_error(text: str) -> None:
    try:
        got: float | str | None = duration_s(text)
    except ValueError as exc:
        got = str(exc)
    assert got is None or (isinstance(got, float) and got >= 0) or \
        str(got).startswith("not a Slurm duration")


@given(st.integers(1, 10**9), st.sampled_from(["K", "M", "G", "T"]),
       st.sampled_from(["", "n", "c"]), st.integers(1, 256))
def test_memory_sizes_by_unit_and_per_cpu(number: int, unit: str, per: str, cpus: int) -> None:
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}[unit]
    got = memory_mib(f"{number}{unit}{per}", cpus)
    want = number * scale * (cpus if per == "c" else 1)
    assert got == pytest.approx(want)


def test_memory_edge_cases() -> None:
    assert memory_mib("") is None and memory_mib("0") is None
    assert memory_mib("4000Mc") is None  # per CPU with no CPU count: unknown, not a guess
    with pytest.raises(ValueError, match="not a memory size"):
        memory_mib("lots")


node_names = st.tuples(st.sampled_from(["gpu", "node", "a100-", "n"]), st.integers(0, 300),
                       st.integers(0, 5))


@given(st.lists(node_names, min_size=1, max_size=6), st.integers(1, 4))
def test_node_lists_expand_to_every_name(groups: list[tuple[str, int, int]], width: int) -> None:
    parts, want = [], []
    for prefix, first, span in groups:
        last = first + span
        ranges = f"{first:0{width}d}-{last:0{width}d}" if span else f"{first:0{width}d}"
        parts.append(f"{prefix}[{ranges}]")
        want += [f"{prefix}{n:0{width}d}" for n in range(first, last + 1)]
    assert expand_nodes(",".join(parts)) == tuple(want)


def test_node_list_shapes() -> None:
    assert expand_nodes("vm") == ("vm",)
    assert expand_nodes("gpu[01-02,07],login1") == ("gpu01", "gpu02", "gpu07", "login1")
    assert expand_nodes("r[1-2]n[3-4]") == ("r1n3", "r1n4", "r2n3", "r2n4")
    assert expand_nodes("") == () and expand_nodes("None assigned") == ()
    for bad in ("gpu[01-", "gpu]", "gpu[a-b]", "gpu[5-1]", "n[0-999999]"):
        with pytest.raises(ValueError):
            expand_nodes(bad)


def test_versions() -> None:
    assert version_of("slurm 22.05.8") == (22, 5, 8)
    assert version_of("slurm-wlm 23.11.4") == (23, 11, 4)
    assert version_of("bash: squeue: command not found") is None


def test_stdout_patterns_are_filled_like_sbatch() -> None:
    assert stdout_path(None, "/w", "12", None, None, "t", "me") == "/w/slurm-12.out"
    assert stdout_path(None, "/w", "12_3", "12", "3", "t", "me") == "/w/slurm-12_3.out"
    assert stdout_path("logs/%x-%j.%u.out", "/w", "12", None, None, "train", "me") == \
        "/w/logs/train-12.me.out"
    assert stdout_path("/abs/%A_%4a.log", "/w", "9_5", "9", "5", "t", "me") == "/abs/9_0005.log"


# --------------------------------------------------------------------------------------------
# squeue --json: every OpenAPI version's number shapes


def _number(value: int | None, shape: str) -> Any:
    if shape == "plain":
        return value
    if value is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": value}


jobs_strategy = st.lists(st.fixed_dictionaries({
    "id": st.integers(1, 10**7), "name": st.text(max_size=30),
    "state": st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "TIMEOUT"]),
    "limit": st.one_of(st.none(), st.integers(1, 10**5)),
    "start": st.integers(0, 2 * 10**9), "mem": st.one_of(st.none(), st.integers(1, 10**6)),
}), max_size=8)


@given(jobs_strategy, st.sampled_from(["plain", "object"]), st.booleans())
@settings(max_examples=60)
def test_squeue_json_of_each_version_reads_back(jobs: list[dict[str, Any]], shape: str,
                                                state_list: bool) -> None:
    doc = {"meta": {}, "errors": [], "jobs": [{
        "job_id": j["id"], "name": j["name"], "user_name": "me",
        "job_state": [j["state"]] if state_list else j["state"],
        "state_reason": "None", "partition": "gpu", "account": "lab",
        "time_limit": _number(j["limit"], shape), "start_time": _number(j["start"], shape),
        "end_time": _number(0, shape), "submit_time": _number(1, shape),
        "nodes": "gpu[01-02]" if j["state"] == "RUNNING" else "",
        "memory_per_node": _number(j["mem"], shape), "array_job_id": _number(0, shape),
        "array_task_id": _number(None, shape), "current_working_directory": "/w",
        "standard_output": "", "batch_flag": True,
    } for j in jobs]}
    got, problems = squeue_json(json.dumps(doc), NOW)
    assert problems == []
    assert [g.job_id for g in got] == [str(j["id"]) for j in jobs]
    for g, j in zip(got, jobs, strict=True):
        assert g.name == j["name"] and g.state == j["state"]
        assert g.time_limit_s == (j["limit"] * 60 if j["limit"] is not None else None)
        assert g.start_at == (j["start"] or None)
        assert g.req_mem_mib == j["mem"]
        assert g.nodes == (("gpu01", "gpu02") if j["state"] == "RUNNING" else ())
        assert g.stdout == f"/w/slurm-{j['id']}.out"


def test_squeue_json_keeps_the_good_jobs_of_a_bad_answer() -> None:
    doc = {"jobs": [{"job_id": 1, "job_state": "RUNNING", "name": "a"}, "junk",
                    {"job_state": "RUNNING"}, {"job_id": 4, "name": "d"}]}
    got, problems = squeue_json(json.dumps(doc), NOW)
    assert [g.job_id for g in got] == ["1"]
    assert len(problems) == 3 and problems[0].startswith("squeue --json: job #1")
    with pytest.raises(ValueError, match="did not answer JSON"):
        squeue_json("slurm_load_jobs error: Socket timed out", NOW)


# --------------------------------------------------------------------------------------------
# squeue --format and sacct lines


def _format_line(i: int, name: str, state: str, limit: str, nodes: str) -> str:
    values = {"%i": str(i), "%F": str(i), "%K": "N/A", "%j": name, "%u": "me", "%T": state,
              "%r": "Resources" if state == "PENDING" else "None", "%l": limit, "%M": "1:05",
              "%S": "1700000000", "%e": "N/A", "%V": "1699990000", "%N": nodes, "%P": "gpu",
              "%a": "lab", "%m": "8G", "%C": "4", "%Z": "/w d"}
    return SEP.join(values[f] for f in SQUEUE_FIELDS)


@given(st.lists(st.tuples(st.integers(1, 10**7), st.text(alphabet=st.characters(
    blacklist_characters=SEP + "\n\r", blacklist_categories=("Cs",)), max_size=20),
    st.sampled_from(["RUNNING", "PENDING"]),
    st.sampled_from(["UNLIMITED", "1-00:00:00", "30:00"])), max_size=8))
def test_squeue_format_lines_read_back(rows: list[tuple[int, str, str, str]]) -> None:
    lines = [_format_line(i, name, state, limit, "gpu[1-2]") for i, name, state, limit in rows]
    got, problems = squeue_format(lines, NOW)
    assert problems == []
    assert [(g.job_id, g.name, g.state) for g in got] == [(str(i), n, s) for i, n, s, _ in rows]
    for g, (_i, _n, state, limit) in zip(got, rows, strict=True):
        assert g.time_limit_s == {"UNLIMITED": None, "1-00:00:00": 86400.0, "30:00": 1800.0}[limit]
        assert g.nodes == (("gpu1", "gpu2") if state == "RUNNING" else ())
        assert g.req_mem_mib == 8192 and g.workdir == "/w d"


def test_squeue_format_bad_lines_are_problems_with_their_line() -> None:
    good = _format_line(7, "ok", "RUNNING", "10:00", "n1")
    lines = [good, "squeue: error: Invalid user", SEP.join(["x"] * len(SQUEUE_FIELDS)), good]
    got, problems = squeue_format(lines, NOW)
    assert [g.job_id for g in got] == ["7", "7"]
    assert problems == [f"squeue --format line 2: 1 fields, expected {len(SQUEUE_FIELDS)}",
                        "squeue --format line 3: not a job id: 'x'"]


def _sacct(**row: str) -> str:
    base = {"JobID": "5", "JobIDRaw": "5", "User": "me", "UID": "1000", "State": "COMPLETED",
            "ExitCode": "0:0", "ElapsedRaw": "30", "TimelimitRaw": "60", "NodeList": "gpu01",
            "Start": "1700000000", "End": "1700000030", "Submit": "1699999990",
            "ReqMem": "100M", "AllocCPUS": "1", "MaxRSS": "", "Partition": "gpu",
            "Account": "lab", "Reason": "None", "JobName": "train", "WorkDir": "/w"}
    base.update(row)
    return SEP.join(base[f] for f in SACCT_FIELDS)


@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 255), st.integers(0, 64),
                          st.integers(0, 10**7)), max_size=6, unique_by=lambda r: r[0]))
def test_sacct_folds_steps_into_their_job(rows: list[tuple[int, int, int, int]]) -> None:
    lines = []
    for job, code, sig, rss_k in rows:
        lines.append(_sacct(JobID=str(job), JobIDRaw=str(job), State="FAILED",
                            ExitCode=f"{code}:{sig}"))
        lines.append(_sacct(JobID=f"{job}.batch", State="FAILED", MaxRSS=f"{rss_k}K",
                            ExitCode=f"{code}:{sig}"))
        lines.append(_sacct(JobID=f"{job}.0", State="FAILED", MaxRSS=f"{rss_k // 2}K"))
    got, problems = sacct_lines(lines)
    assert problems == []
    assert [g.job_id for g in got] == [str(r[0]) for r in rows]
    for g, (_job, code, sig, rss_k) in zip(got, rows, strict=True):
        assert g.exit_code == code and g.signal == (sig or None)
        assert g.max_rss_mib == (rss_k / 1024 if rss_k else None)
        assert g.source == "sacct" and g.time_limit_s == 3600.0


def test_sacct_names_the_canceller_and_keeps_good_lines() -> None:
    lines = [_sacct(JobID="8", State="CANCELLED by 1000"), "garbage",
             _sacct(JobID="9", State="CANCELLED by 0"), _sacct(JobID="x1", State="FAILED"),
             _sacct(JobID="10_3", State="TIMEOUT", TimelimitRaw="UNLIMITED")]
    got, problems = sacct_lines(lines)
    assert [(g.job_id, g.state, g.cancelled_by) for g in got] == [
        ("8", "CANCELLED", "me"), ("9", "CANCELLED", "root"), ("10_3", "TIMEOUT", None)]
    assert got[2].array_job_id == "10" and got[2].time_limit_s is None
    assert problems == [f"sacct line 2: 1 fields, expected {len(SACCT_FIELDS)}",
                        "sacct line 4: not a job id: 'x1'"]


# --------------------------------------------------------------------------------------------
# The whole answer


def _answer(*parts: str) -> str:
    return "\n".join(parts) + "\n"


def test_an_answer_without_slurm_names_what_the_login_host_said() -> None:
    text = _answer(f"{MARK} version", "sh: 1: squeue: not found", f"{MARK} rc 127")
    with pytest.raises(SlurmError, match=r"did not name a Slurm version.*squeue: not found"):
        read_answer(text, SlurmConfig(host="login1"))
    with pytest.raises(SlurmError, match="section markers"):
        read_answer("Welcome to the cluster!\n", SlurmConfig(host="login1"))


def test_the_format_path_filters_user_and_a_cut_answer_says_so() -> None:
    mine = _format_line(1, "mine", "RUNNING", "10:00", "n1")
    text = _answer(f"{MARK} version", "slurm 20.11.9", f"{MARK} rc 0", f"{MARK} user", "me",
                   f"{MARK} now", "1700000100", "+0000", f"{MARK} squeue-format", mine,
                   f"{MARK} rc 0", f"{MARK} sacct", _sacct(JobID="2", State="TIMEOUT"),
                   f"{MARK} rc 0")
    answer = read_answer(text, SlurmConfig(host="login1"))
    assert answer.version == "20.11.9" and answer.via == "squeue --format"
    assert [j.job_id for j in answer.jobs] == ["1", "2"]
    assert answer.problems == ("the answer was cut short (no end marker): some jobs may be "
                               "missing",)


def test_sections_split_at_markers_and_carry_exit_status() -> None:
    parts = sections(_answer(f"{MARK} a", "x", "y", f"{MARK} rc 3", f"{MARK} b"))
    assert parts.text("a") == "x\ny" and parts.rc("a") == 3
    assert parts.text("b") == "" and parts.rc("b") is None and parts.text("c") is None


def test_round_command_quotes_what_the_config_says() -> None:
    cmd = round_command(SlurmConfig(host="l", user="me; rm -rf /", partition="gpu"), None)
    assert "'me; rm -rf /'" in cmd and "-p gpu" in cmd and "squeue --json" in cmd
    assert "squeue --json" not in round_command(SlurmConfig(host="l"), 1.0, use_json=False)
