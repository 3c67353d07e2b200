"""AnswerLines: under the host view's header, at every size, one line per worst finding: what
is wrong, then what to do (the Findings pane holds the whole sentence and its evidence).

At 80×24 the finding that says what happened used to be the fifth pane, below the fold; these
lines put the answer on the first screen. Nothing at warning or worse: no lines at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.verdict import finding_words, rank
from rich.text import Text

from ..colours import SEVERITY_GLYPH, severity_colour
from ..format import visible
from .text_pane import TextPane

SHOWN = 3
"""Lines at most: the worst findings, most severe first."""


def advice(finding: Finding) -> str:
    """What to do, from a finding's sentence: the part after its last " — " (the house style
    puts the advice there), else the whole sentence."""
    message = " ".join(finding.message.split())
    return message.rsplit(" — ", 1)[1] if " — " in message else message


def answer(finding: Finding) -> str:
    """"run died: OOM-killed — fix the cause, then relaunch it ..." in plain words."""
    return visible(f"{finding_words(finding)} — {advice(finding)}")


class AnswerLines(TextPane):
    def show(self, findings: Sequence[Finding]) -> None:
        worst = sorted((f for f in findings if f.severity >= Severity.WARNING),
                       key=rank)[:SHOWN]  # the verdict's order: its headline's finding first
        self.display = bool(worst)
        self.show_built(lambda width: self.build_lines(worst, width))

    def build_lines(self, worst: Sequence[Finding], width: int) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, f in enumerate(worst):
            if i:
                text.append("\n")
            line = f"{SEVERITY_GLYPH[f.severity]} {answer(f)}"
            if width and len(line) > width:
                line = line[:max(1, width - 1)] + "…"
            text.append(line, style=severity_colour(self.app, f.severity))
        return text
