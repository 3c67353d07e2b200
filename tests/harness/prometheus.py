"""A real Prometheus server on loopback for the tests: Debian's `prometheus` package (installed
without starting its own service, scripts/setup.sh's setup_prometheus), started on a free port
of 127.0.0.1 with a generated config and its data in a temporary folder, stopped and gone
after. Under CI=true a missing Prometheus fails the test; elsewhere it skips, visibly."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.captures import missing

CANDIDATES = ("/usr/bin/prometheus", "/usr/local/bin/prometheus")


def require_prometheus() -> str:
    """Path of the prometheus binary; skip or fail (CI) when it is not installed."""
    for path in CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("prometheus")
    if found is None:
        missing("Prometheus is not installed; the source's integration tests need a real one "
                "(apt-get install --no-install-recommends prometheus, or scripts/setup.sh's "
                "setup_prometheus)")
    assert found is not None
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    """A started server: its base URL and its HTTP API."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as answer:
            return json.loads(answer.read())

    def query(self, promql: str) -> list[dict[str, Any]]:
        doc = self.api("/api/v1/query", query=promql)
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_for(self, promql: str, count: int, deadline_s: float = 120.0
                 ) -> list[dict[str, Any]]:
        """The query's result once it has `count` series (scrapes come every second; the
        deadline is for a very busy machine)."""
        deadline = time.monotonic() + deadline_s
        while True:
            result = self.query(promql)
            if len(result) >= count:
                return result
            assert time.monotonic() < deadline, (promql, result, self.log.read_text()[-2000:])
            time.sleep(0.25)


@contextmanager
def prometheus(config: str, root: Path) -> Iterator[Prometheus]:
    """Prometheus with `config` (prometheus.yml text; rule files beside it in `root`),
    serving on a free loopback port until the block ends."""
    binary = require_prometheus()
    root.mkdir(parents=True, exist_ok=True)
    (root / "prometheus.yml").write_text(config)
    port = free_port()
    log = root / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield Prometheus(url, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
