"""Triton's system shared-memory extension against a real server, with Triton's own clients.

``tritonclient.http`` and ``tritonclient.grpc`` create regions with
``tritonclient.utils.shared_memory``, register them with ``rlserve serve --allow-client-shm``,
and infer with inputs and outputs in shared memory: the answers equal the same call with
ordinary tensors. Every bad call is answered clearly; the extension is off by default; with
an admin token set, only its bearer uses it (``--shm-open`` opens it again); every region a
test made is destroyed, and nothing of them is left in /dev/shm.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import DEMO
from tests.e2e.server import Server, free_port

PREFIX = "rlserve-e2e-"
MAX_REGIONS = 3
TOKEN = "shm-e2e-admin-token-0123456789"
ADMIN = {"authorization": f"Bearer {TOKEN}"}  # tritonclient's headers=: HTTP or gRPC metadata
TRANSPORTS = ["http", "grpc"]
OUTPUTS = ("actions", "log_probs", "values", "logits")


class Shm:
    """A server with system shared memory on, clients for both transports, and the regions
    the tests create (destroyed at the end)."""

    def __init__(self, server: Server, grpc_port: int) -> None:
        self.server = server
        self.urls = {"http": server.url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}
        self.handles: list[Any] = []

    def client(self, transport: str) -> Any:
        module = triton_http if transport == "http" else triton_grpc
        return module.InferenceServerClient(self.urls[transport])

    def region(self, size: int) -> tuple[Any, str]:
        """A new shared-memory object of ``size`` bytes: its handle and its key."""
        key = f"/{PREFIX}{uuid.uuid4().hex}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, size)
        self.handles.append(handle)
        return handle, key


def start(
    repository: Path, tmp: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[Server, int]:
    grpc_port = free_port()
    server = Server.rlserve(
        repository, "--grpc-port", str(grpc_port), *flags, env=env, log=tmp / "log"
    )
    server.wait_ready()
    return server, grpc_port


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("shm") / "repository"
    shutil.copytree(DEMO, repo / "cartpole")
    return repo


@pytest.fixture(scope="module")
def served(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shm]:
    tmp = tmp_path_factory.mktemp("shm-server")
    server, grpc_port = start(
        repository, tmp, "--allow-client-shm", "--shm-max-regions", str(MAX_REGIONS)
    )
    served = Shm(server, grpc_port)
    yield served
    server.stop()
    for handle in served.handles:
        shm.destroy_shared_memory_region(handle)
    assert [name for name in Path("/dev/shm").iterdir() if name.name.startswith(PREFIX)] == []


@pytest.fixture
def shm_server(served: Shm) -> Iterator[Shm]:
    """The shared server, with no region registered after each test."""
    yield served
    for transport in TRANSPORTS:
        with served.client(transport) as client:
            client.unregister_system_shared_memory()


def module_of(transport: str) -> Any:
    return triton_http if transport == "http" else triton_grpc


def obs(n: int) -> np.ndarray:
    return np.random.default_rng(n).uniform(-0.2, 0.2, (n, 4)).astype(np.float32)


def ordinary(client: Any, transport: str, values: np.ndarray) -> dict[str, np.ndarray]:
    module = module_of(transport)
    given = module.InferInput("obs", list(values.shape), "FP32")
    given.set_data_from_numpy(values)
    result = client.infer(
        "cartpole",
        [given],
        outputs=[module.InferRequestedOutput(name) for name in OUTPUTS],
        parameters={"deterministic": True},
    )
    return {name: result.as_numpy(name) for name in OUTPUTS}


def statuses(client: Any, transport: str, name: str = "") -> dict[str, dict[str, int | str]]:
    """Regions by name, as the server tells them (either transport's shape)."""
    if transport == "http":
        listed = client.get_system_shared_memory_status(name)
        return {r["name"]: {k: r[k] for k in ("key", "offset", "byte_size")} for r in listed}
    answer = client.get_system_shared_memory_status(name)
    return {
        n: {"key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for n, r in answer.regions.items()
    }


def refusal(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_inputs_and_outputs_in_shared_memory_answer_as_ordinary_tensors(
    shm_server: Shm, transport: str
) -> None:
    module, rows = module_of(transport), obs(3)
    handle, key = shm_server.region(4096)
    # A window from byte 128 of the object: the call's offsets count from there.
    shm.set_shared_memory_region(handle, [rows], offset=128 + 16)
    with shm_server.client(transport) as client:
        client.register_system_shared_memory("io", key, 2048, offset=128)
        assert statuses(client, transport) == {"io": {"key": key, "offset": 128, "byte_size": 2048}}
        assert statuses(client, transport, "io") == statuses(client, transport)
        given = module.InferInput("obs", [3, 4], "FP32")
        given.set_shared_memory("io", rows.nbytes, offset=16)
        wanted = []
        for i, name in enumerate(OUTPUTS):
            output = module.InferRequestedOutput(name)
            if name != "values":  # one output answered in the call, the others in place
                output.set_shared_memory("io", 256, offset=512 + 256 * i)
            wanted.append(output)
        result = client.infer(
            "cartpole", [given], outputs=wanted, parameters={"deterministic": True}
        )
        expected = ordinary(client, transport, rows)
    for i, name in enumerate(OUTPUTS):
        want = expected[name]
        if name == "values":
            np.testing.assert_array_equal(result.as_numpy(name), want)
            continue
        got = shm.get_contents_as_numpy(handle, want.dtype, want.shape, offset=128 + 512 + 256 * i)
        np.testing.assert_array_equal(got, want, err_msg=name)
        output = result.get_output(name)
        # as Triton answers: name, datatype and shape, nothing Triton's C++ client would
        # read as data (HTTP parameters are binary_data_size to it; a gRPC output's
        # raw_output_contents entry is the one at its own index, empty here)
        if transport == "http":
            assert set(output) == {"name", "datatype", "shape"}
            assert output["shape"] == list(want.shape)
        else:
            assert not output.parameters
            assert list(output.shape) == list(want.shape)
            response = result.get_response()
            index = [o.name for o in response.outputs].index(name)
            assert response.raw_output_contents[index] == b""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unregistering_closes_one_region_or_all(shm_server: Shm, transport: str) -> None:
    _, key = shm_server.region(64)
    with shm_server.client(transport) as client:
        client.register_system_shared_memory("a", key, 32)
        client.register_system_shared_memory("b", key, 32, offset=32)
        client.unregister_system_shared_memory("a")
        assert list(statuses(client, transport)) == ["b"]
        client.unregister_system_shared_memory("a")  # no longer registered: no error, as Triton
        client.unregister_system_shared_memory()
        assert statuses(client, transport) == {}
        error = refusal(lambda: client.get_system_shared_memory_status("b"))
        assert "no shared-memory region 'b' is registered" in error.message()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_calls_are_answered_naming_what_is_wrong(shm_server: Shm, transport: str) -> None:
    module = module_of(transport)
    handle, key = shm_server.region(256)
    shm.set_shared_memory_region(handle, [obs(2)])

    def infer(client: Any, region: str, size: int, offset: int = 0, out: int = 256) -> Any:
        given = module.InferInput("obs", [2, 4], "FP32")
        given.set_shared_memory(region, size, offset=offset)
        output = module.InferRequestedOutput("actions")
        output.set_shared_memory("r", out, offset=64)
        return lambda: client.infer("cartpole", [given], outputs=[output])

    with shm_server.client(transport) as client:
        client.register_system_shared_memory("r", key, 128)
        cases = {
            "no shared-memory region 'nope' is registered": infer(client, "nope", 32),
            "runs past region 'r' of 128 bytes": infer(client, "r", 32, offset=100),
            "does not match shape [2, 4] of FP32, which takes 32 bytes": infer(client, "r", 16),
            "is too small; this call's output takes 16 bytes": infer(client, "r", 32, out=8),
            "key '/a/b' is not a shared-memory name": lambda: client.register_system_shared_memory(
                "s", "/a/b", 8
            ),
            "key '/../etc/passwd' is not a shared-memory name": lambda: (
                client.register_system_shared_memory("s", "/../etc/passwd", 8)
            ),
            "region 'r' is already registered": lambda: client.register_system_shared_memory(
                "r", key, 8
            ),
            "runs past the end of": lambda: client.register_system_shared_memory("s", key, 512),
            "no shared-memory object": lambda: client.register_system_shared_memory(
                "s", f"/{PREFIX}absent", 8
            ),
        }
        for expected, call in cases.items():
            assert expected in refusal(call).message(), expected
        for i in range(1, MAX_REGIONS):
            client.register_system_shared_memory(f"more-{i}", key, 8)
        error = refusal(lambda: client.register_system_shared_memory("one-too-many", key, 8))
        assert "the most shm_max_regions allows" in error.message()


def test_http_statuses_and_cuda_shared_memory_as_triton_without_cuda(shm_server: Shm) -> None:
    with httpx.Client(base_url=shm_server.server.url, timeout=10) as http:
        unknown = http.get("/v2/systemsharedmemory/region/nope/status")
        assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
        twice = http.post("/v2/systemsharedmemory/region/x/register", content=b"{")
        assert twice.status_code == 400
        wrong = http.get("/v2/systemsharedmemory/region/x/register")
        assert wrong.status_code == 405
        # CUDA's routes as Triton answers them without CUDA: clients that clean up both
        # kinds (perf_analyzer) see no error; registering is refused, naming the way out
        assert http.get("/v2/cudasharedmemory/status").json() == []
        assert http.post("/v2/cudasharedmemory/unregister").status_code == 200
        assert http.post("/v2/cudasharedmemory/region/g/unregister").status_code == 200
        named = http.get("/v2/cudasharedmemory/region/g/status")
        assert (named.status_code, named.json()["code"]) == (404, "not_found")
        cuda = http.post("/v2/cudasharedmemory/region/g/register", json={"raw_handle": {}})
        assert (cuda.status_code, cuda.json()["code"]) == (400, "unsupported")
        assert "CUDA shared memory is not served" in cuda.json()["error"]
        extensions = http.get("/v2").json()["extensions"]
        assert "system_shared_memory" in extensions
        assert "cuda_shared_memory" not in extensions


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_clients_cleaning_up_cuda_regions_find_none_and_no_error(
    shm_server: Shm, transport: str
) -> None:
    with shm_server.client(transport) as client:
        status = client.get_cuda_shared_memory_status()
        assert (status == []) if transport == "http" else (not status.regions)
        client.unregister_cuda_shared_memory()  # what perf_analyzer calls as it ends
        client.unregister_cuda_shared_memory("g")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_extension_is_off_by_default_naming_the_setting(
    repository: Path, tmp_path: Path, transport: str
) -> None:
    server, grpc_port = start(repository, tmp_path)
    try:
        off = Shm(server, grpc_port)
        with off.client(transport) as client:
            error = refusal(lambda: client.register_system_shared_memory("r", "/x", 8))
            assert "--allow-client-shm" in error.message()
            assert "--allow-client-shm" in refusal(client.get_system_shared_memory_status).message()
            given = module_of(transport).InferInput("obs", [1, 4], "FP32")
            given.set_shared_memory("r", 16)
            assert (
                "--allow-client-shm" in refusal(lambda: client.infer("cartpole", [given])).message()
            )
            metadata = client.get_server_metadata()
            listed = metadata["extensions"] if transport == "http" else metadata.extensions
            assert "system_shared_memory" not in listed
    finally:
        server.stop()


def test_calls_on_a_grpc_stream_read_and_write_shared_memory(shm_server: Shm) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    handle, key = shm_server.region(8 * 1024)
    steps = {i: obs(i + 1) for i in range(4)}
    with shm_server.client("grpc") as client:
        client.register_system_shared_memory("s", key, 8 * 1024)
        expected = {i: ordinary(client, "grpc", rows)["actions"] for i, rows in steps.items()}
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i, rows in steps.items():  # each call its own 1 KiB: inputs, then actions
            shm.set_shared_memory_region(handle, [rows], offset=1024 * i)
            given = triton_grpc.InferInput("obs", list(rows.shape), "FP32")
            given.set_shared_memory("s", rows.nbytes, offset=1024 * i)
            actions = triton_grpc.InferRequestedOutput("actions")
            actions.set_shared_memory("s", 512, offset=1024 * i + 512)
            client.async_stream_infer(
                "cartpole",
                [given],
                outputs=[actions],
                request_id=str(i),
                parameters={"deterministic": True},
            )
        answered = set()
        for _ in steps:
            result, error = answers.get(timeout=10)
            assert error is None, error
            answered.add(int(result.get_response().id))
        client.stop_stream()
    assert answered == set(steps)
    for i, want in expected.items():
        got = shm.get_contents_as_numpy(handle, np.int64, want.shape, offset=1024 * i + 512)
        np.testing.assert_array_equal(got, want, err_msg=str(i))


def test_a_client_shrinking_its_object_during_calls_gets_refusals_not_a_dead_server(
    shm_server: Shm,
) -> None:
    """The object under a registered region is truncated and regrown while three clients
    read inputs and write outputs beyond its first page: every call is answered (200, or
    422 naming the shrunk region), and the server goes on answering."""
    size, calls_each = 1 << 20, 150
    handle, key = shm_server.region(size)
    shm.set_shared_memory_region(handle, [obs(1)], offset=8192)
    with shm_server.client("http") as client:
        client.register_system_shared_memory("shrinking", key, size)
    statuses_seen: list[int] = []
    failures: list[BaseException] = []

    def call() -> None:
        with httpx.Client(base_url=shm_server.server.url, timeout=30) as http:
            body = {
                "inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32",
                            "parameters": placed(8192, 16)}],
                "outputs": [{"name": "actions", "parameters": placed(65536, 8)}],
            }  # fmt: skip
            try:
                for _ in range(calls_each):
                    answer = http.post("/v2/models/cartpole/infer", json=body)
                    statuses_seen.append(answer.status_code)
                    if answer.status_code != 200:
                        assert answer.json()["code"] == "invalid_input", answer.text
                        assert "shrank" in answer.json()["error"], answer.text
            except BaseException as exc:  # the server gone: a connection error
                failures.append(exc)

    def placed(offset: int, size: int) -> dict[str, Any]:
        return {
            "shared_memory_region": "shrinking",
            "shared_memory_offset": offset,
            "shared_memory_byte_size": size,
        }

    threads = [threading.Thread(target=call) for _ in range(3)]
    fd = os.open(Path("/dev/shm") / key.lstrip("/"), os.O_RDWR)
    try:
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            os.ftruncate(fd, 4096)
            os.ftruncate(fd, size)
    finally:
        os.ftruncate(fd, size)
        os.close(fd)
        for thread in threads:
            thread.join()
    assert failures == []
    assert len(statuses_seen) == 3 * calls_each
    assert set(statuses_seen) <= {200, 422}
    with httpx.Client(base_url=shm_server.server.url, timeout=10) as http:
        assert http.get("/health").status_code == 200


@pytest.fixture(scope="module")
def guarded(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shm]:
    """A server with system shared memory on and an admin token set, which guards it."""
    tmp = tmp_path_factory.mktemp("shm-guarded")
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN}
    server, grpc_port = start(repository, tmp, "--allow-client-shm", env=env)
    served = Shm(server, grpc_port)
    yield served
    server.stop()
    for handle in served.handles:
        shm.destroy_shared_memory_region(handle)


def refused_as(transport: str, call: Any, http: str, grpc: str, message: str) -> None:
    error = refusal(call)
    assert error.status() == (http if transport == "http" else grpc), error
    assert message in error.message(), error.message()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_with_an_admin_token_only_the_admin_registers_lists_unregisters_and_places(
    guarded: Shm, transport: str
) -> None:
    """A client without the token can neither register another process's object, nor list
    the regions' keys, nor unregister them, nor have outputs written into them."""
    module = module_of(transport)
    handle, key = guarded.region(256)
    shm.set_shared_memory_region(handle, [obs(1)])
    unauthenticated = ("401", "StatusCode.UNAUTHENTICATED", "missing bearer token")
    with guarded.client(transport) as client:
        anonymous: dict[str, Any] = {
            "register": lambda: client.register_system_shared_memory("r", key, 64),
            "status": client.get_system_shared_memory_status,
            "unregister": client.unregister_system_shared_memory,
        }
        for call in anonymous.values():
            refused_as(transport, call, *unauthenticated)
        wrong = {"authorization": "Bearer not-the-admin-token-at-all"}
        refused_as(
            transport,
            lambda: client.register_system_shared_memory("r", key, 64, headers=wrong),
            "403",
            "StatusCode.PERMISSION_DENIED",
            "does not match admin_token",
        )
        client.register_system_shared_memory("r", key, 64, headers=ADMIN)
        refused_as(transport, lambda: client.unregister_system_shared_memory("r"), *unauthenticated)
        assert statuses_as_admin(client, transport) == {
            "r": {"key": key, "offset": 0, "byte_size": 64}
        }
        given = module.InferInput("obs", [1, 4], "FP32")
        given.set_shared_memory("r", 16)
        actions = module.InferRequestedOutput("actions")
        actions.set_shared_memory("r", 8, offset=32)
        refused_as(
            transport,
            lambda: client.infer("cartpole", [given], outputs=[actions]),
            *unauthenticated,
        )
        assert shm.get_contents_as_numpy(handle, np.int64, [1], offset=32).tolist() == [0]
        client.infer("cartpole", [given], outputs=[actions], headers=ADMIN)
        want = ordinary(client, transport, obs(1))["actions"]
        got = shm.get_contents_as_numpy(handle, np.int64, want.shape, offset=32)
        np.testing.assert_array_equal(got, want)
        client.unregister_system_shared_memory(headers=ADMIN)
        assert statuses_as_admin(client, transport) == {}


def statuses_as_admin(client: Any, transport: str) -> dict[str, dict[str, int | str]]:
    if transport == "http":
        listed = client.get_system_shared_memory_status(headers=ADMIN)
        return {r["name"]: {k: r[k] for k in ("key", "offset", "byte_size")} for r in listed}
    answer = client.get_system_shared_memory_status(headers=ADMIN)
    return {
        n: {"key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for n, r in answer.regions.items()
    }


def test_a_grpc_stream_places_tensors_with_the_streams_admin_token(guarded: Shm) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    handle, key = guarded.region(1024)
    shm.set_shared_memory_region(handle, [obs(1)])
    given = triton_grpc.InferInput("obs", [1, 4], "FP32")
    given.set_shared_memory("s", 16)
    for headers, error_wanted in ((None, "missing bearer token"), (ADMIN, None)):
        with guarded.client("grpc") as client:
            client.register_system_shared_memory("s", key, 1024, headers=ADMIN)
            client.start_stream(
                callback=lambda result, error: answers.put((result, error)), headers=headers
            )
            client.async_stream_infer("cartpole", [given], request_id="1")
            result, error = answers.get(timeout=10)
            client.stop_stream()
            client.unregister_system_shared_memory(headers=ADMIN)
        if error_wanted is None:
            assert error is None, error
        else:
            assert error is not None, result
            assert error_wanted in error.message(), error


def test_shm_open_opens_it_to_every_client_despite_the_admin_token(
    repository: Path, tmp_path: Path
) -> None:
    server, grpc_port = start(
        repository,
        tmp_path,
        "--allow-client-shm",
        "--shm-open",
        env={"RLSERVE_ADMIN_TOKEN": TOKEN},
    )
    opened = Shm(server, grpc_port)
    try:
        _, key = opened.region(64)
        for transport in TRANSPORTS:
            with opened.client(transport) as client:
                client.register_system_shared_memory(transport, key, 8)
                assert list(statuses(client, transport, transport)) == [transport]
                client.unregister_system_shared_memory(transport)
    finally:
        server.stop()
        for handle in opened.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_region_names_are_bounded_and_a_404_names_only_the_callers_region(
    shm_server: Shm, transport: str
) -> None:
    """Three names of 1 MB once made every client's gRPC status fail (RESOURCE_EXHAUSTED);
    a 404 listed the regions other clients had registered."""
    _, key = shm_server.region(64)
    with shm_server.client(transport) as client:
        client.register_system_shared_memory("theirs", key, 8)
        longest = "n" * 128
        client.register_system_shared_memory(longest, key, 8, offset=8)
        huge = "h" * (1 << 20) if transport == "grpc" else "h" * 4096  # a URL path over HTTP
        for name in ("n" * 129, huge):
            error = refusal(lambda name=name: client.register_system_shared_memory(name, key, 8))
            assert "a region needs a name of 1 to 128 characters" in error.message()
            assert len(error.message()) < 1024  # the name is cut, not echoed
        assert set(statuses(client, transport)) == {"theirs", longest}
        error = refusal(lambda: client.get_system_shared_memory_status("mine"))
        assert "no shared-memory region 'mine' is registered" in error.message()
        assert "theirs" not in error.message()
