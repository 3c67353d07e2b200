"""Real captures of other tools' output, kept in the repository (tests/data/captures), for
conformance tests.

Only files whose source licence allows copying are here, each with its licence and provenance
beside it (tests/data/captures/PROVENANCE.md); where a test needs the format of a file that
could not be copied (GPL or unknown licence), the folder holds our own file in that format.
So a fresh clone runs these tests with nothing beside it. GPUWATCH_CAPTURES points them at
another folder with the same files. A capture that is missing skips, visibly; under CI=true it
fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CAPTURES = Path(os.environ.get("GPUWATCH_CAPTURES",
                               Path(__file__).resolve().parents[1] / "data" / "captures"))


def missing(what: str) -> None:
    """Skip, or under CI=true fail, saying what real component is missing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} (CI=true: a real component is required)", pytrace=False)
    pytest.skip(what)


def capture(*parts: str) -> Path:
    """A path under the captures folder that must exist."""
    path = CAPTURES.joinpath(*parts)
    if not path.exists():
        missing(f"real capture not found: {path}")
    return path
