"""What the TUI said in toasts, recorded through the app's own `notify`.

Every toast of the app and its screens goes through `GpuwatchApp.notify` (Textual's widgets call
the app's). `record_toasts(app)` wraps that method on the one app, so a test reads every toast
in order, what the app was asked to say, for as long as the test runs (Textual's own list drops
a toast when it times out, which on a busy machine can be before the test looks). How a toast
is drawn is read from the screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from .waiting import TIMEOUT_S, wait_for_async


@dataclass(frozen=True)
class Toast:
    """One call of the app's notify."""

    message: str
    title: str
    severity: str


class ToastLog:
    """The toasts one app said, in order."""

    def __init__(self) -> None:
        self.toasts: list[Toast] = []

    def __len__(self) -> int:
        return len(self.toasts)

    @property
    def messages(self) -> list[str]:
        return [t.message for t in self.toasts]

    async def said_since(self, count: int,
                         timeout: float = TIMEOUT_S) -> list[str]:  # noqa: ASYNC109
        """The messages after the first `count`, once there is at least one."""
        return await wait_for_async(lambda: self.messages[count:], timeout,
                                    f"a toast after the {count} said before")

    async def saying(self, text: str, timeout: float = TIMEOUT_S) -> str:  # noqa: ASYNC109
        """The first message that contains `text`, once there is one."""
        return await wait_for_async(lambda: next((m for m in self.messages if text in m), ""),
                                    timeout, f"a toast saying {text!r}")


_LOGS: WeakKeyDictionary[Any, ToastLog] = WeakKeyDictionary()


def record_toasts(app: Any) -> ToastLog:
    """Record every toast `app` says from now on (again for the same app: the same log)."""
    if app in _LOGS:
        return _LOGS[app]
    log = _LOGS[app] = ToastLog()
    notify = app.notify  # the app's own, bound

    def recording(message: str, *, title: str = "", severity: str = "information",
                  **kwargs: Any) -> None:
        log.toasts.append(Toast(message, title, severity))
        notify(message, title=title, severity=severity, **kwargs)

    app.notify = recording
    return log


def toasts_of(app: Any) -> ToastLog:
    """The log `record_toasts` keeps for `app` (it must have been called first)."""
    if app not in _LOGS:
        raise AssertionError("record_toasts(app) was not called for this app")
    return _LOGS[app]
