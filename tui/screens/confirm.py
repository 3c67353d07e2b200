"""ConfirmAction: a ModalScreen[bool] that shows exactly what an action will hit and defaults to
Cancel (STYLE 7; k9s#146: people asked for Cancel to be the default).

Focus starts on Cancel, Enter on it cancels, Escape cancels. Confirming takes a deliberate
step: Tab to the action's button (or click it), or `y`. A plan the actions refused (a run that is
still alive, a pid that is someone else's) shows the refusal and offers only Cancel.

The buttons and the keys that answer stay on screen at any height: the description scrolls
instead (at 80x24 a long plan pushed the buttons below the box's edge).
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ..format import visible

BODY_MAX = 20
"""Rows of description shown at most before it scrolls (fewer where the screen is short)."""
CHROME = 2 + 2 + 1 + 1 + 3
"""The box's rows besides its title's and description's: border, padding, the title's
margin, the buttons' margin and the buttons."""


class ConfirmAction(ModalScreen[bool]):
    """Returns True only when the person confirmed."""

    AUTO_FOCUS = "#cancel"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("n", "cancel", "Cancel", show=False),
        Binding("y", "confirm", "Confirm"),
        Binding("left,right", "toggle_focus", "Move", show=False),
    ]

    def __init__(self, title: str, description: str, *, verb: str,
                 refusal: str | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.description = description
        self.verb = verb
        self.refusal = refusal

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(Text(visible(self.title_text), style="bold"), id="confirm-title")
            with VerticalScroll(id="confirm-body"):
                # plan.describe() holds command lines and paths from the box: Text, not markup,
                # control characters visible (a command line must not redraw what will be hit).
                yield Static(Text(visible(self.description, multiline=True)),
                             id="confirm-description")
                if self.refusal:
                    yield Static(Text(f"Refused: {visible(self.refusal, multiline=True)}"),
                                 id="confirm-refusal")
            with Horizontal(id="confirm-buttons"):
                yield Static(self.keys_hint(), id="confirm-keys", markup=False)
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.verb, id="confirm", variant="error",
                             disabled=self.refusal is not None)

    def keys_hint(self) -> str:
        """The keys that answer, in words (Enter presses the focused button: Cancel first)."""
        cancel = "n / Esc cancel"
        return cancel if self.refusal is not None else f"y {self.verb.lower()} · {cancel}"

    def on_mount(self) -> None:
        self.fit_body()

    def on_resize(self, event: events.Resize) -> None:
        self.fit_body()

    def fit_body(self) -> None:
        """The description's most rows: what the screen's 90 % leaves beside the title and
        the buttons, so that they are never pushed out of sight."""
        rows, columns = self.size.height, self.size.width
        if not rows:
            return
        box = int(rows * 0.9)
        inner = max(1, min(columns * 9 // 10, 110) - 6)  # less border and padding
        title = -(-cell_len(self.title_text) // inner)
        self.query_one("#confirm-body").styles.max_height = max(
            1, min(BODY_MAX, box - CHROME - title))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm" and self.refusal is None)

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_confirm(self) -> None:
        if self.refusal is None:
            self.dismiss(True)

    def action_toggle_focus(self) -> None:
        self.focus_next(Button)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "confirm" and self.refusal is not None:
            return None
        return True
