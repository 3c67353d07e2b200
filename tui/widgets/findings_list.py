"""FindingsList: what is wrong on the host, newest first, coloured by severity: the sentence a
person acts on, then the evidence behind it. Messages carry box text: Text, never markup."""

from __future__ import annotations

from gpuwatch.remote.model.finding import Finding
from rich.text import Text

from ..colours import SEVERITY_GLYPH, colour, severity_colour
from ..format import evidence_words, visible
from .text_pane import TextPane


class FindingsList(TextPane):
    def show(self, findings: list[Finding] | None) -> None:
        self.show_built(lambda _width: self.render_findings(findings or []))

    def render_findings(self, findings: list[Finding]) -> Text:
        muted = colour(self.app, "text-muted")
        if not findings:
            return Text("nothing wrong found", style=colour(self.app, "success"))
        text = Text()
        for n, f in enumerate(findings):
            if n:
                text.append("\n")
            sev = severity_colour(self.app, f.severity)
            text.append(f"{SEVERITY_GLYPH[f.severity]} {f.severity.label:<8} ",
                        style=f"bold {sev}")
            text.append(visible(f.code), style=sev)
            where = " ".join(x for x in (f"GPU{f.gpu}" if f.gpu is not None else "",
                                         f"run {visible(f.run)}" if f.run else "") if x)
            if where:
                text.append(f"  {where}", style=muted)
            text.append("\n  ")
            text.append(visible(f.message))
            evidence = evidence_words(f.evidence)
            if evidence:
                text.append("\n  ")
                text.append(evidence, style=muted)
        return text

