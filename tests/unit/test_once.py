"""`--once` end to end on `local` hosts (the same probe, run as a subprocess), pointed at
simulated boxes: the JSON validates against the shipped schema, values are the simulator's,
the store makes two runs stateful, and the exit codes follow the contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from gpuwatch.remote.report import load_schema
from gpuwatch.remote.sim import Box, h100_mig, h100_sxm, rtx_2080_super
from harness.cli import box_env, gpuwatch

PROM_LINE = re.compile(r'^(# (HELP|TYPE) gpuwatch_\w+ .+|'
                       r'gpuwatch_\w+\{([a-z_]+="([^"\\]|\\.)*",?)*\} (-?[0-9.e+-]+|NaN|[+-]Inf))$')


@pytest.mark.parametrize("preset", [h100_sxm, h100_mig, rtx_2080_super],
                         ids=["h100x8", "h100-mig", "rtx2080-na"])
def test_once_json_matches_schema_and_the_simulator(tmp_path: Path, preset) -> None:
    box = Box(tmp_path / "box", preset())
    box.set_gpu(0, util_pct=97, sm_clock_mhz=1410, power_w=512.25, temp_c=66, mem_used_mib=30500)
    box.set_throttle(0, ["sw_power_cap"])
    out = gpuwatch(tmp_path, "--once", "--json", "local", env=box_env(box))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, load_schema())
    (host,) = doc["hosts"]
    assert host["ok"] and host["boot_id"] == box.boot_id
    gpus = host["gpus"]
    assert len(gpus) == len(box.gpus)
    first = gpus[0]
    assert first["uuid"] == box.gpus[0]["uuid"] and first["name"] == box.gpus[0]["name"]
    assert first["sm_clock_mhz"] == 1410 and first["temp_c"] == 66
    assert first["power_w"] == 512.25 and first["mem_used_mib"] == 30500
    assert first["throttle_reasons"] == ["sw_power_cap"]
    expected_util = None if box.gpus[0].get("utilization.gpu") is None else 97
    assert first["util_pct"] == expected_util  # MIG reports util as [N/A]: null, not 0
    mig = box.gpus[0].get("mig.mode.current")
    assert first["mig"] is (mig if isinstance(mig, bool) else None)
    for gpu, state in zip(gpus, box.gpus, strict=True):
        limit = state.get("enforced.power.limit")
        assert gpu["power_limit_w"] == (limit if isinstance(limit, (int, float)) else None)


def test_once_json_gives_each_process_its_cpu_since_the_last_cron_run(tmp_path: Path) -> None:
    """`cpu_pct`: null the first time a process is seen; on the next cron `--once`, the CPU it
    used since the poll the store kept (the simulated box counts a running process's ticks
    as the kernel does: one core per thread)."""
    from dataclasses import replace

    from gpuwatch.remote.sim.box import training_process

    box = Box(tmp_path / "box", h100_sxm(2))
    box.add_process(replace(training_process(4242, gpu=0), threads=1))  # running
    box.add_process(replace(training_process(4343, gpu=1), threads=1, state="S"))
    env = box_env(box)
    docs = []
    for _ in range(2):
        out = gpuwatch(tmp_path, "--once", "--json", "local", env=env)
        assert out.returncode == 0, out.stderr
        docs.append(json.loads(out.stdout))
        jsonschema.validate(docs[-1], load_schema())
        box.advance(10)
    first, second = ({p["pid"]: p["cpu_pct"] for p in d["hosts"][0]["processes"]}
                     for d in docs)
    assert first[4242] is None and first[4343] is None
    assert second[4242] == 100.0 and second[4343] == 0.0


def test_once_text_and_prometheus(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(2))
    env = box_env(box)
    text = gpuwatch(tmp_path, "--once", "local", env=env)
    assert text.returncode == 0
    assert text.stdout.splitlines()[3].split()[:2] == ["local", "ok"]
    prom = gpuwatch(tmp_path, "--once", "--prometheus", "local", env=env)
    assert prom.returncode == 0
    lines = prom.stdout.splitlines()
    assert all(PROM_LINE.match(line) for line in lines), [
        line for line in lines if not PROM_LINE.match(line)]
    assert 'gpuwatch_up{host="local"} 1' in lines
    assert any(line.startswith('gpuwatch_gpu_sm_clock_mhz{host="local",gpu="1"') for line in lines)


def test_two_runs_share_state_through_the_store(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    env = box_env(box)
    first = gpuwatch(tmp_path, "--once", "--json", "local", env=env)
    assert first.returncode == 0
    assert json.loads(first.stdout)["hosts"][0]["findings"] == []
    box.reboot()
    second = gpuwatch(tmp_path, "--once", "--json", "local", env=env)
    findings = json.loads(second.stdout)["hosts"][0]["findings"]
    assert [f["code"] for f in findings] == ["host.rebooted"]
    assert findings[0]["evidence"]["boot_id_now"] == box.boot_id
    assert second.returncode == 0  # a warning: below the default --fail-on critical
    third = gpuwatch(tmp_path, "--once", "--json", "--fail-on", "warning", "local", env=env)
    assert json.loads(third.stdout)["hosts"][0]["findings"] == []  # seen once, not again
    assert third.returncode == 0
    box.reboot()
    fourth = gpuwatch(tmp_path, "--once", "--fail-on", "warning", "local", env=env)
    assert fourth.returncode == 1 and "host.rebooted" in fourth.stdout


def test_a_host_that_cannot_be_polled_exits_2_and_the_others_are_reported(tmp_path: Path) -> None:
    box = Box(tmp_path / "box", h100_sxm(1))
    config = ('[hosts.good]\nssh = "local"\n'
              '[hosts.nopython]\nssh = "local"\npython = "python3-not-installed"\n')
    out = gpuwatch(tmp_path, "--once", "--json", env=box_env(box), config=config)
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, load_schema())
    good, bad = doc["hosts"]
    assert good["ok"] and len(good["gpus"]) == 1
    assert not bad["ok"] and bad["error"]["kind"] == "probe"
    message = bad["error"]["message"]
    assert "python3-not-installed" in message and "not found" in message
    assert [f["code"] for f in bad["findings"]] == ["host.unreachable"]


def python_in(home: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`python -c code` with `home` as its HOME and state."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home),
                               "XDG_STATE_HOME": str(home / "s")}, timeout=60)


def test_once_does_not_import_textual_or_asyncssh_for_local_hosts(tmp_path: Path) -> None:
    """Nor asyncio (with the ssl and logging it pulls in): local hosts poll without an event
    loop (a cron run's start-up)."""
    code = ("import sys\nfrom gpuwatch.tui.cli.command import run\n"
            "rc = run(['--once', 'local'])\n"
            "bad = [m for m in ('textual', 'asyncssh', 'plotext', 'textual_plotext', "
            "'asyncio', 'ssl') if m in sys.modules]\n"
            "print('IMPORTED', bad)\n")
    out = python_in(tmp_path, code)
    assert "IMPORTED []" in out.stdout, out.stdout + out.stderr


def test_several_local_hosts_are_polled_at_once(tmp_path: Path) -> None:
    """Two `local` hosts (one machine, two interpreters) wait in parallel, not one after the
    other: the run takes the longest of their deadlines, not the sum."""
    log = tmp_path / "starts"
    wrapper = tmp_path / "slow-python3"
    wrapper.write_text(f'#!/bin/sh\necho "$(date +%s.%N)" >> {log}\nsleep 2\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    config = "".join(f'[hosts.{n}]\nssh = "local"\npython = "{wrapper}"\n' for n in "ab")
    out = gpuwatch(tmp_path, "--once", "--json", config=config)
    assert out.returncode == 0, out.stderr
    assert [h["ok"] for h in json.loads(out.stdout)["hosts"]] == [True, True]
    first, second = sorted(float(t) for t in log.read_text().split())
    assert second - first < 1.5  # the second began before the first's 2 s sleep ended


def test_the_collector_is_off_only_for_start_up(tmp_path: Path) -> None:
    """main() turns the cyclic garbage collector off for the imports (~20 ms of a
    cron run) and the command turns it back on, with start-up's objects frozen, before its
    work: a poll of many hosts must not run without it."""
    code = ("import gc, sys\nfrom gpuwatch.tui import cli\n"
            "seen = []\n"
            "import gpuwatch.tui.cli.once as once\n"
            "orig = once.run_once\n"
            "def spy(*a, **k):\n"
            "    seen.append((gc.isenabled(), gc.get_freeze_count() > 0))\n"
            "    return orig(*a, **k)\n"
            "once.run_once = spy\n"
            "try:\n    cli.main(['--once', 'local'])\nexcept SystemExit:\n    pass\n"
            "print('POLLED WITH GC', seen)\n")
    out = python_in(tmp_path, code)
    assert "POLLED WITH GC [(True, True)]" in out.stdout, out.stdout + out.stderr


def test_runs_across_two_cron_runs(tmp_path: Path) -> None:
    """A run's series, checkpoints and status carry over through the store: the second run
    reads only what was appended, yet reports the whole series; a killed run is `dead`."""
    from tensorboardX import SummaryWriter

    work = tmp_path / "work"
    (work / "outputs" / "checkpoint-10").mkdir(parents=True)
    (work / "outputs" / "checkpoint-10" / "model.pt").write_bytes(b"x" * 1000)
    (work / "outputs" / "checkpoint-20.tmp").write_bytes(b"partial")
    script = work / "gw_train_job.py"
    script.write_text("import time\nwhile True: time.sleep(1)\n")
    (work / "train.log").write_text("step 1 loss 2.0\n[bold red]not markup[/]\n")
    writer = SummaryWriter(str(work / "runs" / "a"))
    for step in range(10):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.close()  # tensorboardX's flush() is asynchronous; close() is not
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    config = (f'[hosts.me]\nssh = "local"\n[hosts.me.runs.job]\nprocess = "gw_train_job.py"\n'
              f'workdir = "{work}"\nlog = "train.log"\nevents = "runs"\n'
              f'checkpoints = "outputs/checkpoint-*"\n')
    try:
        first = gpuwatch(tmp_path, "--once", "--json", config=config)
        assert first.returncode == 0, first.stderr
        doc = json.loads(first.stdout)
        jsonschema.validate(doc, load_schema())
        (run,) = doc["hosts"][0]["runs"]
        assert run["status"] == "running" and run["pids"] == [proc.pid]
        loss = run["series"]["loss"]
        assert (loss["last_step"], loss["points"]) == (9, 10)
        assert loss["last_value"] == pytest.approx(0.1, rel=1e-7)  # float32 as written
        assert run["latest_checkpoint"] == str(work / "outputs" / "checkpoint-10")
        assert run["checkpoints"][0]["bytes"] == 1000
        assert run["log_age_s"] is not None and run["log_age_s"] >= 0
        time.sleep(1.1)  # the resumed writer's file gets a later name (epoch seconds)
        resumed = SummaryWriter(str(work / "runs" / "a"))  # a restart: a second file
        for step in range(10, 25):
            resumed.add_scalar("loss", 1.0 / (step + 1), step)
        resumed.close()
        proc.kill()
        proc.wait()
        second = gpuwatch(tmp_path, "--once", "--json", config=config)
        (run,) = json.loads(second.stdout)["hosts"][0]["runs"]
        assert run["series"]["loss"]["points"] == 25 and run["series"]["loss"]["last_step"] == 24
        assert run["status"] == "dead" and run["pids"] == []
    finally:
        if proc.poll() is None:
            proc.kill()
