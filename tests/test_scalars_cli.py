"""`gpuwatch scalars`: the DESIGN §3 JSON shape, text summary, exit codes 0 / 1 / 66."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest
from gpuwatch.tui.cli.scalars import EXIT_CORRUPT, EXIT_NOINPUT, EXIT_OK, run_scalars
from tensorboardX import SummaryWriter


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    w = SummaryWriter(str(tmp_path / "runs"))
    for step in range(5):
        w.add_scalar("loss", 1.0 / (step + 1), step, walltime=1000.0 + step)
        w.add_scalars("acc", {"train": step / 10}, step, walltime=1000.0 + step)
    w.add_scalar("odd", float("nan"), 5, walltime=2000.0)
    w.add_scalar("odd", float("inf"), 6, walltime=2001.0)
    w.add_scalar("odd", float("-inf"), 7, walltime=2002.0)
    w.add_histogram("h", [1.0, 2.0], 1)
    w.close()
    return tmp_path / "runs"


def scalars(*paths: str | Path, tags: list[str] | None = None, as_json: bool = True
            ) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_scalars([str(p) for p in paths], tags, as_json, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_json_shape_and_values(logdir: Path) -> None:
    code, out, err = scalars(logdir)
    assert code == EXIT_OK and err == ""
    doc = json.loads(out)
    assert set(doc) == {"runs", "errors"} and doc["errors"] == []
    assert set(doc["runs"]) == {".", "acc/train"}
    run = doc["runs"]["."]
    assert run["loss"] == [[s, 1.0 / (s + 1) if s in (0, 1, 3) else pytest.approx(1.0 / (s + 1)),
                            1000.0 + s] for s in range(5)]
    assert struct.pack("<f", run["loss"][2][1]) == struct.pack("<f", 1.0 / 3)  # float32 exact
    assert run["odd"] == [[5, "nan", 2000.0], [6, "inf", 2001.0], [7, "-inf", 2002.0]]
    assert doc["runs"]["acc/train"]["acc"] == [[s, s / 10 if s in (0, 5) else pytest.approx(
        s / 10), 1000.0 + s] for s in range(5)]
    assert "NaN" not in out and "Infinity" not in out  # strict JSON


def test_file_path_and_several_paths(logdir: Path, tmp_path: Path) -> None:
    (file,) = [p for p in logdir.iterdir() if p.is_file()]
    code, out, _ = scalars(file)
    assert code == EXIT_OK and set(json.loads(out)["runs"]) == {"."}
    code, out, _ = scalars(logdir, file)
    runs = json.loads(out)["runs"]
    assert set(runs) == {str(logdir), str(logdir / "acc" / "train")}
    assert len(runs[str(logdir)]["loss"]) == 5  # the same file reached twice is read once


def test_tag_filter_exact_and_pattern(logdir: Path) -> None:
    _, out, _ = scalars(logdir, tags=["loss"])
    assert json.loads(out)["runs"] == {".": {"loss": json.loads(out)["runs"]["."]["loss"]},
                                       "acc/train": {}}
    _, out, _ = scalars(logdir, tags=["o*"])
    assert list(json.loads(out)["runs"]["."]) == ["odd"]


def test_text_summary(logdir: Path) -> None:
    code, out, _ = scalars(logdir, as_json=False)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0] == "."
    loss = next(line.split() for line in lines if line.strip().startswith("loss"))
    assert loss == ["loss", "5", "0", "4", "0.2", "0.2", "1"]
    odd = next(line for line in lines if line.strip().startswith("odd"))
    assert "(1 nan)" in odd and "inf" in odd


def test_missing_path_and_empty_folder_exit_66(logdir: Path, tmp_path: Path) -> None:
    code, out, err = scalars(tmp_path / "nope")
    assert code == EXIT_NOINPUT and "no such file" in err
    (tmp_path / "empty").mkdir()
    code, out, err = scalars(tmp_path / "empty")
    assert code == EXIT_NOINPUT and "no TensorBoard event file" in err
    code, out, err = scalars(logdir, tmp_path / "nope")  # the good path is still printed
    assert code == EXIT_NOINPUT and len(json.loads(out)["runs"][str(logdir)]["loss"]) == 5


def test_corrupt_record_exits_1_and_keeps_good_data(logdir: Path) -> None:
    (file,) = [p for p in logdir.iterdir() if p.is_file()]
    raw = bytearray(file.read_bytes())
    i = raw.index(b"loss") + 2
    raw[i] ^= 0xFF  # inside the first "loss" record's data
    file.write_bytes(bytes(raw))
    code, out, err = scalars(logdir)
    doc = json.loads(out)
    assert code == EXIT_CORRUPT and len(doc["errors"]) == 1
    assert set(doc["errors"][0]) == {"file", "offset", "message"}
    assert [p[0] for p in doc["runs"]["."]["loss"]] == [1, 2, 3, 4]
    code, out, err = scalars(logdir, as_json=False)
    assert code == EXIT_CORRUPT and "data CRC mismatch" in err
