"""The real thing: Debian's Prometheus, on loopback, scraping two sharded `gpuwatch watch
--listen` processes and a real DCGM exporter page; `gpuwatch --once --json` with
`[sources.prometheus]` then reads every host back, with no SSH.

The watchers poll simulated SSH hosts (tests/integration/fleet_fakes.py: in-process asyncssh
servers answering with a real probe document of an 8-GPU box; one host a black hole that
accepts TCP and never speaks). The DCGM page is DataDog's capture of a real dcgm-exporter
(tests/data/captures/dcgm-exporter/, PROVENANCE.md), served by the test. Prometheus runs with
docs/prometheus.md's scrape config and alert rules, as written there but for the targets and
a 1 s scrape interval."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
from gpuwatch.tui.cli.watch import shard_of
from harness.captures import capture
from harness.prometheus import prometheus, require_prometheus

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).with_name("fleet_fakes.py")
GOOD = 6
DCGM_HOSTS = {"424773df46e0", "551bdf382151"}
"""The capture's hosts with series gpuwatch reads (a third, ip-11111, has only
DCGM_FI_PROF_DRAM_ACTIVE, which it does not)."""


def docs_yaml(title: str) -> str:
    """The YAML block under a heading of docs/prometheus.md."""
    text = (ROOT / "docs" / "prometheus.md").read_text()
    section = text.split(f"### {title}\n", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


class _Exporter(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    """The real exporter page on a loopback port: host:port."""
    _Exporter.page = capture("dcgm-exporter", "datadog-dcgm-metrics.txt").read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def start_fleet(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, list[str]]:
    """GOOD answering hosts and one black hole; the watchers' config; the host names."""
    (tmp_path / "keys").mkdir()
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(tmp_path / "keys" / "client_key"))
    (tmp_path / "keys" / "client_key").chmod(0o600)
    key.write_public_key(str(tmp_path / "keys" / "client_key.pub"))
    fleet = subprocess.Popen([sys.executable, str(FAKES), str(GOOD), "1", str(tmp_path / "keys")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert fleet.stdout is not None
    ports = json.loads(fleet.stdout.readline())
    host_key = " ".join((tmp_path / "keys" / "host_key.pub").read_text().split()[:2])
    names = {f"node-{i}": port for i, port in enumerate(ports["good"])}
    names["blackhole"] = ports["bad"][0]
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{port} {host_key}\n" for port in names.values()))
    blocks = [f"Host {name}\n    HostName 127.0.0.1\n    Port {port}\n    User gwt\n"
              f"    IdentityFile {tmp_path / 'keys' / 'client_key'}\n    IdentitiesOnly yes\n"
              for name, port in names.items()]
    (tmp_path / "ssh_config").write_text("\n".join(blocks))
    config = tmp_path / "watchers.toml"
    config.write_text(
        "interval = 2\n[ssh]\nconnect_timeout = 2\n"
        f"config_file = {json.dumps(str(tmp_path / 'ssh_config'))}\n"
        f"known_hosts = {json.dumps(str(known))}\n"
        + "".join(f'[hosts.{name}]\nssh = "{name}"\n' for name in names))
    return fleet, config, list(names)


def start_watcher(config: Path, shard: str, state: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    proc = subprocess.Popen([sys.executable, "-c", "from gpuwatch.tui.cli import main; main()",
                             "watch", "--config", str(config), "--listen", "127.0.0.1:0",
                             "--shard", shard], stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"serving http://(127\.0\.0\.1:\d+)/metrics", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # drained
            return proc, found.group(1)
    raise AssertionError(f"the watcher did not start (exit {proc.wait()})")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_prometheus_scrapes_sharded_watchers_and_dcgm_and_once_reads_them_all_back(
        tmp_path: Path, dcgm_exporter: str) -> None:
    require_prometheus()
    fleet, config, names = start_fleet(tmp_path)
    watchers: list[subprocess.Popen[str]] = []
    try:
        addresses = []
        for k in (1, 2):
            proc, address = start_watcher(config, f"{k}/2", tmp_path / f"state{k}")
            watchers.append(proc)
            addresses.append(address)
        owned = {k: [n for n in names if shard_of(n, 2) == k - 1] for k in (1, 2)}
        assert owned[1] and owned[2], owned  # both watchers own some of the hosts
        scrape = docs_yaml("A scrape config")
        scrape = scrape.replace('["127.0.0.1:9464", "127.0.0.1:9465"]', json.dumps(addresses))
        scrape = scrape.replace('["gpu-node-1:9400", "gpu-node-2:9400"]',
                                json.dumps([dcgm_exporter]))
        scrape = scrape.replace("scrape_interval: 15s", "scrape_interval: 1s")
        scrape = scrape.replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        assert json.dumps(addresses) in scrape and dcgm_exporter in scrape
        root = tmp_path / "prometheus"
        root.mkdir()
        (root / "gpuwatch-rules.yml").write_text(docs_yaml("Two alert rules"))
        with prometheus(scrape, root) as server:
            # every host of both shards, each from the watcher that owns it
            ups = server.wait_for("gpuwatch_up", len(names))
            by_host = {s["metric"]["host"]: s for s in ups}
            assert sorted(by_host) == sorted(names)
            for k, address in enumerate(addresses, 1):
                assert sorted(h for h, s in by_host.items()
                              if s["metric"]["instance"] == address) == sorted(owned[k])
            server.wait_for("gpuwatch_up == 0", 1)  # the black hole's poll failed
            server.wait_for("DCGM_FI_DEV_GPU_UTIL", 1)
            # the docs' two rules load and evaluate (GpuwatchHostDown's expression holds for
            # the black hole; its `for` keeps it pending)
            groups = server.api("/api/v1/rules")["data"]["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            assert set(rules) == {"GpuwatchHostCritical", "GpuwatchHostDown"}
            assert all(r["health"] in ("ok", "unknown") for r in rules.values()), rules
            assert [s["metric"]["host"] for s in server.query(rules["GpuwatchHostDown"]["query"])
                    ] == ["blackhole"]
            # both watchers are ready once their first round landed
            for address in addresses:
                with urllib.request.urlopen(f"http://{address}/ready", timeout=30) as ready:
                    assert ready.status == 200
            exported = urllib.request.urlopen(f"http://{addresses[0]}/metrics",
                                              timeout=30).read().decode()

            reader = tmp_path / "reader.toml"  # no ssh config: an SSH poll could not work
            reader.write_text(f'[sources.prometheus]\nurl = "{server.url}"\ntimeout_s = 20\n')
            env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "reader-state")}
            once = subprocess.run([sys.executable, "-c",
                                   "from gpuwatch.tui.cli import main; main()", "--once",
                                   "--json", "--config", str(reader)],
                                  capture_output=True, text=True, env=env, timeout=120)
        assert once.returncode == 2, once.stderr  # the black hole: a host not polled
        hosts = {h["name"]: h for h in json.loads(once.stdout)["hosts"]}
        assert set(hosts) == set(names) | DCGM_HOSTS
        down = hosts.pop("blackhole")
        assert not down["ok"] and down["error"]["kind"] in ("timeout", "unreachable")
        assert "as Prometheus at" in down["error"]["message"]
        for name in set(names) - {"blackhole"}:
            host = hosts[name]
            assert host["ok"], host["error"]
            assert len(host["gpus"]) == 8 and host["processes"] == [] and host["runs"] == []
        # a watcher's host reads back as the watcher exported it
        name = next(n for n in owned[1] if n != "blackhole")
        for gpu in hosts[name]["gpus"]:
            line = (f'gpuwatch_gpu_memory_total_mib{{host="{name}",gpu="{gpu["index"]}",'
                    f'uuid="{gpu["uuid"]}"}} {gpu["mem_total_mib"]}')
            assert line in exported.splitlines()
        t4 = hosts["424773df46e0"]["gpus"]
        assert [(g["name"], g["sm_clock_mhz"], g["mem_total_mib"], g["temp_c"]) for g in t4] \
            == [("Tesla T4", 300, 15109, 25)]
        other = hosts["551bdf382151"]["gpus"]
        assert [(g["power_limit_w"], g["throttle_reasons"]) for g in other] \
            == [(70.0, ["gpu_idle"])]
    finally:
        for proc in watchers:
            stop(proc)
        assert fleet.stdin is not None
        fleet.stdin.close()
        try:
            fleet.wait(20)
        except subprocess.TimeoutExpired:
            fleet.kill()
            fleet.wait()
