"""The system shared-memory registry's checks, on real /dev/shm objects, without a server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr

from kernel.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unsupported,
)
from serve.frontends.oip.shared_memory import (
    DIRECTORY,
    PlacedInput,
    Placement,
    SharedMemory,
    placement,
    shm_name,
)

Make = Callable[[int], str]


@pytest.fixture
def make_object() -> Iterator[Make]:
    """Creates /dev/shm objects of a given size (their keys, '/name'); unlinks them all after."""
    made: list[Path] = []

    def make(size: int) -> str:
        name = f"rlserve-test-{uuid.uuid4().hex}"
        path = DIRECTORY / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        made.append(path)
        return "/" + name

    yield make
    for path in made:
        path.unlink(missing_ok=True)


@pytest.fixture
def registry() -> Iterator[SharedMemory]:
    shm = SharedMemory(enabled=True, max_regions=2, max_region_bytes=1 << 20)
    yield shm
    shm.close()


def write(key: str, offset: int, data: bytes) -> None:
    fd = os.open(DIRECTORY / shm_name(key), os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def read(key: str, offset: int, size: int) -> bytes:
    fd = os.open(DIRECTORY / shm_name(key), os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def test_an_input_is_read_from_its_slice_and_an_output_written_in_place(
    registry: SharedMemory, make_object: Make
) -> None:
    key = make_object(70_000)  # past a page: the window's offset is not page-aligned
    registry.register("r", key, 5000, 60_000)
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    write(key, 5000 + 16, obs.tobytes())
    given = PlacedInput("obs", "FP32", [2, 4], Placement("r", 16, obs.nbytes))
    assert registry.read_input(given) == obs.tobytes()
    registry.write_output("actions", Placement("r", 100, 64), b"\x07" * 16)
    assert read(key, 5100, 17) == b"\x07" * 16 + b"\x00"
    assert [s.to_json() for s in registry.status()] == [
        {"name": "r", "key": key, "offset": 5000, "byte_size": 60_000}
    ]


def test_a_slice_outside_its_region_or_of_the_wrong_size_is_refused(
    registry: SharedMemory, make_object: Make
) -> None:
    registry.register("r", make_object(4096), 0, 64)
    with pytest.raises(InvalidInput, match="runs past region 'r' of 64 bytes"):
        registry.read_input(PlacedInput("obs", "FP32", [2, 4], Placement("r", 40, 32)))
    with pytest.raises(
        InvalidInput, match=r"does not match shape \[2, 4\] of FP32, which takes 32"
    ):
        registry.read_input(PlacedInput("obs", "FP32", [2, 4], Placement("r", 0, 16)))
    with pytest.raises(InvalidInput, match="too small; this call's output takes 16 bytes"):
        registry.check_output("actions", Placement("r", 0, 8), 16)
    with pytest.raises(InvalidInput, match="runs past region"):
        registry.check_output("actions", Placement("r", 60, 16), 16)
    with pytest.raises(NotFound, match="no shared-memory region 'nope' is registered"):
        registry.read_input(PlacedInput("obs", "FP32", [1], Placement("nope", 0, 4)))


def test_registration_checks_the_object_its_window_and_the_bounds(
    registry: SharedMemory, make_object: Make
) -> None:
    key = make_object(4096)
    with pytest.raises(InvalidInput, match=r"runs past the end of .* which holds 4096 bytes"):
        registry.register("r", key, 4000, 100)
    with pytest.raises(InvalidInput, match="a region holds 1 to 1048576 bytes"):
        registry.register("r", key, 0, 0)
    with pytest.raises(NotFound, match="no shared-memory object"):
        registry.register("r", "/rlserve-test-absent-" + uuid.uuid4().hex, 0, 8)
    registry.register("r", key, 0, 8)
    with pytest.raises(Conflict, match="already registered"):
        registry.register("r", key, 0, 8)
    registry.register("s", key, 8, 8)
    with pytest.raises(InvalidInput, match="the most shm_max_regions allows"):
        registry.register("t", key, 16, 8)
    registry.unregister("r")
    registry.unregister("r")  # idempotent, as Triton's
    registry.register("t", key, 16, 8)
    assert [s.name for s in registry.status()] == ["s", "t"]
    registry.unregister()
    assert registry.status() == []
    assert (DIRECTORY / shm_name(key)).exists()  # closed, never unlinked: the client's


@pytest.mark.parametrize(
    "key", ["/a/b", "a/b", "../etc/passwd", "/..", "..", ".", "", "/", "//x", "x\x00y", 7]
)
def test_a_key_that_is_not_a_plain_shm_name_is_refused(registry: SharedMemory, key: object) -> None:
    with pytest.raises(InvalidInput, match=r"key|shared-memory object"):
        registry.register("r", key, 0, 8)  # type: ignore[arg-type]


def test_a_symbolic_link_or_a_directory_in_dev_shm_is_refused(registry: SharedMemory) -> None:
    link = DIRECTORY / f"rlserve-test-link-{uuid.uuid4().hex}"
    folder = DIRECTORY / f"rlserve-test-dir-{uuid.uuid4().hex}"
    link.symlink_to("/etc/hostname")
    folder.mkdir()
    try:
        with pytest.raises(InvalidInput, match="cannot open"):
            registry.register("r", "/" + link.name, 0, 1)
        with pytest.raises(InvalidInput, match=r"cannot open|not a shared-memory object"):
            registry.register("r", "/" + folder.name, 0, 1)
    finally:
        link.unlink()
        folder.rmdir()


def test_an_object_shrunk_after_registration_is_refused_not_read(
    registry: SharedMemory, make_object: Make
) -> None:
    key = make_object(8192)
    registry.register("r", key, 0, 8192)
    os.truncate(DIRECTORY / shm_name(key), 100)
    with pytest.raises(InvalidInput, match="shrank to 100 bytes"):
        registry.read_input(PlacedInput("obs", "UINT8", [8000], Placement("r", 0, 8000)))


def test_everything_is_refused_naming_the_setting_while_it_is_off(make_object: Make) -> None:
    off = SharedMemory(enabled=False, max_regions=2, max_region_bytes=64)
    for call in (lambda: off.register("r", make_object(8), 0, 8), off.status, off.unregister):
        with pytest.raises(Unsupported, match="--allow-client-shm"):
            call()


def test_parameters_place_a_tensor_only_with_a_region_and_a_byte_size() -> None:
    assert placement({"binary_data_size": 4}, "input", "obs") is None
    got = placement({"shared_memory_region": "r", "shared_memory_byte_size": 16}, "input", "x")
    assert got == Placement("r", 0, 16)
    with pytest.raises(InvalidInput, match="input 'obs': give both shared_memory_region and"):
        placement({"shared_memory_region": "r"}, "input", "obs")
    with pytest.raises(InvalidInput, match="shared_memory_offset: expected a byte count"):
        placement(
            {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": -1},
            "output",
            "x",
        )
    with pytest.raises(InvalidInput, match="expected a byte count"):
        placement({"shared_memory_region": "r", "shared_memory_byte_size": True}, "input", "x")


ADMIN = SecretStr("shared-memory-admin-token")


def test_with_an_admin_token_only_its_bearer_is_admitted() -> None:
    guarded = SharedMemory(enabled=True, max_regions=2, max_region_bytes=64, admin_token=ADMIN)
    with pytest.raises(Unauthorized, match=r"system shared memory .*--shm-open.*missing bearer"):
        guarded.admit("")
    with pytest.raises(Forbidden, match="does not match admin_token"):
        guarded.admit("Bearer another-token-entirely")
    guarded.admit("Bearer shared-memory-admin-token")
    guarded.admit("bearer  shared-memory-admin-token ")  # as the admin routes take it
    # no token to check (none set, or shm_open): every caller, as before
    SharedMemory(enabled=True, max_regions=2, max_region_bytes=64).admit("")
    off = SharedMemory(enabled=False, max_regions=2, max_region_bytes=64, admin_token=ADMIN)
    with pytest.raises(Unsupported, match="--allow-client-shm"):
        off.admit("Bearer shared-memory-admin-token")


def test_a_region_name_is_bounded(registry: SharedMemory, make_object: Make) -> None:
    key = make_object(64)
    registry.register("n" * 128, key, 0, 8)
    for name in ("n" * 129, "n" * (1 << 20), ""):
        with pytest.raises(InvalidInput, match="a region needs a name of 1 to 128 characters"):
            registry.register(name, key, 8, 8)
    assert [s.name for s in registry.status()] == ["n" * 128]


def test_a_region_not_registered_is_named_alone_never_the_others(
    registry: SharedMemory, make_object: Make
) -> None:
    registry.register("someone-elses", make_object(64), 0, 8)
    for call in (
        lambda: registry.status("mine"),
        lambda: registry.read_input(PlacedInput("obs", "UINT8", [1], Placement("mine", 0, 1))),
        lambda: registry.check_output("actions", Placement("mine", 0, 8), 8),
    ):
        with pytest.raises(NotFound) as refused:
            call()
        assert "'mine' is registered" in refused.value.message
        assert "someone-elses" not in refused.value.message
