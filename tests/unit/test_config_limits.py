"""Config numbers and config errors: every number has a range, every error is one line naming
file:line:key, all of a file's errors come at once, and nothing but ConfigError gets out.

Each file in tests/data/configs/ holds one kind of bad config; its `# error:` lines at the top
say exactly the lines the loader must report (`...` stands for any text)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from gpuwatch.remote.config.load import load_file, parse_config
from gpuwatch.remote.config.schema import (
    SSH_RANGES,
    TOP_RANGES,
    Config,
    ConfigError,
    SshSettings,
    threshold_ranges,
)
from gpuwatch.remote.config.thresholds import HISTORY_LEN, Thresholds
from gpuwatch.tui.cli.command import EXIT_CONFIG
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

CONFIGS = Path(__file__).parents[1] / "data" / "configs"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def expected_errors(path: Path) -> list[str]:
    """The `# error: LINE: TEXT` lines a fixture opens with."""
    lines = path.read_text(encoding="utf-8").split("\n")
    return [line.removeprefix("# error: ") for line in lines if line.startswith("# error: ")]


def matches(pattern: str, line: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(re.escape("..."), ".*"), line) is not None


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_each_bad_config_is_every_error_on_its_line(path: Path) -> None:
    expected = expected_errors(path)
    assert expected, f"{path.name} says no error it expects"
    with pytest.raises(ConfigError) as info:
        load_file(path)
    lines = info.value.lines
    assert len(lines) == len(expected), lines
    for want, got in zip(expected, lines, strict=True):
        assert matches(f"{path}:{want}", got), (want, got)
        assert "\n" not in got and not _CONTROL.search(got)
    assert str(info.value) == "\n".join(lines)
    first = info.value
    assert first.path == path and lines[0].startswith(f"{path}:{first.line}: ")


def test_cli_prints_every_error_and_exits_78() -> None:
    path = CONFIGS / "many_errors.toml"
    out = subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "check", "--config",
                          str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_CONFIG
    assert "config OK" not in out.stdout
    got = out.stderr.splitlines()
    expected = expected_errors(path)
    assert len(got) == len(expected), out.stderr
    for want, line in zip(expected, got, strict=True):
        assert matches(f"gpuwatch: config error: {path}:{want}", line), (want, line)


def test_an_escape_in_a_key_never_reaches_the_terminal() -> None:
    path = CONFIGS / "host_name_escape.toml"
    out = subprocess.run([sys.executable, "-m", "gpuwatch.tui.cli", "check", "--config",
                          str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_CONFIG
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
    assert '"bad\\u001b]2;x\\u0007"' in out.stderr


@pytest.mark.parametrize("opener", ["[", "{a="])
def test_nesting_too_deep_is_a_config_error(opener: str) -> None:
    text = "interval = 5\n\nx = " + opener * 50_000 + "\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, Path("c.toml"))
    assert info.value.line == 3 and "nested too deeply" in str(info.value)


def test_the_edges_of_each_range_load() -> None:
    config = parse_config("interval = 1\n[ssh]\ncommand_timeout = 3600\nconnect_timeout = 0.01\n"
                          "server_alive_count_max = 100\n[thresholds]\ndisk_low_pct = 0\n"
                          "inodes_low_pct = 100\nclock_low_ratio = 1\nsustain_polls = 64\n"
                          "disk_low_bytes = 0\nxid_critical = [1, 65535]\n")
    assert config.interval == 1.0 and isinstance(config.interval, float)
    assert config.ssh.command_timeout == 3600.0 and isinstance(config.ssh.command_timeout, float)
    assert config.ssh.server_alive_count_max == 100
    th = config.thresholds
    assert th is not None and (th.disk_low_pct, th.inodes_low_pct) == (0.0, 100.0)
    assert th.sustain_polls == HISTORY_LEN and th.xid_critical == (1, 65535)
    assert parse_config("interval = 86400").interval == 86400.0


def test_every_number_has_a_range_that_holds_its_default() -> None:
    """A new numeric setting cannot land without a range (and a default outside it)."""
    ranges = threshold_ranges()
    defaults = Thresholds()
    for f in fields(Thresholds):
        value = getattr(defaults, f.name)
        if isinstance(value, tuple) and not (value and isinstance(value[0], int)):
            continue  # lists of strings
        assert f.name in ranges, f"Thresholds.{f.name} has no range in config.threshold_ranges"
        for v in value if isinstance(value, tuple) else (value,):
            assert ranges[f.name].holds(v), (f.name, v)
            assert isinstance(v, int) == ranges[f.name].integer, f.name
    ssh = SshSettings()
    numeric = {f.name for f in fields(SshSettings) if isinstance(getattr(ssh, f.name), int | float)}
    assert numeric == set(SSH_RANGES)
    assert all(SSH_RANGES[k].holds(getattr(ssh, k)) for k in numeric)
    assert TOP_RANGES["interval"].holds(Config().interval)


# --- property: whatever the document, only ConfigError ----------------------------------------

def config_error(text: str) -> ConfigError | None:
    """None when text loads, else its ConfigError (anything else propagates: the failure)."""
    try:
        parse_config(text, Path("c.toml"))
    except ConfigError as err:
        return err
    return None


def assert_loads_or_config_error(text: str) -> None:
    """The loader's contract: a Config, or a ConfigError whose every error is one clean line
    naming file and line."""
    err = config_error(text)
    event("loaded" if err is None else f"{min(len(err.errors), 3)}{'+' * (len(err.errors) > 2)}"
          " error(s)")
    if err is None:
        return
    assert err.errors and err.errors[0] is err
    for e in err.errors:
        assert e.line is not None and e.line >= 1, e.line_text
        assert e.line_text.startswith(f"c.toml:{e.line}: ")
        assert "\n" not in e.line_text and not _CONTROL.search(e.line_text), e.line_text


NAMES = st.text(max_size=6)
SCALARS = st.one_of(
    st.integers(), st.integers(min_value=-10**450, max_value=10**450), st.floats(),
    st.booleans(), st.text(max_size=8), st.dates(),
    st.datetimes())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(NAMES, inner, max_size=3), max_leaves=6)
NUMBERS = st.one_of(st.integers(min_value=-2, max_value=70), st.floats(min_value=-1, max_value=101),
                    st.sampled_from([0, 1, 100, 3600, 86400, 2**63, 10**400, float("nan"),
                                     float("inf"), -float("inf"), True, False]))


@st.composite
def table(draw: st.DrawFn, keys: set[str], special: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """A table of the config's real keys (and a few unknown ones), each with a value of the
    shape it wants or of any other."""
    special = special or {}
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(keys)) | NAMES, max_size=6, unique=True)):
        out[key] = draw(st.one_of(special[key], VALUES) if key in special else VALUES)
    return out


THRESHOLD_KEYS = {f.name for f in fields(Thresholds)}
SSH_KEYS = {f.name for f in fields(SshSettings)}
SSH = table(SSH_KEYS, dict.fromkeys(SSH_RANGES, NUMBERS))
RUN = table({"process", "workdir", "log", "events", "metrics", "checkpoints", "done", "relaunch",
             "detach", "env"}, {"env": st.dictionaries(NAMES, VALUES, max_size=3)})
HOST = table({"ssh", "python", "disks", "runs"} | SSH_KEYS,
             {**dict.fromkeys(SSH_RANGES, NUMBERS),
              "runs": st.dictionaries(NAMES, RUN, max_size=2),
              "disks": st.lists(st.text(max_size=5), max_size=3)})
DOCUMENTS = table({"interval", "readonly", "theme", "ssh", "hosts", "thresholds"}, {
    "interval": NUMBERS, "ssh": SSH, "hosts": st.dictionaries(NAMES, HOST, max_size=3),
    "thresholds": table(THRESHOLD_KEYS, {**dict.fromkeys(THRESHOLD_KEYS, NUMBERS),
                                         "xid_critical": st.lists(NUMBERS, max_size=3)})})
PROPERTY = settings(derandomize=True, max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@given(DOCUMENTS)
def test_any_document_of_real_keys_loads_or_is_a_config_error(doc: dict[str, Any]) -> None:
    assert_loads_or_config_error(tomli_w.dumps(doc))


TOML_BITS = st.sampled_from([
    "[hosts.a]", "[[hosts]]", '[hosts."a.b"]', "[hosts.a.runs.r]", "[ssh]", "[thresholds]",
    "interval = ", "command_timeout = ", "hosts.a.ssh = ", "disk_low_pct = ", "x.y = ", "ssh = ",
    "nan", "inf", "-inf", "1" + "0" * 400, "9" * 5000, "true", '"a"', "'''", '"""', "[", "]",
    "{", "}", "=", ".", ",", "#", "\n", "\r\n", " ", "\u2028", "\x1b", "0x1f", "1e400",
    "1979-05-27T07:32:00Z", "[1, 2]", "{ a = 1 }", '"\\u001b"'])


@PROPERTY
@given(st.lists(TOML_BITS | st.text(max_size=4), max_size=30).map("".join))
def test_any_text_loads_or_is_a_config_error(text: str) -> None:
    assert_loads_or_config_error(text)


@PROPERTY
@given(DOCUMENTS, st.integers(min_value=0, max_value=40), st.text(max_size=12) | TOML_BITS)
def test_a_document_with_text_spliced_in_loads_or_is_a_config_error(
        doc: dict[str, Any], at: int, junk: str) -> None:
    lines = tomli_w.dumps(doc).split("\n")
    lines.insert(min(at, len(lines)), junk)
    assert_loads_or_config_error("\n".join(lines))
