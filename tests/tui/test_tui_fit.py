"""What a person needs is on screen whole (numbers never cut, evidence in words), severities
follow a finding that escalates, disabled keys can be told from enabled ones in every theme, and
the keys users bring from other tools work. On the deterministic fleet of tui_fixtures."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.remote.model.finding import Finding, Severity
from gpuwatch.remote.watch import fleet as fleet_module
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.colours import contrast_ratio
from gpuwatch.tui.format import evidence_words, step_ticks, time_ticks
from gpuwatch.tui.screens.fleet import FleetScreen
from gpuwatch.tui.screens.host import HostScreen
from gpuwatch.tui.textual_compat import FooterKey
from gpuwatch.tui.widgets.checkpoint_timeline import CheckpointTimeline
from gpuwatch.tui.widgets.disk_gauges import DiskGauges
from gpuwatch.tui.widgets.fleet_table import FleetTable
from gpuwatch.tui.widgets.gpu_panel import GpuPanel
from gpuwatch.tui.widgets.loss_pane import LossPane, StepMark
from gpuwatch.tui.widgets.process_table import ProcessTable
from rich.cells import cell_len
from textual.pilot import Pilot

NARROW = (80, 24)
WIDE = (160, 48)


def make_app(**kwargs: Any) -> GpuwatchApp:
    cfg = fx.config()
    return build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False, **kwargs)


async def feed(pilot: Pilot[Any]) -> None:
    for o in fx.latest(pilot.app.config):  # type: ignore[attr-defined]
        pilot.app.fleet.land(o)  # the pipeline, as a poll of its own lands
    await pilot.pause()


async def open_host(pilot: Pilot[Any], name: str) -> HostScreen:
    app = pilot.app
    assert isinstance(app, GpuwatchApp)
    fleet = app.screen
    assert isinstance(fleet, FleetScreen)
    await pilot.press("g")
    for _ in range(fleet.table.shown.index(name)):  # the fleet's order: worst first
        await pilot.press("down")
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(app.screen, HostScreen)
    return app.screen


def text_of(app: GpuwatchApp) -> str:
    return "\n".join(fx.svg_lines(app.export_screenshot()))


# ----------------------------------------------------------------------------- words, numbers

def test_evidence_reads_as_words_and_units_never_a_python_dict() -> None:
    said = evidence_words({"polls": 2, "span_s": 125.0, "sm_clock_mhz": [724, 742],
                           "cause": "oom_cgroup",
                           "diagnosis": {"cause": "oom_cgroup",
                                         "evidence": {"memory_max_bytes": 16 << 30}},
                           "holders": [{"pid": 7, "gpu_mem_mib": 4096}], "gone": None})
    assert "{" not in said and "'" not in said and "=" not in said, said
    assert "span 2 m" in said and "sm clock 724 MHz, 742 MHz" in said
    assert said.count("cause oom cgroup") == 1  # said once, not again from the nested dict
    assert "memory max 16.0 GiB" in said and "holders (pid 7, gpu mem 4.0 GiB)" in said
    assert "gone" not in said


def test_evidence_hides_internals_and_says_codes_ratios_and_sizes_in_words() -> None:
    said = evidence_words({"bytes_free": 24367424524, "clock_ratio": 0.3525,
                           "reasons": ["sw_power_cap"], "tag": "train_loss",
                           "holders": [{"pid": 10267, "start_ticks": 1968053,
                                        "explanation": "pid 10267 holds GPU 3 memory"}],
                           "signallable": [10267]})
    assert "free 22.7 GiB" in said and "clock 35% of max" in said, said
    assert "reasons sw power cap" in said and "tag train_loss" in said, said  # a tag as it is
    assert "holders (pid 10267)" in said and "ticks" not in said and "explanation" not in said
    assert "pids a signal can free 10267" in said and "signallable" not in said, said
    said = evidence_words({"cause": "oom_cgroup", "at": fx.NOW,  # a death's evidence
                           "oom_kill_before": 0, "oom_kill_now": 1})
    assert "OOM kills before 0 · OOM kills now 1" in said, said
    assert f"at {time.strftime('%H:%M:%S', time.localtime(fx.NOW))}" in said, said
    assert "e+09" not in said


def test_step_ticks_are_whole_steps_and_time_ticks_clock_times() -> None:
    assert step_ticks(1, 19, 5) == [5, 10, 15]
    assert step_ticks(0, 1000, 6) == [0, 200, 400, 600, 800, 1000]
    assert all(isinstance(t, int) for t in step_ticks(3, 7, 20))
    ticks, labels = time_ticks(fx.NOW, fx.NOW + 120, 5)
    assert ticks[1] - ticks[0] == 30 and all(len(label) == 8 for label in labels)  # HH:MM:SS
    ticks, labels = time_ticks(fx.NOW, fx.NOW + 7 * 3600, 6)
    assert ticks[1] - ticks[0] == 7200 and all(len(label) == 5 for label in labels)  # HH:MM


def test_paused_old_data_says_paused_not_stale() -> None:
    app = make_app()
    data = app.hosts["gpu-healthy"]
    outcome = next(o for o in fx.latest(app.config) if o.host.name == "gpu-healthy")
    data.apply(app.fleet.land(outcome))
    assert data.status(fx.NOW + 3600, 10).text.startswith("stale")
    said = data.status(fx.NOW + 3600, 10, paused=True)
    assert said.text.startswith("paused, data") and "old" in said.text


@pytest.mark.parametrize("size", [NARROW, WIDE])
async def test_host_view_numbers_are_whole(size: tuple[int, int]) -> None:
    """VRAM, the throttle reason's words and the disk forecast are never cut (they were "VR…",
    "(the pow…" and "78.5 GiB free…" at 160x48)."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot)
        screen = await open_host(pilot, "gpu-capped")
        await pilot.pause()
        for widget in (screen.query_one(GpuPanel), screen.query_one(DiskGauges),
                       screen.query_one(CheckpointTimeline)):
            width = widget.size.width
            for line in str(widget.render()).splitlines():
                assert cell_len(line) <= width, (type(widget).__name__, width, line)
        gpus = screen.query_one("#gpus").render()
        assert "VRAM 60.0/79.6 GiB" in str(gpus)  # the driver's 81559 MiB, as the fleet sums it
        assert "power cap: at its power limit" in str(gpus)


async def test_checkpoint_rows_drop_their_gap_and_size_whole_at_any_width() -> None:
    """A checkpoint's row gives up its "+20 m" gap, then its size, whole where they do not fit
    ("+27…" read as a number cut, on the demo at 160x48)."""
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        screen = await open_host(pilot, "gpu-capped")
        timeline = screen.query_one(CheckpointTimeline)
        run = screen.run_series()
        widths_with_gap = []
        for width in range(24, 72):
            text = timeline.render_run(run, fx.NOW, width)
            rows = [line for line in text.plain.splitlines() if line.endswith(" ago") is False
                    and "checkpoint-" in line and " ago  " in line]
            assert rows, width
            for row in rows:
                assert cell_len(row) <= width or not row.rstrip().endswith(("GiB", "m")), (
                    width, row)
                assert "…" not in row
            if any(" +" in row for row in rows):
                widths_with_gap.append(width)
                assert all(cell_len(row) <= width for row in rows), (width, rows)
        assert widths_with_gap and widths_with_gap[-1] == 71  # wide enough: the gap shows


# ----------------------------------------------------------------------------- severities

async def test_a_finding_that_escalates_shows_its_new_count_and_glyph(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """warning -> critical: the fleet's findings count and state cell follow (1▲ stayed)."""
    severity = {"now": Severity.WARNING}
    real = fleet_module.judge

    def judge(history: Any, outcome: Any) -> Any:
        report = real(history, outcome)
        if outcome.host.name != "gpu-healthy":
            return report
        disk = Finding("disk.full_soon", severity["now"], "the disk fills soon",
                       evidence={"path": "/data"}, subject="/data")
        return replace(report, findings=[disk])

    monkeypatch.setattr(fleet_module, "judge", judge)
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        table = app.screen.query_one(FleetTable)
        assert table.get_cell("gpu-healthy", "findings").plain == "1▲"
        assert table.get_cell("gpu-healthy", "state").plain == "▲ disk full soon"
        severity["now"] = Severity.CRITICAL
        await feed(pilot)
        assert table.get_cell("gpu-healthy", "findings").plain == "1✖"
        assert table.get_cell("gpu-healthy", "state").plain == "✖ disk full soon"


# ----------------------------------------------------------------------------- footer

def test_contrast_ratio_is_wcags() -> None:
    assert round(contrast_ratio((0, 0, 0), (255, 255, 255)), 1) == 21.0
    assert contrast_ratio((40, 40, 40), (40, 40, 40)) == 1.0


async def test_disabled_footer_keys_stand_apart_from_enabled_ones_in_every_theme() -> None:
    """Textual's dim left a disabled key at colour 239 beside an enabled one at 241."""
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        await open_host(pilot, "gpu-healthy")  # K has nothing selected: disabled
        assert len(app.theme_names) >= 4
        for theme in app.theme_names:
            app.theme = theme
            await pilot.pause()
            keys = list(app.screen.query(FooterKey))
            off = [k for k in keys if k.has_class("-disabled")]
            on = [k for k in keys if not k.has_class("-disabled")]
            assert off and on, theme
            for part in ("footer-key--key", "footer-key--description"):
                def fg(k: FooterKey, part: str = part) -> tuple[int, int, int]:
                    style = k.rich_style + k.get_component_rich_style(part)
                    assert style.color is not None
                    return tuple(style.color.get_truecolor())  # type: ignore[return-value]

                def bg(k: FooterKey, part: str = part) -> tuple[int, int, int]:
                    style = k.rich_style + k.get_component_rich_style(part)
                    assert style.bgcolor is not None
                    return tuple(style.bgcolor.get_truecolor())  # type: ignore[return-value]

                for a in on:
                    for b in off:
                        apart = contrast_ratio(fg(a), fg(b))
                        assert apart >= 2.0, (theme, part, a.key, b.key, apart)
                for k in on:  # enabled: readable (WCAG AA for text)
                    assert contrast_ratio(fg(k), bg(k)) >= 4.5, (theme, part, k.key)
                for k in off:  # disabled: recessive, still legible
                    assert contrast_ratio(fg(k), bg(k)) >= 1.8, (theme, part, k.key)


async def test_host_footer_fits_80_columns_with_help_and_both_keys_of_a_pair() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot)
        await open_host(pilot, "gpu-healthy")
        await pilot.pause()
        footer = text_of(app).splitlines()[-1]
        assert footer.rstrip().endswith("q Quit") and "? Help" in footer, footer
        assert "[ ] Tag" in footer, footer
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        await open_host(pilot, "gpu-healthy")
        await pilot.pause()
        footer = text_of(app).splitlines()[-1]
        assert "s S Smooth" in footer and "t Theme" in footer, footer


# ----------------------------------------------------------------------------- keys

async def test_j_k_g_G_move_the_cursor_and_o_sorts_the_fleet() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        table = app.screen.query_one(FleetTable)
        await pilot.press("g", "j", "j")  # the rows settled worst first; the cursor on row 0
        assert table.cursor_row == 2
        await pilot.press("k")
        assert table.cursor_row == 1
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("g")
        assert table.cursor_row == 0
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("home")
        assert table.cursor_row == 0
        # worst first by default: every host's verdict no better than the one below it, ties
        # in the config's order
        assert "state ▼" in text_of(app)
        levels = [app.hosts[h].verdict(fx.NOW, 10.0).level for h in table.shown]
        assert levels == sorted(levels, reverse=True) and levels[0] == 3
        await pilot.press("o")  # the config's order
        assert table.shown == list(app.hosts)
        await pilot.press("o")  # by name
        assert table.shown == sorted(app.hosts)
        assert "host ▼" in text_of(app)
        assert isinstance(app.screen, FleetScreen)


async def test_processes_sort_by_vram_cpu_and_age_with_o() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        fx.prime(app)
        await feed(pilot)
        screen = await open_host(pilot, "gpu-healthy")
        procs = screen.query_one(ProcessTable)
        snap = app.hosts["gpu-healthy"].snapshot
        assert snap is not None
        await pilot.press("o")
        assert procs.sorted_by == "vram"
        pids = [int(k[4:]) for k in procs._keys if k.startswith("pid:")]
        mem = {p.pid: p.gpu_mem_mib or 0 for p in snap.processes}
        by_run: dict[str | None, list[int]] = {}
        for pid in pids:
            by_run.setdefault(next(p.run for p in snap.processes if p.pid == pid), []).append(
                pid)
        for run_pids in by_run.values():  # within each run, most VRAM first
            assert [mem[p] for p in run_pids] == sorted((mem[p] for p in run_pids),
                                                        reverse=True)
        await pilot.press("o")  # CPU since the previous poll, most first
        assert procs.sorted_by == "cpu" and "CPU% ▼" in text_of(app)
        pids = [int(k[4:]) for k in procs._keys if k.startswith("pid:")]
        assert pids == sorted(pids, key=lambda p: -fx.CPU_PCT[p]) == [4123, 4122, 4121, 4124]
        shown = {p.pid: p.cpu_pct for p in app.hosts["gpu-healthy"].snapshot.processes}
        assert shown == pytest.approx({p: fx.CPU_PCT[p] for p in pids})
        await pilot.press("o")
        assert procs.sorted_by == "age" and "age ▼" in text_of(app)
        await pilot.press("o")
        assert procs.sorted_by is None


async def test_cpu_shows_whole_at_80_columns_and_a_dash_until_known() -> None:
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot)  # a first sighting: no CPU% yet
        await open_host(pilot, "gpu-healthy")
        await pilot.press("6")  # the processes pane, scrolled into view
        await pilot.pause()
        rows = [line for line in text_of(app).splitlines() if "4123" in line]
        assert rows and "–" in rows[0], rows
    app = make_app()
    async with app.run_test(size=NARROW) as pilot:
        fx.prime(app)
        await feed(pilot)
        await open_host(pilot, "gpu-healthy")
        await pilot.press("6")
        await pilot.pause()
        screen = text_of(app)
        assert "CPU%" in screen
        for pid, cell in ((4123, " 312 "), (4124, " 7.5 "), (4122, " 103 ")):
            rows = [line for line in screen.splitlines() if f"{pid}" in line]
            assert rows and cell in rows[0], (pid, rows)


async def test_loss_plot_marks_findings_at_their_step() -> None:
    app = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot)
        screen = await open_host(pilot, "gpu-healthy")
        data = app.hosts["gpu-healthy"]
        run = screen.selected_run
        nan = Finding("run.loss_nan", Severity.CRITICAL, "the loss went NaN", run=run,
                      evidence={"step": 300, "tag": "train/loss"})
        data.findings = [*data.findings, nan]
        screen.refresh_data()
        await pilot.pause()
        assert screen.step_marks() == (StepMark(300, "✖", "error"),)
        plot = screen.query_one(LossPane).query_one("#loss-plot")
        marks = plot.series.marks  # type: ignore[attr-defined]
        assert any(m.glyph == "✖" and m.x == 300.0 for m in marks)
        assert any(m.glyph == "◆" for m in marks)  # checkpoints: marks, not lines
        assert "✖ finding" in plot.series.xlabel  # type: ignore[attr-defined]
        ticks = plot.series.xticks  # type: ignore[attr-defined]
        assert ticks and all(t == int(t) for t in ticks)


def test_the_process_table_lists_runs_and_gpu_holders_not_a_runs_parents() -> None:
    """The box lists a run's parents too (its shell, tmux, init: whether it dies with the SSH
    session); they are the findings' evidence, not rows of the Processes pane."""
    from dataclasses import replace
    from types import SimpleNamespace

    import tui_fixtures as fx
    from gpuwatch.tui.widgets.process_table import ProcessTable

    data = SimpleNamespace(reap_targets={99})
    worker = fx.process(10, cmd="python train.py", run="llama")
    shell = replace(fx.process(9, cmd="-bash", run=None, gpu_index=None, mem=None),
                    nvidia_devs=())
    other = fx.process(11, cmd="python eval.py", run=None)  # another user's, on a GPU
    leftover = replace(shell, pid=99, cmd="python dead_rank.py")
    shown = [p.pid for p in (worker, shell, other, leftover)
             if ProcessTable.worth_a_row(p, data)]  # type: ignore[arg-type]
    assert shown == [10, 11, 99]
