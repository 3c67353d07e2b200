"""LogTail: the last lines of the selected run's log, as plain text (a log line that looks like
markup is shown as written: the Log widget never parses markup; its colour codes and other
escape sequences are shown as `\x1b[31m`, never sent to the terminal)."""

from __future__ import annotations

from textual.widgets import Log

from ..format import visible


class LogTail(Log):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(highlight=False, auto_scroll=True, **kwargs)  # type: ignore[arg-type]
        self._shown: str | None = None

    def show(self, tail: str | None, placeholder: str = "no log lines yet") -> None:
        text = tail if tail else placeholder
        if text == self._shown:
            return
        self._shown = text
        self.clear()
        # split on LF only: splitlines() also breaks at \x0c, \x1c-\x1e, \x85 and U+2028,
        # which visible() shows as text
        self.write_lines(visible(text.rstrip("\n"), multiline=True).split("\n"))
