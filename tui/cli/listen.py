"""`gpuwatch watch --listen ADDR:PORT`: a watcher's /metrics and /ready over HTTP, for Prometheus.

A small HTTP/1.1 server on the watcher's own event loop (asyncio's start_server; no thread, no
framework), so a scrape never waits on a poll and a poll never waits on a scrape:

- `/metrics`: the `--prometheus` exposition (remote/report.py) of every owned host's latest
  landed report, with the runs' pace from their histories; rendered in a thread, at most once
  per landed poll (a scrape between two polls gets the text already made), gzipped when the
  scraper asks for it (Prometheus does).
- `/ready`: 200 once the first poll of every owned host has landed (a failed poll lands too),
  503 until then, naming how many are still awaited: several watchers, each owning a shard of
  the hosts (`--shard K/N`), say when their series are whole.

Bounded like everything else here: a request's head is at most MAX_HEAD bytes and must arrive
within HEAD_TIMEOUT_S; a response must be taken within WRITE_TIMEOUT_S; at most MAX_CLIENTS
connections are served at once (more wait in the kernel's backlog); one request per
connection (Connection: close). Only GET and HEAD. Textual-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatch.remote.report import HostReport
    from gpuwatch.remote.watch.fleet import FleetWatch

MAX_HEAD = 8192
"""Bytes of a request line and headers (Prometheus sends a few hundred)."""
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CLIENTS = 4
GZIP_ABOVE = 1024
"""Bodies larger than this go gzipped to a client that accepts it."""
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}


def listen_address(text: str) -> tuple[str, int]:
    """ADDR:PORT as the command line gives it: `127.0.0.1:9464`, `[::1]:9464`,
    `localhost:9464`; port 0 asks the kernel for a free one (the log line says which). Raises
    ValueError with what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected ADDR:PORT (e.g. 127.0.0.1:9464), got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is no IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"an IPv6 address goes in brackets: [{host}]:{port_text}")
    elif _HOST.fullmatch(host) is None:
        raise ValueError(f"{host!r} is no address or host name")
    if not port_text.isdigit() or len(port_text) > 5 or int(port_text) > 65535:
        raise ValueError(f"expected a port from 0 to 65535, got {port_text!r}")
    return host, int(port_text)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    allow: str | None = None


class MetricsServer:
    """/metrics and /ready of one watcher's FleetWatch, served on its event loop."""

    def __init__(self, fleet: FleetWatch, host: str, port: int, *,
                 paces: Callable[[], dict[tuple[str, str], float]] | None = None) -> None:
        self.fleet, self.host, self.port = fleet, host, port
        self.owned: Sequence[str] = list(fleet.names)
        self.reports: dict[str, HostReport] = {}
        self.generation = 0
        """Landed polls so far: the text made for one generation serves every scrape of it."""
        self._made: tuple[int, bytes] | None = None
        self._making: asyncio.Lock | None = None
        self._clients: asyncio.Semaphore | None = None
        self._server: asyncio.Server | None = None
        self._paces = paces or self._fleet_paces
        fleet.listen(self._landed)

    def _landed(self, report: HostReport) -> None:
        self.reports[report.name] = report
        self.generation += 1

    @property
    def waiting(self) -> list[str]:
        """Owned hosts whose first poll has not landed yet."""
        return [name for name in self.owned if name not in self.reports]

    async def start(self) -> tuple[str, int]:
        """Listen; (address, port) as bound. Raises OSError (a port in use, an address this
        machine does not have)."""
        self._making = asyncio.Lock()
        self._clients = asyncio.Semaphore(MAX_CLIENTS)
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_HEAD, reuse_address=True)
        bound = self._server.sockets[0].getsockname()
        return bound[0], bound[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), WRITE_TIMEOUT_S)
            self._server = None

    # -- one connection ----------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._clients is not None
        try:
            async with self._clients:
                response, head_only, gzip_ok = await self._answer(reader)
                await asyncio.wait_for(self._send(writer, response, head_only, gzip_ok),
                                       WRITE_TIMEOUT_S)
        except (TimeoutError, OSError):
            pass  # the scraper went away or stopped reading: its loss, nobody else's
        finally:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Response, bool, bool]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return Response(431, b"request head too large\n"), False, False
        except asyncio.IncompleteReadError:
            return Response(400, b"incomplete request\n"), False, False
        except TimeoutError:
            return Response(408, b"request not sent in time\n"), False, False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return Response(400, b"not an HTTP request\n"), False, False
        method, target = parts[0], parts[1].split("?", 1)[0]
        gzip_ok = any(line.lower().startswith("accept-encoding:") and "gzip" in line.lower()
                      for line in lines[1:])
        if method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD\n", allow="GET, HEAD"), False, False
        return await self.route(target), method == "HEAD", gzip_ok

    async def route(self, path: str) -> Response:
        if path == "/metrics":
            return Response(200, await self.metrics(), METRICS_TYPE)
        if path == "/ready":
            waiting = self.waiting
            if not waiting:
                return Response(200, f"ready: the first poll of each of {len(self.owned)} "
                                     f"hosts has landed\n".encode())
            shown = ", ".join(waiting[:5]) + (", ..." if len(waiting) > 5 else "")
            return Response(503, f"not ready: waiting for the first poll of {len(waiting)} of "
                                 f"{len(self.owned)} hosts ({shown})\n".encode())
        if path == "/":
            return Response(200, b"gpuwatch watch: /metrics (Prometheus), /ready\n")
        return Response(404, b"not found: /metrics or /ready\n")

    async def metrics(self) -> bytes:
        """The exposition of the latest reports, made once per generation, in a thread (a
        fleet of hundreds of hosts takes tens of milliseconds to render)."""
        from gpuwatch.remote.report import prometheus_text

        assert self._making is not None
        async with self._making:
            made = self._made
            if made is not None and made[0] == self.generation:
                return made[1]
            generation = self.generation
            reports = [self.reports[n] for n in self.owned if n in self.reports]
            paces = self._paces()
            # no [slurm] jobs: a watcher's rounds poll hosts only
            text = await asyncio.to_thread(prometheus_text, reports, None, paces)
            body = text.encode()
            self._made = (generation, body)
            return body

    def _fleet_paces(self) -> dict[tuple[str, str], float]:
        """Each run's steps a second at its own recent pace (the curves' rules keep it)."""
        out: dict[tuple[str, str], float] = {}
        for name in self.reports:
            for run, series in self.fleet.history(name).runs.items():
                if series.pace_s:
                    out[(name, run)] = round(1.0 / series.pace_s, 6)
        return out

    async def _send(self, writer: asyncio.StreamWriter, response: Response, head_only: bool,
                    gzip_ok: bool) -> None:
        body = response.body
        headers = [f"Content-Type: {response.content_type}", "Connection: close"]
        if gzip_ok and len(body) > GZIP_ABOVE:
            body = await asyncio.to_thread(gzip.compress, body, 1)
            headers.append("Content-Encoding: gzip")
        if response.allow:
            headers.append(f"Allow: {response.allow}")
        headers.append(f"Content-Length: {len(body)}")
        status = f"HTTP/1.1 {response.status} {REASONS.get(response.status, '')}"
        writer.write(("\r\n".join([status, *headers]) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        await writer.drain()
