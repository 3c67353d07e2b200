"""A finding: one thing wrong on a host, its severity and the evidence behind it. Plain data
kept in the history and the store (first/last seen), judged by remote/findings/ rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @classmethod
    def parse(cls, name: str) -> Severity:
        return cls[name.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong, in one sentence, with the evidence behind it."""

    code: str
    severity: Severity
    message: str
    gpu: int | None = None
    run: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    subject: str | None = None
    """What else tells two findings of one code apart (a disk's path); not in the JSON."""

    @property
    def key(self) -> tuple[str, int | None, str | None, str | None]:
        """What makes two findings the same across polls (for first seen / cleared)."""
        return (self.code, self.gpu, self.run, self.subject)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity.label,
                               "message": self.message}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.run is not None:
            out["run"] = self.run
        out["evidence"] = dict(self.evidence)
        return out
