"""What one poll sends to a box: a short fixed command, and the probe plus request on stdin.

The command carries no secrets and no config values (U34), only the interpreter's name,
shell-quoted. stdin is `<N>\\n`, then N bytes of zlib-compressed payload (about 3x smaller
than the sources: fewer bytes on every poll, U15), then the request JSON, which the probe
reads to the end of stdin.

The payload is a small loader and the sources of the probe's modules (the probe and the
TensorBoard event decoder it uses). The loader installs each one into `sys.modules` under a
`gpuwatch_` name (types.ModuleType + exec: any Python 3.6+, nothing written to the box's
disk, nothing imported from it), then runs the probe's main(). The command stays the same
whatever the payload holds.

If the interpreter is missing, the shell answers "not found" with exit status 127
(PYTHON_MISSING_EXIT) and nothing on stdout; the probe itself never exits 127. (A pyenv shim
for a version that is not selected answers 127 too: the same fix, name the real interpreter.)
"""

from __future__ import annotations

import functools
import io
import json
import shlex
import tokenize
import zlib
from pathlib import Path
from typing import Any

PROBE_PATH = Path(__file__).with_name("probe.py")
MODULES = (("gpuwatch_tfevents", Path(__file__).with_name("tfevents.py")),
           ("gpuwatch_discover", Path(__file__).with_name("discover.py")),  # issue 8
           ("gpuwatch_probe", PROBE_PATH))
"""Installed in this order on the box; the last one's main() runs."""
PYTHON_MISSING_EXIT = 127

# Runs on the box under any Python 3.6+: read the length line, inflate, run the loader.
BOOTSTRAP = "import sys,zlib;i=sys.stdin.buffer;exec(zlib.decompress(i.read(int(i.readline()))))"

LOADER = '''
import sys, types


def install(name, source):
    module = types.ModuleType(name)
    module.__file__ = "<%s>" % name
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


for name, source in SOURCES:
    last = install(name, source)
last.main()
'''


def strip_source(text: str) -> str:
    """Source without comments, docstrings and blank lines: a third fewer bytes on the wire,
    the same code. A docstring becomes `0`, so a body that held only one stays a body."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def at(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    skip = (tokenize.COMMENT, tokenize.NL)
    significant = [t for t in tokens if t.type not in skip]
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    cuts = [(at(t.start), at(t.end), "") for t in tokens if t.type == tokenize.COMMENT]
    for before, tok, after in zip([None, *significant[:-1]], significant, [*significant[1:], None],
                                  strict=True):
        if (tok.type == tokenize.STRING and (before is None or before.type in statement_start)
                and after is not None and after.type == tokenize.NEWLINE):
            cuts.append((at(tok.start), at(tok.end), "0"))  # a string alone: a docstring
    out = text
    for start, end, replacement in sorted(cuts, reverse=True):
        out = out[:start] + replacement + out[end:]
    return "".join(line.rstrip() + "\n" for line in out.splitlines() if line.strip())


def payload(tfevents: bool = True) -> str:
    """The Python source the bootstrap executes: the module sources, then the loader. Without
    `tfevents` the event decoder is left out (the probe imports it only to read event files)."""
    sources = [(name, strip_source(path.read_text(encoding="utf-8"))) for name, path in MODULES
               if tfevents or name != "gpuwatch_tfevents"]
    return f"SOURCES = {sources!r}\n{LOADER}"


@functools.cache
def compressed_probe(tfevents: bool = True) -> bytes:
    return zlib.compress(payload(tfevents).encode("utf-8"), 9)


def reads_event_files(request: dict[str, Any]) -> bool:
    """Whether a run of the request asks for TensorBoard event files."""
    wanted = request.get("want")
    if not isinstance(wanted, dict) or wanted.get("discover", True) is not False:
        return True  # issue 8: discovery may find event files on this very poll
    runs = request.get("runs")
    return isinstance(runs, list) and any(isinstance(r, dict) and r.get("events") for r in runs)


def build_command(python: str = "python3") -> str:
    """The shell command for the SSH exec: the same on every poll of a host."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(BOOTSTRAP)}"


def build_stdin(request: dict[str, Any], *, trim: bool = False) -> bytes:
    """The bytes to feed the command's stdin: the framed payload, then the request. `trim`
    leaves out what this request does not use: the event decoder (5 KB of the 18.6 KB
    compressed, and 7 ms of compiling on the box) when no run reads event files."""
    probe = compressed_probe(not trim or reads_event_files(request))
    body = json.dumps(request, separators=(",", ":")).encode()
    return b"%d\n" % len(probe) + probe + body
