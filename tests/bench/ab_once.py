"""`gpuwatch --once` start-up of two git revisions, interleaved in one run.

    .venv/bin/python tests/bench/ab_once.py REV_A REV_B [-n 30]

Each revision is exported (`git archive`), built into a wheel and installed into a venv of its
own (as a user's install: byte-compiled, no editable finder), its dependencies read from this
venv. Then `gpuwatch --once --json` runs with a local-only config, A, B, A, B, ... so that the
machine's bad minutes hit both alike (timings here swing 1.5-2x within hours), and prints per
revision the wall time minus the poll (the document's poll_s) and the CPU of the run with its
children (the probe included), fastest and median. Nothing is asserted: it prints figures, for
a before/after claim made from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
from figures import SMOKE

ROOT = Path(__file__).resolve().parents[2]


def install(rev: str, into: Path) -> Path:
    """The console script of `rev` installed into its own venv under `into`."""
    src, wheels, venv = into / "src", into / "wheels", into / "venv"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    "--no-deps", *map(str, wheels.glob("gpuwatch-*.whl"))],
                   check=True, capture_output=True)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "ab_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin" / "gpuwatch"


def once(exe: Path, home: Path) -> tuple[float, float]:
    """(wall time minus the poll, CPU seconds of the run and its children)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
           "XDG_CACHE_HOME": str(home / "cache")}
    t0 = time.monotonic()
    proc = subprocess.Popen([str(exe), "--config", str(home / "c.toml"), "--once", "--json"],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    return wall - json.loads(out)["hosts"][0]["poll_s"], usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs=2, metavar="REV")
    parser.add_argument("-n", type=int, default=30, help="runs of each (default 30)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-ab-") as tmp:
        exes: list[Path] = []
        for i, rev in enumerate(args.revs):  # the same revision twice is installed once
            same = args.revs.index(rev)
            exes.append(exes[same] if same < i else install(rev, Path(tmp) / f"rev{i}"))
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "c.toml").write_text('[hosts.box]\nssh = "local"\n')
        for exe in exes:  # the payload cache and the store's first state, for both
            once(exe, home)
        samples: list[list[tuple[float, float]]] = [[] for _ in exes]
        for _ in range(args.n):
            for i, exe in enumerate(exes):
                samples[i].append(once(exe, home))
    print(f"--once, local-only config, {args.n} runs each, interleaved "
          f"(load average {os.getloadavg()[0]:.2f} at the end)")
    print(f"  {'revision':<24} {'wall - poll: fastest / median':>32} {'CPU: fastest / median':>26}")
    for rev, runs in zip(args.revs, samples, strict=True):
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"  {rev:<24} {min(walls) * 1e3:>17.1f} / {statistics.median(walls) * 1e3:5.1f} ms"
              f" {min(cpus) * 1e3:>14.1f} / {statistics.median(cpus) * 1e3:5.1f} ms")


def test_ab_once_smoke() -> None:
    """Smoke mode (CI): HEAD against itself, one run each: the script runs to its end. Run by
    hand (two revisions, 30 runs) it is a before/after figure."""
    if not SMOKE:
        pytest.skip("a before/after figure takes two revisions: run the script by hand")
    main(["HEAD", "HEAD", "-n", "1"])


if __name__ == "__main__":
    main()
