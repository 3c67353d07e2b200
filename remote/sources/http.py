"""One bounded HTTP GET of a JSON document, on asyncio's streams (no client library).

Bounded like an SSH poll: one deadline over connecting, sending and reading the whole answer;
at most `max_bytes` of body (before and after gzip); the status line and headers at most
MAX_HEAD. HTTP/1.0, so the server sends the body as it is and closes (no chunked encoding to
undo, no connection kept). `https://` goes through the system's trust store; a user and
password in the URL become Basic authentication. Every failure is a SourceError with the kind
the host's poll reports and a sentence that names the URL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import urllib.parse
import zlib
from typing import Any

MAX_HEAD = 16384
"""Bytes of an answer's status line and headers."""
_READ = 65536


class SourceError(Exception):
    """A source could not say: `kind` is the host's error kind ("source"), `message` what
    happened, for a person."""

    def __init__(self, message: str, kind: str = "source") -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def shown(url: str) -> str:
    """A URL as a message shows it: without its password, nor its query (a PromQL query
    of a few hundred characters says nothing to a person)."""
    parts = urllib.parse.urlsplit(url)._replace(query="", fragment="")
    if parts.password is not None:
        netloc = f"{parts.username}:***@{parts.hostname}" + (
            f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    return urllib.parse.urlunsplit(parts)


def _why(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(exc, socket.gaierror):
        return f"the name is not known ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    return exc.strerror or str(exc)


async def get_json(url: str, *, timeout_s: float, max_bytes: int) -> tuple[int, Any, int]:
    """GET url: its HTTP status, its JSON body parsed (gzip allowed) and the bytes that came.
    Raises SourceError (a body that is no JSON; with a status other than 200, that status and
    its first words)."""
    try:
        async with asyncio.timeout(timeout_s):
            status, headers, body = await _get(url, max_bytes)
    except TimeoutError:
        raise SourceError(f"{shown(url)} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise SourceError(f"cannot reach {shown(url)}: {_why(exc)}") from None
    size = len(body)
    if headers.get("content-encoding", "").lower() == "gzip":
        body = _gunzip(body, max_bytes, url)
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        if status != 200:
            raise SourceError(f"{shown(url)} answered HTTP {status}: "
                              f"{body[:200].decode('utf-8', 'replace').strip()}") from None
        raise SourceError(f"{shown(url)} sent no JSON (is it a Prometheus API?)") from None
    return status, doc, size


async def _get(url: str, max_bytes: int) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"GET {target} HTTP/1.0", f"Host: {parts.netloc.rpartition('@')[2]}",
             "Accept: application/json", "Accept-Encoding: gzip", "User-Agent: gpuwatch"]
    if parts.username is not None:
        who = f"{urllib.parse.unquote(parts.username)}:" \
              f"{urllib.parse.unquote(parts.password or '')}"
        lines.append(f"Authorization: Basic {base64.b64encode(who.encode()).decode()}")
    context = ssl.create_default_context() if tls else None
    reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                   limit=MAX_HEAD)
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise SourceError(f"{shown(url)} sent headers over {MAX_HEAD} bytes") from None
        except asyncio.IncompleteReadError:
            raise SourceError(f"{shown(url)} closed the connection without an answer") \
                from None
        status, headers = _head(head, url)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > max_bytes:
            raise SourceError(f"{shown(url)}'s answer is {int(length)} bytes, over max_bytes "
                              f"({max_bytes}): narrow the selector or raise max_bytes")
        chunks, size = [], 0
        while chunk := await reader.read(_READ):
            size += len(chunk)
            if size > max_bytes:
                raise SourceError(f"{shown(url)}'s answer is over max_bytes ({max_bytes}): "
                                  "narrow the selector or raise max_bytes")
            chunks.append(chunk)
        return status, headers, b"".join(chunks)
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, TimeoutError):
            pass


def _head(head: bytes, url: str) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split(" ", 2)
    if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
        raise SourceError(f"{shown(url)} did not answer in HTTP")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(words[1]), headers


def _gunzip(body: bytes, max_bytes: int, url: str) -> bytes:
    """A gzip body inflated, at most max_bytes of it (a small answer that inflates to
    gigabytes is refused before it is)."""
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        out = inflate.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise SourceError(f"{shown(url)} sent a broken gzip body ({exc})") from None
    if len(out) > max_bytes or inflate.unconsumed_tail:
        raise SourceError(f"{shown(url)}'s answer inflates to over max_bytes ({max_bytes})")
    return out
