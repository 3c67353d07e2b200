"""The first hour's friction, each pinned on the deterministic fleet of tui_fixtures: process
commands at nvitop's level (the script and its arguments, the whole command on the selected row,
direct sort keys that reverse), checkpoints newest first, a disk forecast from the second poll
(rough until its span is long enough) with its rate, GPU strips that say their span, one unit
vocabulary."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.remote.config.thresholds import Thresholds
from gpuwatch.remote.model.snapshot import Checkpoint
from gpuwatch.remote.units import duration, mib, mib_pair, size
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.screens.host import HostScreen
from gpuwatch.tui.state import DiskPoint
from gpuwatch.tui.widgets.checkpoint_timeline import CheckpointTimeline
from gpuwatch.tui.widgets.disk_gauges import forecast_words, gauge_forecast
from gpuwatch.tui.widgets.process_table import ProcessTable, short_command
from textual.pilot import Pilot

WIDE = (160, 48)


def make_app() -> GpuwatchApp:
    cfg = fx.config()
    return build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False)


async def open_host(pilot: Pilot[Any], name: str) -> HostScreen:
    app = pilot.app
    assert isinstance(app, GpuwatchApp)
    for o in fx.latest(app.config):
        app.fleet.land(o)  # the pipeline, as a poll of its own lands
    await pilot.pause()
    for _ in range(list(app.hosts).index(name)):
        await pilot.press("down")
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(app.screen, HostScreen)
    return app.screen


# ---------------------------------------------------------------- processes


@pytest.mark.parametrize(("cmd", "shown"), [
    ("/usr/bin/python3 /tmp/gpuwatch-demo-2_z65yck/boxes/demo-disk/home/sft/train.py --lr 3e-4",
     "python3 train.py --lr 3e-4"),
    ("/opt/conda/bin/python3.11 -u -X dev /w/train.py --out /data/run",
     "python3.11 train.py --out /data/run"),
    ("python -m torch.distributed.run --nproc_per_node 8 /w/train.py --bs 4",
     "python -m torch.distributed.run --nproc_per_node 8 train.py --bs 4"),
    ("/opt/conda/bin/torchrun --nproc_per_node=8 /home/me/llama/train.py --config c.yaml",
     "torchrun --nproc_per_node=8 train.py --config c.yaml"),
    ("/usr/bin/bash /home/me/run.sh", "bash run.sh"),
    ("[sshd]", "[sshd]"),
    ("", ""),
    ("python", "python"),
])
def test_a_command_shows_its_program_and_script_by_name_with_their_arguments(
        cmd: str, shown: str) -> None:
    """`python3 /tmp/gpuwatch-demo-2_z65yck/boxes/d` at 160 columns, `python3 /tmp/g` at 80:
    the script was cut before its name. nvitop and btop show the script and its arguments."""
    assert short_command(cmd) == shown


async def test_the_selected_process_shows_its_whole_command_wrapped_to_the_pane() -> None:
    long = ("/usr/bin/python3 /tmp/gpuwatch-demo-2_z65yck/boxes/demo-healthy/home/llama-7b/"
            "train.py --run llama-7b --workdir /tmp/gpuwatch-demo-2_z65yck/boxes/demo-healthy/"
            "home/llama-7b --step-s 0.5 --save-every 40 --save-total-limit 3")
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        screen = await open_host(pilot, "gpu-healthy")
        table = screen.query_one(ProcessTable)
        data = app.hosts["gpu-healthy"]
        snap = data.snapshot
        assert snap is not None
        procs = tuple(replace(p, cmd=long) if p.pid == 4121 else p for p in snap.processes)
        data.history.snapshots[-1] = replace(snap, processes=procs)
        data.version += 1
        table.show(data, fx.NOW, force=True)
        await pilot.pause()
        row = table._keys.index("pid:4121")
        table.focus()
        table.move_cursor(row=row)
        await pilot.pause()
        await pilot.pause()
        cell = table.get_cell("pid:4121", "cmd")
        lines = cell.plain.splitlines()
        assert len(lines) > 1 and "".join(lines).replace(" ", "") == long.replace(" ", "")
        assert all(len(line) <= table.size.width for line in lines)
        other = table.get_cell("pid:4122", "cmd").plain
        assert other.startswith("python train.py") and "\n" not in other
        # moving on: the next row is the one shown whole
        table.move_cursor(row=table._keys.index("pid:4122"))
        await pilot.pause()
        await pilot.pause()
        assert table.get_cell("pid:4121", "cmd").plain == short_command(long)


async def test_direct_sort_keys_and_reverse() -> None:
    """htop's M (memory: VRAM here) and T (time), C for CPU, I reverses; `o` still cycles."""
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        screen = await open_host(pilot, "gpu-healthy")
        table = screen.query_one(ProcessTable)
        table.focus()
        await pilot.pause()

        def pids() -> list[int]:
            return [int(k[4:]) for k in table._keys if k.startswith("pid:")]

        data = app.hosts["gpu-healthy"]
        snap = data.snapshot
        assert snap is not None
        cpu = {p.pid: p.cpu_pct for p in snap.processes if f"pid:{p.pid}" in table._keys}
        await pilot.press("C")
        await pilot.pause()
        assert table.sorted_by == "cpu" and not table.reverse
        by_cpu = [p for p in pids() if cpu.get(p) is not None]
        assert by_cpu == sorted(by_cpu, key=lambda p: -(cpu[p] or 0)), cpu
        await pilot.press("I")
        await pilot.pause()
        assert table.reverse and pids() == list(reversed(
            [p for p in sorted(cpu, key=lambda p: (-(cpu[p] or 0), p))]))
        assert any(str(c.label).endswith("▲") for c in table.columns.values())
        await pilot.press("C")  # the same key again: the other way round
        await pilot.pause()
        assert not table.reverse
        await pilot.press("M")
        await pilot.pause()
        assert table.sorted_by == "vram"
        await pilot.press("o")  # the screen's cycle wins over the table's own order
        await pilot.pause()
        assert table.sorted_by == "vram" and not table.reverse  # o's first order: VRAM


# ---------------------------------------------------------------- checkpoints


async def test_checkpoints_newest_first() -> None:
    """On demo-disk the pane showed checkpoint-30 … 180 and the latest, checkpoint-570, only
    after scrolling: the newest is the first row."""
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        screen = await open_host(pilot, "gpu-capped")
        run = screen.run_series()
        assert run is not None and len(run.checkpoints) >= 2
        text = screen.query_one(CheckpointTimeline).render_run(run, fx.NOW, 60).plain
        rows = [line for line in text.splitlines() if " ago  " in line]
        names = [line.split(" ago  ")[1].split()[0] for line in rows]
        newest_first = [c.path.rsplit("/", 1)[1]
                        for c in sorted(run.checkpoints, key=lambda c: -c.mtime)]
        assert names == newest_first


def test_the_next_checkpoint_is_sized_from_the_runs_own() -> None:
    """The disk evidence said "next checkpoint 0 B" for 132 KiB checkpoints."""
    sample = fx.run_sample("r", pids=(1,), steps=range(10), t_end=fx.NOW)
    ckpts = (Checkpoint("/d/c-1", 1.0, 135_168), Checkpoint("/d/c-2", 2.0, 140_000),
             Checkpoint("/d/c-3", 3.0, 4_096))  # the newest still being written
    assert replace(sample, checkpoints=ckpts).next_checkpoint_bytes == 140_000
    assert replace(sample, checkpoints=()).next_checkpoint_bytes is None


# ---------------------------------------------------------------- disks


def host_data(points: list[tuple[float, int]]) -> Any:
    ring = deque(DiskPoint(t, free, 1000) for t, free in points)
    return SimpleNamespace(disk_history={"/": ring},
                           history=SimpleNamespace(thresholds=Thresholds()))


def test_the_disk_forecast_shows_from_the_second_poll_marked_rough_with_its_rate() -> None:
    """disk.full_soon needs 300 s of history and the demo's disk drained in ~2 min: the
    forecast never showed. The gauge has it from two polls on, rough until the span is
    disk_full_min_span_s, with its rate."""
    gib = 1 << 30
    assert gauge_forecast(host_data([(0.0, 100 * gib)]), "/") is None
    early = gauge_forecast(host_data([(0.0, 100 * gib), (2.0, 99 * gib)]), "/")
    assert early is not None and early.rough and early.span_s == 2.0
    said = forecast_words(early, size)
    assert said == f"full in ~{duration(198)} ({size(gib * 1800)}/h, rough)", said
    later = gauge_forecast(host_data([(0.0, 100 * gib), (150.0, 99 * gib),
                                      (300.0, 98 * gib)]), "/")
    assert later is not None and not later.rough and later.span_s == 300.0
    assert "rough" not in forecast_words(later, size)
    assert gauge_forecast(host_data([(0.0, 10 * gib), (2.0, 11 * gib)]), "/") is None


# ---------------------------------------------------------------- GPUs and units


async def test_the_gpu_strips_say_their_span() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        screen = await open_host(pilot, "gpu-capped")
        await pilot.pause()
        said = str(screen.query_one("#pane-gpus").border_subtitle)
        assert said.startswith("strips: last ") and said.endswith((" s", " min", " h")), said


def test_one_vocabulary_for_durations_and_sizes() -> None:
    """A finding said "12 min" where the header said "12 m"; the fleet said 120/159 GiB beside
    2 x 80 GiB per GPU; the kill dialog 60866 MiB beside the table's 59.4 GiB."""
    assert [duration(s) for s in (5, 720, 7830, 3 * 86400)] == [
        "5 s", "12 min", "2 h 10 min", "3.0 d"]
    assert mib(60866) == "59.4 GiB"
    assert mib_pair(60866, 81559) == "59.4/79.6 GiB"
    assert mib_pair(2 * 60866, 2 * 81559) == "119/159 GiB"
    assert size(135_168) == "132.0 KiB" and size(0) == "0 B"


def test_the_docs_name_the_glyphs_the_app_shows() -> None:
    """docs/tui.md named the dead glyph `✗`; the app shows `†` (✗ is a host not polled)."""
    from pathlib import Path

    from gpuwatch.remote.model.finding import Severity
    from gpuwatch.tui.format import RUN_GLYPH, SEVERITY_GLYPH, STATUS_GLYPH

    text = " ".join((Path(__file__).parents[2] / "docs" / "tui.md").read_text().split())
    s, r, v = STATUS_GLYPH, RUN_GLYPH, SEVERITY_GLYPH
    assert (f"{s['ok']} ok, {s['stale']} stale, {s['unreachable']} could not be polled, "
            f"{s['waiting']} not polled yet") in text
    assert (f"{v[Severity.CRITICAL]} {v[Severity.WARNING]} {v[Severity.INFO]} critical, "
            "warning, info") in text
    assert f"{r['running']} {r['finished']} {r['dead']} a run running, finished, dead" in text
    assert f"{r['left behind']} left behind" in text
