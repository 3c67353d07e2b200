"""`[sources.prometheus]` and a host's `source`: what they accept, their defaults, and the
errors (file, line, key, what was expected) for what they do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import ConfigError, PrometheusConfig, PrometheusLabels


def test_a_prometheus_source_with_its_defaults_and_every_key() -> None:
    config = parse_config('[sources.prometheus]\nurl = "http://prom:9090/"\n')
    assert config.sources.prometheus == PrometheusConfig(url="http://prom:9090")
    assert config.hosts == ()
    full = parse_config(
        '[sources.prometheus]\nurl = "https://u:p@prom.example/prefix"\ntimeout_s = 2.5\n'
        'max_bytes = 2048\nmetrics = ["gpuwatch"]\nselector = \'cluster="a", job!~"te.*"\'\n'
        'max_age_s = 60\n[sources.prometheus.labels]\nhost = "instance"\nuuid = "uuid"\n'
        '[hosts.n1]\nsource = "prometheus"\n[hosts.box]\nssh = "box"\n')
    prom = full.sources.prometheus
    assert prom == PrometheusConfig(
        url="https://u:p@prom.example/prefix", timeout_s=2.5, max_bytes=2048,
        metrics=("gpuwatch",), selector='cluster="a", job!~"te.*"', max_age_s=60.0,
        labels=PrometheusLabels(host="instance", uuid="uuid"))
    assert [(h.name, h.source) for h in full.hosts] == [("n1", "prometheus"), ("box", "ssh")]


BAD = """\
[sources.prometheus]
url = "ftp://x"
selector = 'up{a="b"} or vector(1)'
metrics = ["nvml"]
timeout_s = 0
max_bytes = 10
speed = 3
[sources.prometheus.labels]
host = "a-b"
gpu2 = "x"
[hosts.n1]
source = "prometheus"
[hosts.n1.runs.r]
process = "x"
[hosts.n2]
source = "slurm"
"""


def test_every_error_of_the_source_says_where_and_what() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BAD, Path("c.toml"))
    assert caught.value.lines == [
        "c.toml:2: sources.prometheus.url: expected an http:// or https:// URL, got 'ftp://x'",
        'c.toml:3: sources.prometheus.selector: expected label matchers like cluster="a", '
        'job!="test" (name, one of = != =~ !~, a double-quoted value), got '
        "'up{a=\"b\"} or vector(1)'",
        "c.toml:4: sources.prometheus.metrics: expected a list naming dcgm, gpuwatch or both, "
        "got 'nvml'",
        "c.toml:5: sources.prometheus.timeout_s: expected a number greater than 0 and at most "
        "300, got 0",
        "c.toml:6: sources.prometheus.max_bytes: expected an integer from 1024 to 1073741824, "
        "got 10",
        "c.toml:7: sources.prometheus.speed: unknown key (expected one of: labels, max_age_s, "
        "max_bytes, metrics, selector, timeout_s, url)",
        "c.toml:9: sources.prometheus.labels.host: expected a Prometheus label name (letters, "
        "digits, _), got 'a-b'",
        "c.toml:10: sources.prometheus.labels.gpu2: unknown key (expected one of: gpu, host, "
        "model, pci, uuid)",
        "c.toml:12: hosts.n1.source: a host read from Prometheus has no runs (runs are read "
        "from their files over SSH): remove its runs or the source key",
        "c.toml:16: hosts.n2.source: expected one of ssh, prometheus, got 'slurm'"]


@pytest.mark.parametrize(("text", "line"), [
    ('[hosts.a]\nsource = "prometheus"\n',
     'c.toml:2: hosts.a.source: source = "prometheus" needs a [sources.prometheus] table with '
     "the server's url"),
    ("[sources.prometheus]\ntimeout_s = 3\n",
     'c.toml:1: sources.prometheus: url is required: the server\'s address, e.g. url = '
     '"http://127.0.0.1:9090"'),
    ('[sources.prometheus]\nurl = "http://h:99999"\n',
     "c.toml:2: sources.prometheus.url: not a URL with a valid port: 'http://h:99999'"),
    ('[sources.prometheus]\nurl = "http://h:9090/?x=1"\n',
     "c.toml:2: sources.prometheus.url: the server's base URL, without ?query or #fragment"),
    ('[sources.prometheus]\nurl = "http://h"\nmetrics = []\n',
     "c.toml:3: sources.prometheus.metrics: expected a list naming dcgm, gpuwatch or both, "
     "got 'none'"),
    ("[sources]\nslurm = 1\n",
     "c.toml:2: sources.slurm: unknown key (expected one of: prometheus)"),
])
def test_a_source_that_cannot_work_is_refused(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Path("c.toml"))
    assert caught.value.lines == [line]
