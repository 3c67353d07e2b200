"""The shape of the one pipeline (remote/watch/fleet.py), held by tests as well as by the
import-linter contracts in pyproject.toml: every caller adapts FleetWatch; none builds a
collector or lands a poll itself; whoever asks for the rules gets all of them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = {"remote/watch/fleet.py", "remote/watch/landing.py"}
LANDING = {"judge", "remember", "restore", "resume", "save_runs_of"}


def _sources() -> list[Path]:
    return sorted(p for top in ("remote", "tui") for p in (ROOT / top).rglob("*.py"))


def test_only_the_pipeline_builds_a_collector_and_lands_polls() -> None:
    offenders = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        if rel in PIPELINE or rel.startswith("remote/wire/"):
            continue
        tree = ast.parse(path.read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else (
                    node.func.attr if isinstance(node.func, ast.Attribute) else None)
                if name == "Collector":
                    offenders.append(f"{rel}:{node.lineno}: builds a Collector")
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.endswith("watch.landing"):
                offenders.append(f"{rel}:{node.lineno}: imports the pipeline's landing")
    assert offenders == [], offenders


def test_the_adapters_go_through_fleetwatch() -> None:
    """The TUI, --once, check, watch, ack and the action verbs each build a FleetWatch with
    their role."""
    roles = {}
    for rel in ("tui/app.py", "tui/cli/once.py", "tui/cli/check.py", "tui/cli/watch.py",
                "tui/cli/actions.py", "tui/cli/ack.py"):
        tree = ast.parse((ROOT / rel).read_text(), rel)
        roles[rel] = sorted({kw.value.value for node in ast.walk(tree)
                             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                             and node.func.id == "FleetWatch"
                             for kw in node.keywords if kw.arg == "role"
                             and isinstance(kw.value, ast.Constant)})
    assert roles["tui/app.py"] == ["tui"]
    assert roles["tui/cli/once.py"] == ["once"]
    assert roles["tui/cli/check.py"] == ["check"]
    assert roles["tui/cli/actions.py"] == ["action"]
    assert roles["tui/cli/ack.py"] == ["action"]
    watch = (ROOT / "tui/cli/watch.py").read_text()
    assert 'role="cron" if args.once else "watch"' in watch


def test_every_rule_is_registered_whatever_was_imported_first() -> None:
    """`--once` imports only what it needs: the rules must not depend on some other module
    having imported every rule module first (a --once that judged with the curve rules alone
    called an unreadable GPU healthy)."""
    code = ("from gpuwatch.remote.findings.evaluate import evaluate\n"
            "from gpuwatch.remote.findings.base import registered_codes\n"
            "print(len(registered_codes()))")
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    from gpuwatch.remote.findings import rules

    assert int(alone) == len(rules.CODES) and int(alone) > 30
