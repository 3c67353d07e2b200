"""The config as a file a careless user may point anywhere: only a regular file of at most
1 MiB is read (checked before a byte is), an empty --config is a usage error, and pin writes
through a symlinked config to the file it names and never rewrites a read-only one. The CLI runs
as a real process; the files are real (a FIFO, /dev/zero, a 2 MB file, links, a 0444 file)."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from gpuwatch.remote.actions.pin import pin_run
from gpuwatch.remote.config.load import load_config, load_file
from gpuwatch.remote.config.schema import ConfigError
from gpuwatch.remote.model.discovery import Discovery

CONFIG_MAX_BYTES = 1 << 20  # the documented cap (docs/config.md)
CONFIG = '# my fleet\n[hosts.gpu1]\nssh = "gpu1"  # the big box\n'


def gpuwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gpuwatch --once ...` in a process of its own, its memory capped at 1 GiB (a config read
    whole from /dev/zero must fail here, not take the machine's memory)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-c", "from gpuwatch.tui.cli import main; main()",
                           "--once", *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=cap, env=env, check=False)


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "folder", "too_big"])
def test_a_config_that_is_no_regular_small_file_is_a_config_error(tmp_path: Path,
                                                                  kind: str) -> None:
    path = {"dev_zero": Path("/dev/zero"), "fifo": tmp_path / "fifo",
            "folder": tmp_path, "too_big": tmp_path / "big.toml"}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: reading it would wait forever
    if kind == "too_big":
        path.write_text("# padding\n" * (CONFIG_MAX_BYTES // 10 + 1))
    done = gpuwatch("--config", str(path))
    assert done.returncode == 78, (done.returncode, done.stderr[-500:])
    said = {"dev_zero": "not a regular file (a character device)",
            "fifo": "not a regular file (a FIFO", "folder": "not a regular file (a folder)",
            "too_big": f"over the {CONFIG_MAX_BYTES} bytes"}[kind]
    assert f"config error: {path}: " in done.stderr and said in done.stderr


def test_an_empty_config_path_is_a_usage_error() -> None:
    done = gpuwatch("--config", "")
    assert done.returncode == 64 and "an empty path names no config file" in done.stderr
    with pytest.raises(ConfigError, match="empty path"):
        load_config("")


def test_a_symlinked_config_is_read_through_its_link(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "gpuwatch.toml"
    real.parent.mkdir()
    real.write_text(CONFIG)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    assert load_file(link).hosts[0].name == "gpu1"


def discovery(name: str = "train") -> Discovery:
    return Discovery(name=name, key=("/w", "/w/train.py"), alive=True, cwd="/w",
                     argv=("python", "train.py"), process="train.py", log="/w/train.log")


def test_pin_writes_through_a_symlink_to_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "gpuwatch.toml"
    real.parent.mkdir()
    real.write_text(CONFIG)
    real.chmod(0o640)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    said = pin_run(link, "gpu1", discovery())
    assert link.is_symlink() and os.readlink(link) == str(real)
    text = real.read_text()
    assert text.startswith(CONFIG) and "[hosts.gpu1.runs.train]" in text
    assert load_file(link).hosts[0].runs[0].name == "train"
    assert real.stat().st_mode & 0o777 == 0o640
    assert str(real) in said and "the rest of the file is unchanged" in said


def test_pin_never_rewrites_a_read_only_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    path.chmod(0o444)
    before = path.stat()
    with pytest.raises(ValueError, match=r"read-only \(mode 0444\)") as err:
        pin_run(path, "gpu1", discovery())
    assert "chmod u+w" in str(err.value)
    after = path.stat()
    assert path.read_text() == CONFIG and (after.st_ino, after.st_mtime_ns) == (
        before.st_ino, before.st_mtime_ns)


def test_pin_refuses_a_config_it_cannot_read_as_a_config(tmp_path: Path) -> None:
    """A FIFO named as the config: refused at once (never waited on), nothing written."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    result: list[BaseException | str] = []

    def pin() -> None:
        try:
            result.append(pin_run(fifo, "gpu1", discovery()))
        except BaseException as exc:  # handed to the test's thread
            result.append(exc)

    worker = threading.Thread(target=pin, daemon=True)
    worker.start()
    worker.join(30)  # a bound on a test that would otherwise hang, not a timing assertion
    assert result, "pin waited on the FIFO"
    assert isinstance(result[0], ValueError) and "not a regular file" in str(result[0])


def test_pin_from_an_event_loop_runs_off_it(tmp_path: Path) -> None:
    """pin_run_async: the TUI's call. The loop keeps turning while the pin runs in a thread:
    a task of the loop's own finishes before the pin's result is awaited."""
    from gpuwatch.remote.actions.pin import pin_run_async

    path = tmp_path / "config.toml"
    path.write_text(CONFIG)

    async def main() -> tuple[str, bool]:
        other = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(other.set_result, True)
        said = await pin_run_async(path, "gpu1", discovery())
        return said, other.done()

    said, turned = asyncio.run(main())
    assert "pinned run train of gpu1" in said and turned
