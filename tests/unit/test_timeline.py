"""The timeline (remote/store_timeline.py, remote/timeline.py, `gpuwatch events`): what the store
records as it happens — findings appearing, changing, clearing; a host unreachable and back; a
reboot; a run running with new processes — read back with the audit log and the watchdog's
restarts as one list; and the durations `--since` takes."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.store import GpuRow, RunHold, Store
from gpuwatch.remote.timeline import text, timeline, to_json
from gpuwatch.tui.cli import events as events_verb
from gpuwatch.tui.cli.command import EXIT_USAGE, run
from gpuwatch.tui.cli.durations import MAX_S, UNITS, parse_duration
from hypothesis import given
from hypothesis import strategies as st

T = 1_784_100_000.0


def kinds(store: Store, host: str = "h") -> list[str]:
    return [e.kind for e in store.events(host=host)]


def test_a_host_unreachable_then_back_is_two_events_with_how_long() -> None:
    with Store.open(":memory:") as store:
        store.record_poll("h", taken_at=T, ok=True, boot_id="b1")
        store.record_poll("h", taken_at=T + 10, ok=False,
                          error={"kind": "timeout", "message": "no answer in 30 s"})
        for i in range(2, 360):  # an hour of failed polls: one event, not 358
            store.record_poll("h", taken_at=T + 10 * i, ok=False,
                              error={"kind": "timeout", "message": "no answer in 30 s"})
        store.record_poll("h", taken_at=T + 3610, ok=True, boot_id="b1")
        store.record_poll("h", taken_at=T + 3620, ok=True, boot_id="b2")
        events = store.events(host="h")
        assert [e.kind for e in events] == ["unreachable", "reachable", "reboot"]
        down, up, reboot = events
        assert down.at == T + 10 and "timeout: no answer in 30 s" in down.message
        assert down.detail["last_ok_at"] == T
        assert up.detail["down_s"] == 3600 and up.message == "answering again after 1 h 00 min"
        assert reboot.detail == {"boot_id_before": "b1", "boot_id": "b2"}
        # a host never reached is unreachable from its first poll
        store.record_poll("new", taken_at=T, ok=False, error={"kind": "auth", "message": "no"})
        assert kinds(store, "new") == ["unreachable"]


def test_findings_appear_change_clear_and_come_back() -> None:
    low = Finding("disk.low", Severity.WARNING, "/data has 4% free", subject="/data",
                  evidence={"free_pct": 4.0})
    with Store.open(":memory:") as store:
        store.update_findings("h", [low], T)
        store.update_findings("h", [low], T + 10)  # held: nothing new
        store.update_findings("h", [Finding("disk.low", Severity.CRITICAL, "/data has 1% free",
                                            subject="/data")], T + 20)
        store.update_findings("h", [], T + 30, clear=False)  # a failed poll clears nothing
        store.update_findings("h", [], T + 40)
        store.update_findings("h", [low], T + 50)
        events = store.events(host="h")
        assert [(e.kind, e.severity, e.at) for e in events] == [
            ("finding", "warning", T), ("changed", "critical", T + 20),
            ("cleared", "critical", T + 40), ("finding", "warning", T + 50)]
        assert events[0].detail == {"free_pct": 4.0} and events[0].subject == "/data"
        assert events[2].message == "cleared: /data has 1% free"
        # the findings table still keeps one row, started anew
        (record,) = store.findings("h")
        assert record.first_seen == T + 50 and record.active


def rows(t: float, watts: float, gpus: int = 2) -> list[GpuRow]:
    return [GpuRow(t, g, 90.0, 1900.0, 1980.0, watts, 700.0, 60.0, 1.0) for g in range(gpus)]


def test_a_run_with_new_processes_is_an_event_and_a_new_span() -> None:
    with Store.open(":memory:") as store:
        def poll(t: float, pids: tuple[int, ...], gpus: tuple[int, ...] = (0, 1),
                 boot: str = "b1") -> None:
            store.record_poll("h", taken_at=t, ok=True, boot_id=boot, gpu_rows=rows(t, 300.0),
                              runs={"llama": RunHold(pids, gpus)}, gap_s=30.0)

        poll(T, (11, 10))
        poll(T + 10, (10, 11))
        poll(T + 20, (10, 11), gpus=(0,))  # a rank let go of a GPU: a span, not an event
        poll(T + 30, (20, 21))  # restarted
        poll(T + 40, (20, 21), boot="b2")  # the same pids after a reboot are new processes
        events = store.events(host="h")
        assert [(e.kind, e.at) for e in events] == [
            ("started", T), ("started", T + 30), ("reboot", T + 40), ("started", T + 40)]
        assert events[0].message == "run llama running: pids 10, 11 on GPUs 0, 1"
        assert events[1].detail["pids_before"] == [10, 11]
        spans = store.run_spans("h", "llama")
        assert [(s.start, s.end, s.pids, s.gpus, s.polls) for s in spans] == [
            (T, T + 10, (10, 11), (0, 1), 2), (T + 20, T + 20, (10, 11), (0,), 1),
            (T + 30, T + 30, (20, 21), (0, 1), 1), (T + 40, T + 40, (20, 21), (0, 1), 1)]
        assert spans[0].energy_j == 2 * 300.0 * 10 and spans[0].measured_s == 10


def test_the_timeline_merges_events_actions_and_restarts() -> None:
    with Store.open(":memory:") as store:
        store.update_findings("h", [Finding(
            "run.dead", Severity.CRITICAL, "run llama is dead: OOM-killed", run="llama",
            evidence={"cause": "oom_cgroup", "work_lost_s": 600.0,
                      "loss": float("nan")})], T)
        store.record_restart("h", "llama", death="10,11", holder="watch@box:1:ab",
                             outcome="sent", message="restart 1 of 3 in 6 h", at=T + 60)
        store.record_action(who="alice@laptop", host="h", action="relaunch", phase="execute",
                            targets=[{"run": "llama"}], command="python train.py",
                            outcome="sent", ok=True, message="started in tmux", at=T + 61)
        store.record_action(who="bob@laptop", host="other", action="kill", phase="execute",
                            targets=[{"pid": 7}], command="TERM", outcome="failed", ok=False,
                            message="no such process", at=T + 30)
        entries = timeline(store, since=T - 1)
        assert [(e.kind, e.host) for e in entries] == [
            ("death", "h"), ("action", "other"), ("restart", "h"), ("action", "h")]
        assert entries[1].severity == "warning" and entries[1].who == "bob@laptop"
        assert entries[3].run == "llama" and entries[2].who == "watch"
        assert [e.kind for e in timeline(store, since=T - 1, host="h", run="llama")] == [
            "death", "restart", "action"]
        assert timeline(store, since=T + 31, until=T + 60)[0].kind == "restart"
        said = text(entries, since=T - 1)
        assert "1 death" in said.splitlines()[0]
        assert "[oom_cgroup] run llama is dead: OOM-killed" in said
        doc = to_json(entries, since=T - 1, generated_at=T + 100)
        json.dumps(doc, allow_nan=False)  # a NaN in the evidence leaves as "nan"
        assert doc["events"][0]["detail"]["loss"] == "nan"
        assert doc["events"][0]["kind"] == "death" and doc["kind"] == "events"


def test_box_text_in_an_event_is_inert_on_a_terminal() -> None:
    with Store.open(":memory:") as store:
        store.update_findings("h", [Finding("run.stalled", Severity.WARNING,
                                            "run \x1b[31mred\x1b[0m is stalled", run="x")], T)
        said = text(timeline(store, since=T - 1), since=T - 1)
    assert "\x1b" not in said and "\\x1b[31mred" in said


def args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"host": None, "since": 8 * 3600.0, "json": False, "config": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_gpuwatch_events_prints_the_night(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.delenv("GPUWATCH_CONFIG", raising=False)
    path = str(tmp_path / "s.sqlite3")
    with Store.open(path) as store:
        store.record_poll("gpu1", taken_at=T - 9 * 3600, ok=False, error={"kind": "timeout"})
        store.record_poll("gpu1", taken_at=T - 3600, ok=True, boot_id="b")
        store.record_poll("gpu2", taken_at=T - 60, ok=False,
                          error={"kind": "unreachable", "message": "no route to host"})
    assert events_verb.run_verb(args(), store_path=path, now=T) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("on 2 hosts: 2 events, 0 deaths")
    assert "answering again after 8 h unreachable" in out[2] and "gpu1" in out[2]
    assert "unreachable: no route to host" in out[3]
    assert events_verb.run_verb(args(host="gpu2", json=True), store_path=path, now=T) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in doc["events"]] == ["unreachable"] and doc["host"] == "gpu2"
    assert doc["since"] == T - 8 * 3600
    assert events_verb.run_verb(args(host="gpu9"), store_path=path, now=T) == 1
    assert "knows no host 'gpu9'" in capsys.readouterr().err


def test_a_bad_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["events", "--since", "8 hours"])
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "'8 hours' is not a duration" in err and "30m, 8h, 2d" in err


@pytest.mark.parametrize(("text", "seconds"), [
    ("8h", 28_800), ("30m", 1800), ("2d", 172_800), ("1h30m", 5400), ("1.5h", 5400),
    ("90s", 90), ("1w2d", 777_600), (" 8h ", 28_800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["8 hours", "", "30m1h", "1h1h", "0h", "-1h", "8", "h",
                                  "1e3s", "8H", "1" * 400 + "s", "1,5h", "1h 30m"])
def test_what_is_no_duration_says_what_one_is(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|10 years|such as 30m") as info:
        parse_duration(text)
    assert "\n" not in str(info.value)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(list(UNITS))),
                min_size=1, max_size=5))
def test_a_duration_is_its_parts_added_up(parts: list[tuple[int, str]]) -> None:
    ordered = sorted({u: n for n, u in parts}.items(), key=lambda kv: -UNITS[kv[0]])
    written = "".join(f"{n}{u}" for u, n in ordered)
    total = sum(n * UNITS[u] for u, n in ordered)
    if 0 < total <= MAX_S:
        assert math.isclose(parse_duration(written), total)
    else:
        with pytest.raises(ValueError):
            parse_duration(written)


@given(st.text(max_size=30))
def test_any_text_is_a_duration_or_a_value_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError:
        return
    assert 0 < seconds <= MAX_S


def test_two_gpuwatch_writing_one_host_share_its_spans(tmp_path: Path) -> None:
    """The TUI and a cron `--once` both poll a host into one store: each keeps the run's span
    in memory, and one that the other moved on is read again, never forked or lost."""
    path = tmp_path / "s.sqlite3"
    with Store.open(path) as tui, Store.open(path) as cron:
        for i, store in enumerate((tui, cron, tui, tui, cron)):
            t = T + 10 * i
            store.record_poll("h", taken_at=t, ok=True, boot_id="b", gpu_rows=rows(t, 300.0),
                              runs={"llama": RunHold((10, 11), (0, 1))}, gap_s=30.0)
        (span,) = tui.run_spans("h", "llama")
        assert (span.start, span.end, span.polls, span.measured_s) == (T, T + 40, 5, 40)
        assert span.energy_j == 2 * 300.0 * 40 and span.gaps == 0
        assert kinds(tui) == ["started"]
