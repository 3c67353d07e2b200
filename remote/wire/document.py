"""The probe's document, read: decoded (zlib or not, within MAX_DOCUMENT_BYTES), checked
against its limits before json builds anything, then read section by section into a
HostSnapshot. `parse_probe_output` trusts nothing: a garbage document or one from another
probe version is a ProbeError naming the place; keys it does not know are ignored.

Parsing the box's bytes is the wire's job (DESIGN §1): the model only holds what they say."""

from __future__ import annotations

import itertools
import json
import re
import zlib
from array import array
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..model.snapshot import (
    DiskUsage,
    GpuError,
    HostSnapshot,
    ProbeError,
    classify_gpu_error,
)
from .raw_events import expand_raw_events
from .reader import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_NUMBER_DIGITS,
    MAX_STRING_BYTES,
    MAX_VALUES,
    PROBE_VERSION,
    BadDocument,
    Node,
    is_number,
    kind_of,
)
from .sections import (
    gpu_use_of,
    lenient_number,
    parse_cgroup,
    parse_counts,
    parse_discovered_runs,
    parse_disk,
    parse_elastic,
    parse_gpu,
    parse_gpu_processes,
    parse_kernel_events,
    parse_mig,
    parse_process,
    parse_runs,
    parse_scripts,
    parse_xid_counts,
)

# ---------------------------------------------------------------- the document

_MIB = 1024 * 1024
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_SKELETON = bytes(set(range(256)) - set(b'"[]{}'))
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # \" and \\ most of all: what hides a quote
_ESCAPES_BY_REGEX = 10_000
_STRING = re.compile(rb'"[^"]*"')  # in text without escapes
_LONG_STRING = re.compile(rb'"[^"]{%d,}"' % MAX_STRING_BYTES)
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * (MAX_NUMBER_DIGITS + 1)  # in text through _DIGITS
_ZEROS = re.compile(rb"0+")
_DEPTH_CHUNK = 64 * 1024


def decode_document(data: bytes) -> bytes:
    """The probe's stdout as JSON text: inflated where the request asked for compression,
    never past MAX_DOCUMENT_BYTES (a zlib stream of a few KB can inflate to gigabytes)."""
    if not data.strip():
        raise BadDocument("", "the probe printed nothing")
    text = data if data.lstrip().startswith(b"{") else _inflate(data)
    if len(text) > MAX_DOCUMENT_BYTES:
        raise _too_big("")
    return text


def _too_big(how: str) -> BadDocument:
    return BadDocument("", f"larger than the limit of {MAX_DOCUMENT_BYTES // _MIB} MiB "
                    f"(MAX_DOCUMENT_BYTES){how}")


def _inflate(data: bytes) -> bytes:
    """A zlib stream inflated a MiB at a time, given up as soon as it passes the limit:
    nothing past it is ever inflated, and a bomb's pieces are never joined."""
    inflate, parts, size = zlib.decompressobj(), [], 0
    try:
        part = inflate.decompress(data, _MIB)
        while part:
            parts.append(part)
            size += len(part)
            if size > MAX_DOCUMENT_BYTES:
                raise _too_big(" once inflated")
            part = inflate.decompress(inflate.unconsumed_tail, _MIB)
    except zlib.error:
        raise BadDocument("", "neither JSON nor zlib-compressed JSON") from None
    if not inflate.eof:
        raise BadDocument("", "neither JSON nor zlib-compressed JSON (the stream is cut short)")
    return b"".join(parts)


def _outside_strings(flat: bytes, find: Callable[[int], tuple[int, int] | None]) -> bool:
    """Whether what `find(pos)` finds from pos on ((start, where to look on)) begins somewhere
    in `flat` outside a string (an even number of quotes before it: a long string's match
    begins at its opening quote)."""
    quotes = counted = pos = 0
    while (found := find(pos)) is not None:
        quotes += flat.count(b'"', counted, found[0])
        counted, pos = found
        if quotes % 2 == 0:
            return True
    return False


def _long_string(flat: bytes) -> Callable[[int], tuple[int, int] | None]:
    def find(pos: int) -> tuple[int, int] | None:
        m = _LONG_STRING.search(flat, pos)
        return None if m is None else (m.start(), m.end() - 1)  # its end may open the next
    return find


def _long_number(digits: bytes) -> Callable[[int], tuple[int, int] | None]:
    def find(pos: int) -> tuple[int, int] | None:
        at = digits.find(_LONG_NUMBER, pos)
        if at < 0:
            return None
        run = _ZEROS.match(digits, at)
        return at, at if run is None else run.end()
    return find


def _depth(skeleton: bytes) -> int:
    """The deepest nesting of a text of brackets alone; stops at the first chunk past
    MAX_DEPTH (a document nested 300,000 deep is refused after 64 KB of it)."""
    level = deepest = 0
    steps = skeleton.translate(_BRACKETS, b'"')  # a stray quote: JSON that will not load
    for at in range(0, len(steps), _DEPTH_CHUNK):
        chunk = array("b", steps[at:at + _DEPTH_CHUNK])
        deepest = max(deepest, max(itertools.accumulate(chunk, initial=level)))
        if deepest > MAX_DEPTH:
            break
        level += sum(chunk)
    return deepest


def _unescaped(text: bytes) -> bytes:
    """The text without escapes, so that every quote left opens or closes a string. The regex
    is the fast way; two replaces (no object per match) where escapes are many."""
    if text.count(b"\\") < _ESCAPES_BY_REGEX:
        return _ESCAPE.sub(b"", text)
    return text.replace(b"\\\\", b"").replace(b'\\"', b"")


def check_text(text: bytes) -> None:
    """The limits on a document's shape, from its text before json.loads builds anything:
    nesting depth, containers, values, string length and number length. A few C-level passes
    over the bytes (tens of microseconds for a steady poll's document); strings are told
    apart from structure by the parity of the quotes once escapes are taken out."""
    flat = _unescaped(text)
    # Brackets outside strings: strings without brackets go first (adjacent quotes only ever
    # join two strings' contents, so dropping `""` keeps the rest in step); strings holding
    # brackets, rare, go by a regex once their number is known to be bounded.
    skeleton = flat.translate(None, _NOT_SKELETON).replace(b'""', b"")
    exact = b'"' not in skeleton
    if exact and _depth(skeleton) > MAX_DEPTH:
        raise BadDocument("", f"nested deeper than the limit of {MAX_DEPTH} (MAX_DEPTH)")
    if skeleton.count(b"[") + skeleton.count(b"{") > MAX_CONTAINERS:  # strings' too: over
        raise BadDocument("", f"more than the limit of {MAX_CONTAINERS:,} objects and lists "
                       f"(MAX_CONTAINERS)")
    if not exact and _depth(_STRING.sub(b"", skeleton)) > MAX_DEPTH:
        raise BadDocument("", f"nested deeper than the limit of {MAX_DEPTH} (MAX_DEPTH)")
    if text.count(b",") > MAX_VALUES:
        raise BadDocument("", f"more than the limit of {MAX_VALUES:,} values (MAX_VALUES)")
    if _outside_strings(flat, _long_string(flat)):
        raise BadDocument("", f"a string longer than the limit of {MAX_STRING_BYTES // 1024} KiB "
                       f"(MAX_STRING_BYTES)")
    digits = flat.translate(_DIGITS)
    if _LONG_NUMBER in digits and _outside_strings(digits, _long_number(digits)):
        raise BadDocument("", f"a number of more than the limit of {MAX_NUMBER_DIGITS} digits "
                       f"(MAX_NUMBER_DIGITS)")


def _decode(data: bytes) -> Any:
    """The probe prints JSON, or its zlib stream when the request asked for compression;
    every limit is checked before json.loads."""
    text = decode_document(data)
    check_text(text)
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadDocument("", f"not JSON: {exc}") from None


def _section(doc: Node, name: str, errors: dict[str, str]) -> Node | None:
    """A section's node; None when not asked for or failed ({"error": ...}, recorded)."""
    value = doc.data.get(name)
    if isinstance(value, dict) and "error" in value:
        errors.setdefault(name, Node(value, doc.child(name)).get_str("error"))
        return None
    return None if value is None else doc.node(name)


def _kernel_section(doc: Node, errors: dict[str, str]) -> Node | None:
    """The kernel section. Where the box's probe came without its parser of Xid and OOM lines
    (sent only where the last poll saw some), the lines come raw and are parsed here
    by the same code (box/kernel_log.py, the probe's default limits)."""
    kernel = _section(doc, "kernel", errors)
    if kernel is None or kernel.data.get("raw") is None:
        return kernel
    raw = kernel.opt_list("raw", lambda v: isinstance(v, str), "strings") or ()
    from ..box.base import DEFAULT_LIMITS  # only here: a box's first Xid
    from ..box.kernel_log import parse_kernel_log

    parsed = parse_kernel_log(raw, DEFAULT_LIMITS["kernel_events"], DEFAULT_LIMITS["msg_chars"])
    parsed["candidates"] = kernel.opt_int("candidates")
    total = kernel.opt_int("raw_total")
    parsed["partial"] = total is not None and total > len(raw)
    return Node(parsed, doc.child("kernel"))


def _host_clock(host: Node | None) -> tuple[int, int] | None:
    """(btime, clock ticks per second): what turns start ticks into epoch seconds."""
    if host is None:
        return None
    btime, ticks = host.opt_int("btime"), host.opt_int("clk_tck")
    return (btime, ticks) if btime is not None and ticks else None


def _disks(doc: Node, errors: dict[str, str]) -> tuple[DiskUsage, ...]:
    value = doc.data.get("disks")
    if isinstance(value, dict) and "error" in value:
        errors.setdefault("disks", Node(value, "disks").get_str("error"))
        return ()
    return tuple(parse_disk(node) for node in doc.nodes("disks"))


def _snapshot(doc: Node, host: str) -> HostSnapshot:
    errors = dict(doc.messages("errors"))
    info = _section(doc, "host", errors)
    clock = _host_clock(info)
    gpu_section = _section(doc, "gpus", errors)
    gpu_error = _gpu_error(doc.data.get("gpus"), doc.child("gpus"))
    vendor = (gpu_section.opt_str("vendor") or "nvidia") if gpu_section else "nvidia"
    gpus = tuple(parse_gpu(row, vendor) for row in gpu_section.table("devices")) if gpu_section \
        else ()
    apps = parse_gpu_processes(gpu_section, gpus) if gpu_section else ()
    if gpu_section and gpu_section.opt_str("apps_error"):
        errors["gpus.apps"] = gpu_section.get_str("apps_error")
    if gpu_section:
        try:  # a bad MIG table loses the instances only, never the GPUs
            gpus = parse_mig(gpu_section, gpus, apps)
        except BadDocument as bad:
            errors["gpus.mig"] = f"{bad.where}: {bad.problem}"
        if gpu_section.opt_str("mig_error"):
            errors["gpus.mig"] = gpu_section.get_str("mig_error")
    procs = _section(doc, "processes", errors)
    use = gpu_use_of(apps)
    cgroup = _section(doc, "cgroup", errors)
    scripts = parse_scripts(procs) if procs else {}
    ticks = info.opt_int("clk_tck") if info else None
    elastic = parse_elastic(procs) if procs else frozenset()
    logind = _section(doc, "logind", errors)
    kernel = _kernel_section(doc, errors)
    return HostSnapshot(
        host=host,
        taken_at=info.opt_float("time") if info else None,
        hostname=info.opt_str("hostname") if info else None,
        boot_id=info.opt_str("boot_id") if info else None,
        uptime_s=info.opt_float("uptime_s") if info else None,
        loadavg=info.opt_list("loadavg", is_number, "numbers") if info else None,
        ncpu=info.opt_int("ncpu") if info else None,
        gpus=gpus,
        gpu_processes=apps,
        gpu_source=gpu_section.opt_str("source") if gpu_section else None,
        gpu_hints=_gpu_hints(gpu_section),
        gpu_vendor=vendor if gpu_section else None,
        processes=tuple(parse_process(row, use, clock, scripts, elastic, ticks)
                        for row in procs.table("procs")) if procs else (),
        process_counts=parse_counts(procs) if procs else None,
        disks=_disks(doc, errors),
        cgroup=parse_cgroup(cgroup) if cgroup else None,
        kill_user_processes=logind.opt_bool("kill_user_processes") if logind else None,
        kernel_events=parse_kernel_events(kernel, clock[0] if clock else None) if kernel else (),
        xid_counts=parse_xid_counts(kernel) if kernel else MappingProxyType({}),
        section_errors=MappingProxyType(errors),
        probe_s=doc.opt_float("probe_s"),
        probe_cpu_s=doc.opt_float("cpu_s"),
        runs=parse_runs(doc, errors) + parse_discovered_runs(doc, errors),
        pynvml=gpu_section.opt_bool("pynvml") if gpu_section else None,
        pynvml_dir=gpu_section.opt_str("pynvml_dir") if gpu_section else None,
        spawn=info.opt_bool("spawn") if info else None,
        kernel_lines=kernel.opt_int("candidates") if kernel else None,
        xid_counts_partial=bool(kernel and kernel.data.get("partial") is True),
        gpu_error=gpu_error,
        gpu_tool_missing=_gpu_tool_missing(doc.data.get("gpus"), gpu_error),
        gpu_query_s=gpu_error.query_s if gpu_error is not None
        else gpu_section.opt_float("query_s") if gpu_section else None,
        processes_uptime_s=lenient_number(procs.data.get("uptime_s")) if procs else None,
        **_discovery_note(doc),
    )


def _gpu_tool_missing(value: object, error: GpuError | None) -> str | None:
    """The probe's words where the GPU tool was not found on PATH and no /dev/nvidia* says
    there are GPUs (classify_gpu_error: not an error by itself)."""
    if error is not None or not isinstance(value, dict) or value.get("missing") is not True:
        return None
    said = value.get("error")
    return said[:300] if isinstance(said, str) else "nvidia-smi not found on PATH"


def _gpu_hints(section: Node | None) -> Mapping[str, str]:
    """What the GPU source said of the box for the next poll (strings, short); anything else
    is left out: the next poll learns it again."""
    hints = section.data.get("hints") if section else None
    if not isinstance(hints, dict):
        return MappingProxyType({})
    return MappingProxyType({k: v for k, v in list(hints.items())[:8]
                             if isinstance(k, str) and isinstance(v, str) and len(v) <= 2000})


def _gpu_error(value: object, where: str) -> GpuError | None:
    """The GPU section's failure, or its lost GPUs beside the ones that answered, classified;
    None where the GPUs were read (or the box has none)."""
    if not isinstance(value, dict):
        return None
    node = Node(value, where)
    if node.opt_bool("not_read"):  # the probe's deadline passed before the GPUs' turn
        return None
    lost = node.opt_list("lost", lambda v: isinstance(v, str), "strings") or ()
    if "error" not in value:
        if not lost:
            return None
        return GpuError("gpu_lost", lost[0], node.opt_float("query_s"), True, tuple(lost))
    message = node.get_str("error")
    said = node.opt_str("said")
    nvml = node.opt_str("nvml")
    devices = node.opt_bool("devices")
    kind = classify_gpu_error(
        " ".join(t for t in (message, said, nvml) if t), exit_status=node.opt_int("exit"),
        timeout=node.opt_bool("timeout") is True, missing=node.opt_bool("missing") is True,
        devices=devices, lost=lost)
    if kind is None:
        return None
    return GpuError(kind, (said or message)[:300], node.opt_float("query_s"), devices,
                    tuple(lost))


def _discovery_note(doc: Node) -> dict[str, Any]:
    """The probe's word on its discovery: the cache to send back, or the need for the
    module. Malformed reads as absent: the next poll sends the module, which is always right."""
    note = doc.data.get("discovery")
    if not isinstance(note, dict):
        return {}
    reuse = note.get("reuse")
    return {"discovery_reuse": MappingProxyType(reuse) if isinstance(reuse, dict) else None,
            "discovery_need": note.get("need") if note.get("need") in ("now", "next") else None}


def load_document(data: bytes, host: str) -> Any:
    """The probe's stdout as JSON values, within every limit; ProbeError if not (for readers of
    fields the snapshot does not keep: `gpuwatch check`)."""
    try:
        return _decode(data)
    except BadDocument as bad:
        raise ProbeError(host, bad.where or "document", bad.problem) from None


def parse_probe_output(data: bytes, host: str) -> HostSnapshot:
    """The probe's stdout → a HostSnapshot; ProbeError if it is not a document we read."""
    try:
        raw = _decode(data)
        if not isinstance(raw, dict):
            raise BadDocument("", f"expected an object, got {kind_of(raw)}")
        if raw.get("v") != PROBE_VERSION:
            version = raw.get("v")
            raise BadDocument("v", f"version {version!r}; this gpuwatch reads version "
                                   f"{PROBE_VERSION}")
        return _snapshot(Node(expand_raw_events(raw), ""), host)
    except BadDocument as bad:
        raise ProbeError(host, bad.where or "document", bad.problem) from None
