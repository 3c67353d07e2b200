"""No string gpuwatch may show a person cites a gotcha by number ("U21", "seed 000"): those
mean nothing to a user. Code comments, docstrings, the rule registry's {code: gotchas} and
SQL comments cite them on purpose; every other string literal under remote/ and tui/ is
scanned, since any of them may reach a toast, a finding, an action's outcome, a log line or
a Prometheus HELP text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"\bU\d{1,2}\b|\bseed 0\d\d\b")


def _not_for_people(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation or registry data."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            skip.add(id(node.value))  # a docstring, or an attribute's docstring
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:  # @rule({"gpu.xid": ("U22",)})
                skip.update(id(n) for n in ast.walk(decorator))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "CREATE TABLE" in node.value):
            skip.add(id(node))  # the store's schema, with its SQL comments
    return skip


def cited(path: Path) -> list[str]:
    """`line: 'the string'` for each string literal of `path` that cites a gotcha."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _not_for_people(tree)
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skip and CODE.search(node.value)]


def test_no_user_facing_string_cites_a_gotcha_by_number() -> None:
    files = [p for folder in ("remote", "tui") for p in sorted((ROOT / folder).rglob("*.py"))
             if "__pycache__" not in p.parts]
    assert len(files) > 100
    found = [f"{path.relative_to(ROOT)}:{line}" for path in files for line in cited(path)]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_code_in_a_message_and_not_in_a_comment_or_docstring(
        tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Module (U3)."""\n\n@rule({"x": ("U5",)})\ndef f():\n'
                      '    """Doc (seed 000)."""\n    return "dead (U21)"  # U9\n')
    hits = cited(sample)
    assert len(hits) == 1 and "dead (U21)" in hits[0]

