"""The Slurm source: the user's jobs, asked of a login host in one bounded call per round
(DESIGN §1 sources/, docs/slurm.md).

Each round runs one POSIX shell command on `[slurm] host` (over the same bounded SSH exec as a
poll, wire/ssh.py's run_once, or as a local command when the host is `local`): it prints the
Slurm version (`squeue --version`: read, not assumed), the login's user and clock, then the live
jobs (`squeue --json` where the version has it, 21.08 on, else a fixed `squeue --format`; if
the JSON fails the format is asked in the same call), then `sacct` for the jobs that ended
since the round before (the first round: within `ended_within_s`). slurm_parse.py reads the
answer by its format; jobs that ended are remembered between rounds (bounded), so a job that
died an hour ago still says why until `ended_within_s` has passed.

Actions (`scontrol requeue JOB`, `scancel JOB`) are their own bounded call each, built here.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..config.schema import LOCAL, HostConfig, SlurmConfig
from ..model.slurm_job import ENDED, Job
from .slurm_parse import (
    MARK,
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SlurmParseError,
    sacct_lines,
    sections,
    squeue_format,
    squeue_json,
    version_of,
)

if TYPE_CHECKING:  # asyncssh is loaded only where a call goes over SSH
    from ..wire.ssh_base import ExecResult

JSON_FROM = (21, 8)
"""The first Slurm whose squeue has --json."""
SLACK_S = 120.0
"""sacct is asked from this long before the last round (clocks, slow accounting writes)."""
MAX_STDOUT = 8 << 20
MAX_STDERR = 64 << 10
KEEP_ENDED = 500
"""Ended jobs remembered between rounds (the most recent)."""
ENDED_STATES = "CA,CD,F,TO,OOM,NF,PR,BF,DL"
"""sacct -s: the states of a job that is over (ENDED)."""


class SlurmError(Exception):
    """A round that brought no jobs: `kind` as a host's poll error (unreachable, timeout, auth,
    host_key, config, probe), `message` one sentence a person can act on."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(frozen=True, slots=True)
class Answer:
    """One round's reading: the jobs (live and recently ended), how they were read."""

    jobs: tuple[Job, ...]
    version: str | None
    via: str | None
    user: str | None
    now: float
    """The login host's clock when it answered."""
    problems: tuple[str, ...] = ()


def round_command(config: SlurmConfig, since: float | None, use_json: bool = True) -> str:
    """The shell command of one round. `since`: sacct's start (epoch s), None for the first
    round (then `ended_within_s` before the login host's now). `use_json`: ask squeue --json
    where the version has it (False: always --format)."""
    user = config.user
    who = shlex.quote(user) if user else '"$(id -un)"'
    filters = ""
    if config.partition:
        filters += f" -p {shlex.quote(config.partition)}"
    if config.account:
        filters += f" -A {shlex.quote(config.account)}"
    fmt = "${d}".join(SQUEUE_FIELDS)
    # sacct's -S takes `now-N` (seconds) in every version; an epoch it does not.
    back = (f"$(( $(date +%s) - {int(since)} ))" if since is not None
            else f"{int(config.ended_within_s)}")
    wants = JSON_FROM[0] * 100 + JSON_FROM[1]
    json_try = (f'if [ "${{v:-0}}" -ge {wants} ] 2>/dev/null && out=$(squeue --json 2>&1); '
                f'then echo "{MARK} squeue-json"; printf "%s\\n" "$out"; else ') if use_json \
        else "if true; then "
    # One line per section marker; `rc N` closes a section with its exit status.
    return "; ".join([
        "export SLURM_TIME_FORMAT=%s LC_ALL=C",
        "d=$(printf '\\037')",
        f'echo "{MARK} version"; squeue --version 2>&1; echo "{MARK} rc $?"',
        f'echo "{MARK} user"; echo {who}',
        f'echo "{MARK} now"; date +%s; date +%z',
        "v=$(squeue --version 2>/dev/null | sed -n "
        "'s/^slurm[^ ]* *\\([0-9][0-9]*\\)\\.\\([0-9][0-9]\\).*/\\1\\2/p')",
        f'{json_try}echo "{MARK} squeue-format"; squeue -h -a -u {who}{filters} '
        f'-o "{fmt}" 2>&1; echo "{MARK} rc $?"; fi',
        f'echo "{MARK} sacct"; sacct -n -P --delimiter="$d" -u {who}{filters} '
        f'-S "now-{back}" -E now -s {ENDED_STATES} -o {",".join(SACCT_FIELDS)} 2>&1; '
        f'echo "{MARK} rc $?"',
        f'echo "{MARK} end"',
    ])


def read_answer(text: str, config: SlurmConfig) -> Answer:
    """A round's answer, read section by section. Raises SlurmError (kind `probe`) when it is
    not one (no markers, no Slurm on the login host), naming what it said."""
    try:
        parts = sections(text)
    except SlurmParseError as exc:
        raise SlurmError("probe", str(exc)) from None
    version_text = (parts.text("version") or "").strip()
    version = version_of(version_text)
    if version is None or parts.rc("version") not in (0, None):
        said = version_text.splitlines()[0][:200] if version_text else "nothing"
        raise SlurmError("probe", f"squeue --version on the login host did not name a Slurm "
                                  f"version (it said {said!r}): is Slurm installed there and on "
                                  "PATH for a non-interactive shell?")
    now_lines = (parts.text("now") or "").split()
    now = float(now_lines[0]) if now_lines and now_lines[0].isdigit() else time.time()
    offset = _utc_offset_s(now_lines[1] if len(now_lines) > 1 else "+0000")
    user = (parts.text("user") or "").strip() or None
    problems: list[str] = []
    jobs: list[Job] = []
    via = None
    if parts.text("squeue-json") is not None:
        via = "squeue --json"
        try:
            live, bad = squeue_json(parts.text("squeue-json") or "", now)
        except SlurmParseError as exc:
            raise SlurmError("probe", str(exc)) from None
        jobs.extend(_mine(live, config, user))
        problems.extend(bad)
    elif parts.text("squeue-format") is not None:
        via = "squeue --format"
        body = parts.text("squeue-format") or ""
        if parts.rc("squeue-format") not in (0, None):
            raise SlurmError("probe", f"squeue failed on the login host: {_first(body)}")
        live, bad = squeue_format(body.splitlines(), now, offset)
        jobs.extend(_mine(live, config, user))
        problems.extend(bad)
    sacct = parts.text("sacct")
    if sacct is not None:
        if parts.rc("sacct") not in (0, None):
            problems.append(f"sacct failed on the login host: {_first(sacct)} (jobs that ended "
                            "are not known this round)")
        else:
            ended, bad = sacct_lines(sacct.splitlines(), offset)
            problems.extend(bad)
            jobs.extend(ended)
    if parts.text("end") is None:
        problems.append("the answer was cut short (no end marker): some jobs may be missing")
    text_version = f"{version[0]}.{version[1]:02d}.{version[2]}"
    return Answer(tuple(jobs), text_version, via, user, now, tuple(problems))


def _first(text: str) -> str:
    line = next((ln for ln in text.splitlines() if ln.strip()), "no output")
    return line.strip()[:300]


def _utc_offset_s(text: str) -> float:
    m = re.fullmatch(r"([+-])(\d\d)(\d\d)", text.strip())
    if m is None:
        return 0.0
    sign = -1 if m.group(1) == "-" else 1
    return sign * (int(m.group(2)) * 3600 + int(m.group(3)) * 60)


def _mine(jobs: Iterable[Job], config: SlurmConfig, user: str | None) -> list[Job]:
    """The jobs of the user, partition and account asked for: squeue --json ignores its
    filters in some versions (22.05), so they are applied here too."""
    want_user = config.user or user
    out = []
    for job in jobs:
        if want_user and job.user and job.user != want_user:
            continue
        if config.partition and job.partition and job.partition != config.partition:
            continue
        if config.account and job.account and job.account != config.account:
            continue
        out.append(job)
    return out


@dataclass
class SlurmSource:
    """The scheduler of one `[slurm]` table: its rounds, and the jobs that ended, remembered."""

    config: SlurmConfig
    accept_new_host_keys: bool = False
    use_json: bool = True
    last_now: float | None = None
    """The login host's clock at the last good round (sacct's next start, less SLACK_S)."""
    ended: dict[str, Job] = field(default_factory=dict)

    def command(self) -> str:
        since = self.last_now - SLACK_S if self.last_now is not None else None
        return round_command(self.config, since, self.use_json)

    def merge(self, answer: Answer) -> Answer:
        """This round's jobs, with the ended ones of earlier rounds still within
        ended_within_s; a live job wins over its own ended record (a requeued job)."""
        self.last_now = answer.now
        live_ids = {j.job_id for j in answer.jobs if j.state not in ENDED}
        for job in answer.jobs:
            if job.state in ENDED and job.source == "sacct":
                self.ended[job.job_id] = job
        horizon = answer.now - self.config.ended_within_s
        for job_id in [k for k, j in self.ended.items()
                       if k in live_ids or (j.end_at or answer.now) < horizon]:
            self.ended.pop(job_id)
        if len(self.ended) > KEEP_ENDED:
            keep = sorted(self.ended.values(), key=lambda j: j.end_at or 0)[-KEEP_ENDED:]
            self.ended = {j.job_id: j for j in keep}
        jobs: dict[str, Job] = {}
        for job in answer.jobs:
            if job.job_id in jobs and job.source == "sacct":
                continue  # squeue's word on a job it still lists wins
            if job.state in ENDED and job.job_id in self.ended:
                continue  # from the memory below, once
            jobs[job.job_id] = job
        for job_id, job in self.ended.items():
            live = jobs.get(job_id)
            if live is None or live.state in ENDED:
                jobs[job_id] = _fill(job, live)
        ordered = sorted(jobs.values(), key=_order)
        return replace(answer, jobs=tuple(ordered))

    def read(self, stdout: bytes, stderr: bytes, status: int | None) -> Answer:
        text = stdout.decode("utf-8", "replace")
        try:
            return self.merge(read_answer(text, self.config))
        except SlurmError as exc:
            said = stderr.decode("utf-8", "replace").strip()
            if said and exc.kind == "probe":
                raise SlurmError("probe", f"{exc.message} (stderr: {said[:300]})") from None
            raise

    async def poll(self) -> Answer:
        """One round (SlurmError when it brought nothing)."""
        if self.config.host == LOCAL:
            from ..wire import local

            try:
                result = await local.run_async(self.command(), b"",
                                               self.config.settings.command_timeout,
                                               max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR)
            except local.LocalTimeout:
                raise SlurmError("timeout", self._timeout()) from None
            except OSError as exc:
                raise SlurmError("probe", f"cannot run the Slurm commands here: {exc}") from None
            return self.read(result.stdout, result.stderr, result.exit_status)
        return await self._poll_ssh()

    def poll_sync(self) -> Answer:
        """poll() of a `local` login host without an event loop (a cron `--once`)."""
        if self.config.host != LOCAL:
            import asyncio

            return asyncio.run(self.poll())
        from ..wire import local

        try:
            result = local.run(self.command(), b"", self.config.settings.command_timeout,
                               max_stdout=MAX_STDOUT, max_stderr=MAX_STDERR)
        except local.LocalTimeout:
            raise SlurmError("timeout", self._timeout()) from None
        except OSError as exc:
            raise SlurmError("probe", f"cannot run the Slurm commands here: {exc}") from None
        return self.read(result.stdout, result.stderr, result.exit_status)

    async def act(self, kind: str, job_id: str) -> tuple[int | None, str]:
        """An action on a job (action_command), its own bounded call on the login host:
        (exit status, what it said). SlurmError when the call itself failed."""
        command = action_command(kind, job_id)
        if self.config.host == LOCAL:
            from ..wire import local

            try:
                result = await local.run_async(command, b"",
                                               self.config.settings.command_timeout,
                                               max_stdout=MAX_STDERR, max_stderr=MAX_STDERR)
            except local.LocalTimeout:
                raise SlurmError("timeout", self._timeout()) from None
            status, out = result.exit_status, result.stdout
        else:
            done = await self._run_ssh(command, max_stdout=MAX_STDERR)
            status, out = done.exit_status, done.stdout
        return status, out.decode("utf-8", "replace").strip()

    def _timeout(self) -> str:
        return (f"the Slurm commands on {self.config.host} did not answer within "
                f"{self.config.settings.command_timeout:g} s (slurmctld or slurmdbd busy or "
                "down?); raise [slurm] command_timeout if it is only slow")

    async def _poll_ssh(self) -> Answer:
        result = await self._run_ssh(self.command(), max_stdout=MAX_STDOUT)
        return self.read(result.stdout, result.stderr, result.exit_status)

    async def _run_ssh(self, command: str, *, max_stdout: int) -> ExecResult:
        """`command` on the login host: one bounded SSH call ([slurm]'s bounds and ssh files);
        an SSH failure as the SlurmError of its kind."""
        from ..wire import ssh
        from ..wire.collect import ssh_files

        files = ssh_files(self._as_host())
        try:
            return await ssh.run_once(self.config.host, command, bounds=self.config.settings,
                                      config_file=files["config_file"],
                                      known_hosts=files["known_hosts"],
                                      identity_file=files["identity_file"],
                                      accept_new_host_keys=self.accept_new_host_keys,
                                      max_stdout=max_stdout, max_stderr=MAX_STDERR)
        except ssh.SshError as exc:
            raise SlurmError(exc.kind, exc.message) from None

    def _as_host(self) -> HostConfig:
        return HostConfig(name=self.config.host, ssh=self.config.host,
                          settings=self.config.settings)


def _fill(ended: Job, live: Job | None) -> Job:
    """An ended job from accounting, with what squeue knew of it and sacct does not say."""
    if live is None:
        return ended
    return replace(ended, stdout=live.stdout or ended.stdout,
                   restarts=live.restarts if live.restarts is not None else ended.restarts)


def _order(job: Job) -> tuple[int, float, str]:
    rank = 0 if job.running else 1 if job.pending else 2
    return rank, -(job.end_at or job.start_at or job.submit_at or 0), job.job_id


# --------------------------------------------------------------------------------------------
# Actions through the scheduler


ACTIONS = {"requeue": ("scontrol", "requeue"), "cancel": ("scancel",)}


def action_command(kind: str, job_id: str) -> str:
    """The shell command of an action on a job (`requeue`: scontrol requeue; `cancel`:
    scancel). Raises ValueError for an unknown action or a job id that is not one."""
    if kind not in ACTIONS:
        raise ValueError(f"no such job action: {kind!r} (expected requeue or cancel)")
    if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
        raise ValueError(f"not a job id: {job_id!r} (a number, or ARRAY_TASK as 1234_7)")
    return " ".join([*ACTIONS[kind], shlex.quote(job_id)]) + " 2>&1"
