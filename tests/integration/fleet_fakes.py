"""A fleet for the fairness test, in a process of its own: GOOD cheap SSH boxes and BAD black
holes, each on a port of its own on 127.0.0.1.

A good box is an in-process asyncssh server (real SSH: key exchange, public-key login, one exec
channel per poll) that answers every command with a probe document: the real probe's, taken
once at start from a simulated 8-GPU box on this machine (so the client parses, judges and
stores a real document), its clock fields set to now on each answer. Nothing runs per poll, so
a hundred of them cost the test machine little. A black hole accepts TCP and never speaks (a
host whose sshd hangs, a firewall that swallows the handshake): each connection is held open.

    python fleet_fakes.py GOOD BAD KEYDIR

KEYDIR holds client_key.pub (the key gpuwatch logs in with); the host key is written there
(host_key.pub). Prints {"good": [port, ...], "bad": [port, ...]} on stdout, then serves until
stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import asyncssh


async def probe_document() -> dict[str, Any]:
    """The real probe's document of a simulated 8-GPU box (one local poll)."""
    from gpuwatch.remote.config.schema import HostConfig
    from gpuwatch.remote.sim import Box, h100_sxm
    from gpuwatch.remote.wire.collect import Collector

    root = Path(tempfile.mkdtemp(prefix="gwt-fleet-"))
    box = Box(root / "box", h100_sxm(8))
    os.environ.update(box.env())
    outcome = await Collector().poll(HostConfig(name="local", ssh="local",
                                                python=sys.executable), {})
    assert outcome.doc is not None, outcome.error_message
    raw = outcome.doc if outcome.doc.startswith(b"{") else zlib.decompress(outcome.doc)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def answer(doc: dict[str, Any]) -> bytes:
    now = time.time()
    host = doc.get("host")
    if isinstance(host, dict):
        host["time"] = now
    return zlib.compress(json.dumps(doc).encode(), 1)  # as the probe sends it


async def main(good: int, bad: int, keydir: Path) -> None:
    doc = await probe_document()
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    (keydir / "host_key.pub").write_bytes(host_key.export_public_key())
    authorized = asyncssh.import_authorized_keys((keydir / "client_key.pub").read_text())

    async def serve(process: asyncssh.SSHServerProcess[bytes]) -> None:
        await process.stdin.read()  # the probe and its request, up to EOF
        process.stdout.write(answer(doc))
        process.exit(0)

    servers = []
    for _ in range(good):
        servers.append(await asyncssh.listen(
            "127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized,
            process_factory=serve, encoding=None, allow_pty=False, login_timeout=30))
    held: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered, kept open

    holes = [await asyncio.start_server(swallow, "127.0.0.1", 0, backlog=256)
             for _ in range(bad)]
    print(json.dumps({"good": [s.get_port() for s in servers],
                      "bad": [h.sockets[0].getsockname()[1] for h in holes]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])))
