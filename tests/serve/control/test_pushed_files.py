"""Push by path: what is copied from the repository into a staged version, and what is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel.errors import InvalidInput, PayloadTooLarge
from serve.control import pushed_files

LIMIT = 1024


def repository(tmp_path: Path) -> Path:
    """A repository with a model folder and a trainer's version folder."""
    root = tmp_path / "repository"
    (root / "policy").mkdir(parents=True)
    folder = root / ".trainer" / "3"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"onnx")
    (folder / "tokenizer.json").write_bytes(b"{}")
    return root


def stage(root: Path, path: str, limit: int = LIMIT) -> Path:
    return pushed_files.stage(root, "policy", 3, path, limit)


def staging_left(root: Path) -> list[str]:
    return [p.name for p in (root / "policy").iterdir()]


def test_a_model_file_brings_its_regular_siblings(tmp_path: Path) -> None:
    root = repository(tmp_path)
    staged = stage(root, "./.trainer//3/model.onnx")
    assert sorted(p.name for p in staged.parent.iterdir()) == ["model.onnx", "tokenizer.json"]
    assert staged.read_bytes() == b"onnx"


def test_another_file_comes_alone_as_the_model(tmp_path: Path) -> None:
    root = repository(tmp_path)
    (root / ".trainer" / "3" / "candidate.onnx").write_bytes(b"other")
    staged = stage(root, ".trainer/3/candidate.onnx")
    assert [p.name for p in staged.parent.iterdir()] == ["model.onnx"]
    assert staged.read_bytes() == b"other"


def test_the_repository_root_may_itself_be_a_link(tmp_path: Path) -> None:
    """The root is the operator's setting: its own link is followed, a client's never."""
    root = repository(tmp_path)
    (tmp_path / "served").symlink_to(root)
    assert stage(tmp_path / "served", ".trainer/3/model.onnx").read_bytes() == b"onnx"


def test_a_pipe_or_folder_beside_is_refused_by_name_without_blocking(tmp_path: Path) -> None:
    root = repository(tmp_path)
    os.mkfifo(root / ".trainer" / "3" / "pipe")
    (root / ".trainer" / "3" / "checkpoints").mkdir()
    with pytest.raises(InvalidInput, match=r"\['checkpoints', 'pipe'\] are not regular files"):
        stage(root, ".trainer/3/model.onnx")
    assert staging_left(root) == []


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "is absolute"),
        ("policy/../../outside/model.onnx", "goes up with '..'"),
        ("", "names no file"),
        ("./", "names no file"),
        (".trainer/3", "is not a regular file"),
        (".trainer/missing/model.onnx", "cannot be opened"),
        (".trainer/3/model.onnx/x", "is not a folder"),
    ],
)
def test_paths_that_name_no_regular_file_inside_are_refused(
    tmp_path: Path, path: str, why: str
) -> None:
    root = repository(tmp_path)
    with pytest.raises(InvalidInput, match=why):
        stage(root, path)
    assert staging_left(root) == []


def test_a_malformed_path_is_quoted_in_part(tmp_path: Path) -> None:
    root = repository(tmp_path)
    with pytest.raises(InvalidInput) as overlong:
        stage(root, "x" * 100_000)
    with pytest.raises(InvalidInput, match="NUL"):
        stage(root, ".trainer/3/model.onnx\x00")
    assert "(100,000 characters)" in overlong.value.message
    assert len(overlong.value.message) < 400


def test_the_files_together_are_bounded_by_the_limit(tmp_path: Path) -> None:
    root = repository(tmp_path)
    with open(root / ".trainer" / "3" / "sparse.bin", "wb") as sparse:
        sparse.truncate(LIMIT - 5)  # each file fits; all of them do not
    with pytest.raises(PayloadTooLarge, match="1,025 bytes"):
        stage(root, ".trainer/3/model.onnx")
    assert staging_left(root) == []
    assert stage(root, ".trainer/3/model.onnx", LIMIT + 1).parent.is_dir()
