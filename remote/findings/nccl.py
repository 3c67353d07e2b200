"""Deaths from the log, deeper: PyTorch's NCCL watchdog lines read by their format (seed 002).

When one rank of a distributed run stops (a dataloader stuck, an exception, an OOM there), the
others wait in their next collective until ProcessGroupNCCL's watchdog gives up and logs, per
rank (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; the prefix differs by version):

    [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=668,
      OpType=ALLREDUCE, NumelIn=52, NumelOut=52, Timeout(ms)=600000) ran for 600097
      milliseconds before timing out.
    [rank3]:[E ProcessGroupNCCL.cpp:563] [PG 0 (default_pg) Rank 3] Watchdog caught ...
    [PG 0 Rank 3] Timeout at NCCL work: 669, last enqueued NCCL work: 669, last completed
      NCCL work: 668.

`read` turns such lines, from one log where the ranks' lines mingle (torchrun's `[rankN]:`
prefix) or from several ranks' logs, into the cause in words: the operation, its sequence
number, the timeout, the rank that logged it; and, where the ranks' sequence numbers differ,
the rank whose last collective lags: the one that stopped, whose own log says why. Nothing is
guessed from a line that does not have the format: it is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_LINE = 2000
"""A longer line is not one of these (a dumped tensor): not read."""
MAX_RANKS = 4096

_RANK = re.compile(r"\[(?:PG [^\[\]]{0,80}?)?Rank ([0-9]{1,9})\]")
_PREFIX = re.compile(r"^\s*\[rank([0-9]{1,9})\]:")
_WORK = re.compile(r"WorkNCCL\(((?:[^()]|\([a-z]{1,4}\)){0,600})\)")
_FIELD = re.compile(r"([A-Za-z_]{1,20}(?:\(ms\))?)=([^,]{1,80})")
_RAN = re.compile(r"ran for ([0-9]{1,15}) milliseconds before timing out")
_PROGRESS = re.compile(
    r"(?:Timeout at NCCL work|detected by watchdog at work): ([0-9]{1,15}), "
    r"last enqueued NCCL work: (-?[0-9]{1,15}), last completed NCCL work: (-?[0-9]{1,15})")


@dataclass(frozen=True, slots=True)
class NcclLine:
    """What one watchdog line says."""

    rank: int | None
    seq: int | None
    """The collective's sequence number (SeqNum, or the work that timed out)."""
    op: str | None
    timeout_ms: int | None
    ran_ms: int | None
    completed: int | None
    """The last collective this rank completed (the progress line), where it says."""
    source: str


def parse_line(line: str, source: str = "log") -> NcclLine | None:
    """One watchdog line, or None for any line that is not one."""
    if len(line) > MAX_LINE:
        return None
    progress = _PROGRESS.search(line)
    timeout = "Watchdog caught collective operation timeout" in line
    if not timeout and progress is None:
        return None
    rank = _rank(line)
    if progress is not None:
        seq, _, done = (int(g) for g in progress.groups())
        return NcclLine(rank, seq, None, None, None, done, source)
    work = _WORK.search(line)
    fields = dict(_FIELD.findall(work.group(1))) if work else {}
    ran = _RAN.search(line)
    return NcclLine(rank, _int(fields.get("SeqNum")), _op(fields.get("OpType")),
                    _int(fields.get("Timeout(ms)")), int(ran.group(1)) if ran else None, None,
                    source)


def _rank(line: str) -> int | None:
    found = _RANK.search(line) or _PREFIX.search(line)
    return int(found.group(1)) if found else None


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 15 else None


def _op(text: str | None) -> str | None:
    text = (text or "").strip()
    return text if re.fullmatch(r"_?[A-Z][A-Z_]{0,39}", text) else None


def ranks_seen(text: str) -> set[int]:
    """Every rank a log's lines name (torchrun's [rankN]: prefix, or [Rank N])."""
    out: set[int] = set()
    for line in text.splitlines():
        if len(line) <= MAX_LINE:
            found = _PREFIX.search(line) or _RANK.search(line)
            if found and len(out) < MAX_RANKS:
                out.add(int(found.group(1)))
    return out


def read(logs: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, Any] | None:
    """The NCCL watchdog timeout the logs (source → text: one log, or one per rank) say,
    as evidence: {"op", "seq", "timeout_ms", "ran_ms", "rank", "ranks" (each rank's newest
    sequence number), "lagging_rank", "lagging_seq", "silent_ranks", "said"}; None when no
    watchdog timeout line is there."""
    items = list(logs.items()) if isinstance(logs, Mapping) else list(logs)
    lines: list[NcclLine] = []
    seen: set[int] = set()
    for source, text in items:
        ranks = ranks_seen(text)
        for raw in text.splitlines():
            got = parse_line(raw, source)
            if got is None:
                continue
            if got.rank is None and len(items) > 1 and len(ranks) == 1:
                got = NcclLine(next(iter(ranks)), *_rest(got))  # one rank's own log
            lines.append(got)
        seen |= ranks
    timeouts = [x for x in lines if x.op is not None or x.timeout_ms is not None]
    if not timeouts:
        return None
    first = timeouts[0]
    newest: dict[int, int] = {}
    for x in lines:
        mark = x.completed if x.completed is not None else x.seq
        if x.rank is not None and mark is not None and len(newest) < MAX_RANKS:
            newest[x.rank] = max(newest.get(x.rank, mark), mark)
    lagging = lagging_seq = None
    if len(newest) > 1 and len(set(newest.values())) > 1:
        lagging = min(newest, key=lambda r: (newest[r], r))
        lagging_seq = newest[lagging]
    silent = sorted(seen - set(newest)) if newest else []
    ev: dict[str, Any] = {
        "op": first.op, "seq": first.seq, "timeout_ms": first.timeout_ms,
        "ran_ms": first.ran_ms, "rank": first.rank,
        "ranks": {str(r): s for r, s in sorted(newest.items())},
        "lagging_rank": lagging, "lagging_seq": lagging_seq, "silent_ranks": silent[:16]}
    ev["said"] = words(ev)
    return ev


def _rest(x: NcclLine) -> tuple[Any, ...]:
    return (x.seq, x.op, x.timeout_ms, x.ran_ms, x.completed, x.source)


def words(ev: Mapping[str, Any]) -> str:
    """The timeout in words: what timed out, where, and which rank to look at."""
    who = f"rank {ev['rank']}'s" if ev.get("rank") is not None else "a rank's"
    op = ev.get("op") or "a collective"
    seq = f" #{ev['seq']}" if ev.get("seq") is not None else ""
    ran = ev.get("ran_ms")
    timeout = ev.get("timeout_ms")
    took = f" after {ran / 1000:.0f} s" if isinstance(ran, int) else ""
    limit = f" (its timeout {timeout / 1000:.0f} s)" if isinstance(timeout, int) else ""
    said = f"{who} NCCL watchdog timed out waiting for {op}{seq}{took}{limit}"
    if ev.get("lagging_rank") is not None:
        said += (f"; rank {ev['lagging_rank']} lags (its last collective #{ev['lagging_seq']}): "
                 "it stopped first, and its own log says why")
    elif ev.get("silent_ranks"):
        names = ", ".join(str(r) for r in ev["silent_ranks"][:8])
        said += (f"; rank{'s' if len(ev['silent_ranks']) > 1 else ''} {names} logged no "
                 "timeout: the one that never reached the collective is among them")
    else:
        said += ": one rank stopped (a dataloader, an exception, an OOM there) and the others "\
                "waited for it"
    return said
