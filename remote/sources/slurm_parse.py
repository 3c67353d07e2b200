"""The Slurm login host's answer, read by its format: `squeue --json` (each OpenAPI version's
shapes), `squeue --format` and `sacct --parsable2` lines with a fixed field list, Slurm's
durations, memory sizes and node lists (docs/slurm.md).

The answer of one round is sections, each opened by a marker line that the command of
remote/sources/slurm.py prints (`@@gpuwatch-slurm NAME [rc N]`). A line or a job that cannot be
read becomes a problem naming what and where; the rest stands (nothing good is lost for one bad
line). Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..model.slurm_job import Job

MARK = "@@gpuwatch-slurm"
SEP = "\x1f"
"""The field separator of the --format and sacct lines (ASCII unit separator: no job name or
path a person types holds it)."""

SQUEUE_FIELDS = ("%i", "%F", "%K", "%j", "%u", "%T", "%r", "%l", "%M", "%S", "%e", "%V", "%N",
                 "%P", "%a", "%m", "%C", "%Z")
"""squeue --format's letters, in this order: id, array job, array task, name, user, state,
reason, time limit, time used, start (expected, when pending), end, submit, node list,
partition, account, min memory, CPUs, work dir (last: a path is the likeliest to be odd)."""
SACCT_FIELDS = ("JobID", "JobIDRaw", "User", "UID", "State", "ExitCode", "ElapsedRaw",
                "TimelimitRaw", "NodeList", "Start", "End", "Submit", "ReqMem", "AllocCPUS",
                "MaxRSS", "Partition", "Account", "Reason", "JobName", "WorkDir")
"""sacct's fields (Slurm 20.11 has each), in this order."""

MAX_NODES = 4096
"""A node list expands to at most this many names (a bigger one is kept as written)."""
MAX_JOBS = 5000
"""Jobs read from one answer; the rest are counted as a problem."""

_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2, "P": 1024.0 ** 3}


class SlurmParseError(ValueError):
    """An answer that cannot be read at all (no marker, not the expected sections)."""


# --------------------------------------------------------------------------------------------
# Small formats


def duration_s(text: str) -> float | None:
    """Slurm's duration `[D-]HH:MM:SS`, `MM:SS`, `M`, with `UNLIMITED`/`INFINITE` as None.
    Raises ValueError for anything else."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NOT_SET", "PARTITION_LIMIT", "N/A", ""):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?(?:\.\d+)?", text)
    if m is None:
        raise ValueError(f"not a Slurm duration: {text!r}")
    days, a, b, c = m.groups()
    parts = [int(p) for p in (a, b, c) if p is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        h, mi, s = parts
    elif len(parts) == 3:
        h, mi, s = parts
    elif len(parts) == 2:
        h, mi, s = 0, parts[0], parts[1]
    else:
        h, mi, s = 0, parts[0], 0  # a bare number is minutes
    return float(int(days or 0) * 86400 + h * 3600 + mi * 60 + s)


def memory_mib(text: str, cpus: int | None = None) -> float | None:
    """A size as sacct/squeue write it (`137208K`, `100M`, `1.5G`, `4000Mc` per CPU, `100Mn`
    per node) in MiB; per CPU times `cpus`. Empty or zero → None. Raises ValueError otherwise."""
    text = text.strip()
    if not text or text in ("0", "0n", "0c"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)", text)
    if m is None:
        raise ValueError(f"not a memory size: {text!r}")
    number, unit, per = m.groups()
    if float(number) == 0:
        return None  # 0K: not measured (a step too short for the accounting poller)
    mib = float(number) * _UNITS[unit or "M"]
    if per == "c":
        if cpus is None:
            return None
        mib *= cpus
    return mib


def timestamp(text: str, utc_offset_s: float = 0.0) -> float | None:
    """An epoch second (SLURM_TIME_FORMAT=%s) or an ISO time of the login host's zone; `None`,
    `Unknown`, `N/A` and 0 are None. Raises ValueError otherwise."""
    text = text.strip()
    if text in ("", "None", "Unknown", "N/A", "0", "(null)"):
        return None
    if re.fullmatch(r"\d{1,12}", text):
        return float(text)
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    except ValueError:
        raise ValueError(f"not a time: {text!r}") from None
    return when.timestamp() - utc_offset_s


def expand_nodes(text: str) -> tuple[str, ...]:
    """A Slurm node list (`gpu[01-03,07],login1`) as names; an empty list, `None` and
    `(null)` → (). Raises ValueError for an unbalanced or too large one."""
    text = text.strip()
    if text in ("", "None", "None assigned", "(null)", "N/A"):
        return ()
    names: list[str] = []
    for part in _split_top(text):
        names.extend(_expand_one(part))
        if len(names) > MAX_NODES:
            raise ValueError(f"node list over {MAX_NODES} names")
    return tuple(names)


def _split_top(text: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced node list: {text!r}")
        elif ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced node list: {text!r}")
    yield text[start:]


def _expand_one(part: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", part)
    if m is None:
        if not part:
            raise ValueError("empty name in a node list")
        return [part]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out: list[str] = []
    for item in ranges.split(","):
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a node range: {item!r}")
        width = len(lo)
        first, last = int(lo), int(hi) if hi else int(lo)
        if last < first or last - first > MAX_NODES:
            raise ValueError(f"not a node range: {item!r}")
        out.extend(f"{prefix}{n:0{width}d}{tail}" for n in range(first, last + 1)
                   for tail in tails)
        if len(out) > MAX_NODES:
            raise ValueError(f"node list over {MAX_NODES} names")
    return out


def version_of(text: str) -> tuple[int, int, int] | None:
    """`slurm 22.05.8` (or `slurm-wlm 22.05.8`) as (22, 5, 8); None when it is not one."""
    m = re.search(r"\bslurm[-\w]*\s+(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


# --------------------------------------------------------------------------------------------
# The answer's sections


@dataclass
class Sections:
    """The answer of one round, by section: name -> (exit status or None, lines)."""

    parts: dict[str, tuple[int | None, list[str]]] = field(default_factory=dict)

    def text(self, name: str) -> str | None:
        part = self.parts.get(name)
        return None if part is None else "\n".join(part[1])

    def rc(self, name: str) -> int | None:
        part = self.parts.get(name)
        return None if part is None else part[0]


def sections(text: str) -> Sections:
    """Split an answer at its marker lines (`@@gpuwatch-slurm NAME`, and `@@gpuwatch-slurm rc
    N` closing the section before it with its exit status). Raises SlurmParseError when the
    answer has no marker at all."""
    out = Sections()
    name: str | None = None
    for line in text.splitlines():
        if line.startswith(MARK + " "):
            words = line[len(MARK) + 1:].split()
            if len(words) == 2 and words[0] == "rc" and name is not None:
                status = int(words[1]) if words[1].lstrip("-").isdigit() else None
                out.parts[name] = (status, out.parts[name][1])
                continue
            if words:
                name = words[0]
                out.parts[name] = (None, [])
            continue
        if name is not None:
            out.parts[name][1].append(line)
    if not out.parts:
        raise SlurmParseError("the login host's answer has none of gpuwatch's section markers "
                              f"(it began {text[:80]!r})")
    return out


# --------------------------------------------------------------------------------------------
# squeue --json


def _num(value: Any) -> float | None:
    """A number as each OpenAPI version writes it: 5, null, or {"set", "infinite", "number"}
    (0.0.39 on); an unset or infinite one is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return _num(value.get("number"))
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value if value.strip() and value not in ("None", "(null)") else None
    if isinstance(value, list):  # 0.0.40 on: job_state ["RUNNING"], flags as lists
        words = [v for v in value if isinstance(v, str)]
        return words[0] if words else None
    return None


def _when(value: Any) -> float | None:
    number = _num(value)
    return number if number else None  # 0: not set


def _id(value: Any) -> str | None:
    number = _num(value)
    return str(int(number)) if number is not None else None


def squeue_json(text: str, now: float) -> tuple[list[Job], list[str]]:
    """`squeue --json`'s jobs; problems name the job (by index) and what was wrong.
    Raises SlurmParseError when the text is no JSON object with a list of jobs."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmParseError(f"squeue --json did not answer JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmParseError("squeue --json's answer has no list of jobs")
    jobs: list[Job] = []
    problems = [f"squeue: {e}" for e in _errors(data)]
    for i, raw in enumerate(data["jobs"]):
        if len(jobs) >= MAX_JOBS:
            problems.append(f"squeue --json: {len(data['jobs']) - MAX_JOBS} jobs over "
                            f"{MAX_JOBS} not read")
            break
        try:
            jobs.append(_json_job(raw, now))
        except (ValueError, TypeError, KeyError) as exc:
            problems.append(f"squeue --json: job #{i}: {exc}")
    return jobs, problems


def _errors(data: Mapping[str, Any]) -> Iterator[str]:
    for err in data.get("errors") or ():
        if isinstance(err, dict):
            yield str(err.get("description") or err.get("error") or err)[:200]


def _json_job(raw: Any, now: float) -> Job:
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    job_id = _id(raw.get("job_id"))
    if job_id is None:
        raise ValueError("no job_id")
    state = _text(raw.get("job_state"))
    if state is None:
        raise ValueError(f"job {job_id}: no job_state")
    array_job = _id(raw.get("array_job_id"))
    array_task = _id(raw.get("array_task_id"))
    if array_job in (None, "0"):
        array_job = array_task = None
    shown = f"{array_job}_{array_task}" if array_job and array_task is not None else job_id
    limit_min = _num(raw.get("time_limit"))
    start = _when(raw.get("start_time"))
    state = state.upper()
    cpus = _num(raw.get("cpus"))
    mem = _num(raw.get("memory_per_node"))
    if mem is None:
        per_cpu = _num(raw.get("memory_per_cpu"))
        mem = per_cpu * cpus if per_cpu is not None and cpus else None
    workdir = _text(raw.get("current_working_directory"))
    nodes_text = _text(raw.get("nodes")) or ""
    running = state in ("RUNNING", "COMPLETING")
    return Job(
        job_id=shown, name=str(raw.get("name") or ""), user=_text(raw.get("user_name")),
        state=state, reason=_reason(_text(raw.get("state_reason"))),
        partition=_text(raw.get("partition")), account=_text(raw.get("account")),
        submit_at=_when(raw.get("submit_time")), start_at=start,
        end_at=_when(raw.get("end_time")),
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        elapsed_s=max(0.0, now - start) if running and start else None,
        nodes=expand_nodes(nodes_text) if running or state not in ("PENDING",) else (),
        node_list=nodes_text or None, req_mem_mib=mem, workdir=workdir,
        stdout=stdout_path(_text(raw.get("standard_output")), workdir, shown, array_job,
                           array_task, str(raw.get("name") or ""),
                           _text(raw.get("user_name")), bool(raw.get("batch_flag", True))),
        array_job_id=array_job, array_task_id=array_task,
        restarts=int(_num(raw.get("restart_cnt")) or 0), source="squeue")


def _reason(text: str | None) -> str | None:
    return None if text in (None, "None", "") else text


def stdout_path(given: str | None, workdir: str | None, job_id: str, array_job: str | None,
                array_task: str | None, name: str, user: str | None,
                batch: bool = True) -> str | None:
    """A job's StdOut path: the one given, its `%j %A %a %x %u %%` filled as sbatch fills them,
    relative to the work dir; else sbatch's default (`slurm-%j.out`, `slurm-%A_%a.out` for an
    array's task) in the work dir. None for a job that is not a batch script."""
    raw_id = job_id.split("_")[0]
    if given is None:
        if not batch or workdir is None:
            return None
        given = f"slurm-{array_job}_{array_task}.out" if array_job else f"slurm-{raw_id}.out"
    subs = {"j": raw_id, "A": array_job or raw_id, "a": array_task or "4294967294", "x": name,
            "u": user or "", "%": "%"}
    path = re.sub(r"%(\d*)([jAaxu%])",
                  lambda m: subs[m.group(2)].zfill(int(m.group(1) or 0)), given)
    if not path.startswith("/") and workdir:
        path = f"{workdir.rstrip('/')}/{path}"
    return path


# --------------------------------------------------------------------------------------------
# squeue --format


def squeue_format(lines: Iterable[str], now: float,
                  utc_offset_s: float = 0.0) -> tuple[list[Job], list[str]]:
    """The lines of `squeue -h -o FORMAT` (SQUEUE_FIELDS joined by SEP), one job each."""
    jobs: list[Job] = []
    problems: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(jobs) >= MAX_JOBS:
            problems.append(f"squeue --format: jobs past {MAX_JOBS} not read")
            break
        parts = line.split(SEP)
        if len(parts) != len(SQUEUE_FIELDS):
            problems.append(f"squeue --format line {n}: {len(parts)} fields, expected "
                            f"{len(SQUEUE_FIELDS)}")
            continue
        try:
            jobs.append(_format_job(parts, now, utc_offset_s))
        except ValueError as exc:
            problems.append(f"squeue --format line {n}: {exc}")
    return jobs, problems


def _format_job(parts: list[str], now: float, utc_offset_s: float) -> Job:
    (job_id, array_job, array_task, name, user, state, reason, limit, used, start, end, submit,
     nodes, partition, account, mem, cpus, workdir) = parts
    if not re.fullmatch(r"\d+(?:_\d+)?(?:\+\d+)?", job_id.strip()):
        raise ValueError(f"not a job id: {job_id!r}")
    state = state.strip().upper()
    if not re.fullmatch(r"[A-Z_]+", state):
        raise ValueError(f"not a job state: {state!r}")
    job_id = job_id.strip()
    a_job = array_job.strip() if "_" in job_id else None
    a_task = array_task.strip() if "_" in job_id else None
    n_cpus = int(cpus) if cpus.strip().isdigit() else None
    running = state in ("RUNNING", "COMPLETING")
    return Job(
        job_id=job_id, name=name, user=user.strip() or None, state=state,
        reason=_reason(reason.strip()), partition=partition.strip() or None,
        account=account.strip() or None, submit_at=timestamp(submit, utc_offset_s),
        start_at=timestamp(start, utc_offset_s), end_at=timestamp(end, utc_offset_s),
        time_limit_s=duration_s(limit), elapsed_s=duration_s(used) if running else None,
        nodes=expand_nodes(nodes) if running else (), node_list=nodes.strip() or None,
        req_mem_mib=memory_mib(mem, n_cpus), workdir=workdir or None,
        stdout=stdout_path(None, workdir or None, job_id, a_job, a_task, name, user.strip()),
        array_job_id=a_job, array_task_id=a_task, source="squeue")


# --------------------------------------------------------------------------------------------
# sacct


def sacct_lines(lines: Iterable[str], utc_offset_s: float = 0.0) -> tuple[list[Job], list[str]]:
    """`sacct -n -P --delimiter=SEP -o SACCT_FIELDS` lines: one job each, its steps (`1234.batch`,
    `1234.0`) folded into it: the largest MaxRSS of any step, and the signal and canceller of
    its batch step where the job's own line has none."""
    jobs: dict[str, Job] = {}
    steps: dict[str, list[tuple[float | None, str, int | None]]] = {}
    problems: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split(SEP)
        if len(parts) != len(SACCT_FIELDS):
            problems.append(f"sacct line {n}: {len(parts)} fields, expected {len(SACCT_FIELDS)}")
            continue
        row = dict(zip(SACCT_FIELDS, parts, strict=True))
        job_id = row["JobID"].strip()
        try:
            if "." in job_id:  # a step of a job: its memory and how it ended
                owner = job_id.split(".", 1)[0]
                cpus = int(row["AllocCPUS"]) if row["AllocCPUS"].strip().isdigit() else None
                steps.setdefault(owner, []).append(
                    (memory_mib(row["MaxRSS"], cpus), row["State"].strip(),
                     _exit(row["ExitCode"])[1]))
                continue
            if len(jobs) >= MAX_JOBS:
                problems.append(f"sacct: jobs past {MAX_JOBS} not read")
                break
            jobs[job_id] = _sacct_job(row, utc_offset_s)
        except ValueError as exc:
            problems.append(f"sacct line {n}: {exc}")
    out = []
    for job_id, job in jobs.items():
        rss = [mib for mib, _state, _sig in steps.get(job_id, ()) if mib is not None]
        signal, by = job.signal, job.cancelled_by
        for _mib, state, sig in steps.get(job_id, ()):
            signal = signal if signal else sig
            by = by or _canceller(state)
        out.append(replace(job, max_rss_mib=max(rss) if rss else job.max_rss_mib,
                           signal=signal or None, cancelled_by=by))
    return out, problems


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if m is None:
        if text.strip() in ("", "N/A"):
            return None, None
        raise ValueError(f"not an exit code: {text!r}")
    return int(m.group(1)), int(m.group(2))


def _canceller(state: str) -> str | None:
    m = re.fullmatch(r"CANCELLED by (\S+)", state.strip())
    if m is None:
        return None
    who = m.group(1)
    return "root" if who == "0" else (f"uid {who}" if who.isdigit() else who)


def _sacct_job(row: Mapping[str, str], utc_offset_s: float) -> Job:
    job_id = row["JobID"].strip()
    if not re.fullmatch(r"\d+(?:_\d+|_\[[\d,%-]+\])?(?:\+\d+)?", job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    state_text = row["State"].strip()
    state = state_text.split()[0].rstrip("+").upper() if state_text else ""
    if not re.fullmatch(r"[A-Z_]+", state):
        raise ValueError(f"job {job_id}: not a job state: {state_text!r}")
    code, signal = _exit(row["ExitCode"])
    by = _canceller(state_text)
    if by is not None and by == f"uid {row['UID'].strip()}" and row["User"].strip():
        by = row["User"].strip()
    limit = row["TimelimitRaw"].strip()
    cpus = int(row["AllocCPUS"]) if row["AllocCPUS"].strip().isdigit() else None
    elapsed = row["ElapsedRaw"].strip()
    array_job = array_task = None
    if "_" in job_id:
        array_job, array_task = job_id.split("_", 1)
    workdir = row["WorkDir"].strip() or None
    name = row["JobName"]
    return Job(
        job_id=job_id, name=name, user=row["User"].strip() or None, state=state,
        reason=_reason(row["Reason"].strip()), partition=row["Partition"].strip() or None,
        account=row["Account"].strip() or None,
        submit_at=timestamp(row["Submit"], utc_offset_s),
        start_at=timestamp(row["Start"], utc_offset_s),
        end_at=timestamp(row["End"], utc_offset_s),
        time_limit_s=float(limit) * 60 if limit.isdigit() else duration_s(limit),
        elapsed_s=float(elapsed) if elapsed.isdigit() else None,
        nodes=expand_nodes(row["NodeList"]), node_list=row["NodeList"].strip() or None,
        exit_code=code, signal=signal or None, cancelled_by=by,
        req_mem_mib=memory_mib(row["ReqMem"], cpus), max_rss_mib=memory_mib(row["MaxRSS"], cpus),
        workdir=workdir,
        stdout=stdout_path(None, workdir, job_id, array_job, array_task, name,
                           row["User"].strip()),
        array_job_id=array_job, array_task_id=array_task, source="sacct")
