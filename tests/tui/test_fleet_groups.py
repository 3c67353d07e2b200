"""The fleet view for many hosts: groups (a `group` key, or the hosts' names less their
number), the worst group first with its hosts by verdict in its row, folding with Space and
Enter, and the `/` filter that finds a host by name, run or user and opens it on Enter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tui_fixtures as fx
from gpuwatch.remote.config.load import parse_config
from gpuwatch.remote.config.schema import Config, ConfigError, HostConfig
from gpuwatch.tui.app import GpuwatchApp, build_app
from gpuwatch.tui.groups import GROUP_ROW, OTHER, group_names, name_group
from gpuwatch.tui.screens.fleet import FleetScreen
from gpuwatch.tui.screens.host import HostScreen
from gpuwatch.tui.state import HostData
from harness.toasts import record_toasts
from textual.pilot import Pilot

SIZE = (120, 40)


def make_app(cfg: Config) -> GpuwatchApp:
    app = build_app(cfg, store=fx.seeded_store(cfg), clock=fx.clock, poll=False)
    record_toasts(app)
    return app


async def feed(pilot: Pilot[Any], outcomes: list[Any]) -> None:
    for o in outcomes:
        pilot.app.fleet.land(o)  # the pipeline, as a poll of its own lands
    await pilot.pause()
    await pilot.pause()


def fleet(app: GpuwatchApp) -> FleetScreen:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    return screen


def cell(screen: FleetScreen, key: str, column: str) -> str:
    return screen.table.get_cell(key, column).plain


def node_polls(cfg: Config, *, down: tuple[str, ...] = (),
               users: dict[str, str] | None = None) -> list[Any]:
    """fx.latest's outcomes, with the named node hosts not answering and the named ones'
    GPU held by a process of that user."""
    out = []
    for o in fx.latest(cfg):
        name = o.host.name
        if name in down:
            o = fx.failed(o.host, fx.NOW)
        elif users and name in users:
            assert o.snapshot is not None
            proc = fx.process(9000, cmd="python sweep.py", run=None, user=users[name])
            o = replace(o, snapshot=replace(o.snapshot, processes=(proc,)))
        out.append(o)
    return out


# ----------------------------------------------------------------------------- which group

def test_a_hosts_group_is_its_key_else_its_name_less_the_number() -> None:
    assert name_group("node-017") == "node"
    assert name_group("node017.lab.example") == "node"
    assert name_group("gpu-a100-03") == "gpu-a100"
    assert name_group("gpu-healthy") is None
    assert name_group("10.0.0.17") is None
    def data(names: list[str], groups: dict[str, str] | None = None) -> list[HostData]:
        return [HostData(HostConfig(name=n, ssh=n, group=(groups or {}).get(n)), _history(n))
                for n in names]

    small = [f"node-{i}" for i in range(10)] + ["login"]
    assert group_names(data(small)) is None  # a small fleet is one table
    large = [f"node-{i:02d}" for i in range(30)] + ["login", "gpu-a"]
    names = group_names(data(large))
    assert names is not None
    assert {names[f"node-{i:02d}"] for i in range(30)} == {"node"}
    assert names["login"] == names["gpu-a"] == OTHER  # a name shared with no other host
    # a `group` key groups a fleet of any size; the others by their names
    names = group_names(data(["a1", "a2", "b"], {"b": "lab"}))
    assert names == {"a1": "a", "a2": "a", "b": "lab"}
    assert group_names(data([f"n{i}" for i in range(30)])) is None  # one group: no groups


def _history(name: str) -> Any:
    from gpuwatch.remote.model.history import HostHistory

    return HostHistory(name)


def test_the_group_key_in_the_config() -> None:
    cfg = parse_config('[hosts.a]\nssh = "a"\ngroup = "rack-a"\n[hosts.b]\n', Path("c.toml"))
    assert [h.group for h in cfg.hosts] == ["rack-a", None]
    for bad, said in (('group = ""', "non-empty"), ("group = 3", "expected a string")):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[hosts.a]\n{bad}\n", Path("c.toml"))
        assert info.value.key == "hosts.a.group" and said in str(info.value)


def test_the_group_is_in_the_json_by_the_schema() -> None:
    """`--once --json` carries each host's configured group (null without one), additively."""
    import jsonschema
    from gpuwatch.remote.report import HostReport, document, load_schema

    cfg = parse_config('[hosts.a]\nssh = "a"\ngroup = "rack-a"\n[hosts.b]\n', Path("c.toml"))
    doc = document([HostReport(fx.failed(h, fx.NOW)) for h in cfg.hosts], generated_at=fx.NOW)
    jsonschema.validate(doc, load_schema())
    assert [h["group"] for h in doc["hosts"]] == ["rack-a", None]


# ----------------------------------------------------------------------------- the view

async def test_the_worst_group_comes_first_and_a_fine_group_starts_folded() -> None:
    cfg = fx.config(n_extra=40)  # 45 hosts: node-000..039 all fine, gpu-* one unreachable
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, node_polls(cfg))
        screen = fleet(app)
        keys = screen.table.row_keys
        assert keys[0] == GROUP_ROW + OTHER  # gpu-down could not be polled: worst group first
        assert keys[1] == "gpu-down"  # worst host first inside it
        assert keys[-1] == GROUP_ROW + "node" and len(keys) == 2 + 5  # node folded
        assert cell(screen, keys[0], "host") == "▾ other (5)"
        assert cell(screen, keys[0], "state").startswith("✗1 ✖")
        node = GROUP_ROW + "node"
        assert cell(screen, node, "host") == "▸ node (40)"
        assert cell(screen, node, "state") == "●40"
        assert cell(screen, node, "util") == "40 GPUs"
        assert screen.table.selected_host == "gpu-down"  # the cursor on the worst host
        assert "2 groups" in str(screen.query_one("#fleet-title").render())

        # Space folds the group under the cursor; Space on a folded group's row unfolds it
        await pilot.press("space")
        assert screen.table.row_keys == [GROUP_ROW + OTHER, node]
        assert screen.table.selected_key == GROUP_ROW + OTHER
        await pilot.press("G", "space")  # the node group, unfolded
        assert len(screen.table.row_keys) == 2 + 40
        assert cell(screen, node, "host") == "▾ node (40)"
        await pilot.press("g", "enter")  # Enter on a group's row unfolds it too, opens nothing
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen) and len(screen.table.row_keys) == 2 + 45

        # a host of the node group stops answering: its group's row says so, the order follows
        await feed(pilot, node_polls(cfg, down=("gpu-down", "node-007")))
        keys = screen.table.row_keys
        assert cell(screen, node, "state") == "✗1 ●39"
        assert keys.index("node-007") == keys.index(node) + 1  # worst first inside the group


async def test_a_folded_group_unfolds_when_one_of_its_hosts_turns_bad() -> None:
    cfg = fx.config(n_extra=40)
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, node_polls(cfg))
        screen = fleet(app)
        assert "node-021" not in screen.table.shown
        await feed(pilot, node_polls(cfg, down=("gpu-down", "node-021")))
        await pilot.pause()
        assert "node-021" in screen.table.shown
        keys = screen.table.row_keys  # unfolded, its bad host first
        assert keys[-41:-39] == [GROUP_ROW + "node", "node-021"] and len(keys) == 2 + 45


async def test_configured_groups_in_a_small_fleet_start_open() -> None:
    hosts = tuple(replace(h, group="lab" if h.name in ("gpu-healthy", "gpu-capped") else "cloud")
                  for h in fx.HOSTS)
    cfg = replace(fx.config(), hosts=hosts)
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, fx.latest(cfg))
        screen = fleet(app)
        keys = screen.table.row_keys
        assert keys[0] == GROUP_ROW + "cloud" and GROUP_ROW + "lab" in keys
        assert len(keys) == 2 + 5  # a small fleet's groups start open
        await pilot.press("slash", *"lab")  # a configured group's name finds its hosts
        await pilot.pause()
        assert sorted(screen.table.shown) == ["gpu-capped", "gpu-healthy"]


async def test_slash_finds_a_host_by_name_run_or_user_and_enter_opens_it() -> None:
    """A host in a folded group, found in two keys: `/`, its name, Enter opens it."""
    cfg = fx.config(n_extra=40)
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, node_polls(cfg, users={"node-033": "carol"}))
        screen = fleet(app)
        assert "node-012" not in screen.table.shown  # folded away
        for typed, host in (("node-012", "node-012"), ("mistral", "gpu-capped"),
                            ("carol", "node-033")):
            await pilot.press("slash", "ctrl+u", *typed, "enter")
            await pilot.pause()
            assert isinstance(app.screen, HostScreen) and app.screen.host == host, typed
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is screen
        # several matches: Enter goes back to the table, on the first match, opening nothing
        await pilot.press("slash", "ctrl+u", *"node-01", "enter")
        await pilot.pause()
        assert app.screen is screen and app.focused is screen.table
        assert len(screen.table.shown) == 10
        title = str(screen.query_one("#fleet-title").render())
        assert "10 shown (filter 'node-01')" in title and "2 groups" in title, title
        assert screen.table.selected_host == screen.table.shown[0]
        assert screen.table.row_keys[0] == GROUP_ROW + "node"  # open while filtering
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HostScreen)


# ----------------------------------------------------------------------------- who holds GPUs

async def test_u_lists_who_holds_the_gpus_and_enter_filters_the_fleet_to_them() -> None:
    from gpuwatch.tui.holders import holders
    from gpuwatch.tui.screens.users import UsersScreen
    from gpuwatch.tui.widgets.users_table import UsersTable, hosts_words

    cfg = fx.config(n_extra=40)
    app = make_app(cfg)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, node_polls(cfg, users={"node-033": "carol", "node-034": "carol"}))
        rows = holders(app.hosts.values(), fx.NOW)
        carol = next(r for r in rows if r.user == "carol")
        assert carol.hosts == ("node-033", "node-034") and carol.processes == 2
        assert carol.gpus == (("node-033", 0), ("node-034", 0))
        assert carol.vram_mib == 2 * 61_000 and carol.held_s is not None
        alice = next(r for r in rows if r.user == "alice")  # gpu-healthy's 4 ranks and more
        assert rows[0] == alice and ("gpu-healthy", 3) in alice.gpus
        await pilot.press("u")
        await pilot.pause()
        assert isinstance(app.screen, UsersScreen)
        table = app.screen.query_one(UsersTable)
        assert table.row_count == len(rows)
        assert table.get_cell("carol", "gpus").plain == "2"
        assert table.get_cell("carol", "vram").plain == "119.1 GiB"
        assert table.get_cell("carol", "hosts").plain == "node-033 node-034"
        await pilot.press("j")  # alice, then carol
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        screen = fleet(app)
        assert sorted(screen.table.shown) == ["node-033", "node-034"]
    assert hosts_words([f"node-{i:03d}" for i in range(9)], 30) == "node-000 node-001 node-002 +6"
