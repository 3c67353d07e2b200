"""What one poll sends to a box: a short fixed command, and the probe plus request on stdin.

The command carries no secrets and no config values (U34), only the interpreter's name,
shell-quoted. stdin is `<N>\\n`, then N bytes of zlib-compressed payload (about 3x smaller
than the sources: fewer bytes on every poll, U15), then the request JSON (compressed too when
long), which the probe reads to the end of stdin.

The payload is a small loader and the sources of the probe's modules (the probe, and its part
that reads runs' files, the TensorBoard event decoder and the discovery of runs nobody
configured when this poll needs them, see modules_for). The loader installs each one into
`sys.modules` under a `gpuwatch_` name (a module object + exec: any Python 3.6+, nothing
written to the box's disk, nothing imported from it), then runs the probe's main(). The
command stays the same whatever the payload holds.

Stripping the sources costs ~50 ms of tokenizing on this side, so each compressed payload is
kept under $XDG_CACHE_HOME/gpuwatch/, named by a hash of what it is made from: a cron
`--once` pays it once per gpuwatch version, not on every run before its first connection.

If the interpreter is missing, the shell answers "not found" with exit status 127
(PYTHON_MISSING_EXIT) and nothing on stdout; the probe itself never exits 127. (A pyenv shim
for a version that is not selected answers 127 too: the same fix, name the real interpreter.)
"""

from __future__ import annotations

import functools
import io
import json
import os
import shlex
import time
import tokenize
import zlib
from pathlib import Path
from typing import Any

from .. import paths

BOX = Path(__file__).parent.parent / "box"
PROBE_PATH = BOX / "probe.py"
CORE = ("base", "host", "gpus/section", "processes", "disks", "known_runs", "probe")
"""The probe's files that every poll sends (the gpuwatch_probe part): what it always runs."""
RUN_FILES = "gpuwatch_runs"
"""The part of the probe that reads runs' files (runs.py and checkpoints.py): sent only to a
poll that may read a run (modules_for; a quarter of the probe)."""
RAW_RECORDS = "gpuwatch_events"
"""The reader that sends event files' new records raw (events.py: read_raw_records),
sent only to a poll that reads event files without the decoder."""
SMI = "gpuwatch_gpus_nvidia_smi"
"""The probe's nvidia-smi reader (gpus/nvidia_smi.py): sent unless the last poll of the host
read its GPUs through NVML (the request's "gpu_source"), which then goes instead: a box reads
its GPUs through one of the two, and each poll carries that one (DESIGN §6's upload)."""
NVML = "gpuwatch_gpus_nvml"
"""The probe's NVML reader (gpus/nvml.py): sent unless the last poll of the host said its
python cannot import pynvml (most boxes' system python3; the probe then reads nvidia-smi, and
says so when pynvml starts to import)."""
METRICS = "gpuwatch_metrics"
"""The readers of trainer_state.json, metrics CSV and JSONL files (metrics.py), sent only to a
poll where a run names some or discovery may find them (a third of the run files)."""
GLOB = "gpuwatch_globs"
"""The probe's own glob (globs.py: `import glob` pulls in re, 3.7 ms of a poll), sent only to
a poll where a run's path has glob characters (discovery names every HuggingFace run's
checkpoints by one; the poll that finds the run reads them with the stdlib's glob)."""
CGROUP_V1 = "gpuwatch_cgroup_v1"
"""The probe's reader of cgroup v1 files (cgroup_v1.py): sent unless the last poll of the
host said its cgroups are v2 (most boxes now)."""
KERNEL = "gpuwatch_kernel_log"
"""The probe's parser of NVIDIA Xid and OOM kill lines (kernel_log.py): sent unless the last
poll of the host saw no such line in its kernel log (most boxes; one that has some then sends
them raw, and the client parses them, model.snapshot)."""
MIG = "gpuwatch_gpus_mig"
"""The reader of MIG instances (gpus/mig.py): sent only where the last poll of the host said a
GPU has MIG on (the GPU source's hint "mig")."""
POPEN = "gpuwatch_popen"
"""The probe's way to run nvidia-smi and dmesg where os.posix_spawnp is missing (popen.py;
Python 3.6 and 3.7, PyPy; subprocess, 4 ms more CPU): sent unless the last poll of the host
said its python has os.posix_spawnp."""
PARTS = (("gpuwatch_tfevents", ("tfevents_proto", "tfevents")),
         ("gpuwatch_discover", ("discover_found", "discover")),
         ("gpuwatch_probe", CORE), (SMI, ("gpus/nvidia_smi",)),
         (RUN_FILES, ("runs", "checkpoints")), (RAW_RECORDS, ("events",)), (METRICS, ("metrics",)),
         (GLOB, ("globs",)), (NVML, ("gpus/nvml",)), (MIG, ("gpus/mig",)), (POPEN, ("popen",)),
         (CGROUP_V1, ("cgroup_v1",)), (KERNEL, ("kernel_log",)))
"""What modules_for picks from, in its order: each part is the files of box/ it names."""
FILES = ("tfevents_proto", "tfevents", "base", "gpus/section", "gpus/nvidia_smi", "gpus/nvml",
         "gpus/mig", "host", "disks", "kernel_log", "cgroup_v1", "popen", "runs", "checkpoints",
         "metrics", "processes", "events", "known_runs", "discover_found", "discover", "globs",
         "probe")
"""The order the loader installs them in: base.py before the rest, a file after those it
binds at its top (`host = base.load_module("host")`), probe.py last, whose main() runs; else
the order that zlib packs best (tens of bytes of every poll)."""
MODULES = tuple(("gpuwatch_" + name.replace("/", "_"), BOX / (name + ".py")) for name in FILES)
"""(the name installed on the box, the file) of every file the bundle may send, in FILES'
order."""
PYTHON_MISSING_EXIT = 127
REQUEST_COMPRESSED_FROM = 256
"""A request JSON longer than this goes zlib-compressed (the probe tells by its first byte)."""

# Runs on the box under any Python 3.6+: read the length line, inflate, run the loader.
# `python -c` puts the login folder ('') first on sys.path: a json.py or zlib.py lying there
# would be imported, that is executed, by the probe. It goes before any other import.
BOOTSTRAP = ("import sys;sys.path=[p for p in sys.path if p not in('','.')];import zlib;"
             "i=sys.stdin.buffer;exec(zlib.decompress(i.read(int(i.readline()))))")

# Garbage collection off: a short life that makes few cycles, and compiling the sources is
# 2 ms quicker. The command runs python with -S (build_command): site-packages are loaded
# where the event decoder goes, for its C crc32c (and by the probe where it looks for pynvml).
LOADER = '''
import gc, sys
gc.disable()
if sys.flags.no_site and any(name == "gpuwatch_tfevents" for name, _ in SOURCES):
    import site
    site.main()


def install(name, source):
    module = type(sys)(name)  # types.ModuleType, without importing types (0.2 ms)
    module.__file__ = "<%s>" % name
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


for name, source in SOURCES:
    last = install(name, source)
last.main()
'''


def strip_source(text: str) -> str:
    """Source without comments, docstrings and blank lines, indented by one space a level: a
    third fewer bytes on the wire, the same code. A docstring that is all its body holds
    becomes `0`, so the body stays one. A statement's first line is re-indented; a line that
    continues one inside brackets loses its indentation, unless it starts inside a string."""
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
    depth = 0
    for before, tok, after, then in zip([None, *significant[:-1]], significant,
                                        [*significant[1:], None], [*significant[2:], None, None],
                                        strict=True):
        depth += {tokenize.INDENT: 1, tokenize.DEDENT: -1}.get(tok.type, 0)
        starts_statement = before is None or before.type in statement_start
        if starts_statement and tok.type not in statement_start and tok.start[1]:
            offset = starts[tok.start[0] - 1]
            cuts.append((offset, offset + tok.start[1], " " * depth))
        elif (not starts_statement and before is not None and tok.start[1]
              and tok.start[0] > before.end[0]):  # the first token of a continuation line
            offset = starts[tok.start[0] - 1]
            if not text[offset:offset + tok.start[1]].strip():  # not a string's last line
                cuts.append((offset, offset + tok.start[1], ""))
        if (tok.type == tokenize.STRING and starts_statement
                and after is not None and after.type == tokenize.NEWLINE):
            # a string alone (a docstring): gone, or `0` where it is all its block holds
            alone = then is None or then.type in (tokenize.DEDENT, tokenize.ENDMARKER)
            cuts.append((at(tok.start), at(tok.end), "0" if alone else ""))
    out = text
    for start, end, replacement in sorted(cuts, reverse=True):
        out = out[:start] + replacement + out[end:]
    return _tighten("".join(line.rstrip() + "\n" for line in out.splitlines() if line.strip()))


_WORDS = (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)
_FSTRING = (getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -2))


def _tighten(text: str) -> str:
    """The spaces between two tokens on a line dropped where Python needs none (`x = f(a, b)`
    is sent `x=f(a,b)`): kept between two names, numbers or strings, after a number before a
    dot (`1 .real`), and inside f-strings (Python 3.12 splits them into tokens). 2 % of the
    compressed upload, every poll."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    gaps, prev, in_fstring = [], None, 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == _FSTRING[0]:
            in_fstring += 1
        elif tok.type == _FSTRING[1]:
            in_fstring -= 1
        elif (prev is not None and not in_fstring and prev.end[0] == tok.start[0]
              and tok.start[1] > prev.end[1] and tok.type not in (tokenize.NEWLINE, tokenize.NL)
              and not (prev.type in _WORDS and tok.type in _WORDS)
              and not (prev.type == tokenize.NUMBER and tok.string.startswith("."))):
            row = starts[tok.start[0] - 1]
            gaps.append((row + prev.end[1], row + tok.start[1]))
        prev = tok
    kept, at = [], 0
    for start, end in gaps:
        kept.append(text[at:start])
        at = end
    return "".join(kept) + text[at:]


def files(parts: tuple[str, ...] | None) -> list[tuple[str, Path]]:
    """The MODULES that `parts` (names of PARTS; None: every one) are made of, in FILES'
    order."""
    chosen = {"gpuwatch_" + name.replace("/", "_") for part, names in PARTS
              if parts is None or part in parts for name in names}
    return [(module, path) for module, path in MODULES if module in chosen]


def payload(parts: tuple[str, ...] | None = None) -> str:
    """The Python source the bootstrap executes: the sources of the files of `parts` (names of
    PARTS, as modules_for gives them; None: everything), then the loader."""
    sources = [(name, strip_source(path.read_text(encoding="utf-8")))
               for name, path in files(parts)]
    return f"SOURCES = {sources!r}\n{strip_source(LOADER)}"


CACHE_MAX_AGE_S = 30 * 86400.0
"""A cached payload not written for this long is removed when another one is written."""


def cache_dir() -> Path:
    return paths.cache_dir()


@functools.cache
def compressed_probe(parts: tuple[str, ...] | None = None) -> bytes:
    """payload(parts), zlib-compressed; from the cache when it holds this very payload."""
    try:  # CPython's own BLAKE2: `import hashlib` loads OpenSSL first (~4 ms of every --once)
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b

    digest = blake2b(Path(__file__).read_bytes(), digest_size=16)  # strip, loader
    for name, path in files(parts):
        digest.update(b"\0%s\0%s" % (name.encode(), path.read_bytes()))
    path = cache_dir() / f"probe-{digest.hexdigest()}.z"
    try:
        if path.stat().st_uid == os.getuid():  # it is sent to every box: only our own file
            blob = path.read_bytes()
            zlib.decompress(blob)  # whole and readable
            return blob
    except (OSError, zlib.error):
        pass
    blob = zlib.compress(payload(parts).encode("utf-8"), 9)
    _keep(path, blob)
    return blob


def _keep(path: Path, blob: bytes) -> None:
    """Write a payload into the cache (atomically; old ones go); a cache that cannot be
    written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in path.parent.glob("probe-*.z"):
            if time.time() - old.stat().st_mtime > CACHE_MAX_AGE_S:
                old.unlink()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    except OSError:
        pass


def wants_discovery(request: dict[str, Any]) -> bool:
    wanted = request.get("want")
    return not isinstance(wanted, dict) or wanted.get("discover", True) is not False


def reads_event_files(request: dict[str, Any]) -> bool:
    """Whether a run of the request, configured or discovered earlier, names event files."""
    return any(isinstance(r, dict) and r.get("events") for r in _runs(request))


def decodes_event_files(request: dict[str, Any]) -> bool:
    """Whether this poll needs the event decoder on the box: a run names event files
    and its entry does not say "raw" (RunSeries.events_raw: a run's first poll, a first load
    or a growth larger than probe.RAW_CAP still going, a damaged record to resynchronise
    over). Without the decoder the probe sends the new records raw (probe.read_raw_records)
    and the client decodes them (raw_events.py): the steady state of a run being watched."""
    return any(isinstance(r, dict) and r.get("events") and r.get("raw") is not True
               for r in _runs(request))


def _runs(request: dict[str, Any]) -> list[Any]:
    return [r for key in ("runs", "discovered_runs") if isinstance(request.get(key), list)
            for r in request[key]]


def modules_for(request: dict[str, Any]) -> tuple[str, ...]:
    """What a poll with this request needs on the box (the `parts` of payload). Discovery
    (a quarter of the upload) unless the request carries the last discovery for the
    probe to reuse (probe.reuse_discovery: on a box whose runs did not change, every
    poll but the first); the probe's run files part when the request has runs or discovery
    may find some, and its glob where a run's path has glob characters; the event decoder
    when discovery may find event files this poll, or when a run's event files need it
    (decodes_event_files), else, where a run reads event files, the
    probe's raw records part: in steady state their new records go raw; the metrics
    readers where a run names metrics files or discovery may find some; the NVML reader unless
    the box said its python has no pynvml, the nvidia-smi reader unless the last poll read
    NVML; the MIG reader where the box said a GPU has MIG on;
    the subprocess part unless the box said its python has os.posix_spawnp;
    the cgroup v1 reader unless the box said its cgroups are v2; the kernel
    log's parser unless the box's last kernel log had no Xid or OOM line. A host's first poll,
    knowing nothing yet, gets whatever it may need."""
    discover = wants_discovery(request) and not isinstance(request.get("discovery_reuse"), dict)
    wanted = {"gpuwatch_probe"}
    if discover:
        wanted |= {"gpuwatch_discover", "gpuwatch_tfevents", RUN_FILES, METRICS}
    if _runs(request):
        wanted.add(RUN_FILES)
    if any(isinstance(r, dict) and r.get("metrics") for r in _runs(request)):
        wanted.add(METRICS)
    if any(_globbed(r) for r in _runs(request)):
        wanted.add(GLOB)
    if decodes_event_files(request):
        wanted.add("gpuwatch_tfevents")
    elif reads_event_files(request):
        wanted.add(RAW_RECORDS)
    wanted_want = request.get("want")
    no_gpus = isinstance(wanted_want, dict) and wanted_want.get("gpus") is False
    if request.get("pynvml") is not False and not no_gpus and not (
            isinstance(wanted_want, dict) and wanted_want.get("nvml") is False):
        wanted.add(NVML)
    if not no_gpus and (NVML not in wanted or request.get("gpu_source") != "nvml"):
        wanted.add(SMI)
    hints = request.get("gpu_hints")
    if isinstance(hints, dict) and hints.get("mig") == "1":
        wanted.add(MIG)
    if request.get("spawn") is not True:
        wanted.add(POPEN)
    if request.get("cgroup") != 2:
        wanted.add(CGROUP_V1)
    if request.get("kernel_lines") != 0:
        wanted.add(KERNEL)
    return tuple(part for part, _ in PARTS if part in wanted)


def _globbed(run: Any) -> bool:
    """Whether a run's entry names a path with glob characters (probe.has_glob)."""
    if not isinstance(run, dict):
        return False
    paths = [run.get(key) for key in ("log", "events", "checkpoints", "done")]
    metrics = run.get("metrics")
    paths += metrics if isinstance(metrics, list) else []
    return any(isinstance(p, str) and any(c in p for c in "*?[") for p in paths)


def build_command(python: str = "python3") -> str:
    """The shell command for the SSH exec: the same on every poll of a host. `-S`: no site
    at start-up (the probe loads it where it needs site-packages, see probe.load_site)."""
    return f"exec {shlex.quote(python)} -S -c {shlex.quote(BOOTSTRAP)}"


def build_stdin(request: dict[str, Any], *, trim: bool = False) -> bytes:
    """The bytes to feed the command's stdin: the framed payload, then the request. `trim`
    leaves out what this request does not use (modules_for); without it every module goes."""
    probe = compressed_probe(modules_for(request) if trim else None)
    body = json.dumps(request, separators=(",", ":")).encode()
    if len(body) > REQUEST_COMPRESSED_FROM:  # remembered runs, event-file offsets
        body = min(body, zlib.compress(body, 9), key=len)
    return b"%d\n" % len(probe) + probe + body
