"""`gpuwatch watch --listen ADDR:PORT [--shard K/N]`: /metrics and /ready of a real watcher
process over this machine's `local` hosts, the address and shard arguments, and the run-level
series of the exposition."""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.model.snapshot import GpuSample, HostSnapshot
from gpuwatch.remote.report import HostReport, prometheus_text
from gpuwatch.remote.wire.collect import PollOutcome
from gpuwatch.tui.cli.listen import listen_address
from gpuwatch.tui.cli.watch import shard_of

HOSTS = ("alpha", "bravo", "charlie", "delta", "echo")


def config(tmp_path: Path) -> Path:
    conf = tmp_path / "c.toml"
    conf.write_text("interval = 2\n" + "".join(f'[hosts.{h}]\nssh = "local"\n' for h in HOSTS))
    return conf


def env_of(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CONFIG_HOME": str(tmp_path / "conf")}
    env.pop("GPUWATCH_NOTIFY_URLS", None)
    return env


def start_watcher(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """A `gpuwatch watch --listen 127.0.0.1:0` process and the base URL it logged."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpuwatch.tui.cli import main; main()", "watch",
         "--config", str(config(tmp_path)), "--listen", "127.0.0.1:0", *args],
        stderr=subprocess.PIPE, text=True, env=env_of(tmp_path))
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)/metrics", line)
        if found:
            return proc, found.group(1)
    raise AssertionError(f"the watcher never said where it serves (exit {proc.wait()})")


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    proc, url = start_watcher(tmp_path, "--shard", "2/2")
    try:
        yield url, [h for h in HOSTS if shard_of(h, 2) == 1]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def until_ready(url: str) -> bytes:
    """/ready's answers until it says 200 (each poll of this machine takes a fraction of a
    second; the deadline is for a machine that is very busy)."""
    deadline = time.monotonic() + 120
    while True:
        status, _, body = get(f"{url}/ready")
        if status == 200:
            return body
        assert status == 503 and body.startswith(b"not ready: waiting for the first poll of")
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


def test_a_sharded_watcher_serves_its_hosts_metrics_once_ready(
        watcher: tuple[str, list[str]]) -> None:
    url, owned = watcher
    assert 0 < len(owned) < len(HOSTS)  # the names are chosen so that both shards own some
    assert until_ready(url) == (f"ready: the first poll of each of {len(owned)} hosts has "
                                f"landed\n").encode()
    status, headers, body = get(f"{url}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert sorted(re.findall(r'^gpuwatch_up\{host="([^"]+)"\} 1$', text, re.M)) == sorted(owned)
    assert sorted(re.findall(r'^gpuwatch_host_severity\{host="([^"]+)"', text, re.M)) \
        == sorted(owned)
    for line in text.splitlines():  # the exposition's grammar, line by line
        assert re.fullmatch(r"# (HELP|TYPE) gpuwatch_\w+ .+|gpuwatch_\w+\{[^}]*\} \S+", line), line
    status, headers, zipped = get(f"{url}/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert gzip.decompress(zipped).startswith(b"# HELP gpuwatch_up")


def raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_server_answers_what_it_does_not_serve_and_bounds_a_request(
        watcher: tuple[str, list[str]]) -> None:
    url, _ = watcher
    assert raw(url, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 404 Not Found\r\n")
    post = raw(url, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: GET, HEAD\r\n" in post
    assert raw(url, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    huge = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    assert raw(url, huge).startswith(b"HTTP/1.1 431 ")
    head = raw(url, b"HEAD /ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.split(b"\r\n\r\n", 1)[1] == b""  # a HEAD gets the headers alone


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:0", ("::1", 0)),
    ("localhost:65535", ("localhost", 65535))])
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert listen_address(text) == expected


@pytest.mark.parametrize("text", ["9464", ":9464", "127.0.0.1:", "127.0.0.1:65536",
                                  "::1:9464", "[nope]:1", "a b:1", "127.0.0.1:-1", "x:1e3"])
def test_bad_listen_addresses_and_shards_are_usage_errors(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError):
        listen_address(text)
    out = subprocess.run([sys.executable, "-c", "from gpuwatch.tui.cli import main; main()",
                          "watch", "--config", str(config(tmp_path)), "--listen", text],
                         capture_output=True, text=True, env=env_of(tmp_path), timeout=60)
    assert out.returncode == 64 and "argument --listen: " in out.stderr


@pytest.mark.parametrize("shard", ["0/2", "3/2", "1/0", "a/b", "1", "1/2000"])
def test_bad_shards_are_usage_errors(tmp_path: Path, shard: str) -> None:
    out = subprocess.run([sys.executable, "-c", "from gpuwatch.tui.cli import main; main()",
                          "watch", "--once", "--config", str(config(tmp_path)), "--shard", shard],
                         capture_output=True, text=True, env=env_of(tmp_path), timeout=60)
    assert out.returncode == 64 and "argument --shard: " in out.stderr


def test_every_host_is_in_exactly_one_shard_and_the_hash_is_stable() -> None:
    names = [f"gpu{i:03d}" for i in range(200)]
    for n in range(1, 7):
        owners = [shard_of(name, n) for name in names]
        assert all(0 <= k < n for k in owners)
        assert len(set(owners)) == n  # 200 names fall in every shard of a handful
    # sha1 of the name, not Python's salted hash(): the same in every process
    script = "from gpuwatch.tui.cli.watch import shard_of; print(shard_of('gpu007', 7))"
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert int(other.stdout) == shard_of("gpu007", 7)


def _snapshot(taken_at: float) -> HostSnapshot:
    gpu = GpuSample(0, "GPU-1", "NVIDIA H100", 97.0, 1000, 81559, 1980, 1980, 650.0, 700.0, 60,
                    (), False)
    return HostSnapshot("h", taken_at, "h", "boot", 100.0, None, 1, (gpu,), (), "nvidia-smi",
                        (), None, (), None, None, (), {}, {}, None, None)


def test_the_run_series_say_step_pace_loss_and_checkpoint_age() -> None:
    host = HostConfig(name="h", ssh="local")
    outcome = PollOutcome(host, 1000.0, 0.5, _snapshot(5000.0), None)
    runs = [{"name": "llama", "status": "running", "checkpoints": [
                {"path": "/c/1", "mtime": 4000.0, "bytes": 1}, {"path": "/c/2", "mtime": 4700.0,
                                                                "bytes": 1}],
             "series": {"eval_loss": {"last_step": 90, "last_value": 2.5, "points": 3},
                        "train/loss": {"last_step": 120, "last_value": 1.75, "points": 9},
                        "lr": {"last_step": 120, "last_value": 0.001, "points": 9}}},
            {"name": "nan", "status": "dead", "checkpoints": [],
             "series": {"loss": {"last_step": 7, "last_value": "nan", "points": 7}},
             "progress": {"step": 8, "steps_per_s": 0.5}}]
    finding = Finding("run.dead", Severity.CRITICAL, "run nan died", run="nan")
    text = prometheus_text([HostReport(outcome, [finding], runs=runs)],
                           steps_per_s={("h", "llama"): 3.25})
    lines = set(text.splitlines())
    assert {'gpuwatch_run_step{host="h",run="llama"} 120',
            'gpuwatch_run_steps_per_second{host="h",run="llama"} 3.25',
            'gpuwatch_run_loss{host="h",run="llama",tag="train/loss"} 1.75',
            'gpuwatch_run_checkpoint_age_seconds{host="h",run="llama"} 300',
            'gpuwatch_run_step{host="h",run="nan"} 8',
            'gpuwatch_run_steps_per_second{host="h",run="nan"} 0.5',
            'gpuwatch_run_loss{host="h",run="nan",tag="loss"} NaN',
            'gpuwatch_finding{host="h",code="run.dead",severity="critical",run="nan"} 1',
            'gpuwatch_findings{host="h",severity="critical"} 1',
            'gpuwatch_gpu_info{host="h",gpu="0",uuid="GPU-1",name="NVIDIA H100"} 1',
            'gpuwatch_last_poll_timestamp_seconds{host="h"} 1000.5'} <= lines
    assert not any(line.startswith("gpuwatch_run_checkpoint_age_seconds{host=\"h\",run=\"nan\"")
                   for line in lines)  # no checkpoint: no age, rather than a zero
    failed = PollOutcome(host, 1000.0, 10.0, None, None, "timeout", "no answer")
    text = prometheus_text([HostReport(failed)])
    assert 'gpuwatch_poll_error{host="h",kind="timeout"} 1' in text.splitlines()
