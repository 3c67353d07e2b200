"""A wheel built from the source tree installs into a clean venv as the `gpuwatch` namespace.

The product card fixes the top-level folders remote/, tui/, themes/; they must land in
site-packages as gpuwatch.remote, gpuwatch.tui, gpuwatch.themes and never as `remote` or `tui`.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {"gpuwatch." + str(init.parent.relative_to(ROOT)).replace("/", ".")
             for top in ("remote", "tui", "themes") for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    str(ROOT)], check=True, timeout=300)
    (wheel,) = wheels.glob("gpuwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("gpuwatch/", "gpuwatch-")) for n in names), names
    assert "gpuwatch/remote/config/schema.py" in names and "gpuwatch/tui/cli/command.py" in names
    assert "gpuwatch/remote/box/probe.py" in names and "gpuwatch/remote/wire/bundle.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    str(wheel)], check=True, timeout=600)
    exe = venv / "bin" / "gpuwatch"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("gpuwatch ")
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "gpuwatch --once" in helptext.stdout
    for generic in ("remote", "tui", "themes"):
        probe = subprocess.run([py, "-c", f"import {generic}"], capture_output=True, text=True,
                               cwd=tmp_path)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr
    ok = subprocess.run([py, "-c", "import gpuwatch.remote.config, gpuwatch.tui.cli"], cwd=tmp_path)
    assert ok.returncode == 0
