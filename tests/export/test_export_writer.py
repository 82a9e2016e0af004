"""The model repository writer: next free versions, immutable versions, no half-written dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from export import writer
from export.errors import ExportError


def _accept(_: Path) -> None:
    return None


def test_versions_count_up_from_the_highest_existing_one(tmp_path: Path) -> None:
    assert writer.destination(tmp_path, "cartpole", None).version == 1
    (tmp_path / "cartpole" / "1").mkdir(parents=True)
    (tmp_path / "cartpole" / "4").mkdir()
    (tmp_path / "cartpole" / "notes").mkdir()
    assert writer.destination(tmp_path, "cartpole", None).version == 5


def test_an_existing_version_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "cartpole" / "2").mkdir(parents=True)
    with pytest.raises(ExportError, match=r"--version 2: .* already exists .* \(3\)"):
        writer.destination(tmp_path, "cartpole", 2)


@pytest.mark.parametrize("name", ["", "../escape", ".hidden", "a/b", "with space", "a" * 129])
def test_names_that_are_not_one_safe_path_segment_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ExportError, match=r"--name .*: a model name is 1 to 128 letters, digits"):
        writer.destination(tmp_path, name, None)


def test_the_longest_name_is_a_directory_that_can_be_written(tmp_path: Path) -> None:
    dest = writer.destination(tmp_path, "a" * 128, None)
    assert writer.write(dest, b"bytes", check=_accept).read_bytes() == b"bytes"


def test_a_written_version_appears_whole_and_readable(tmp_path: Path) -> None:
    path = writer.write(writer.destination(tmp_path, "m", None), b"bytes", check=_accept)
    assert path == tmp_path / "m" / "1" / "model.onnx"
    assert path.read_bytes() == b"bytes"
    assert (path.parent.stat().st_mode & 0o777) == 0o755
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["1"]


def test_a_failed_check_leaves_nothing_behind(tmp_path: Path) -> None:
    def reject(path: Path) -> None:
        assert path.read_bytes() == b"bytes"  # checked in its temporary place
        raise ExportError("golden vectors differ")

    with pytest.raises(ExportError, match="golden vectors differ"):
        writer.write(writer.destination(tmp_path, "m", None), b"bytes", check=reject)
    assert list(tmp_path.iterdir()) == []


def test_a_version_taken_meanwhile_is_reported_not_replaced(tmp_path: Path) -> None:
    destination = writer.destination(tmp_path, "m", None)
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"theirs")
    with pytest.raises(ExportError, match="another export may have taken this version"):
        writer.write(destination, b"ours", check=_accept)
    assert (tmp_path / "m" / "1" / "model.onnx").read_bytes() == b"theirs"
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["1"]
