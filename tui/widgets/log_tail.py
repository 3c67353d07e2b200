"""LogTail: the last lines of the selected run's log, as plain text (a log line that looks like
markup is shown as written: the Log widget never parses markup)."""

from __future__ import annotations

from textual.widgets import Log


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
        self.write_lines(text.rstrip("\n").splitlines())
