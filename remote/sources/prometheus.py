"""The fleet from a Prometheus-compatible server's HTTP API (`[sources.prometheus]`).

It reads, with a few instant queries (`/api/v1/query`), DCGM exporter's series
(`DCGM_FI_DEV_GPU_UTIL`, `..._SM_CLOCK`, `..._POWER_USAGE`, `..._XID_ERRORS`, framebuffer used and
free, ...) and gpuwatch watchers' own (`gpuwatch watch --listen`: their GPUs, disks, verdicts
and findings), and makes of each host a HostSnapshot that lands in the pipeline like any poll:
remote/watch/fleet.py asks a PrometheusSource, instead of its SSH collector, for the hosts whose
`source` is "prometheus" (`with_source_hosts` adds every host the server knows that the config
does not list). A host with both kinds of series is read from gpuwatch's.

One read of the server serves every host polled within `fresh_s` of it (a fleet of hundreds is
a few queries per interval, not a few per host), under one lock, so a round of --once reads it
once. Bounded as an SSH poll is: `timeout_s` over all the queries, `max_bytes` of each answer,
and a failure is each host's `source` error with a sentence that names the server (down, slow,
no Prometheus, a host it has no series of any more, and why where the server knows: its scrape
of the host's exporter failing, with the scrape's own error).

What a snapshot from Prometheus holds: the GPUs (utilization, SM clock, power and its limit,
temperature, VRAM, throttle reasons, MIG, the last Xid as a kernel event), and from a watcher
also uptime, disks and the findings it judged (`findings()`: the pipeline adds them to the
host's own). No processes, no runs: those are read on the box (the snapshot says so in
`section_errors`, so no rule takes "no process listed" for "no process there").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..box.gpus.section import REASON_BITS
from ..config.schema import Config, HostConfig, PrometheusConfig, PrometheusLabels
from ..model.finding import Finding, Severity
from ..model.series import RunSeries
from ..model.snapshot import DiskUsage, GpuSample, HostSnapshot, KernelEvent
from ..units import duration
from ..verdict import FINDING_WORDS
from ..wire.collect import PollOutcome
from .http import SourceError, get_json, shown

SOURCE_HOST = "prometheus"
"""The name of the one host that stands for the server when it could not be read at start
(so every output says so, rather than showing a fleet without its hosts)."""

DCGM_FIELDS: Mapping[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "sm_clock_max_mhz",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_FB_USED": "used",
    "DCGM_FI_DEV_FB_FREE": "free",
    "DCGM_FI_DEV_FB_RESERVED": "reserved",
    "DCGM_FI_DEV_FB_TOTAL": "total",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "reasons",
}
"""DCGM exporter's series read (its default counters, and a few it may be told to export),
and the GpuSample field each fills. FB_* are MiB; XID_ERRORS is the last Xid seen (0: none);
the reasons are NVML's clock-event bit mask."""
SUMMED = frozenset({"used", "free", "reserved", "total"})
"""Fields a MIG GPU's instances each report a part of (their framebuffer): summed."""
GPUWATCH_FIELDS: Mapping[str, str] = {
    "gpuwatch_gpu_utilization_percent": "util_pct", "gpuwatch_gpu_sm_clock_mhz": "sm_clock_mhz",
    "gpuwatch_gpu_sm_clock_max_mhz": "sm_clock_max_mhz", "gpuwatch_gpu_power_watts": "power_w",
    "gpuwatch_gpu_power_limit_watts": "power_limit_w",
    "gpuwatch_gpu_temperature_celsius": "temp_c", "gpuwatch_gpu_memory_used_mib": "used",
    "gpuwatch_gpu_memory_total_mib": "total", "gpuwatch_gpu_throttle_active": "reason",
    "gpuwatch_gpu_info": "info",
}
GPUWATCH_HOST = ("gpuwatch_up", "gpuwatch_poll_error", "gpuwatch_last_poll_timestamp_seconds",
                 "gpuwatch_finding", "gpuwatch_uptime_seconds", "gpuwatch_disk_bytes_total",
                 "gpuwatch_disk_bytes_free", "gpuwatch_disk_inodes_total",
                 "gpuwatch_disk_inodes_free")
"""A watcher's series of a host read besides its GPUs' (report.py writes them)."""
NOT_READ = "not read: this host's data comes from Prometheus (open it over SSH for processes)"
SEVERITIES = {s.label: s for s in Severity}


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: its name, labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class FleetRead:
    """One read of the server: every host's series, by kind."""

    at: float
    """The server's evaluation time (epoch s): what the data is "now" to."""
    dcgm: dict[str, list[Sample]] = field(default_factory=dict)
    gpuwatch: dict[str, list[Sample]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Series left out, one line each (an answer item that is no sample, a GPU with no
    index): said in the hosts' section_errors, never the whole read's failure."""
    bytes: int = 0

    @property
    def names(self) -> list[str]:
        return sorted(set(self.dcgm) | set(self.gpuwatch))


# --- the HTTP API's answers ----------------------------------------------------------------

def parse_vector(doc: object, what: str) -> tuple[list[Sample], list[str], float | None]:
    """An instant query's answer (`{"status": "success", "data": {"resultType": "vector",
    "result": [{"metric": {...}, "value": [t, "v"]}, ...]}}`): its samples, a line per item
    left out (naming it), and the evaluation time. An answer that is not one raises
    SourceError naming what is wrong; an error answer, the server's own words."""
    if not isinstance(doc, Mapping):
        raise SourceError(f"{what}: the answer is no JSON object")
    if doc.get("status") == "error":
        said = doc.get("error")
        raise SourceError(f"{what}: the server said: "
                          f"{said[:300] if isinstance(said, str) else 'an error'}")
    data = doc.get("data")
    if doc.get("status") != "success" or not isinstance(data, Mapping):
        raise SourceError(f"{what}: expected status \"success\" and a data object")
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise SourceError(f"{what}: expected a vector result, got "
                          f"{str(data.get('resultType'))[:40]!r}")
    samples, problems, at = [], [], None
    for i, item in enumerate(data["result"]):
        try:
            sample, t = _sample(item)
        except ValueError as exc:
            problems.append(f"{what}: result[{i}] left out: {exc}")
            continue
        samples.append(sample)
        at = t if at is None else max(at, t)
    return samples, problems, at


def _sample(item: object) -> tuple[Sample, float]:
    if not isinstance(item, Mapping):
        raise ValueError("not an object")
    metric, value = item.get("metric"), item.get("value")
    if not isinstance(metric, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ValueError("metric: expected an object of label names to strings")
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str) \
            or isinstance(value[0], bool) or not isinstance(value[0], int | float):
        raise ValueError('value: expected [time, "number"]')
    try:
        number = float(value[1])  # the API writes NaN, +Inf and -Inf as such
    except ValueError:
        raise ValueError(f"value: {value[1][:40]!r} is no number") from None
    name = metric.get("__name__", "")
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    if not math.isfinite(float(value[0])):
        raise ValueError("value: the time is no finite number")
    return Sample(name, labels, number), float(value[0])


def _names_query(names: Iterable[str], selector: str | None) -> str:
    matchers = [f'__name__=~"{"|".join(sorted(set(names)))}"']
    if selector:
        matchers.append(selector.rstrip().rstrip(","))
    return "{" + ", ".join(matchers) + "}"


async def _query(config: PrometheusConfig, query: str, what: str
                 ) -> tuple[list[Sample], list[str], float | None, int]:
    url = f"{config.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    status, doc, size = await get_json(url, timeout_s=config.timeout_s,
                                       max_bytes=config.max_bytes)
    if status != 200 and not (isinstance(doc, Mapping) and doc.get("status") == "error"):
        raise SourceError(f"{shown(config.url)} answered HTTP {status} to {what}")
    samples, problems, at = parse_vector(doc, f"{shown(config.url)}: {what}")
    return samples, problems, at, size


async def read_fleet(config: PrometheusConfig, clock: Any = time.time) -> FleetRead:
    """Every host's series, read at once (the queries side by side, within timeout_s all
    together). Raises SourceError."""
    queries = []
    if "dcgm" in config.metrics:
        queries.append(("dcgm", _names_query(DCGM_FIELDS, config.selector)))
    if "gpuwatch" in config.metrics:
        queries.append(("gpuwatch", _names_query([*GPUWATCH_FIELDS, *GPUWATCH_HOST],
                                                 config.selector)))
    try:
        async with asyncio.timeout(config.timeout_s):
            answers = await asyncio.gather(*(_query(config, q, f"the {kind} series")
                                             for kind, q in queries))
    except TimeoutError:
        raise SourceError(f"{shown(config.url)} did not answer within {config.timeout_s:g} s "
                          "(timeout_s)") from None
    read = FleetRead(at=clock())
    times = [a[2] for a in answers if a[2] is not None]
    if times:
        read.at = max(times)
    for (kind, _), (samples, problems, _, size) in zip(queries, answers, strict=True):
        read.problems += problems
        read.bytes += size
        label = config.labels.host if kind == "dcgm" else "host"
        into = read.dcgm if kind == "dcgm" else read.gpuwatch
        for sample in samples:
            host = sample.labels.get(label)
            if host:
                into.setdefault(host, []).append(sample)
    return read


# --- snapshots -----------------------------------------------------------------------------

def _number(values: list[float], summed: bool) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return sum(finite) if summed else max(finite)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _reasons(mask: float | None) -> tuple[str, ...] | None:
    if mask is None or mask < 0 or mask >= 1 << 63:
        return None
    bits = int(mask)
    return tuple(name for bit, name in REASON_BITS if bits & bit)


def dcgm_gpus(samples: Sequence[Sample], labels: PrometheusLabels
              ) -> tuple[list[GpuSample], list[KernelEvent], list[str]]:
    """One host's DCGM series as GPUs (a MIG GPU's instances as one: their framebuffers
    summed, the device's clock, power and temperature once), its last Xids as kernel
    events, and what was left out."""
    gpus: dict[tuple[int, str | None], dict[str, Any]] = {}
    problems: list[str] = []
    seen: set[tuple[str, str, str, str | None]] = set()
    for s in samples:
        field_name = DCGM_FIELDS.get(s.name)
        if field_name is None:  # a series it does not read (the queries ask for none)
            continue
        index_text = s.labels.get(labels.gpu, "")
        if not index_text.isdigit() or len(index_text) > 4:
            problems.append(f"{s.name}: no GPU index in label {labels.gpu}="
                            f"{index_text[:20]!r}")
            continue
        uuid = s.labels.get(labels.uuid) or None
        instance = s.labels.get("GPU_I_ID")
        key = (s.name, index_text, uuid or "", instance)
        if key in seen:  # the same GPU through two scrape jobs: once
            continue
        seen.add(key)
        gpu = gpus.setdefault((int(index_text), uuid), {"values": {}, "mig": False})
        gpu["values"].setdefault(field_name, []).append(s.value)
        gpu["mig"] = gpu["mig"] or instance is not None
        for what, label in (("name", labels.model), ("pci", labels.pci)):
            if gpu.get(what) is None:
                gpu[what] = s.labels.get(label) or None
    out, events = [], []
    for (index, uuid), gpu in sorted(gpus.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        values = {name: _number(v, name in SUMMED) for name, v in gpu["values"].items()}
        used, total = values.get("used"), values.get("total")
        if total is None and used is not None and values.get("free") is not None:
            total = used + (values["free"] or 0) + (values.get("reserved") or 0)
        out.append(GpuSample(
            index=index, uuid=uuid, name=gpu["name"], util_pct=values.get("util_pct"),
            mem_used_mib=_int(used), mem_total_mib=_int(total),
            sm_clock_mhz=_int(values.get("sm_clock_mhz")),
            sm_clock_max_mhz=_int(values.get("sm_clock_max_mhz")),
            power_w=values.get("power_w"), power_limit_w=values.get("power_limit_w"),
            temp_c=_int(values.get("temp_c")), throttle_reasons=_reasons(values.get("reasons")),
            mig=True if gpu["mig"] else None, pci_bus_id=gpu["pci"], vendor="nvidia"))
        xid = values.get("xid")
        if xid is not None and 0 < xid < 65536:  # U22: DCGM keeps the last Xid it saw
            events.append(KernelEvent(
                "xid", None, None, None, None, xid=int(xid), pci=gpu["pci"],
                message=f"DCGM exporter: the last Xid of GPU {index} is {int(xid)}"))
    return out, events, problems


def gpuwatch_gpus(samples: Sequence[Sample]) -> tuple[list[GpuSample], list[str]]:
    """A watcher's GPU series of one host as GPUs."""
    gpus: dict[tuple[int, str | None], dict[str, Any]] = {}
    problems: list[str] = []
    for s in samples:
        what = GPUWATCH_FIELDS.get(s.name)
        if what is None:
            continue
        index_text = s.labels.get("gpu", "")
        if not index_text.isdigit() or len(index_text) > 4:
            problems.append(f"{s.name}: no GPU index in label gpu={index_text[:20]!r}")
            continue
        gpu = gpus.setdefault((int(index_text), s.labels.get("uuid") or None),
                              {"values": {}, "reasons": []})
        if what == "reason":
            gpu["reasons"].append(s.labels.get("reason", ""))
        elif what == "info":
            gpu["name"] = s.labels.get("name")
        else:
            gpu["values"][what] = s.value if math.isfinite(s.value) else None
    out = []
    for (index, uuid), gpu in sorted(gpus.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        v = gpu["values"]
        out.append(GpuSample(
            index=index, uuid=uuid, name=gpu.get("name"), util_pct=v.get("util_pct"),
            mem_used_mib=_int(v.get("used")), mem_total_mib=_int(v.get("total")),
            sm_clock_mhz=_int(v.get("sm_clock_mhz")),
            sm_clock_max_mhz=_int(v.get("sm_clock_max_mhz")), power_w=v.get("power_w"),
            power_limit_w=v.get("power_limit_w"), temp_c=_int(v.get("temp_c")),
            # the watcher writes one series per active reason; none: none active, if it read
            # the GPU at all (it leaves out what the driver did not say)
            throttle_reasons=tuple(sorted(r for r in gpu["reasons"] if r)), mig=None))
    return out, problems


def told_findings(samples: Sequence[Sample], name: str, instance: str | None) -> list[Finding]:
    """The findings a watcher judged of a host (its gpuwatch_finding series), in words."""
    out = []
    by = f"the gpuwatch watcher at {instance}" if instance else "a gpuwatch watcher"
    for s in samples:
        if s.name != "gpuwatch_finding" or s.value != 1:
            continue
        code, severity = s.labels.get("code", ""), SEVERITIES.get(s.labels.get("severity", ""))
        if not code or severity is None:
            continue
        run = s.labels.get("run") or None
        gpu_text = s.labels.get("gpu", "")
        gpu = int(gpu_text) if gpu_text.isdigit() and len(gpu_text) <= 4 else None
        words = FINDING_WORDS.get(code, code)
        about = f"run {run}: " if run else f"GPU {gpu}: " if gpu is not None else ""
        out.append(Finding(code, severity, f"{about}{words} ({code}, as {by} judged it on "
                                            f"{name}; open the host for the details)",
                           gpu=gpu, run=run, evidence={"source": "prometheus", "by": instance}))
    return out


def _disks(samples: Sequence[Sample]) -> list[DiskUsage]:
    by: dict[tuple[str, str | None], dict[str, int | None]] = {}
    for s in samples:
        if not s.name.startswith("gpuwatch_disk_") or "path" not in s.labels:
            continue
        what = s.name.removeprefix("gpuwatch_disk_")
        by.setdefault((s.labels["path"], s.labels.get("mount")), {})[what] = (
            round(s.value) if math.isfinite(s.value) else None)
    return [DiskUsage(path, mount, v.get("bytes_total"), v.get("bytes_free"),
                      v.get("inodes_total"), v.get("inodes_free"))
            for (path, mount), v in sorted(by.items(), key=lambda kv: kv[0][0])]


def _value(samples: Sequence[Sample], name: str) -> float | None:
    return next((s.value for s in samples if s.name == name and math.isfinite(s.value)), None)


def snapshot_of(name: str, read: FleetRead, labels: PrometheusLabels, kind: str,
                *, gpus: Sequence[GpuSample], events: Sequence[KernelEvent] = (),
                disks: Sequence[DiskUsage] = (), uptime_s: float | None = None,
                problems: Sequence[str] = ()) -> HostSnapshot:
    errors = {"processes": NOT_READ, "gpus.apps": NOT_READ}
    if problems or read.problems:
        errors["prometheus"] = "; ".join([*problems, *read.problems][:3])
    return HostSnapshot(
        host=name, taken_at=read.at, hostname=name, boot_id=None, uptime_s=uptime_s,
        loadavg=None, ncpu=None, gpus=tuple(gpus), gpu_processes=(), gpu_source=kind,
        processes=(), process_counts=None, disks=tuple(disks), cgroup=None,
        kill_user_processes=None, kernel_events=tuple(events), xid_counts={},
        section_errors=errors, probe_s=None, probe_cpu_s=None, gpu_vendor="nvidia")


# --- the source the pipeline polls ---------------------------------------------------------

class PrometheusSource:
    """A Collector's poll for the hosts read from Prometheus: one read of the server serves
    every host polled within `fresh_s` of it."""

    def __init__(self, config: PrometheusConfig, *, fresh_s: float = 5.0,
                 clock: Any = time.time) -> None:
        self.config, self.fresh_s, self.clock = config, fresh_s, clock
        self._read: tuple[float, FleetRead] | None = None
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._told: dict[str, list[Finding]] = {}
        self._instances: dict[str, str] = {
            name: instance for name, (_, instance) in load_known(config.url).items()
            if instance}
        """Each host's `instance` label when it was last seen: where to ask why it is gone."""
        self._targets: tuple[float, dict[str, str]] | None = None

    def _locked(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:  # a --once's loop, then another
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def fleet(self) -> FleetRead:
        """The latest read of the server, read again when older than fresh_s."""
        async with self._locked():
            now = time.monotonic()
            if self._read is not None and now - self._read[0] < self.fresh_s:
                return self._read[1]
            read = await read_fleet(self.config, self.clock)
            self._read = (time.monotonic(), read)
            for host, samples in [*read.dcgm.items(), *read.gpuwatch.items()]:
                instance = next((s.labels["instance"] for s in samples
                                 if "instance" in s.labels), None)
                if instance:
                    self._instances[host] = instance
            return read

    def findings(self, name: str) -> list[Finding]:
        """What the watcher of a host judged of it, as of the latest read."""
        return list(self._told.get(name, ()))

    async def poll(self, host: HostConfig,
                   runs: Mapping[str, RunSeries] | None = None) -> PollOutcome:
        """One host's poll, from the latest read. Never raises: a failure is this host's
        `source` error (or the watcher's own kind, where a watcher could not poll it)."""
        started_at, t0 = self.clock(), time.monotonic()
        try:
            read = await self.fleet()
            outcome = await self._outcome(host, read, started_at, t0)
        except SourceError as exc:
            self._told.pop(host.name, None)
            return PollOutcome(host, started_at, time.monotonic() - t0, None, None, exc.kind,
                               exc.message)
        except Exception as exc:  # a bug of ours: this host's error, logged
            from ..wire.collect import internal_failure

            return internal_failure(host, started_at, exc, "reading Prometheus for",
                                    time.monotonic() - t0)
        return outcome

    async def _outcome(self, host: HostConfig, read: FleetRead, started_at: float,
                       t0: float) -> PollOutcome:
        name, labels = host.name, self.config.labels
        where = shown(self.config.url)
        self._told.pop(name, None)
        if name not in read.dcgm and name not in read.gpuwatch:
            if name == SOURCE_HOST and host.ssh == self.config.url:
                raise SourceError(nothing_matches(self.config) if not read.names else
                                  f"Prometheus at {where} answers now, but did not when "
                                  f"gpuwatch started: start it again to list its "
                                  f"{len(read.names)} hosts")
            raise SourceError(await self._missing(name, read))
        if name in read.gpuwatch:
            samples = read.gpuwatch[name]
            instance = next((s.labels["instance"] for s in samples if "instance" in s.labels),
                            None)
            by = f"the gpuwatch watcher at {instance}" if instance else "its gpuwatch watcher"
            if _value(samples, "gpuwatch_up") == 0:
                kind = next((s.labels.get("kind") for s in samples
                             if s.name == "gpuwatch_poll_error"), None) or "source"
                raise SourceError(f"{by} could not poll it ({kind}), as Prometheus at {where} "
                                  "says", kind=kind)
            polled = _value(samples, "gpuwatch_last_poll_timestamp_seconds")
            if polled is not None and read.at - polled > self.config.max_age_s:
                raise SourceError(f"{by} last polled it {duration(read.at - polled)} ago "
                                  f"(over max_age_s = {self.config.max_age_s:g} s): is it "
                                  "still running?")
            gpus, problems = gpuwatch_gpus(samples)
            snap = snapshot_of(name, read, labels, "gpuwatch via prometheus", gpus=gpus,
                               disks=_disks(samples), problems=problems,
                               uptime_s=_value(samples, "gpuwatch_uptime_seconds"))
            self._told[name] = told_findings(samples, name, instance)
        else:
            gpus, events, problems = dcgm_gpus(read.dcgm[name], labels)
            if not gpus:
                raise SourceError(f"Prometheus at {where} has series of {name}, but none "
                                  f"with a GPU index ({'; '.join(problems[:2])})")
            snap = snapshot_of(name, read, labels, "dcgm-exporter via prometheus", gpus=gpus,
                               events=events, problems=problems)
        poll_s = time.monotonic() - t0
        share = read.bytes // max(1, len(read.names))
        return PollOutcome(host, started_at, poll_s, replace(snap, poll_s=poll_s), None,
                           bytes_received=share)

    async def _missing(self, name: str, read: FleetRead) -> str:
        """Why the server has no series of a host now: its scrape failing (the server's own
        words) where the host was seen before, else that nothing matches."""
        where = shown(self.config.url)
        instance = self._instances.get(name)
        if instance is not None:
            with contextlib.suppress(SourceError):
                health = await self._target_health()
                if instance in health:
                    return (f"Prometheus at {where} cannot scrape {instance}, whose series "
                            f"said {name}: {health[instance]}")
            return (f"Prometheus at {where} has no series of {name} now (its exporter at "
                    f"{instance} is no longer scraped, or the node is gone)")
        label = self.config.labels.host
        return (f"Prometheus at {where} has no series of {name} (DCGM exporter's "
                f"{label}=\"{name}\" or a watcher's host=\"{name}\""
                f"{', with ' + self.config.selector if self.config.selector else ''}): "
                "check the name, the selector and that the exporter is scraped")

    async def _target_health(self) -> dict[str, str]:
        """instance -> the scrape's error, for the targets whose last scrape failed
        (`/api/v1/targets`), read at most once per fresh_s."""
        now = time.monotonic()
        if self._targets is not None and now - self._targets[0] < self.fresh_s:
            return self._targets[1]
        status, doc, _ = await get_json(f"{self.config.url}/api/v1/targets?state=active",
                                        timeout_s=self.config.timeout_s,
                                        max_bytes=self.config.max_bytes)
        out: dict[str, str] = {}
        targets = doc.get("data", {}).get("activeTargets") if isinstance(doc, Mapping) else None
        for target in targets if status == 200 and isinstance(targets, list) else ():
            if not isinstance(target, Mapping) or target.get("health") == "up":
                continue
            labels = target.get("labels")
            instance = labels.get("instance") if isinstance(labels, Mapping) else None
            error = target.get("lastError")
            if isinstance(instance, str):
                out[instance] = (error[:200] if isinstance(error, str) and error
                                 else f"its scrape is {target.get('health')}")
        self._targets = (now, out)
        return out


# --- which hosts -----------------------------------------------------------------------------

def with_source_hosts(config: Config, clock: Any = time.time) -> Config:
    """The config with every host the server knows that it does not list, each to be read
    from Prometheus (its `ssh` its name, for opening it; the [ssh] defaults), and those it
    had series of in the last FORGET_S (known_hosts): a node gone from the server is a host
    whose poll says so, not one that quietly left the fleet. A server that cannot be read
    adds one host, SOURCE_HOST, whose poll says why. Without [sources.prometheus], the config
    as it is. Bounded by timeout_s."""
    source = config.sources.prometheus
    if source is None:
        return config
    try:
        read: FleetRead | None = asyncio.run(read_fleet(source))
    except SourceError:
        read = None
    known = load_known(source.url)
    now = clock()
    if read is not None:
        for host, samples in [*read.dcgm.items(), *read.gpuwatch.items()]:
            instance = next((s.labels["instance"] for s in samples if "instance" in s.labels),
                            known.get(host, (0.0, None))[1])
            known[host] = (now, instance)
        known = {h: v for h, v in known.items() if now - v[0] <= FORGET_S}
        save_known(source.url, known)
    listed = {h.name for h in config.hosts}
    names = sorted(known)
    added = [HostConfig(name=n, ssh=n, settings=config.ssh, source="prometheus")
             for n in names if n not in listed]
    if (read is None or not read.names) and SOURCE_HOST not in listed:
        added.append(HostConfig(name=SOURCE_HOST, ssh=source.url, settings=config.ssh,
                                source="prometheus"))
    return replace(config, hosts=(*config.hosts, *added))


FORGET_S = 7 * 86400.0
"""A host the server had series of is listed (with the source's error) this long after."""
KNOWN_FILE = "prometheus-hosts.json"
KNOWN_MAX_BYTES = 8 << 20
KNOWN_MAX_HOSTS = 50_000


def _known_path() -> Path:
    from ..paths import state_dir

    return state_dir() / KNOWN_FILE


def load_known(url: str) -> dict[str, tuple[float, str | None]]:
    """Hosts a server had series of: name -> (when last seen, its `instance`), from the
    state folder's KNOWN_FILE; anything unreadable or malformed: none (it is a convenience)."""
    try:
        path = _known_path()
        if path.stat().st_size > KNOWN_MAX_BYTES:
            return {}
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    hosts = doc.get("servers", {}).get(url) if isinstance(doc, dict) and isinstance(
        doc.get("servers"), dict) else None
    out: dict[str, tuple[float, str | None]] = {}
    for name, entry in (hosts.items() if isinstance(hosts, dict) else ()):
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int | float) \
                and not isinstance(entry[0], bool) and isinstance(entry[1], str | None):
            out[name] = (float(entry[0]), entry[1])
    return dict(list(out.items())[:KNOWN_MAX_HOSTS])


def save_known(url: str, known: Mapping[str, tuple[float, str | None]]) -> None:
    """Write the server's known hosts beside the others' (atomically; a failure is silent:
    the next run learns them again from the server)."""
    path = _known_path()
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(doc, dict) or not isinstance(doc.get("servers"), dict):
            doc = {"servers": {}}
    except (OSError, ValueError, RecursionError):
        doc = {"servers": {}}
    doc["servers"][url] = {name: list(v) for name, v in
                           sorted(known.items(), key=lambda kv: -kv[1][0])[:KNOWN_MAX_HOSTS]}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)


def nothing_matches(source: PrometheusConfig) -> str:
    """The server answers, with no series of any host: in words, with what to check."""
    return (f"Prometheus at {shown(source.url)} has no series of "
            f"{' or '.join(_what(k) for k in source.metrics)}"
            f"{' matching ' + source.selector if source.selector else ''} with a host label: "
            "is the exporter scraped, and do the selector and labels match it?")


def _what(kind: str) -> str:
    return "DCGM exporter (DCGM_FI_DEV_*)" if kind == "dcgm" else "gpuwatch watchers (gpuwatch_*)"
