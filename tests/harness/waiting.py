"""wait_for: the one way a test waits for something to happen, by a condition, never by a time.

A test that waits for a thing asks for it by name and is handed it as soon as it is there, so a
generous deadline costs nothing when the machine is quick and saves the test when it is busy (two
CPU hogs beside the suite is the bar). A test that something did *not* happen does not wait at
all: it counts events in the store or the audit log after a condition that proves the thing
had its chance (STYLE 19).

`wait_for` blocks (processes, sshd, files, a store written by another process);
`wait_for_async` lets the event loop run between two looks (Textual's Pilot, asyncio rigs).
Both fail with an AssertionError that names what was waited for and what was last seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 30.0
"""Long enough for a busy 2-core machine; a passing test never waits it out."""
FIRST_LOOK_S = 0.01
LONGEST_GAP_S = 0.25
"""Between two looks: short at first (most things are quick), longer while it takes."""


def _gaps(timeout: float) -> Iterator[float]:
    """The pauses between looks until `timeout` seconds have gone by (then it stops)."""
    deadline = time.monotonic() + timeout
    gap = FIRST_LOOK_S
    while (left := deadline - time.monotonic()) > 0:
        yield min(gap, left)
        gap = min(gap * 2, LONGEST_GAP_S)


def _timed_out(what: str | Callable[..., object], timeout: float, last: object) -> AssertionError:
    name = what if isinstance(what, str) else getattr(what, "__name__", repr(what))
    seen = repr(last)
    if len(seen) > 2000:
        seen = seen[:2000] + "…"
    return AssertionError(f"timed out after {timeout:g} s waiting for {name}; last seen: {seen}")


def wait_for(condition: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "") -> T:
    """Call `condition` until it returns something true, and return that; fail after `timeout`
    seconds naming `what` (or the condition) and the last value it returned."""
    last = condition()
    if last:
        return last
    for gap in _gaps(timeout):
        time.sleep(gap)
        last = condition()
        if last:
            return last
    raise _timed_out(what or condition, timeout, last)


async def wait_for_async(condition: Callable[[], T],
                         timeout: float = TIMEOUT_S,  # noqa: ASYNC109 (a deadline of looks)
                         what: str = "") -> T:
    """`wait_for` for a test running in the event loop: the loop runs between two looks."""
    last = condition()
    if last:
        return last
    for gap in _gaps(timeout):
        await asyncio.sleep(gap)
        last = condition()
        if last:
            return last
    raise _timed_out(what or condition, timeout, last)
