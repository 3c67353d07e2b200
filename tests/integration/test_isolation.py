"""One host's garbage is that host's error (cases 1, 6, 7): hostile documents beside a
good SSH host in one `--once`, a rule that breaks on a document, a store locked by another
process, and a crash that must not read as a finding.

The hostile hosts are `local` hosts whose `python` is a small script that swallows the probe and
prints the bytes a hostile box would: the document goes through the very collector, parser and
judge a real box's does.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.config.load import load_file
from gpuwatch.remote.config.schema import HostConfig
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch import landing as watch_module
from gpuwatch.remote.wire.collect import Collector
from gpuwatch.tui.cli import once as once_module
from harness.sshd import SshdBox
from harness.sshd_cli import gpuwatch, ssh_config, start_box

BOMB_MIB = 400
"""What the zlib bomb inflates to; it is a few hundred KB on the wire."""


def hostile_python(folder: Path, name: str, payload: bytes) -> str:
    """A `python` for a local host that reads the probe from stdin and prints `payload`."""
    doc = folder / f"{name}.doc"
    doc.write_bytes(payload)
    script = folder / f"{name}-python"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\nexec cat '{doc}'\n")
    script.chmod(0o755)
    return str(script)


def real_document(tmp_path: Path) -> dict[str, Any]:
    """A real probe document, from the real probe run against a simulated 2-GPU box."""
    box = Box(tmp_path / "docbox", h100_sxm(2))
    host = HostConfig(name="docbox", ssh="local", python=sys.executable)
    env = box_env(box)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        outcome = Collector().poll_local(host)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert outcome.ok and outcome.doc is not None, outcome.error_message
    raw = outcome.doc if outcome.doc[:1] == b"{" else zlib.decompress(outcome.doc)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def box_env(box: Box) -> dict[str, str]:
    env = box.env(base_path="/usr/bin:/bin")
    env["PATH"] = f"{env['PATH']}:{Path(sys.executable).parent}"
    return env


def zlib_bomb(mib: int) -> bytes:
    """A zlib stream that inflates to `mib` MiB of spaces (about 1 KB per MiB compressed)."""
    packer = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    return b"".join([packer.compress(chunk) for _ in range(mib)] + [packer.flush()])


def with_huge_number(doc: dict[str, Any]) -> bytes:
    """The real document with a numeric field hundreds of digits long."""
    text = json.dumps({**doc, "uptime_s": 0.5}, separators=(",", ":"))
    return text.replace('"uptime_s":0.5', '"uptime_s":' + "9" * 600).encode()


def test_hostile_documents_are_their_hosts_errors_beside_a_good_ssh_host(
        tmp_path: Path, sshd_factory: Callable[..., SshdBox]) -> None:
    good = Box(tmp_path / "good", h100_sxm(2))
    box = start_box(sshd_factory, good)
    doc = real_document(tmp_path)
    payloads = {
        "deep": b"[" * 300_000 + b"]" * 300_000,
        "deep-object": b'{"v":1,"a":' * 100_000 + b"1" + b"}" * 100_000,
        "bignum": with_huge_number(doc),
        "bomb": zlib_bomb(BOMB_MIB),
        "garbage": b"\x1b]2;PWNED\x07not a document at all\n",
    }
    hosts: dict[str, dict[str, Any]] = {"good": {"ssh": box.alias}}
    for name, payload in payloads.items():
        hosts[name] = {"ssh": "local", "python": hostile_python(tmp_path, name, payload)}
    config = ssh_config(box, hosts)

    baseline = gpuwatch(tmp_path / "home-base", "--once", "--json",
                        config=ssh_config(box, {"good": {"ssh": box.alias}}))
    assert baseline.returncode == 0, baseline.stderr
    run = gpuwatch(tmp_path / "home", "--once", "--json", config=config)

    assert run.returncode == 2, run.stderr  # a host could not be polled; nothing crashed
    reported = run.hosts()
    assert reported["good"]["ok"], reported["good"]["error"]
    assert len(reported["good"]["gpus"]) == 2
    for name in payloads:
        host = reported[name]
        assert not host["ok"] and host["error"]["kind"] == "probe", (name, host["error"])
        assert "Traceback" not in host["error"]["message"]
    assert "Traceback" not in run.stderr
    # The bomb is refused while it inflates: the client never holds its 400 MiB.
    assert run.max_rss_mb < 2 * baseline.max_rss_mb, (run.max_rss_mb, baseline.max_rss_mb)


def test_a_document_that_breaks_a_rule_is_that_hosts_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever slips past the parser's limits and breaks judging stays with its host."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config_path = tmp_path / "c.toml"
    doc = json.dumps(real_document(tmp_path)).encode()
    config_path.write_text(
        f'[hosts.bad]\nssh = "local"\npython = "{hostile_python(tmp_path, "bad", doc)}"\n'
        f'[hosts.fine]\nssh = "local"\npython = "{hostile_python(tmp_path, "fine", doc)}"\n')
    config = load_file(config_path)
    real_evaluate = watch_module.evaluate

    def evaluate(history: Any) -> Any:
        if history.name == "bad":
            raise OverflowError("int too large to convert to float")
        return real_evaluate(history)

    monkeypatch.setattr(watch_module, "evaluate", evaluate)
    with Store.open(tmp_path / "store.sqlite3") as store:
        result = once_module.run_once(config, store)
        state = store.host_state("bad")
    reports = {r.name: r for r in result.reports}
    assert reports["fine"].outcome.ok
    bad = reports["bad"].outcome
    assert not bad.ok and bad.error_kind == "probe"
    assert "OverflowError: int too large" in (bad.error_message or "")
    log = tmp_path / "state" / "gpuwatch" / "errors.log"
    assert str(log) in (bad.error_message or "")
    assert "Traceback" in log.read_text() and "judging bad" in log.read_text()
    assert state is not None and not state.ok  # the document that broke a rule is not kept


def hold_write_lock(path: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Another process (as an sqlite3 shell would) holding the store's write lock."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE')\n"
         "c.execute(\"INSERT OR REPLACE INTO meta VALUES ('lock-test', 'held')\")\n"
         "print('held', flush=True)\n"
         "time.sleep(float(sys.argv[2]))\n"
         "c.execute('ROLLBACK')\n", str(path), str(seconds)],
        stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def test_a_locked_store_still_gets_the_report_out(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    home = tmp_path / "home"
    env = {"PATH": f"/usr/bin:/bin:{Path(sys.executable).parent}", "HOME": str(home),
           "XDG_STATE_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "xdg"),
           **{k: v for k, v in box_env(box).items() if k != "PATH"}}
    env["PATH"] = f"{box_env(box)['PATH']}"
    config = tmp_path / "c.toml"
    config.write_text(f'[hosts.box]\nssh = "local"\npython = "{sys.executable}"\n')

    def once() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "--once", "--json",
                               "--config", str(config)], env=env, capture_output=True,
                              text=True, timeout=60)

    first = once()  # makes the store
    assert first.returncode == 0, first.stderr
    store_path = home / "state" / "gpuwatch" / "gpuwatch.sqlite3"
    holder = hold_write_lock(store_path, 8)
    try:
        locked = once()
    finally:
        holder.wait(timeout=30)
    assert locked.returncode == 0, locked.stderr
    (host,) = json.loads(locked.stdout)["hosts"]
    assert host["ok"] and len(host["gpus"]) == 1
    assert "locked" in locked.stderr and "not saved" in locked.stderr
    assert len(locked.stderr.strip().splitlines()) == 1, locked.stderr
    assert store_path.exists() and not list(store_path.parent.glob("*.corrupt-*"))
    # The store was left whole: the next run saves again.
    again = once()
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_a_store_that_cannot_be_opened_is_not_moved_aside(tmp_path: Path) -> None:
    """Only a damaged file is rebuilt; one that is locked or unopenable is left alone."""
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")  # WAL is switched on again at open: a lock
    conn.close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE')\n"
         "print('held', flush=True)\n"
         "time.sleep(7)\n", str(path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        store = Store.open(path)
    finally:
        holder.wait(timeout=30)
    assert store.path is None and store.warning and "could not be used" in store.warning
    store.close()
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_an_internal_error_exits_70_with_one_line_naming_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash is never exit 1 (a finding, to cron): one line, exit 70, the traceback kept."""
    from gpuwatch.tui.cli import command as cli

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(once_module, "run_once", broken)
    assert cli.run(["--once", "local"]) == 70
    err = capsys.readouterr().err.strip().splitlines()
    log = tmp_path / "state" / "gpuwatch" / "errors.log"
    assert len(err) == 1 and "internal error" in err[0] and str(log) in err[0], err
    assert "KeyError: 'a bug of ours'" in err[0]
    assert "Traceback (most recent call last)" in log.read_text()


def test_a_poll_that_raises_is_its_hosts_error_and_the_loop_goes_on() -> None:
    """The TUI's scheduler: a poll function that raises never ends that host's polling (it
    read 'waiting for the first poll' forever); the collector turns its own bugs into errors."""
    import asyncio

    from gpuwatch.remote.wire.poller import Poller

    calls: list[float] = []
    results: list[str] = []

    async def poll(host: str) -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RecursionError("maximum recursion depth exceeded")
        return "ok"

    async def main() -> None:
        poller: Poller[str, str] = Poller(["h"], poll, lambda _h, r: results.append(r),
                                          lambda r: r == "ok", interval=0.05)
        poller.start()
        for _ in range(200):
            if results:
                break
            await asyncio.sleep(0.02)
        await poller.stop()

    asyncio.run(main())
    assert len(calls) >= 2 and results[:1] == ["ok"]


def test_the_collector_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug anywhere in a poll (here: building the request) is the host's `probe` error."""
    import asyncio

    from gpuwatch.remote.wire import collect

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("empty event-file path")

    monkeypatch.setattr(collect, "build_request", broken)
    host = HostConfig(name="h", ssh="local", python=sys.executable)
    for outcome in (Collector().poll_local(host), asyncio.run(Collector().poll(host))):
        assert not outcome.ok and outcome.error_kind == "probe"
        assert "ValueError: empty event-file path" in (outcome.error_message or "")


async def test_the_tui_shows_a_document_that_breaks_a_rule_and_backs_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the TUI such a host reads as its error (not 'waiting for the first poll' forever),
    the others as usual, and it is polled again with a failed poll's backoff."""
    import tui_fixtures as fx
    from test_tui import FakeCollector, make_app

    cfg = fx.config()
    bad = cfg.hosts[0].name
    real_evaluate = watch_module.evaluate

    def evaluate(history: Any) -> Any:
        if history.name == bad:
            raise OverflowError("int too large to convert to float")
        return real_evaluate(history)

    monkeypatch.setattr(watch_module, "evaluate", evaluate)
    collector = FakeCollector(fx.latest(cfg))
    app = make_app(cfg, poll=True, collector=collector)  # type: ignore[arg-type]
    async with app.run_test(size=(200, 50)) as pilot:
        for _ in range(100):
            await pilot.pause(0.02)
            if all(app.hosts[h.name].outcome is not None for h in cfg.hosts):
                break
        data = app.hosts[bad]
        assert data.outcome is not None and not data.outcome.ok
        assert "OverflowError" in (data.outcome.error_message or "")
        assert data.status(fx.NOW, 10).kind != "ok"
        others = [n for n, o in collector.outcomes.items() if o.ok and n != bad]
        assert others and all(app.hosts[n].outcome.ok for n in others)
        # The poll itself came back fine; the pipeline counts it as a failure (backoff).
        assert app.fleet.host(bad).failures >= 1 and app.fleet.host(bad).report is not None
        assert not app.fleet.host(bad).report.outcome.ok
        await pilot.press("R")
        await pilot.pause(0.3)
        assert collector.calls[bad] >= 2  # polled again, never stuck
