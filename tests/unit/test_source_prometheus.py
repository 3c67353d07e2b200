"""remote/sources/prometheus.py without a Prometheus: the API's answers parsed by the format
(and a property test over whatever JSON comes), DCGM exporter's series of a real capture as
GPUs, a watcher's exposition read back as it was written, and the source's bounds against a
stand-in server on loopback that misbehaves on purpose (slow, huge, not JSON, an error, a gzip
bomb). The real server: tests/integration/test_prometheus.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import HostConfig, PrometheusConfig, PrometheusLabels
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.model.snapshot import GpuSample, HostSnapshot
from gpuwatch.remote.report import HostReport, prometheus_text
from gpuwatch.remote.sources import prometheus as source
from gpuwatch.remote.sources.http import SourceError
from gpuwatch.remote.store import Store
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.wire.collect import PollOutcome
from harness.captures import capture
from hypothesis import given, settings
from hypothesis import strategies as st

LINE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def vector(text: str, at: float = 1000.0) -> dict[str, Any]:
    """An exposition (the capture's, or report.py's) as the query API answers it: what a
    Prometheus that scraped it says of `{__name__=~".+"}` (test helper: plain lines only)."""
    result = []
    for line in text.splitlines():
        found = LINE.match(line)
        if found is None or line.startswith("#"):
            continue
        name, labels, value = found.groups()
        metric = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in LABEL.findall(labels or "")}
        result.append({"metric": {"__name__": name, **metric}, "value": [at, value]})
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def samples_by_host(doc: dict[str, Any], label: str) -> dict[str, list[source.Sample]]:
    samples, problems, _ = source.parse_vector(doc, "test")
    assert problems == []
    out: dict[str, list[source.Sample]] = {}
    for s in samples:
        if label in s.labels:
            out.setdefault(s.labels[label], []).append(s)
    return out


# --- the API's answers ---------------------------------------------------------------------

def test_an_answer_is_read_by_its_format_and_a_bad_item_is_left_out_by_name() -> None:
    doc = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"}, "value": [12.5, "97"]},
        {"metric": {"__name__": "x"}, "value": [13, "NaN"]},
        {"metric": {"gpu": 0}, "value": [1, "1"]},
        {"metric": {}, "value": [1, 2]},
        {"metric": {}, "value": [1, "one"]},
        "nonsense"]}}
    samples, problems, at = source.parse_vector(doc, "q")
    assert [(s.name, dict(s.labels)) for s in samples] == [
        ("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}), ("x", {})]
    assert samples[0].value == 97 and math.isnan(samples[1].value) and at == 13
    assert problems == [
        "q: result[2] left out: metric: expected an object of label names to strings",
        'q: result[3] left out: value: expected [time, "number"]',
        "q: result[4] left out: value: 'one' is no number",
        "q: result[5] left out: not an object"]


@pytest.mark.parametrize(("doc", "said"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
     "q: the server said: parse error at char 3"),
    ([], "q: the answer is no JSON object"),
    ({"status": "success"}, 'q: expected status "success" and a data object'),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}},
     "q: expected a vector result, got 'matrix'"),
])
def test_an_answer_that_is_no_vector_says_what_is_wrong(doc: object, said: str) -> None:
    with pytest.raises(SourceError) as caught:
        source.parse_vector(doc, "q")
    assert caught.value.message == said and caught.value.kind == "source"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSONISH, st.lists(st.tuples(st.dictionaries(st.text(max_size=6), st.text(max_size=6),
                                                   max_size=3), JSONISH), max_size=4))
def test_whatever_json_comes_the_parser_says_source_error_or_keeps_what_is_good(
        anything: Any, items: list[tuple[dict[str, str], Any]]) -> None:
    for doc in (anything, {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": v} for m, v in items]}}):
        try:
            samples, problems, _ = source.parse_vector(doc, "q")
        except SourceError:
            continue
        assert len(samples) + len(problems) == len(doc["data"]["result"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                          st.floats(allow_nan=True, allow_infinity=True)), max_size=6))
def test_well_formed_vectors_keep_every_value(series: list[tuple[str, float]]) -> None:
    doc = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": name, "i": str(i)}, "value": [1.5, repr(v) if math.isfinite(v)
                                                              else {math.inf: "+Inf",
                                                                    -math.inf: "-Inf"}.get(v,
                                                                                           "NaN")]}
        for i, (name, v) in enumerate(series)]}}
    samples, problems, _ = source.parse_vector(doc, "q")
    assert problems == [] and len(samples) == len(series)
    for s, (name, v) in zip(samples, series, strict=True):
        assert s.name == name and (s.value == v or (math.isnan(s.value) and math.isnan(v)))


# --- DCGM exporter's series ----------------------------------------------------------------

def test_a_real_dcgm_exporter_page_reads_as_its_hosts_gpus() -> None:
    page = capture("dcgm-exporter", "datadog-dcgm-metrics.txt").read_text()
    hosts = samples_by_host(vector(page), "Hostname")
    labels = PrometheusLabels()
    t4, events, problems = source.dcgm_gpus(hosts["424773df46e0"], labels)
    assert problems == [] and events == []  # XID_ERRORS 0: no Xid
    assert [(g.index, g.uuid, g.name, g.util_pct, g.sm_clock_mhz, g.power_w, g.temp_c,
             g.mem_used_mib, g.mem_total_mib) for g in t4] == [
        (0, "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "Tesla T4", 0.0, 300, 8.969, 25, 0,
         15109)]  # total: used + free, where FB_TOTAL is not exported
    other, _, _ = source.dcgm_gpus(hosts["551bdf382151"], labels)
    assert [(g.power_limit_w, g.mem_total_mib, g.throttle_reasons, g.util_pct)
            for g in other] == [(70.0, 15109, ("gpu_idle",), None)]
    # ip-11111 has only DCGM_FI_PROF_DRAM_ACTIVE, which gpuwatch does not read
    assert "ip-11111" in hosts
    assert "DCGM_FI_PROF_DRAM_ACTIVE" not in source.DCGM_FIELDS


def dcgm(name: str, value: float, **labels: str) -> source.Sample:
    return source.Sample(name, {"Hostname": "n", "gpu": "0", "UUID": "GPU-a", **labels}, value)


def test_a_mig_gpu_is_one_gpu_and_a_gpu_scraped_twice_counts_once() -> None:
    samples = [dcgm("DCGM_FI_DEV_FB_USED", 1000, GPU_I_ID="3"),
               dcgm("DCGM_FI_DEV_FB_USED", 2000, GPU_I_ID="5"),
               dcgm("DCGM_FI_DEV_FB_USED", 2000, GPU_I_ID="5", job="again"),
               dcgm("DCGM_FI_DEV_FB_FREE", 10, GPU_I_ID="3"),
               dcgm("DCGM_FI_DEV_FB_FREE", 20, GPU_I_ID="5"),
               dcgm("DCGM_FI_DEV_SM_CLOCK", 1410, GPU_I_ID="3"),
               dcgm("DCGM_FI_DEV_SM_CLOCK", 1410, GPU_I_ID="5"),
               dcgm("DCGM_FI_DEV_XID_ERRORS", 79, pci_bus_id="00000000:3B:00.0"),
               dcgm("DCGM_FI_DEV_GPU_UTIL", 5, gpu="x")]
    gpus, events, problems = source.dcgm_gpus(samples, PrometheusLabels())
    assert [(g.mig, g.mem_used_mib, g.mem_total_mib, g.sm_clock_mhz) for g in gpus] == [
        (True, 3000, 3030, 1410)]
    assert [(e.kind, e.xid, e.pci) for e in events] == [("xid", 79, "00000000:3B:00.0")]
    assert problems == ["DCGM_FI_DEV_GPU_UTIL: no GPU index in label gpu='x'"]


def test_a_dcgm_xid_is_a_gpu_xid_finding_once() -> None:
    """U22: DCGM keeps the last Xid: said the poll it appears, not again each poll."""
    from gpuwatch.remote.config.thresholds import Thresholds
    from gpuwatch.remote.findings.evaluate import evaluate
    from gpuwatch.remote.model.history import HostHistory

    read = source.FleetRead(at=100.0)
    gpus, events, _ = source.dcgm_gpus([dcgm("DCGM_FI_DEV_XID_ERRORS", 0),
                                        dcgm("DCGM_FI_DEV_GPU_UTIL", 90)], PrometheusLabels())
    history = HostHistory("n", thresholds=Thresholds())
    history.record(source.snapshot_of("n", read, PrometheusLabels(), "dcgm", gpus=gpus,
                                      events=events), 100.0)
    assert [f.code for f in evaluate(history).apply(history)] == []
    pci = {"pci_bus_id": "00000000:3B:00.0"}  # which GPU the Xid is of (exporters >= 3.x)
    gpus, events, _ = source.dcgm_gpus([dcgm("DCGM_FI_DEV_XID_ERRORS", 79, **pci),
                                        dcgm("DCGM_FI_DEV_GPU_UTIL", 90, **pci)],
                                       PrometheusLabels())
    for at in (110.0, 120.0):
        history.record(source.snapshot_of("n", replace(read, at=at), PrometheusLabels(),
                                          "dcgm", gpus=gpus, events=events), at)
        found = [f for f in evaluate(history).apply(history) if f.code == "gpu.xid"]
        if at == 110.0:
            assert [(f.severity, f.gpu) for f in found] == [(Severity.CRITICAL, 0)]
        else:
            assert found == []


# --- a watcher's exposition, read back -----------------------------------------------------

def snapshot(gpus: tuple[GpuSample, ...]) -> HostSnapshot:
    return HostSnapshot("w", 5000.0, "w", "boot", 100.0, None, 1, gpus, (), "nvml", (), None,
                        (), None, None, (), {}, {}, None, None)


def test_a_watchers_gpus_and_findings_read_back_as_it_wrote_them() -> None:
    gpus = (GpuSample(0, "GPU-1", "NVIDIA H100 80GB HBM3", 97.0, 70000, 81559, 1980, 1980,
                      650.5, 700.0, 61, ("sw_power_cap", "hw_slowdown"), None),
            GpuSample(1, "GPU-2", 'odd "name"', None, None, None, None, None, None, None, None,
                      (), None))
    outcome = PollOutcome(HostConfig(name="w", ssh="w"), 1000.0, 0.5, snapshot(gpus), None)
    told = [Finding("run.dead", Severity.CRITICAL, "run llama died", run="llama"),
            Finding("gpu.throttled", Severity.WARNING, "GPU 0 slowed", gpu=0)]
    text = prometheus_text([HostReport(outcome, told)])
    samples = samples_by_host(vector(text), "host")["w"]
    read_back, problems = source.gpuwatch_gpus(samples)
    assert problems == []
    assert [replace(g, throttle_reasons=tuple(sorted(g.throttle_reasons or ())))
            for g in gpus] == read_back
    findings = source.told_findings(samples, "w", "127.0.0.1:9464")
    assert [(f.code, f.severity, f.run, f.gpu) for f in findings] == [
        ("run.dead", Severity.CRITICAL, "llama", None),
        ("gpu.throttled", Severity.WARNING, None, 0)]
    assert findings[0].message.startswith("run llama: run died (run.dead, as the gpuwatch "
                                          "watcher at 127.0.0.1:9464 judged it on w")


# --- the source against a stand-in server --------------------------------------------------

Handler = Callable[[str], "tuple[int, bytes, dict[str, str]] | None"]


@asynccontextmanager
async def api(handler: Handler, port: int = 0) -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback HTTP server answering each request's target with `handler` (None: never
    answer); its URL and the targets asked, in order."""
    asked: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        target = head.split(b" ")[1].decode()
        asked.append(target)
        answer = handler(target)
        if answer is None:
            await asyncio.sleep(3600)
            return
        status, body, headers = answer
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"HTTP/1.0 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                     .encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        server.close()


def answering(doc: object, status: int = 200) -> Handler:
    return lambda _target: (status, json.dumps(doc).encode(), {})


def one_gpu(host: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": host, "gpu": "0",
                    "UUID": f"GPU-{host}", "instance": "10.0.0.1:9400"},
         "value": [1234.5, "55"]}]}}


async def poll(url: str, host: str = "n1", **changes: Any) -> PollOutcome:
    config = PrometheusConfig(url=url, **{"timeout_s": 2.0, "metrics": ("dcgm",), **changes})
    return await source.PrometheusSource(config).poll(HostConfig(name=host, ssh=host,
                                                                 source="prometheus"))


async def test_a_host_polled_from_the_server_lands_its_gpus() -> None:
    async with api(answering(one_gpu("n1"))) as (url, asked):
        outcome = await poll(url)
    assert outcome.ok and outcome.snapshot is not None
    assert [(g.util_pct, g.uuid) for g in outcome.snapshot.gpus] == [(55.0, "GPU-n1")]
    assert outcome.snapshot.taken_at == 1234.5
    assert "processes" in outcome.snapshot.section_errors  # not "none running"
    (target,) = asked
    assert target.startswith("/api/v1/query?query=") and "DCGM_FI_DEV_GPU_UTIL" in target


@pytest.mark.parametrize(("handler", "said"), [
    (lambda _t: None, "did not answer within 2 s"),
    (lambda _t: (200, b"<html>hello</html>", {}), "sent no JSON (is it a Prometheus API?)"),
    (answering({"status": "error", "errorType": "bad_data", "error": "parse error"}, 400),
     "the dcgm series: the server said: parse error"),
    (lambda _t: (503, b"Service Unavailable", {}), "answered HTTP 503: Service Unavailable"),
    (lambda _t: (200, b"[" + b"1," * 4000 + b"1]", {}), "over max_bytes (4096)"),
    (lambda _t: (200, gzip.compress(b" " * 100_000), {"Content-Encoding": "gzip"}),
     "inflates to over max_bytes (4096)"),
    (answering({"status": "success", "data": {"resultType": "vector", "result": []}}),
     'has no series of n1 (DCGM exporter\'s Hostname="n1" or a watcher\'s host="n1"'),
])
async def test_what_goes_wrong_is_the_hosts_source_error_in_words(handler: Handler,
                                                                   said: str) -> None:
    async with api(handler) as (url, _):
        outcome = await poll(url, max_bytes=4096)
    assert not outcome.ok and outcome.error_kind == "source"
    assert said in (outcome.error_message or ""), outcome.error_message


async def test_a_server_that_is_down_is_said_so() -> None:
    async with api(answering({})) as (url, _):
        pass  # closed: nothing listens there now
    outcome = await poll(url)
    assert outcome.error_kind == "source"
    assert outcome.error_message == (f"cannot reach {url}/api/v1/query: connection refused "
                                     "(nothing listens there)")


async def test_one_read_serves_a_round_of_many_hosts() -> None:
    names = [f"n{i}" for i in range(50)]
    doc = {"status": "success", "data": {"resultType": "vector", "result": [
        r for n in names for r in one_gpu(n)["data"]["result"]]}}
    async with api(answering(doc)) as (url, asked):
        src = source.PrometheusSource(PrometheusConfig(url=url, metrics=("dcgm",)),
                                      fresh_s=60.0)
        outcomes = await asyncio.gather(*(src.poll(HostConfig(name=n, ssh=n,
                                                              source="prometheus"))
                                          for n in names))
    assert all(o.ok for o in outcomes)
    assert len(asked) == 1  # one query for the fifty, not fifty


async def test_a_host_gone_from_the_server_says_why_in_its_words() -> None:
    targets = {"status": "success", "data": {"activeTargets": [
        {"labels": {"instance": "10.0.0.1:9400"}, "health": "down",
         "lastError": 'Get "http://10.0.0.1:9400/metrics": connection refused'}]}}
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    state = {"gone": False}

    def handler(target: str) -> tuple[int, bytes, dict[str, str]]:
        if target.startswith("/api/v1/targets"):
            return 200, json.dumps(targets).encode(), {}
        return 200, json.dumps(empty if state["gone"] else one_gpu("n1")).encode(), {}

    async with api(handler) as (url, _):
        src = source.PrometheusSource(PrometheusConfig(url=url, metrics=("dcgm",)), fresh_s=0)
        host = HostConfig(name="n1", ssh="n1", source="prometheus")
        assert (await src.poll(host)).ok
        state["gone"] = True
        outcome = await src.poll(host)
    assert outcome.error_message == (
        f"Prometheus at {url} cannot scrape 10.0.0.1:9400, whose series said n1: "
        'Get "http://10.0.0.1:9400/metrics": connection refused')


# --- the hosts it adds, and the pipeline ---------------------------------------------------

def test_the_fleet_lists_the_servers_hosts_and_remembers_the_gone_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    served: dict[str, Any] = {"doc": {"status": "success", "data": {
        "resultType": "vector", "result": one_gpu("a")["data"]["result"]
        + one_gpu("b")["data"]["result"]}}}

    from harness.prometheus import free_port

    port = free_port()  # one server URL: what it knew is remembered by its URL

    async def run(clock: float) -> list[HostConfig]:
        async with api(lambda _t: (200, json.dumps(served["doc"]).encode(), {}),
                       port) as (url, _):
            config = parse_config(f'[sources.prometheus]\nurl = "{url}"\nmetrics = ["dcgm"]\n'
                                  '[hosts.mine]\nssh = "local"\n')
            hosts = await asyncio.to_thread(source.with_source_hosts, config, lambda: clock)
        return list(hosts.hosts)

    hosts = asyncio.run(run(time.time()))
    assert [(h.name, h.source, h.ssh) for h in hosts] == [
        ("mine", "ssh", "local"), ("a", "prometheus", "a"), ("b", "prometheus", "b")]
    served["doc"] = one_gpu("a")  # b is gone from the server: still listed, for a week
    assert [h.name for h in asyncio.run(run(time.time() + 3600))] == ["mine", "a", "b"]
    assert [h.name for h in asyncio.run(run(time.time() + source.FORGET_S + 7200))] \
        == ["mine", "a"]
    (tmp_path / "state" / "gpuwatch" / source.KNOWN_FILE).write_text("{not json")
    assert [h.name for h in asyncio.run(run(time.time()))] == ["mine", "a"]


def test_a_server_down_at_start_is_one_host_that_says_so(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def closed_url() -> str:
        async with api(answering({})) as (url, _):
            return url

    url = asyncio.run(closed_url())
    config = parse_config(f'[sources.prometheus]\nurl = "{url}"\ntimeout_s = 2\n')
    hosts = source.with_source_hosts(config).hosts
    assert [(h.name, h.ssh, h.source) for h in hosts] == [(source.SOURCE_HOST, url,
                                                           "prometheus")]
    with Store.open(tmp_path / "s.sqlite3") as store:
        fleet = FleetWatch(replace(config, hosts=hosts), store, role="once")
        (report,) = fleet.round_sync()
    assert report.outcome.error_kind == "source"
    assert report.verdict.headline.startswith("no data from its source: cannot reach")


async def test_a_watchers_verdict_is_the_hosts_in_every_output(tmp_path: Path) -> None:
    """A run the watcher saw die is critical here too, named as the watcher's finding."""
    told = [Finding("run.dead", Severity.CRITICAL, "run llama died", run="llama")]
    gpus = (GpuSample(0, "GPU-1", "H100", 97.0, 70000, 81559, 1980, 1980, 650.0, 700.0, 61,
                      (), None),)
    outcome = PollOutcome(HostConfig(name="w", ssh="w"), time.time() - 2, 0.5,
                          snapshot(gpus), None)
    exposition = prometheus_text([HostReport(outcome, told)])
    doc = vector(exposition, at=time.time())
    async with api(answering(doc)) as (url, _):
        config = parse_config(f'[sources.prometheus]\nurl = "{url}"\n'
                              '[hosts.w]\nsource = "prometheus"\n')
        with Store.open(tmp_path / "s.sqlite3") as store:
            fleet = FleetWatch(config, store, role="once")
            (report,) = await fleet.round()
    assert report.outcome.ok
    assert [(f.code, f.run) for f in report.findings] == [("run.dead", "llama")]
    assert (report.verdict.severity, report.verdict.code) == (Severity.CRITICAL, "run.dead")
    assert 'gpuwatch_host_severity{host="w",code="run.dead"} 3' in prometheus_text([report])
