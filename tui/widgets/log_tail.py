"""LogTail: the last lines of the selected run's log, as plain text (a log line that looks like
markup is shown as written: the Log widget never parses markup; its colour codes and other
escape sequences are shown as `\x1b[31m`, never sent to the terminal).

It follows the end as `tail -f` does: new lines scroll into view, until the person scrolls up
(arrows, PageUp, Home, the wheel); then it stays where they are and the pane's bottom border
says it is scrolled up (held: not "paused", which is the polling's word) and how many lines
came since. End (or G) follows again. Each poll brings
the box's whole tail anew, so the lines that are new are what the old tail does not end with.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import Log

from ..format import visible


def new_lines(old: list[str], new: list[str]) -> tuple[int, int]:
    """(lines dropped from old's top, lines added at new's end): the largest overlap where the
    end of `old` is the start of `new`. No overlap: all of old went, all of new is new."""
    for dropped in range(len(old) + 1):
        kept = len(old) - dropped
        if kept <= len(new) and old[dropped:] == new[:kept]:
            return dropped, len(new) - kept
    return len(old), len(new)  # not reached: dropped == len(old) always matches


class LogTail(Log):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("G", "follow", "Follow", show=False),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(highlight=False, auto_scroll=False, **kwargs)  # type: ignore[arg-type]
        self._shown: str | None = None
        self._shown_lines: list[str] = []
        self._writing = False
        self.following = True
        """At the end, and kept there as lines come (False: the person scrolled up)."""
        self.unseen = 0
        """Lines that came while paused."""

    def show(self, tail: str | None, placeholder: str = "no log lines yet") -> None:
        text = tail if tail else placeholder
        if text == self._shown:
            return
        # split on LF only: splitlines() also breaks at \x0c, \x1c-\x1e, \x85 and U+2028,
        # which visible() shows as text
        lines = visible(text.rstrip("\n"), multiline=True).split("\n")
        dropped, added = new_lines(self._shown_lines, lines) if tail and self._shown_lines \
            and self._shown != placeholder else (0, 0)
        self._shown, self._shown_lines = text, lines if tail else []
        y = self.scroll_y
        self._writing = True  # clear() and write_lines() move the scroll: not the person
        try:
            self.clear()
            self.write_lines(lines, scroll_end=False)
            if self.following:
                self.scroll_end(animate=False, immediate=True, x_axis=False)
            else:  # the lines the person reads stay where they are
                self.unseen += added
                self.scroll_to(y=max(0.0, y - dropped), animate=False, immediate=True)
        finally:
            self._writing = False
        self._say()

    def action_follow(self) -> None:
        self.scroll_end(animate=False, x_axis=False)
        self._set_following(True)

    def on_resize(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if not self._writing and self.is_mounted:
            self._set_following(round(new_value) >= self.max_scroll_y)

    def _set_following(self, following: bool) -> None:
        if following != self.following:
            self.following = following
            if following:
                self.unseen = 0
            self._say()

    def status(self) -> str:
        """What the pane's bottom border says: nothing while following."""
        if self.following:
            return ""
        news = f"↓ {self.unseen} new line{'s' * (self.unseen != 1)} · " if self.unseen else ""
        return f"scrolled up · {news}End follows"

    def _say(self) -> None:
        if isinstance(self.parent, Widget):  # the pane's bottom border, as the loss pane's
            self.parent.border_subtitle = self.status()
