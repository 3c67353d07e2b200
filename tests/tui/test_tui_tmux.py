"""The real `gpuwatch --demo` in a real terminal (tmux, 200×50): every pane is on screen, the
dead demo run comes back with `r` + confirm, the zombie's VRAM comes back with `z` + confirm,
and `q` quits with exit code 0. Slow (the demo's OOM happens a minute in): marked slow."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuwatch.remote.sim.fleet import BOX_NAMES
from harness.tmux import Tmux, gpuwatch_in_tmux, tmux_cmd
from harness.waiting import wait_for

pytestmark = [pytest.mark.slow]

PANES = ("GPUs", "Loss", "Checkpoints", "Disks", "Findings", "Processes", "Log")


@contextlib.contextmanager
def demo_in_tmux(folder: Path, label: str = "test",
                 size: tuple[int, int] = (200, 50)) -> Iterator[Tmux]:
    """The real `gpuwatch --demo --interval 1` in a new tmux session of `size` (its config and
    state under folder); on exit it prints GPUWATCH-EXITED-<code>. Killed at the end."""
    with gpuwatch_in_tmux(folder, ["--demo", "--interval", "1"], label=label,
                          size=size) as tmux:
        yield tmux


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Tmux]:
    with demo_in_tmux(tmp_path) as tmux:
        yield tmux


def open_host(tmux: Tmux, name: str) -> str:
    """Open a host's view through the `/` filter, Enter opening the one match (rows re-sort by
    severity as findings change, so a row number would race)."""
    for _ in range(5):  # back to the fleet view (a key can be lost while a toast is up)
        if tmux.capture().lstrip().startswith("gpuwatch ·"):
            break
        tmux.keys("Escape", pause=1.0)
    tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view")
    tmux.keys("/", "C-u")
    tmux.type(name)
    tmux.wait(lambda s: f"1 shown (filter {name!r})" in s, f"the fleet filtered to {name}")
    tmux.keys("Enter")  # the one match: opened
    return tmux.wait(lambda s: s.lstrip().startswith(name), f"the host view of {name}")


POLLED = ("● ok", "▲ ", "✖ ")
"""How a polled host's state cell starts: ok, or its worst finding (warning, critical)."""


def demo_polled(screen: str) -> bool:
    """Every demo host polled: its state says ok or names its worst problem."""
    rows = [line for line in screen.splitlines() if line.lstrip().startswith("demo-")]
    return len(rows) == len(BOX_NAMES) and all(any(mark in row for mark in POLLED)
                                               for row in rows)


def test_demo_in_tmux_relaunch_reap_and_quit(demo: Tmux) -> None:
    tmux = demo
    fleet = tmux.wait(demo_polled, "every demo host polled", 90)
    for host in ("demo-healthy", "demo-capped", "demo-zombie", "demo-oom", "demo-disk"):
        assert host in fleet

    # Every pane of the host view is on screen at 200x50.
    open_host(tmux, "demo-healthy")
    tmux.wait(lambda s: all(f"─ {title} ─" in s for title in PANES), "every pane on screen")
    tmux.keys("Escape")

    # The OOM box's run dies a minute in; relaunch it with r and confirm, see it running again.
    open_host(tmux, "demo-oom")
    tmux.wait_for("gpt2-xl † dead", 150)
    tmux.keys("r")
    modal = tmux.wait_for("Relaunch run gpt2-xl on demo-oom?")
    assert "Cancel" in modal and "--resume" in modal
    tmux.keys("Tab", "Enter")
    tmux.wait_for("gpt2-xl ▶ running", 60)
    tmux.keys("Escape")

    # The zombie box: rank 3 holds VRAM on GPU 3 with no live run; z frees it.
    open_host(tmux, "demo-zombie")
    tmux.wait_for("zombie VRAM", 60)
    tmux.keys("z")
    tmux.wait_for("Reap the zombie VRAM holders on demo-zombie?")
    tmux.keys("Tab", "Enter")
    tmux.wait(lambda s: "zombie VRAM" not in s and "GPU3 H100 80GB HBM3" in s
              and "VRAM 0.0/79.6 GiB" in s.split("GPU3", 1)[1][:120], "GPU 3's VRAM back", 60)
    # Back to the fleet view before q: an Escape still unread when q arrives reaches the app as
    # one "ESC q" read, which a terminal parser rightly takes for alt+q (CI saw exactly that).
    tmux.keys("Escape")
    tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view")

    # q: the TUI leaves the screen and the process exits 0 (the demo fleet then ends its
    # processes). The time it takes is printed, not asserted: a plain test asserts no wall-clock
    # time; tests/bench/bench_tui.py measures quitting.
    start = time.monotonic()
    tmux.keys("q", pause=0)
    tmux.wait(lambda s: "q Quit" not in s, "the TUI to leave the screen", 30)
    gone = time.monotonic() - start
    try:
        tmux.wait_for("GPUWATCH-EXITED-0", 30)
    except AssertionError as exc:  # say where it is stuck (CI saw this once)
        raise AssertionError(f"{exc}\nits threads, as faulthandler printed them:\n"
                             f"{tmux.stacks()}") from None
    exited = time.monotonic() - start
    print(f"q: TUI gone after {gone:.2f} s, process exited after {exited:.2f} s")


def test_the_demo_tells_its_stories_early_and_shows_nothing_of_this_machine(
        tmp_path: Path) -> None:
    """The demo at its own pace (2 s polls), as a person first sees it at 160×48: the capped
    GPU capped from its first row, its warning soon after; the OOM death, the low disk; then
    demo-disk's view: its own hostname and load (this machine's showed), a time-to-full with
    its rate, the run's command by script name, the newest checkpoint first. How long each
    took is printed, not asserted (a plain test asserts no wall-clock time; README says when)."""
    with gpuwatch_in_tmux(tmp_path, ["--demo"], label="story", size=(160, 48)) as tmux:
        start = time.monotonic()
        first = tmux.wait(demo_polled, "every demo host polled", 90)
        capped = next(line for line in first.splitlines() if "demo-capped" in line)
        assert "100%" in capped and re.search(r"\b3\d%", capped), capped  # SM clock ~37%
        said = {}
        for host, words in (("demo-capped", "busy, low clock"), ("demo-disk", "disk low"),
                            ("demo-oom", "run died")):
            tmux.wait(lambda s, h=host, w=words: any(h in line and w in line
                                                     for line in s.splitlines()),
                      f"{host}: {words}", 120)
            said[host] = time.monotonic() - start
        print("first shown after (s):", {h: round(s, 1) for h, s in said.items()})

        screen = open_host(tmux, "demo-disk")
        header = screen.splitlines()[0]
        assert "hostname demo-disk" in header and f"hostname {os.uname().nodename} " not in header
        assert re.search(r"load \d+\.\d/26 CPUs", header), header
        screen = tmux.wait(lambda s: "full in ~" in s, "a time-to-full on the disk gauge", 30)
        assert re.search(r"full in ~[^(]+\([\d.]+ [KMGT]iB/h", screen), screen
        assert "python3 train.py --run sdxl-finetune" in screen
        screen = tmux.wait(lambda s: "checkpoint-60" in s, "two checkpoints", 90)
        rows = [line for line in screen.splitlines() if " ago  checkpoint-" in line]
        names = [re.search(r"checkpoint-(\d+)", row).group(1) for row in rows]  # type: ignore[union-attr]
        assert names == sorted(names, key=int, reverse=True), rows  # newest first
        tmux.keys("Escape")
        tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view", 10)
        tmux.keys("q", pause=0)
        tmux.wait_for("GPUWATCH-EXITED-0", 30)


def test_80x24_reaches_every_pane_by_keys_and_cuts_no_fleet_column(tmp_path: Path) -> None:
    """At 80×24 (a tmux split, a laptop terminal) the fleet view drops whole columns rather than
    cutting run names and VRAM mid-word (the findings' counts stay), and in the host view each
    pane's title comes on screen by its number key, by Tab from the pane before it and by
    Shift+Tab from the one after it."""
    with demo_in_tmux(tmp_path, label="small", size=(80, 24)) as tmux:
        fleet = tmux.wait(demo_polled, "every demo host polled", 90)
        rows = [line for line in fleet.splitlines() if line.lstrip().startswith("demo-")]
        assert len(rows) == len(BOX_NAMES), fleet
        for line in rows:
            assert len(line.rstrip()) <= 80
            for run in ("llama-7b", "vit-huge", "bert-ddp", "gpt2-xl"):
                if run[:3] in line:  # a run name is shown whole or not at all
                    assert run in line, (run, line)
            if "GiB" in line:  # VRAM whole where it is shown: "N/M GiB"
                assert re.search(r"\d+/\d+ GiB", line), line
        # the findings' counts by severity are the last column to go (VRAM goes first)
        assert any(re.search(r"\d[✖▲]", line) for line in rows), fleet
        assert "Kill" not in fleet and "Relaunch" not in fleet  # host-only keys

        screen = open_host(tmux, "demo-healthy")
        assert "─ GPUs ─" in screen
        for n, title in enumerate(PANES, 1):
            tmux.keys(str(n))
            tmux.wait_for(f"─ {title} ─")
        tmux.keys("1")
        tmux.wait_for("─ GPUs ─")
        for title in PANES[1:]:
            tmux.keys("Tab")
            tmux.wait_for(f"─ {title} ─")
        for title in reversed(PANES[:-1]):
            tmux.keys("BTab")
            tmux.wait_for(f"─ {title} ─")
        tmux.keys("Escape")
        tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view")
        tmux.keys("q", pause=0)
        tmux.wait_for("GPUWATCH-EXITED-0", 30)


def test_box_text_reaches_the_terminal_inert(tmp_path: Path) -> None:
    """A box's hostname, command line, run name, checkpoint name and log line carrying OSC 2 (a
    new window title), CSI (clear the screen), BEL and Textual markup (tests/hostile_box.py),
    shown by the real TUI in a real terminal: on screen each reads as written, control
    characters as `\\x1b`, markup as brackets; in the raw bytes gpuwatch wrote, none of the
    box's sequences; and the terminal's title is not the box's."""
    import hostile_box as hb

    box = hb.make(tmp_path / "hostile")
    config = tmp_path / "config.toml"
    config.write_text(box.config())
    raw = tmp_path / "raw-pty-output"
    with gpuwatch_in_tmux(tmp_path, ["--config", str(config)], env=box.env(), label="evil",
                          raw=raw) as tmux:
        tmux.wait(lambda s: any(mark in s for mark in POLLED), "the hostile host polled", 60)
        tmux.keys("Enter")  # the only host: open it
        screen = tmux.wait(lambda s: hb.SHOWN in s and "saving to [/data/ckpt" in s
                           and "ckpt\\x1b]2;" in s, "the box's text on screen", 30)
        header = screen.lstrip().splitlines()[0]
        assert f"evilhost{hb.SHOWN}" in header  # the hostname, whole
        assert f"run{hb.SHOWN}" in screen  # the run's tab
        assert f"ckpt{hb.SHOWN[:20]}" in screen  # the checkpoint
        assert f"saving to [/data/ckpt/step-100] {hb.SHOWN[:22]}" in screen  # the log line
        # k on the process (the row below its run's): the confirmation shows its command line
        # as written, escapes visible
        tmux.keys("Down")
        tmux.keys("K")
        modal = tmux.wait_for(f"Kill process {hb.PID} on evil?")
        assert f"--tag={hb.SHOWN}" in modal
        tmux.keys("Escape")
        tmux.wait(lambda s: "Kill cancelled" in s, "the kill cancelled")
        title = tmux_cmd(tmux.socket, "display-message", "-p", "-t", tmux.name,
                         "#{pane_title}").stdout
        assert hb.TITLE not in title
        tmux.keys("Escape")
        tmux.wait(lambda s: s.lstrip().startswith("gpuwatch ·"), "the fleet view")
        tmux.keys("q", pause=0)
        tmux.wait_for("GPUWATCH-EXITED-0", 30)
    out = raw.read_bytes()
    assert b"evilhost\\x1b]2;GW-PWNED-TITLE" in out  # what was written is what was read
    for sequence in (hb.OSC, hb.CSI, "\x1b]2;" + hb.TITLE):
        at = out.find(sequence.encode())
        assert at < 0, (sequence, out[max(0, at - 80):at + 80])
    # Textual's own BELs end its OSC 22 (the mouse pointer's shape); any other is the box's.
    at = re.sub(rb"\x1b\]22;[a-z-]*\x07", b"", out).find(b"\x07")
    assert at < 0, out[max(0, at - 80):at + 80]


def test_a_demo_whose_terminal_closes_removes_its_fleet_and_temp_folder(tmp_path: Path) -> None:
    """tmux kill-session (or a dropped SSH) sends SIGHUP: the demo ends as on `q`, its boxes'
    servers and processes stopped and its temp folder removed (44 were left on one machine)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    with gpuwatch_in_tmux(tmp_path, ["--demo"], env={"TMPDIR": str(temp)},
                          label="hup") as tmux:
        tmux.wait(demo_polled, "every demo host polled", 120)
        assert [p.name for p in temp.iterdir() if p.name.startswith("gpuwatch-demo-")]
        tmux_cmd(tmux.socket, "kill-session", "-t", tmux.name)
        # The fleet's servers stop first (seconds), then its folder goes.
        wait_for(lambda: not [p.name for p in temp.iterdir()
                              if p.name.startswith("gpuwatch-demo-")],
                 120, "the demo's temporary folder removed")


def test_the_first_screen_at_80x24_answers_first(tmp_path: Path) -> None:
    """A new user's first minute at 80×24: within 40 s the fleet's first row is its worst host
    (its verdict critical), the title sums the fleet up (hosts by verdict, GPUs), and Enter on
    that first row (demo-oom, OOM-killed) shows the death and what to do on the first screen,
    above the panes."""
    with demo_in_tmux(tmp_path, label="first", size=(80, 24)) as tmux:
        started = time.monotonic()

        def worst_first(screen: str) -> bool:
            rows = [line for line in screen.splitlines() if line.lstrip().startswith("demo-")]
            return bool(rows) and "✖ run died" in rows[0] and "demo-oom" in rows[0]

        fleet = tmux.wait(worst_first, "demo-oom's death as the first row", 40)
        took = time.monotonic() - started
        title = fleet.splitlines()[0]
        assert re.search(r"✖\d", title) and re.search(r"\d+ GPUs", title), title
        tmux.keys("Enter")
        screen = tmux.wait(lambda s: s.lstrip().startswith("demo-oom"), "demo-oom's view", 10)
        top = screen.splitlines()[:3]  # the header, then the answer, before any pane
        assert "✖ run died: OOM-killed" in top[0], screen
        assert top[1].lstrip().startswith("✖ run died: OOM-killed — fix the cause"), screen
        print(f"the worst host was the first row {took:.1f} s after the start")


FAKES = Path(__file__).resolve().parents[1] / "integration" / "fleet_fakes.py"


@contextlib.contextmanager
def fake_fleet(folder: Path, hosts: dict[str, bool]) -> Iterator[Path]:
    """tests/integration/fleet_fakes.py's cheap SSH boxes, one per host, answering (True) or a
    black hole (False); yields a config that names them all (connect_timeout 2 s)."""
    import asyncssh

    keys = folder / "keys"
    keys.mkdir(parents=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(keys / "client_key"))
    (keys / "client_key").chmod(0o600)
    key.write_public_key(str(keys / "client_key.pub"))
    good = [n for n, ok in hosts.items() if ok]
    bad = [n for n, ok in hosts.items() if not ok]
    fleet = subprocess.Popen([sys.executable, str(FAKES), str(len(good)), str(len(bad)),
                              str(keys)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert fleet.stdout is not None
        import json

        ports = json.loads(fleet.stdout.readline())
        port = dict(zip(good, ports["good"], strict=True)) | dict(
            zip(bad, ports["bad"], strict=True))
        host_key = " ".join((keys / "host_key.pub").read_text().split()[:2])
        known = folder / "known_hosts"
        known.write_text("".join(f"[127.0.0.1]:{p} {host_key}\n" for p in port.values()))
        (folder / "ssh_config").write_text("\n".join(
            f"Host {name}\n    HostName 127.0.0.1\n    Port {p}\n    User gwt\n"
            f"    IdentityFile {keys / 'client_key'}\n    IdentitiesOnly yes\n"
            for name, p in port.items()))
        config = folder / "fleet.toml"
        config.write_text(
            "interval = 10\n[ssh]\nconnect_timeout = 2\n"
            f"config_file = {json.dumps(str(folder / 'ssh_config'))}\n"
            f"known_hosts = {json.dumps(str(known))}\n"
            + "".join(f'[hosts.{name}]\nssh = "{name}"\n' for name in hosts))
        yield config
    finally:
        if fleet.stdin is not None:
            fleet.stdin.close()  # it serves until its stdin closes
        try:
            fleet.wait(10)
        except subprocess.TimeoutExpired:
            fleet.kill()
            fleet.wait()


RACKS, NODES = 12, 500


def test_a_large_fleet_at_80x24_worst_group_first_and_a_host_found_in_two_keys(
        tmp_path: Path) -> None:
    """512 hosts over real SSH at 80×24 (the fleet issue 31 asks for): 500 answering
    `node-NNN` boxes and 12 `rack-N` black holes. The rack group, every host of it unreachable,
    is the first row, open, its hosts under it; the node group is a row of its own further down;
    `/`, a node's name, Enter: its view."""
    hosts = ({f"rack-{i}": False for i in range(RACKS)}
             | {f"node-{i:03d}": True for i in range(NODES)})
    with fake_fleet(tmp_path, hosts) as config, gpuwatch_in_tmux(
            tmp_path, ["--config", str(config)], label="groups", size=(80, 24)) as tmux:

        def worst_group_first(screen: str) -> bool:
            rows = [line.strip() for line in screen.splitlines()]
            group = next((i for i, r in enumerate(rows) if r.startswith(("▾", "▸"))), None)
            return (group is not None and rows[group].startswith(f"▾ rack ({RACKS})")
                    and f"✗{RACKS}" in rows[group] and rows[group + 1].startswith("rack-")
                    and "✗" in rows[group + 1])

        screen = tmux.wait(worst_group_first, "the rack group first, every host unreachable",
                           90)
        title = screen.splitlines()[0]
        assert f"{RACKS + NODES} hosts" in title and "2 groups" in title, screen
        print(screen)
        tmux.wait(lambda s: f"node ({NODES})" in s or any(
            line.strip().startswith("node-") for line in s.splitlines()),
                  "the node group's row or its hosts on the screen", 60)
        tmux.keys("/")
        tmux.type("node-077")
        tmux.wait(lambda s: "1 shown (filter 'node-077')" in s, "node-077 alone", 20)
        tmux.keys("Enter")
        view = tmux.wait(lambda s: s.lstrip().startswith("node-077"), "node-077's view", 20)
        assert "GPUs" in view, view
        tmux.keys("q")
        tmux.wait_for("GPUWATCH-EXITED-0", 30)
