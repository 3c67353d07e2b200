"""What one poll sends to a box: a short fixed command, and the probe plus request on stdin.

The command carries no secrets and no config values (U34), only the interpreter's name,
shell-quoted. stdin is `<N>\\n`, then N bytes of zlib-compressed probe source (about 3x
smaller than the source: fewer bytes on every poll, U15), then the request JSON, which the
probe reads to the end of stdin.

If the interpreter is missing, the shell answers "not found" with exit status 127
(PYTHON_MISSING_EXIT) and nothing on stdout; the probe itself never exits 127. (A pyenv shim
for a version that is not selected answers 127 too: the same fix, name the real interpreter.)
"""

from __future__ import annotations

import functools
import json
import shlex
import zlib
from pathlib import Path
from typing import Any

PROBE_PATH = Path(__file__).with_name("probe.py")
PYTHON_MISSING_EXIT = 127

# Runs on the box under any Python 3.6+: read the length line, inflate, run the probe.
BOOTSTRAP = "import sys,zlib;i=sys.stdin.buffer;exec(zlib.decompress(i.read(int(i.readline()))))"


@functools.cache
def compressed_probe() -> bytes:
    return zlib.compress(PROBE_PATH.read_bytes(), 9)


def build_command(python: str = "python3") -> str:
    """The shell command for the SSH exec: the same on every poll of a host."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(BOOTSTRAP)}"


def build_stdin(request: dict[str, Any]) -> bytes:
    """The bytes to feed the command's stdin: the framed probe, then the request."""
    probe = compressed_probe()
    body = json.dumps(request, separators=(",", ":")).encode()
    return b"%d\n" % len(probe) + probe + body
