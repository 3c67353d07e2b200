"""One disk forecast (findings/forecast.py): `disk.full_soon` and the TUI's disk gauge read the
same one, so the finding's "fills in about N h" and the gauge's "full in ~N h" agree."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from findings_helpers import Watched, host_config
from gpuwatch.remote.findings.forecast import disk_forecast
from gpuwatch.remote.sim import Box, h100_sxm
from gpuwatch.tui.state import HostData

NOW = time.time()


def _watched(tmp_path: Path) -> tuple[Watched, Path, dict[str, int]]:
    box = Box(tmp_path / "box", h100_sxm(1), btime=int(time.time()) - 86_400, uptime_s=86_400.0)
    data = tmp_path / "data"
    data.mkdir()
    stat = {"bytes_total": 1000 * 2**30, "bytes_free": 200 * 2**30,
            "inodes_total": 1_000_000, "inodes_free": 900_000}
    (box.sim / "statvfs.json").write_text(json.dumps({str(data): stat}))
    return Watched(box, host_config(disks=(str(data),))), data, stat


def _set(w: Watched, data: Path, stat: dict[str, int], **free: int) -> None:
    stat.update(free)
    (w.box.sim / "statvfs.json").write_text(json.dumps({str(data): stat}))


def test_the_finding_and_the_gauge_give_one_forecast(tmp_path: Path) -> None:
    w, data, stat = _watched(tmp_path)
    gauge = HostData(config=w.host, history=w.history)
    w.poll(at=NOW)
    assert gauge.disk_forecast(str(data)) is None  # one poll: no rate yet
    _set(w, data, stat, bytes_free=190 * 2**30, inodes_free=800_000)  # 60 GiB/h
    w.poll(at=NOW + 600)
    soon = w.one("disk.full_soon")
    shown = gauge.disk_forecast(str(data))
    assert shown is not None
    assert shown / 3600 == pytest.approx(soon.evidence["hours_left"])
    assert shown / 3600 == pytest.approx(190 / 60, 0.01)
    forecast = disk_forecast(w.history, str(data))
    assert forecast is not None
    assert forecast.rate_per_s * 3600 == pytest.approx(soon.evidence["bytes_per_hour"])
    assert forecast.span_s == soon.evidence["span_s"] == 600
    inodes = gauge.disk_forecast(str(data), True)  # 100k inodes / 600 s: 800k in 80 min
    assert inodes == pytest.approx(800_000 / (100_000 / 600))


def test_a_disk_that_is_not_filling_has_no_forecast_anywhere(tmp_path: Path) -> None:
    w, data, stat = _watched(tmp_path)
    gauge = HostData(config=w.host, history=w.history)
    w.poll(at=NOW)
    _set(w, data, stat, bytes_free=210 * 2**30)
    w.poll(at=NOW + 600)
    assert "disk.full_soon" not in w.codes() and gauge.disk_forecast(str(data)) is None
    _set(w, data, stat, bytes_free=199 * 2**30)  # 1 GiB in the 1200 s since the first poll
    w.poll(at=NOW + 1200)
    assert "disk.full_soon" not in w.codes()  # 66 h left: over disk_full_hours
    shown = gauge.disk_forecast(str(data))
    assert shown is not None and shown == pytest.approx(199 * 1200)


def test_a_rough_forecast_from_the_second_poll_and_the_finding_waits(tmp_path: Path) -> None:
    """disk.full_soon waits for disk_full_min_span_s (300 s: the demo's disk drained in ~2 min
    at a 2 s interval, and its 64 snapshots span 128 s, so it never showed). The rough
    forecast is there from the second poll, marked rough, with its rate."""
    w, data, stat = _watched(tmp_path)
    w.poll(at=NOW)
    assert disk_forecast(w.history, str(data), rough=True) is None  # one poll: no rate
    _set(w, data, stat, bytes_free=199 * 2**30)
    w.poll(at=NOW + 2)
    rough = disk_forecast(w.history, str(data), rough=True)
    assert rough is not None and rough.rough and rough.span_s == 2
    assert rough.rate_per_s == pytest.approx(2**30 / 2)
    assert disk_forecast(w.history, str(data)) is None and "disk.full_soon" not in w.codes()
    _set(w, data, stat, bytes_free=190 * 2**30)
    w.poll(at=NOW + 600)
    full = disk_forecast(w.history, str(data), rough=True)
    assert full is not None and not full.rough and full.span_s == 600
    assert w.one("disk.full_soon").message.startswith(f"{data} fills in about 3 h 10 min ")
