"""A run's death as data: its cause and evidence (Diagnosis), what the store keeps of it, and
the crash line of a log's tail (which the run's series reads too). Deciding the cause from two
snapshots is remote/findings/diagnosis.py's `diagnose`; this module only holds the result."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..units import size

CAUSES = ("reboot", "oom_cgroup", "oom_kernel", "xid", "gpu_lost", "exception", "sighup",
          "killed", "exited", "unknown")

CAUSE_WORDS = {"reboot": "box rebooted", "oom_cgroup": "OOM-killed", "oom_kernel": "OOM-killed",
               "xid": "GPU Xid", "gpu_lost": "GPU lost", "exception": "crashed",
               "sighup": "died at logout", "killed": "killed", "exited": "exited"}
"""Each cause in a word or two (Diagnosis.words); "unknown" has none."""
CRASH_WORDS = {"cuda_oom": "CUDA out of memory", "nccl_timeout": "NCCL timeout",
               "nccl_error": "NCCL error", "cuda_error": "CUDA error", "disk_full": "disk full"}
"""A crash line's kind (EXCEPTION_PATTERNS) in words; any other crash is "crashed"."""

# The most telling lines of a crash, most specific first; each is searched in the log's tail.
EXCEPTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError")),  # U10
    ("nccl_timeout", re.compile(
        r"Watchdog caught collective operation timeout|NCCL.*(?:[Tt]imeout|timed out)|"
        r"ProcessGroupNCCL.*[Tt]imeout")),  # seed 002: one rank died, the rest timed out
    ("nccl_error", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|"
                              r"ncclUnhandledCudaError|ncclRemoteError")),
    ("cuda_error", re.compile(r"CUDA error: |CUBLAS_STATUS_|cuDNN error")),
    ("disk_full", re.compile(r"No space left on device|basic_ios::clear: iostream error")),  # U6
    ("exception", re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt)\b(?::|$)")),
)
TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
TAIL_LINES = 80
"""Only the log's last lines count: an old traceback further up is a previous attempt's."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A death's cause with its evidence; `at` is the box time of the poll that saw it."""

    cause: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    at: float | None = None
    pids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The schema's run `diagnosis` object."""
        return {"cause": self.cause, "evidence": dict(self.evidence)}

    def state(self) -> dict[str, Any]:
        return {"cause": self.cause, "evidence": dict(self.evidence), "at": self.at,
                "pids": list(self.pids)}

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> Diagnosis | None:
        cause = data.get("cause")
        if cause not in CAUSES:
            return None
        evidence = data.get("evidence")
        at = data.get("at")
        pids = data.get("pids")
        return cls(str(cause), dict(evidence) if isinstance(evidence, dict) else {},
                   float(at) if isinstance(at, (int, float)) else None,
                   tuple(p for p in pids if isinstance(p, int)) if isinstance(pids, list)
                   else ())

    @property
    def summary(self) -> str:
        """A few words for run.dead's message."""
        ev = self.evidence
        if self.cause == "reboot":
            return "the box rebooted"
        if self.cause == "oom_cgroup":
            return self._cgroup_summary()
        if self.cause == "oom_kernel":
            return f"the kernel OOM killer killed pid {ev.get('pid')} ({ev.get('name')})"
        if self.cause == "xid":
            gpu = f"GPU {ev['gpu']} " if ev.get("gpu") is not None else ""
            who = f", reported for pid {ev['pid']} ({ev.get('name')})" if ev.get("pid") else ""
            said = f": {ev['advice']}" if ev.get("advice") else ""  # the catalog's action
            return f"NVIDIA Xid {ev.get('xid')} on {gpu}({ev.get('pci')}){who}{said}"
        if self.cause == "gpu_lost":
            return (f"its GPU was lost or the driver stopped answering in the same poll "
                    f"({ev.get('gpu_error') or ev.get('message')}); the box needs a reboot")
        if self.cause == "exception":
            nccl = ev.get("nccl")  # findings/nccl.py: a watchdog timeout in words
            if isinstance(nccl, Mapping) and isinstance(nccl.get("said"), str):
                return f"it crashed: {nccl['said']}"
            return f"it crashed: {ev.get('line')!r}"
        if self.cause == "sighup":
            return "it died with its SSH session (tty-bound, not under tmux/nohup/setsid)"
        if self.cause == "killed" and ev.get("signal") is not None:
            why = ("; the kernel log or the cgroup counter could not be read, so an OOM kill "
                   "is not ruled out" if ev.get("unchecked") else
                   "; no OOM, Xid or reboot explains it")
            return (f"it was killed by {ev.get('signal_name')} (its launch wrapper recorded exit "
                    f"status {ev.get('exit_code')}){why}")
        if self.cause == "killed":
            return ("no OOM, Xid, reboot or traceback: it was killed by a signal (or exited "
                    "without a done marker)")
        if self.cause == "exited":
            return (f"it exited with status {ev.get('exit_code')} (its launch wrapper recorded "
                    "it) and no traceback in its log's tail says why")
        return f"cause unknown ({', '.join(ev.get('unchecked', ())) or 'no evidence'})"

    @property
    def words(self) -> str | None:
        """The cause in a word or two, for a narrow cell ("OOM-killed", "killed (SIGKILL)");
        None where it is not known. The summary says it whole."""
        ev = self.evidence
        if self.cause == "exception":
            return CRASH_WORDS.get(str(ev.get("kind")), "crashed")
        if self.cause == "killed" and ev.get("signal_name"):
            return f"killed ({ev['signal_name']})"
        if self.cause == "exited" and ev.get("exit_code") is not None:
            return f"exit status {ev['exit_code']}"
        if self.cause == "xid" and ev.get("xid") is not None:
            return f"GPU Xid {ev['xid']}"
        return CAUSE_WORDS.get(self.cause)

    def _cgroup_summary(self) -> str:
        ev = self.evidence
        cgroup = f" {short_cgroup(ev['cgroup'])}" if ev.get("cgroup") else ""
        pid = ev.get("pid", ev.get("killed_pid"))
        who = f"pid {pid} ({ev.get('name', ev.get('killed_name'))})" if pid else "it"
        limit = ev.get("memory_max_bytes")
        at = f" at its {size(limit)} limit" if isinstance(limit, int) else ""
        # memory.events' oom_kill counter (before → now), when that is the proof, is in the
        # evidence: in the sentence it read as jargon
        return (f"the memory cgroup{cgroup} OOM-killed {who}{at}; lower num_workers "
                "or the batch size, or raise the limit")


_LONG_ID = re.compile(r"[0-9a-f]{24,}")


def short_cgroup(path: object) -> str:
    """A cgroup as a person names it: its last part (the container, slice or scope), a long
    hex id cut to 12 characters as docker prints it ("/process_api/52d9ac44a66ef917..." →
    "process_api/52d9ac44a66e"); the whole path stays in the evidence."""
    text = str(path).strip("/")
    if not text:
        return "(the root cgroup)"
    parts = text.split("/")
    tail = "/".join(parts[-2:]) if len(parts) > 1 and _LONG_ID.search(parts[-1]) else parts[-1]
    return _LONG_ID.sub(lambda m: m.group(0)[:12], tail)


def crash_line(tail: str | None) -> tuple[str, str] | None:
    """(kind, line) of the most telling error in the log's last lines, or None."""
    if not tail:
        return None
    lines = [line.rstrip() for line in tail.splitlines() if line.strip()][-TAIL_LINES:]
    for kind, pattern in EXCEPTION_PATTERNS[:-1]:
        for line in reversed(lines):
            if pattern.search(line):
                return kind, line.strip()[:400]
    generic = EXCEPTION_PATTERNS[-1][1]  # an unindented "SomethingError: ...", a traceback's end
    for line in reversed(lines):
        if generic.match(line):
            return "exception", line.strip()[:400]
    last_tb = max((i for i, line in enumerate(lines) if TRACEBACK.match(line)), default=None)
    if last_tb is not None:  # the traceback's last line was cut off
        return "exception", lines[last_tb].strip()
    return None


# ---------------------------------------------------------------- how a run ended (seed 004)

COMPLETION_LINES: tuple[tuple[re.Pattern[str], bool], ...] = (
    # HuggingFace Trainer.train(), as it returns (logger.info), and its closing summary dict
    (re.compile(r"Training completed\. Do not forget to share your model"), False),
    (re.compile(r"^\s*\{'train_runtime': "), False),
    # Lightning's fit loop: `Trainer.fit` stopped: `max_epochs=10` reached. (or max_steps)
    (re.compile(r"`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached"), False),
    # DeepSpeed's launcher, once per rank that exits 0; after a failing rank it goes on to
    # "Killing subprocess" lines: it counts only as the log's very last line
    (re.compile(r"\[launch\.py:\d+:main\] Process \d+ exits successfully\."), True),
)
"""The frameworks' own words for a run that reached its end, and whether the line must be the
log's last (else: in the tail with no crash line after it)."""
MARKS = 8
"""(file mtime, step) marks kept for a run's pace (its ETA)."""
CKPT_EPOCH = re.compile(r"(?:^|[-_])epoch=(\d+)")
CKPT_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


def completion_line(tail: str | None) -> str | None:
    """The framework's completion line in a log's tail, when nothing after it says the run
    crashed; None otherwise (diagnosis.crash_line: the same words that make a death)."""
    lines = [line.rstrip() for line in (tail or "").splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        for pattern, last_only in COMPLETION_LINES:
            if pattern.search(lines[i]) and (not last_only or i == len(lines) - 1):
                after = "\n".join(lines[i + 1:])
                return None if crash_line(after) else lines[i].strip()[:300]
    return None
