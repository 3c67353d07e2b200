"""Shared pytest fixtures. The machinery lives in tests/harness/; keep each fixture here small."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The tests live in layers (unit/, box/, integration/, tui/); what several share lives in
# harness/ (and in the helper modules beside this file), never in another test module. Every
# layer's folder stays importable by module name while test_watchdog's helpers (trainer,
# first_launch, rounds_until), which test_notify borrows, have not moved there yet.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _layer in ("unit", "box", "integration", "tui"):
    if os.path.join(_HERE, _layer) not in sys.path:
        sys.path.insert(0, os.path.join(_HERE, _layer))

from harness.sshd import SshdBox  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The probe's payload cache ($XDG_CACHE_HOME/gpuwatch) and the error log
    ($XDG_STATE_HOME/gpuwatch/errors.log) of the whole run, and of the gpuwatch processes the
    tests start, in temporary folders: never the machine's ~/.cache or ~/.local/state."""
    old = {name: os.environ.get(name) for name in ("XDG_CACHE_HOME", "XDG_STATE_HOME")}
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# --------------------------------------------------------------------------------------------
# A real OpenSSH sshd on loopback (tests/harness/sshd.py)


@pytest.fixture
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshdBox]]:
    """Start real sshd boxes: ``sshd_factory(env={...}, max_startups="10:30:100")``, each in its
    own temporary folder; every one is stopped at teardown, also when the test failed."""
    boxes: list[SshdBox] = []

    def start(**kwargs: Any) -> SshdBox:
        box = SshdBox(tmp_path_factory.mktemp("sshd"), **kwargs)
        boxes.append(box)
        box.start()
        return box

    yield start
    for box in reversed(boxes):
        box.stop()


@pytest.fixture
def sshd_box(request: pytest.FixtureRequest, sshd_factory: Callable[..., SshdBox]) -> SshdBox:
    """One started box (alias ``box1`` in ``box.ssh_config``). Parametrize it indirectly with a
    dict of ``SshdBox`` keyword arguments, e.g. ``{"env": box_env(root)}``."""
    return sshd_factory(**getattr(request, "param", {}))


# --------------------------------------------------------------------------------------------
# A real Slurm on this machine (tests/harness/slurm.py)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """munge, MariaDB, slurmdbd, slurmctld and one slurmd, started once for the session (about
    10 s) in their own folder; stopped by pid at the end, also when a test failed."""
    from harness.slurm import SlurmCluster

    cluster = SlurmCluster.make()
    cluster.start()
    yield cluster
    cluster.remove()
