"""Hostile probe documents for the limits tests (test_limits.py, test_hostile_props.py): a
real document to mutate (the probe run against the 8-GPU fixture box with a fully configured
run: every section, event files, three metrics formats, checkpoints, a discovered run), the
real GPUs' captured documents, and what a hostile box prints instead."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

CAPTURES = sorted(Path(__file__).parent.glob("captures/*/probe/*.json"))


def real_document(root: Path) -> dict[str, Any]:
    """The probe's first document for the fixture box with a run (metrics.csv added)."""
    from gpuwatch.remote.model.series import run_request
    from test_probe import box_request, build_box
    from test_runs import full_run, probe

    box = build_box(root / "box")
    run = full_run(root / "llama")
    (root / "llama" / "metrics.csv").write_text("step,loss,epoch\n1,0.5,0\n2,0.4,0\n")
    run = dataclasses.replace(run, metrics=(*run.metrics, "metrics.csv"))
    out = probe(box_request(box, compress=True, runs=[run_request(run)]), box.env())
    doc: dict[str, Any] = json.loads(zlib.decompress(out))
    return doc


def deep(levels: int = 300_000) -> bytes:
    """(a) A document nested `levels` deep."""
    return b'{"v":1,"host":' + b"[" * levels + b"]" * levels + b"}"


def big_number(doc: dict[str, Any], digits: int = 400) -> bytes:
    """(b) A real document whose host.ncpu has `digits` digits."""
    text = json.dumps({**doc, "host": {**doc["host"], "ncpu": 0}}, separators=(",", ":"))
    return text.replace('"ncpu":0', '"ncpu":' + "9" * digits).encode()


def zlib_bomb(inflated: int = 256 * 1024 * 1024) -> bytes:
    """(c) A zlib stream of a few hundred KB that inflates to `inflated` bytes of a document
    (built a MiB at a time: the test process never holds the inflated text)."""
    deflate = zlib.compressobj(9)
    parts = [deflate.compress(b'{"v":1,"pad":"')]
    chunk = b" " * (1024 * 1024)
    parts += [deflate.compress(chunk) for _ in range(inflated // len(chunk))]
    parts.append(deflate.compress(b'"}') + deflate.flush())
    return b"".join(parts)


def fake_python(path: Path, payload: bytes) -> Path:
    """A `python` for a `local` host that ignores the probe on its stdin and prints `payload`
    (probe_bundle.build_command runs `exec PYTHON -S -c BOOTSTRAP`)."""
    data = path.with_suffix(".out")
    data.write_bytes(payload)
    path.write_text(f"#!/bin/sh\ncat >/dev/null\nexec cat '{data}'\n")
    path.chmod(0o755)
    return path
