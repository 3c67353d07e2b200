"""Every `from gpuwatch.… import name` in the sources names something that exists.

mypy cannot follow `gpuwatch.*` imports here (the folders map into the namespace through
setuptools' package-dir, which mypy does not see, and ignore_missing_imports makes them Any), so
an import left behind by a move (config.schema.load_file after load_file went to config.load)
passes mypy and breaks only the verb that runs it. This test is that check. The code that runs
on the box is left out: it imports nothing of gpuwatch (an import-linter contract holds that).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for top in ("remote", "tui", "themes", "tests")
                 for p in (ROOT / top).rglob("*.py")
                 if "box" not in p.relative_to(ROOT).parts[:2])


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of each absolute gpuwatch import (name None: `import module`)."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "gpuwatch":
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names
                      if a.name.split(".")[0] == "gpuwatch"]
    return found


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 100
    assert any(imports(p) for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_gpuwatch_import_resolves(path: Path) -> None:
    missing = []
    for line, module, name in imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"line {line}: {module}: {exc}")
            continue
        if name is None or name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"line {line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
