"""Triton's system shared-memory extension: regions a client registers, read and written in place.

A client creates a POSIX shared-memory object (``tritonclient.utils.shared_memory`` does) and
registers a window of it under a name: ``register(name, key, offset, byte_size)``. An infer
call then names, per input or requested output, the region, an offset into it and a byte
size (the parameters ``shared_memory_region``, ``shared_memory_offset``, default 0, and
``shared_memory_byte_size``); an input's bytes are read from there instead of the call's
data, an output's written there instead of into the answer. Both transports decode those
parameters with :func:`placement` and hand them to :class:`SharedMemory`, through
``serve.frontends.oip.infer.Inference``.

Off unless the ``allow_client_shm`` setting turns it on: a region names host memory. Once
on, while an ``admin_token`` is set (and ``shm_open`` does not open it to every client), only
the admin may use it: registering, listing and unregistering regions and every call that
places a tensor in one need ``Authorization: Bearer <admin_token>`` (gRPC: the
``authorization`` metadata), checked by :meth:`SharedMemory.admit` with the admin routes'
own check (``serve.frontends.access.check_bearer``). What is checked, before any byte is read or
written:

- a region's name is 1 to 128 characters (a status lists every name: unbounded names could
  make it larger than any client takes); a call naming a region not registered is told
  that name is not registered, never which others are;
- a key is a plain shared-memory name (``/name`` or ``name``: no other ``/``, no ``..``, no
  NUL), opened as ``/dev/shm/<name>`` without following a symbolic link, and must be a
  regular file there;
- a region's window (``offset``, ``byte_size``) lies inside the object's size as ``fstat``
  tells it, at registration and again at every read and write (an object shrunk meanwhile
  is refused, never touched past its end); a window is at most ``shm_max_region_bytes``,
  and at most ``shm_max_regions`` regions are registered at once;
- the object is never mapped: bytes move through its file descriptor (``pread``,
  ``pwrite``), so an object shrunk between the check and the access gives a short read
  (422 for that call), never the SIGBUS a mapping would raise;
- a tensor's slice lies inside its region's window, and its byte size is exactly what the
  input's datatype and shape take, or at least what the output needs.

An input's bytes are copied out of the region when the call is decoded (a client writing the
region afterwards cannot change a call being served); an output is written once its batch
is done, just before the answer. Regions are opened read-write and closed when
unregistered, never unlinked: the client owns the object. Every region is this process's: a
server with several workers (gunicorn) has one registry per worker.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from kernel.errors import Conflict, InvalidInput, NotFound, Unsupported, quoted
from kernel.json_shown import json_shown
from serve.frontends.access import check_bearer
from serve.frontends.oip import tensors

DIRECTORY = Path("/dev/shm")  # where Linux keeps POSIX shared-memory objects
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)
_KEY_CHARACTERS = 255  # NAME_MAX: the longest file name /dev/shm takes
_NAME_CHARACTERS = 128  # a region's name, at most: as the ids clients name other things by
_GUARDED = (
    "system shared memory (guarded by admin_token; a trusted single-tenant host may open it "
    "to every client with --shm-open)"
)
_TURN_ON = (
    "system shared memory is off: start the server with --allow-client-shm "
    "(RLSERVE_ALLOW_CLIENT_SHM=true, allow_client_shm: true) to use it"
)
_NO_CUDA = (
    "CUDA shared memory is not served by rlserve: pass tensors in system shared memory "
    "(/v2/systemsharedmemory, tritonclient.utils.shared_memory) or in the call itself"
)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a tensor's bytes lie: a registered region, an offset into it, a byte size."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class PlacedInput:
    """An input whose bytes are in shared memory, as its call describes it."""

    name: str
    datatype: str
    shape: list[int]
    placement: Placement


@dataclass(frozen=True, slots=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


def placement(parameters: Mapping[str, Any], role: str, name: str) -> Placement | None:
    """The shared-memory placement the parameters of a tensor give (None: they give none),
    the tensor being ``role`` ("input", "output") ``name`` in messages. The region and the
    byte size go together; the offset is optional (0)."""
    if parameters.keys().isdisjoint(PARAMETERS):
        return None
    tensor = f"{role} {quoted(name)}"
    region, size = parameters.get(REGION), parameters.get(BYTE_SIZE)
    if region is None or size is None:
        raise InvalidInput(
            f"{tensor}: give both {REGION} and {BYTE_SIZE} (and optionally {OFFSET}) to "
            "place it in shared memory"
        )
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{tensor}: {REGION} must be a registered region's name")
    offset = parameters.get(OFFSET, 0)
    return Placement(
        region, _count(offset, f"{tensor}: {OFFSET}"), _count(size, f"{tensor}: {BYTE_SIZE}")
    )


def refuse_cuda() -> Unsupported:
    """The answer to registering a CUDA shared-memory region."""
    return Unsupported(_NO_CUDA)


class _Region:
    """One registered window of a shared-memory object, read and written through its file
    descriptor (``pread``/``pwrite``), never mapped: an object its client shrinks while a
    call reads it gives a short read, answered 422, where a mapping would fault (SIGBUS)
    and end the server."""

    def __init__(self, status: RegionStatus, fd: int) -> None:
        self.status = status
        self.fd = fd  # the object, opened read-write; closed when unregistered

    def _window(self, where: Placement, tensor: str) -> int:
        """The object's offset of ``where``'s first byte, once ``where`` is known to lie
        inside the window and the object still holds the whole window."""
        size = self.status.byte_size
        if where.offset + where.byte_size > size:
            raise InvalidInput(
                f"{tensor}: {OFFSET} {where.offset} + {BYTE_SIZE} {where.byte_size} runs past "
                f"region {quoted(self.status.name)} of {size} bytes"
            )
        held = os.fstat(self.fd).st_size
        if self.status.offset + size > held:
            raise self._shrunk(held)
        return self.status.offset + where.offset

    def _shrunk(self, held: int) -> InvalidInput:
        return InvalidInput(
            f"region {quoted(self.status.name)}: its object {quoted(self.status.key)} "
            f"shrank to {held} bytes since it was registered (offset {self.status.offset}, "
            f"{self.status.byte_size} bytes); unregister it and register it again"
        )

    def read(self, where: Placement, tensor: str) -> bytes:
        """A copy of the slice (the client may rewrite the region afterwards)."""
        first = self._window(where, tensor)
        data = os.pread(self.fd, where.byte_size, first)
        if len(data) < where.byte_size:  # shrunk between the check and the read
            raise self._shrunk(first + len(data))
        return data

    def write(self, where: Placement, data: bytes, tensor: str) -> None:
        """The slice written in place. An object shrunk between the check and the write
        grows back to hold it (the window is the client's): never a fault."""
        first = self._window(where, tensor)
        view = memoryview(data)
        while view:
            view = view[os.pwrite(self.fd, view, first + len(data) - len(view)) :]

    def close(self) -> None:
        os.close(self.fd)


class SharedMemory:
    """This process's registered system shared-memory regions, bounded by the settings."""

    def __init__(
        self,
        *,
        enabled: bool,
        max_regions: int,
        max_region_bytes: int,
        admin_token: SecretStr | None = None,
        directory: Path = DIRECTORY,
    ) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.max_region_bytes = max_region_bytes
        self.admin_token = admin_token  # None: any client may use the regions (shm_open)
        self.directory = directory
        self._regions: dict[str, _Region] = {}

    def _on(self) -> None:
        if not self.enabled:
            raise Unsupported(_TURN_ON)

    def admit(self, authorization: str) -> None:
        """A caller may register, list and unregister regions and place tensors in them:
        anyone while no admin token guards them, else the caller whose ``authorization``
        (header or metadata; "" when none) carries it. Checked first, before what the call
        names is looked at (401 without a bearer token, 403 with another one)."""
        self._on()
        if self.admin_token is not None:
            check_bearer(self.admin_token, authorization, _GUARDED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes of the object ``key`` from ``offset`` as region ``name``."""
        self._on()
        if not isinstance(name, str) or not 0 < len(name) <= _NAME_CHARACTERS:
            shown = quoted(name) if isinstance(name, str) else json_shown(name)
            raise InvalidInput(
                f"register: region name {shown}: a region needs a name of 1 to "
                f"{_NAME_CHARACTERS} characters"
            )
        offset = _count(offset, "register: offset")
        byte_size = _count(byte_size, "register: byte_size")
        if name in self._regions:
            raise Conflict(
                f"region {quoted(name)} is already registered; unregister it first, or "
                "register under another name"
            )
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(
                f"register {quoted(name)}: {len(self._regions)} regions are registered, "
                f"the most shm_max_regions allows; unregister one first"
            )
        if byte_size == 0 or byte_size > self.max_region_bytes:
            raise InvalidInput(
                f"register {quoted(name)}: byte_size {byte_size}: a region holds 1 to "
                f"{self.max_region_bytes} bytes (shm_max_region_bytes)"
            )
        path = self.directory / shm_name(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(
                f"register {quoted(name)}: no shared-memory object {quoted(key)} in "
                f"{self.directory}; create it first (tritonclient.utils.shared_memory."
                "create_shared_memory_region)"
            ) from None
        except OSError as exc:  # a symbolic link (ELOOP), a directory, no permission
            raise InvalidInput(
                f"register {quoted(name)}: cannot open shared-memory object {quoted(key)} "
                f"read-write: {exc.strerror}"
            ) from None
        try:
            region = self._checked(name, key, fd, offset, byte_size)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = region

    def _checked(self, name: str, key: str, fd: int, offset: int, byte_size: int) -> _Region:
        facts = os.fstat(fd)
        if not stat.S_ISREG(facts.st_mode):
            raise InvalidInput(
                f"register {quoted(name)}: {quoted(key)} is not a shared-memory object"
            )
        if offset + byte_size > facts.st_size:
            raise InvalidInput(
                f"register {quoted(name)}: offset {offset} + byte_size {byte_size} runs past "
                f"the end of {quoted(key)}, which holds {facts.st_size} bytes"
            )
        return _Region(RegionStatus(name, key, offset, byte_size), fd)

    def status(self, name: str = "") -> list[RegionStatus]:
        """One region's status, or every region's (``name`` empty)."""
        self._on()
        if not name:
            return [region.status for region in self._regions.values()]
        return [self._region(name, "status").status]

    def unregister(self, name: str = "") -> None:
        """Close one region, or every region (``name`` empty). A name not registered is no
        error, as in Triton: unregistering is idempotent. The objects are never unlinked."""
        self._on()
        names = list(self._regions) if not name else [name]
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def cuda_status(self, name: str = "") -> list[RegionStatus]:
        """CUDA regions, as Triton answers where none can be registered: none (a named one
        is not found)."""
        self._on()
        if name:
            raise NotFound(f"no CUDA shared-memory region {quoted(name)}: {_NO_CUDA}")
        return []

    def cuda_unregister(self, name: str = "") -> None:
        """Nothing is registered, so nothing to do: no error, as in Triton (clients clean up
        both kinds; perf_analyzer reports a failure otherwise)."""
        self._on()

    def close(self) -> None:
        """Shutdown: every region closed, whatever the setting."""
        for region in self._regions.values():
            region.close()
        self._regions.clear()

    def _region(self, name: str, tensor: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"{tensor}: no shared-memory region {quoted(name)} is registered")
        return region

    def read_input(self, given: PlacedInput) -> bytes:
        """An input's bytes, once its byte size is what its datatype and shape take."""
        self._on()
        tensor = f"input {quoted(given.name)}"
        needed = (
            tensors.element_count(given.shape, given.name)
            * tensors.dtype_of(given.datatype, given.name).itemsize
        )
        where = given.placement
        if where.byte_size != needed:
            raise InvalidInput(
                f"{tensor}: {BYTE_SIZE} {where.byte_size} does not match shape {given.shape} "
                f"of {given.datatype}, which takes {needed} bytes"
            )
        return self._region(where.region, tensor).read(where, tensor)

    def check_output(self, name: str, where: Placement, needed: int) -> None:
        """Before the run: the output's slice is in a registered region and can hold it."""
        self._on()
        tensor = f"output {quoted(name)}"
        if where.byte_size < needed:
            raise InvalidInput(
                f"{tensor}: {BYTE_SIZE} {where.byte_size} is too small; this call's output "
                f"takes {needed} bytes"
            )
        self._region(where.region, tensor)._window(where, tensor)

    def write_output(self, name: str, where: Placement, data: bytes) -> None:
        """An output's bytes, written in place at its slice."""
        self.check_output(name, where, len(data))
        tensor = f"output {quoted(name)}"
        self._region(where.region, tensor).write(where, data, tensor)


def shm_name(key: str) -> str:
    """The file name in /dev/shm of a POSIX shared-memory key: ``/name`` or ``name``, and
    nothing that would name another file (no other ``/``, no ``..``, no NUL)."""
    if not isinstance(key, str):
        raise InvalidInput("register: key must be the name of a shared-memory object, a string")
    name = key[1:] if key.startswith("/") else key
    valid = (
        0 < len(name) <= _KEY_CHARACTERS
        and "/" not in name
        and ".." not in name
        and name != "."
        and "\x00" not in name
    )
    if not valid:
        raise InvalidInput(
            f"register: key {quoted(key)} is not a shared-memory name; give '/name' or "
            f"'name' (at most {_KEY_CHARACTERS} characters, no other '/', no '..'), the "
            "name shm_open and tritonclient.utils.shared_memory take"
        )
    return name


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"{field}: expected a byte count (an integer of 0 or more), got {json_shown(value)}"
        )
    return value
