"""The error log: one line for the user, the traceback in a capped file."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.remote import errorlog


def _raise(message: str) -> BaseException:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def test_record_appends_the_traceback_with_its_context(tmp_path: Path) -> None:
    log = tmp_path / "state" / "errors.log"
    assert errorlog.record(_raise("bad\nsecond line"), "judging gpu1", log) == log
    text = log.read_text()
    assert "judging gpu1" in text
    assert "Traceback (most recent call last)" in text
    assert "ValueError: bad" in text
    assert errorlog.summary(_raise("bad\nsecond line")) == "ValueError: bad"


def test_the_log_is_capped_by_rotating(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(errorlog, "MAX_BYTES", 4000)
    log = tmp_path / "errors.log"
    for i in range(50):
        errorlog.record(_raise(f"number {i}"), "ctx", log)
    assert log.stat().st_size <= 4000
    assert (tmp_path / "errors.log.1").stat().st_size <= 4000
    assert "number 49" in log.read_text()


def test_an_unwritable_log_is_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert errorlog.record(_raise("x"), "ctx", blocker / "errors.log") is None


def test_default_path_follows_xdg_state_home() -> None:
    assert errorlog.default_log_path({"XDG_STATE_HOME": "/s"}) == Path("/s/gpuwatch/errors.log")
