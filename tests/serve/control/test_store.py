"""The repository as the durable record: atomic version writes and the serving state."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

import pytest

from kernel.errors import Conflict
from serve.control import store
from serve.control.store import ServingState


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_version(root: Path, version: int, data: bytes) -> Path:
    """What a push does with a checked upload: stage it, then place it."""
    staged = store.staging(root, "policy", version) / "model.onnx"
    staged.write_bytes(data)
    return store.place(root, "policy", version, staged, sha(data))


def test_a_version_is_placed_whole_and_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "policy").mkdir()
    data = b"onnx bytes" * 1000
    path = write_version(tmp_path, 7, data)
    assert path == tmp_path / "policy" / "7" / "model.onnx"
    assert path.read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["7"]


def test_the_same_version_again_is_idempotent_and_different_bytes_conflict(
    tmp_path: Path,
) -> None:
    (tmp_path / "policy").mkdir()
    write_version(tmp_path, 2, b"first")
    write_version(tmp_path, 2, b"first")
    with pytest.raises(Conflict, match="new version number"):
        write_version(tmp_path, 2, b"second")
    assert (tmp_path / "policy" / "2" / "model.onnx").read_bytes() == b"first"
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["2"]  # staging gone


def activate(version: int) -> store.Change:
    return lambda current: ServingState(0, version, newest_seen=0)


def test_each_change_of_intent_gets_the_next_generation(tmp_path: Path) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    assert store.read_state(model) is None
    first = store.update_state(model, activate(3))
    same = store.update_state(model, activate(3))
    second = store.update_state(model, activate(4))
    assert (first.generation, same.generation, second.generation) == (1, 1, 2)
    assert store.read_state(model) == second
    assert second.by == store.worker_id()


def _bump_many(model_dir: str, times: int, start: int) -> None:
    for i in range(times):
        store.update_state(Path(model_dir), activate(start + i))


def test_concurrent_writers_in_other_processes_lose_no_update(tmp_path: Path) -> None:
    model = tmp_path / "policy"
    model.mkdir()
    context = multiprocessing.get_context("spawn")
    writers = [
        context.Process(target=_bump_many, args=(str(model), 25, 1000 * (w + 1))) for w in range(3)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    state = store.read_state(model)
    assert state is not None
    assert state.generation == 75


def test_an_unreadable_or_foreign_state_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / store.STATE_FILE).write_text("[1, 2]")
    assert store.read_state(tmp_path) is None
    (tmp_path / store.STATE_FILE).write_text("{not json")
    assert store.read_state(tmp_path) is None
