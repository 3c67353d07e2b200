"""The real captures beside the repository (../shared/captures in CI), for conformance tests.

They are other projects' files, read at test time and never copied in. Where the folder is
missing a test skips, visibly; under CI=true it fails, because CI always has it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CAPTURES = Path(os.environ.get("GPUWATCH_CAPTURES",
                               Path(__file__).resolve().parents[3] / "shared" / "captures"))


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
