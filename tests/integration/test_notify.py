"""Notifications through Apprise to a real HTTP receiver on loopback (its JSON webhook target,
`json://127.0.0.1:PORT/path`): one line per transition, in order; a receiver that hangs or
fails delays no poll and its failure is said; transitions survive between cron runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from gpuwatch.remote.config.schema import Config, HostConfig, NotifyConfig
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.notify import (
    Notifier,
    last_sent,
    mask,
    scrub,
    target_urls,
    transitions,
)
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from harness import real_box
from harness.real_box import Rig, alive
from harness.waiting import wait_for
from test_watchdog import first_launch, launches, rounds_until, trainer

rig = real_box.rig


class Receiver:
    """A tiny webhook: records each JSON body; mode "ok", "500" or "hang" (holds the request
    until released)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.mode = "ok"
        self.release = threading.Event()
        self.entered = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.entered.set()
                if outer.mode == "hang":
                    outer.release.wait(30)
                if outer.mode == "500":
                    self.send_response(500)
                    self.end_headers()
                    return
                outer.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"json://127.0.0.1:{self.server.server_port}/hook"

    def lines(self) -> list[str]:
        return [line for b in self.bodies for line in b["message"].splitlines()[1:]]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def finding(code: str, severity: Severity, run: str | None = "llama", **ev: object) -> Finding:
    return Finding(code, severity, f"{code} says what to do", run=run, evidence=ev)


def test_transitions_are_sent_once_each_across_cron_runs(tmp_path: Path) -> None:
    cfg = NotifyConfig(min_severity="warning", mute=("gpu.*",))
    path = tmp_path / "s.sqlite3"

    def cron(findings: list[Finding], polled: bool = True, now: float = 1000.0) -> list[str]:
        with Store.open(path) as store:  # each cron run opens the store anew
            return [line for _, line in transitions(store, cfg, "h", findings, polled=polled,
                                                    now=now)]

    stalled = finding("run.stalled", Severity.WARNING, step=120)
    assert cron([stalled]) == ["▲ appeared [warning] run.stalled run llama: run.stalled says "
                               "what to do {\"step\": 120}"]
    assert cron([stalled]) == []  # holds: nothing
    worse = finding("run.stalled", Severity.CRITICAL, step=120)
    assert cron([worse])[0].startswith("▲▲ escalated [critical] run.stalled run llama (was "
                                       "warning)")
    assert cron([stalled]) == []  # eased: remembered, not sent
    assert cron([], polled=False) == []  # a failed poll clears nothing
    assert cron([]) == ["✓ cleared run.stalled run llama (was warning)"]
    assert cron([]) == []
    # below min_severity, muted: never; back after clearing: appears again
    assert cron([finding("run.plateau", Severity.INFO),
                 finding("gpu.throttled", Severity.CRITICAL, run=None)]) == []
    assert len(cron([stalled])) == 1


def test_quiet_hours_let_only_critical_through() -> None:
    from datetime import datetime

    now = datetime.now().astimezone()
    start = f"{now.hour:02d}:00"
    end = f"{(now.hour + 1) % 24:02d}:00"
    cfg = NotifyConfig(quiet_hours=f"{start}-{end}")
    with Store.open(":memory:") as store:
        lines = transitions(store, cfg, "h", [finding("run.stalled", Severity.WARNING),
                                              finding("run.dead", Severity.CRITICAL)],
                            polled=True, now=now.timestamp())
        assert [line.split(":")[0] for _, line in lines] == [
            "▲ appeared [critical] run.dead run llama"]
        assert len(store.notified("h")) == 2  # the warning is remembered: no burst later


def test_urls_from_the_environment_and_masked() -> None:
    cfg = NotifyConfig(urls=("json://127.0.0.1:1/a",), urls_env="GW_URLS")
    urls = target_urls(cfg, {"GW_URLS": "ntfy://tok3nSecret@ntfy.sh/topic, "
                                        "tgram://123456789:ABCdefSecretToken/4242"})
    assert urls[0] == "json://127.0.0.1:1/a" and len(urls) == 3
    assert [mask(u) for u in urls] == ["json://127.0.0.1:1/…", "ntfy://***@ntfy.sh/…",
                                       "tgram://***/…"]
    assert mask("mailto://me:pw@example.com") == "mailto://***@example.com"
    said = scrub("failed: https://api.telegram.org/bot123456789:ABCdefSecretToken/sendMessage",
                 urls[2])
    assert "Secret" not in said and "api.telegram.org" in said


async def test_one_line_per_transition_and_restart_in_order(rig: Rig,
                                                            receiver: Receiver) -> None:
    run, work = trainer(rig, max_restarts=1)
    host = rig.host(run)
    log: list[str] = []
    cfg = NotifyConfig(urls=(receiver.url,), batch_s=0, min_severity="critical")
    watcher = FleetWatch(Config(interval=1.0, hosts=(host,), notify=cfg), rig.store,
                         role="watch", log=log.append)
    pid = await first_launch(rig, host, run, work, rig.store)
    history = watcher.history(host.name)
    await rounds_until(watcher, host, lambda: history.runs["llama"].status == "running")
    os.kill(pid, 9)
    wait_for(lambda: not alive(pid), what="the kill")
    await rounds_until(watcher, host, lambda: len(launches(work)) == 2)
    await rounds_until(watcher, host, lambda: any("running again" in x for x in log))
    for _ in range(2):
        await watcher.cycle(host.name)
    assert watcher.notifier is not None and watcher.notifier.flush(20)
    got = receiver.lines()
    # the log says the same lines, in the same order, as were sent
    assert got == [x.split(": ", 1)[1] for x in log if x.split(": ", 1)[1] in got]
    heads = [line.split(":")[0] for line in got]
    assert heads == ["▲ appeared [critical] run.dead run llama",
                     "↻ llama",
                     "✓ cleared run.dead run llama (was critical)",
                     "✓ llama"], got
    assert "restart 1 of 1" in got[1] and "resumes from" in got[1]
    assert "running again" in got[3]
    assert all(b["title"].startswith("gpuwatch: box1") for b in receiver.bodies)
    watcher.close(5)
    assert last_sent(rig.store, "box1") is not None


@pytest.mark.parametrize("mode", ["hang", "500"])
async def test_a_failing_receiver_delays_no_poll_and_is_said(tmp_path: Path, receiver: Receiver,
                                                             mode: str) -> None:
    receiver.mode = mode
    log: list[str] = []
    cfg = NotifyConfig(urls=(receiver.url,), batch_s=0, timeout_s=1, retries=1)
    notifier = Notifier(cfg, [receiver.url], log.append)
    host = HostConfig(name="me", ssh="local")
    with Store.open(tmp_path / "s.sqlite3") as store:
        watcher = FleetWatch(Config(interval=1.0, hosts=(host,), notify=cfg), store, role="watch",
                             log=log.append, notifier=notifier)
        notifier.post("me", [(Severity.CRITICAL, "▲ appeared [critical] test: a line")])
        assert receiver.entered.wait(10)
        # While the receiver holds the request (or has just failed it), polls go on: the poll
        # path only queues lines.
        for _ in range(2):
            report = await watcher.cycle(host.name)
            assert report.outcome.ok
        if mode == "hang":
            assert not receiver.release.is_set() and receiver.bodies == []
        wait_for(lambda: any("NOT delivered" in x for x in log), timeout=30,
                 what="the failure said")
        failed = [x for x in log if "notify:" in x]
        assert "sending failed" in failed[0] and "try 2 of 2" in failed[0]
        assert "127.0.0.1" in failed[-1] and "NOT delivered after 2 tries" in failed[-1]
        assert ("error=500" if mode == "500" else "Connection error") in failed[-1]
        watcher.close(0)  # what was sent, and how it went, is saved
        last = last_sent(store, "me")
        assert last is not None and "FAILED" in last[0]


def test_notify_test_reports_each_target(tmp_path: Path, receiver: Receiver) -> None:
    bad = Receiver()
    bad.mode = "500"
    try:
        conf = tmp_path / "c.toml"
        conf.write_text(f'[notify]\nurls = ["{receiver.url}"]\nurls_env = "GW_TEST_URLS"\n'
                        'timeout_s = 2\n')
        env = {**os.environ, "GW_TEST_URLS": bad.url, "XDG_STATE_HOME": str(tmp_path)}
        cmd = [sys.executable, "-c", "from gpuwatch.tui.cli import main; main()", "notify",
               "--test", "--config", str(conf)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 1, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith(f"ok      json://127.0.0.1:{receiver.server.server_port}")
        assert lines[1].startswith(f"FAILED  json://127.0.0.1:{bad.server.server_port}")
        assert receiver.bodies[0]["title"] == "gpuwatch: test message"
        env.pop("GW_TEST_URLS")
        assert subprocess.run(cmd, capture_output=True, env=env, timeout=60).returncode == 0
    finally:
        bad.close()
