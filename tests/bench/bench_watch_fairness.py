"""`gpuwatch watch` over 100 good hosts beside 100 black holes: the good hosts keep their
interval (within 10%) while the dead ones fail, back off and cannot hold the opening slots the
good ones wait for (issue 27). A benchmark: it prints the good hosts' first-poll delay and
their intervals (median, p95, max), measured from the store's samples (each good host's polls,
stamped by the client as they ended), and judges them against the interval at full size.

    .venv/bin/python -m pytest tests/bench/bench_watch_fairness.py -s

Smoke mode (GPUWATCH_BENCH_SMOKE=1): 5 good + 5 black holes at a 2 s interval for 6 s, every
good host polled; no interval judged.

The fleet is tests/integration/fleet_fakes.py in a process of its own: good hosts are in-process
asyncssh servers answering with a real probe document (real SSH, nothing run per poll), black
holes are TCP listeners that accept and never speak. `watch` runs as a real process for RUN_S;
the whole test takes under two minutes.

It failed before the pipeline's one Poller (backoff, fair openings): `watch` polled a dead host
every interval without backing off, and black holes held the shared opening slots for their
whole connect_timeout.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
from figures import SMOKE, size
from gpuwatch.remote.store import Store

GOOD = BAD = size(100, 5)
INTERVAL_S = 2.0 if SMOKE else 15.0
RUN_S = 6.0 if SMOKE else 60.0
FAKES = Path(__file__).resolve().parents[1] / "integration" / "fleet_fakes.py"


def write_ssh_files(root: Path, ports: dict[str, list[int]], host_key: str) -> tuple[Path, Path]:
    key = root / "keys" / "client_key"
    known = root / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{port} {host_key}"
                             for port in ports["good"] + ports["bad"]))
    blocks = []
    for kind, kind_ports in ports.items():
        for i, port in enumerate(kind_ports):
            blocks.append(f"Host {kind}-{i:03d}\n    HostName 127.0.0.1\n    Port {port}\n"
                          f"    User gwt\n    IdentityFile {key}\n    IdentitiesOnly yes\n"
                          f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n")
    config = root / "ssh_config"
    config.write_text("\n".join(blocks))
    return config, known


def intervals(store: Store, host: str) -> tuple[float | None, list[float]]:
    """(the first poll's end, the gaps between this host's polls) from its GPU samples."""
    stamps = sorted({row.t for row in store.gpu_history(host)})
    return (stamps[0] if stamps else None), [b - a for a, b in itertools.pairwise(stamps)]


def test_good_hosts_keep_their_interval_beside_100_black_holes(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key.write_private_key(str(tmp_path / "keys" / "client_key"))
    (tmp_path / "keys" / "client_key").chmod(0o600)
    client_key.write_public_key(str(tmp_path / "keys" / "client_key.pub"))
    fleet = subprocess.Popen([sys.executable, str(FAKES), str(GOOD), str(BAD),
                              str(tmp_path / "keys")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    watch = None
    try:
        assert fleet.stdout is not None
        ports = json.loads(fleet.stdout.readline())
        host_key = (tmp_path / "keys" / "host_key.pub").read_text().split()[:2]
        ssh_config, known = write_ssh_files(tmp_path, ports, " ".join(host_key) + "\n")
        config = tmp_path / "config.toml"
        hosts = [f"{kind}-{i:03d}" for kind in ("good", "bad") for i in range(len(ports[kind]))]
        config.write_text(
            f"interval = {INTERVAL_S:g}\n[ssh]\nconfig_file = {json.dumps(str(ssh_config))}\n"
            f"known_hosts = {json.dumps(str(known))}\n"
            + "".join(f'[hosts.{h}]\nssh = "{h}"\n' for h in hosts))
        state = tmp_path / "state"
        env = {**os.environ, "XDG_STATE_HOME": str(state)}
        env.pop("GPUWATCH_NOTIFY_URLS", None)
        started = time.time()
        watch = subprocess.Popen([sys.executable, "-c", "from gpuwatch.tui.cli import main; "
                                  "main()", "watch", "--config", str(config)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(RUN_S)  # a benchmark's run: what happened is read from the store after
        watch.send_signal(signal.SIGTERM)
        watch.wait(90)
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()
        fleet.stdin.close()  # type: ignore[union-attr]
        try:
            fleet.wait(20)
        except subprocess.TimeoutExpired:
            fleet.kill()
            fleet.wait()
    with Store.open(state / "gpuwatch" / "gpuwatch.sqlite3") as store:
        seen = {f"good-{i:03d}": intervals(store, f"good-{i:03d}") for i in range(GOOD)}
    firsts = sorted(first - started for first, _ in seen.values() if first is not None)
    gaps = sorted(g for _, gs in seen.values() for g in gs)
    assert firsts and gaps, "no good host was polled twice"
    p95 = gaps[int(0.95 * (len(gaps) - 1))]
    print(f"\n{GOOD} good + {BAD} black-hole hosts under `gpuwatch watch`, interval "
          f"{INTERVAL_S:g} s, {RUN_S:g} s: good hosts polled {len(firsts)}/{GOOD}; first poll "
          f"after {statistics.median(firsts):.1f} s median, {firsts[-1]:.1f} s max; intervals "
          f"(n={len(gaps)}) median {statistics.median(gaps):.1f} s, p95 {p95:.1f} s, max "
          f"{gaps[-1]:.1f} s")
    assert len(firsts) == GOOD
    if not SMOKE:  # a time is judged at full size only (figures.py)
        assert 0.9 * INTERVAL_S <= statistics.median(gaps) <= 1.1 * INTERVAL_S
        assert p95 <= 1.1 * INTERVAL_S
