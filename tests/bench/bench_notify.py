"""A watcher round of `local` with every round posting a line to a notification target that
works, one that answers 500, one that hangs, and with no target: the round's wall time each way.

    .venv/bin/python tests/bench/bench_notify.py [-n 20]
    .venv/bin/python -m pytest tests/bench/bench_notify.py -s     (20 rounds; smoke mode: 2)

The rounds are interleaved (none, ok, 500, hang, none, ...) so the machine's bad minutes hit all
alike. Each poster is a real Apprise JSON webhook to a real http.server on loopback (`timeout_s
= 2`, `retries = 1`). Nothing is asserted: it prints the median and the slowest round per kind,
and the time post() itself took (the only thing the poll path does for a notification).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from figures import SMOKE
from gpuwatch.remote.config.schema import Config, HostConfig, NotifyConfig
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.notify import Notifier
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch


def receiver(mode: str) -> str:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if mode == "hang":
                time.sleep(3600)
            self.send_response(500 if mode == "500" else 200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"json://127.0.0.1:{server.server_port}/hook"


async def main(n: int) -> None:
    host = HostConfig(name="me", ssh="local")
    cfg = NotifyConfig(batch_s=0, timeout_s=2, retries=1)
    kinds = {"none": None, "ok": receiver("ok"), "500": receiver("500"),
             "hang": receiver("hang")}
    rounds: dict[str, list[float]] = {k: [] for k in kinds}
    posts: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "s.sqlite3") as store:
        watchers = {}
        for kind, url in kinds.items():
            notifier = Notifier(cfg, [url], lambda _line: None) if url else None
            watchers[kind] = FleetWatch(Config(interval=1.0, hosts=(host,), notify=cfg), store,
                                        role="watch", notifier=notifier)
        for i in range(n):
            for kind, w in watchers.items():
                started = time.perf_counter()
                await w.cycle(host.name)
                if w.notifier is not None:
                    t = time.perf_counter()
                    w.notifier.post("me", [(Severity.WARNING, f"bench line {i}")])
                    posts[kind].append(time.perf_counter() - t)
                rounds[kind].append(time.perf_counter() - started)
        for w in watchers.values():
            w.close(0)
    print(f"{n} rounds each, interleaved; local host; round = poll + judge + remember + post")
    for kind in kinds:
        r = rounds[kind]
        line = (f"  {kind:5} round median {statistics.median(r) * 1000:7.1f} ms, "
                f"slowest {max(r) * 1000:7.1f} ms")
        if posts[kind]:
            line += f"; post() slowest {max(posts[kind]) * 1e6:6.0f} µs"
        print(line)


async def test_notify_rounds() -> None:
    await main(2 if SMOKE else 20)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2 if SMOKE else 20)
    asyncio.run(main(parser.parse_args().n))
