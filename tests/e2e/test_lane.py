"""The local lane against a real server (``rlserve serve --lane PATH``), with the project's
clients: answers equal HTTP's for the same observations, the lane's rows run in the same
model's batches as HTTP's, bad input is answered clearly, a killed client costs the server
nothing, and the server's stop removes its socket (slots are anonymous memfds: nothing is
ever named in /dev/shm)."""

from __future__ import annotations

import array
import fcntl
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from client import LaneClient, LaneUnavailable, PolicyClient, RequestFailed
from kernel import lane_wire as wire
from tests.e2e.conftest import DEMO, ROOT
from tests.e2e.server import Server

OUTPUTS = ("actions", "log_probs", "values", "distribution")
OTHER_TESTS_SHM = "rlserve-e2e-"  # the Open Inference Protocol tests' shared-memory regions


@pytest.fixture(scope="module", params=["loop", "thread"])
def lane_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    """A server with a lane, its calls served on the event loop or by the serving thread
    (``--lane-serving``): every test of it holds for both."""
    tmp = tmp_path_factory.mktemp("lane")
    repository = tmp / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    path = tmp / "lane.sock"
    serving = ["--lane-serving", request.param]
    server = Server.rlserve(repository, "--lane", str(path), *serving, log=tmp / "log")
    server.wait_ready()
    yield server, path
    server.stop()


def observations(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.2, 0.2, (n, 4)).astype(np.float32)


def test_lane_answers_equal_http_answers(lane_server: tuple[Server, Path]) -> None:
    server, path = lane_server
    rows = observations(16)
    with LaneClient(path) as lane, PolicyClient(server.url) as http:
        by_lane = lane.predict(rows, outputs=OUTPUTS)
        by_http = http.predict(rows, outputs=OUTPUTS)
        one_lane, one_http = lane.predict(rows[0]), http.predict(rows[0])
    assert (by_lane.model, by_lane.model_version, by_lane.model_sha256) == (
        by_http.model, by_http.model_version, by_http.model_sha256,
    )  # fmt: skip
    np.testing.assert_array_equal(by_lane.actions, by_http.actions)
    np.testing.assert_allclose(by_lane.log_probs, by_http.log_probs, rtol=1e-6)
    np.testing.assert_allclose(by_lane.values, by_http.values, rtol=1e-6)
    np.testing.assert_allclose(
        by_lane.distribution["logits"], by_http.distribution["logits"], rtol=1e-6
    )
    assert np.ndim(one_lane.actions) == 0  # one observation: no batch axis, as over HTTP
    assert int(one_lane.actions) == one_http.actions


def test_lane_calls_and_refusals_are_counted_like_http_calls(
    lane_server: tuple[Server, Path],
) -> None:
    """Each answered call counts in rlserve_requests_total (from its batch's record, which
    the serving thread hands to the event loop) and each refusal in the rejections."""
    server, path = lane_server
    answered = {"model": "cartpole", "status": "200"}
    refused = {"model": "cartpole", "reason": "invalid_input"}
    with httpx.Client(base_url=server.url, timeout=5) as client:
        before = server.metric(client, "rlserve_requests_total", **answered)
        rejected = server.metric(client, "rlserve_rejections_total", **refused)
    with LaneClient(path) as lane:
        for seed in range(20):
            lane.predict(observations(2, seed))
        with pytest.raises(RequestFailed):
            lane.predict(np.full((1, 4), np.nan, np.float32))

    def counted(client: httpx.Client) -> bool:
        calls = server.metric(client, "rlserve_requests_total", **answered) - before
        refusals = server.metric(client, "rlserve_rejections_total", **refused) - rejected
        return calls >= 20 and refusals >= 1

    server.wait_until(counted, 10, "counting the lane's calls")


def test_lane_and_http_calls_at_once_get_the_same_answers(
    lane_server: tuple[Server, Path],
) -> None:
    server, path = lane_server
    rows = observations(64, seed=1)
    answers: dict[str, list[int]] = {"lane": [], "http": []}

    def run(kind: str) -> None:
        client = LaneClient(path) if kind == "lane" else PolicyClient(server.url)
        with client:
            for row in rows:
                answers[kind].append(int(client.predict(row).actions))

    with server.client() as metrics:
        rows_before = server.metric(metrics, "rlserve_batch_rows_sum")
        threads = [threading.Thread(target=run, args=(k,)) for k in ("lane", "http")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert answers["lane"] == answers["http"]  # deterministic: the same rows, the same actions
    assert len(answers["lane"]) == len(rows)

    def all_recorded(client: httpx.Client) -> bool:  # the serving thread's, within 10 ms
        batched = server.metric(client, "rlserve_batch_rows_sum") - rows_before
        assert batched <= 2 * len(rows)
        return batched == 2 * len(rows)  # the lane's rows ran in batches of the model

    server.wait_until(all_recorded, 10, "recording every row")


def test_bad_input_is_answered_and_costs_nothing_else(lane_server: tuple[Server, Path]) -> None:
    _, path = lane_server
    with LaneClient(path) as lane:
        with pytest.raises(RequestFailed) as bad:
            lane.predict(np.array([np.nan, 0, 0, 0], np.float32))
        assert (bad.value.status, bad.value.code) == (422, "invalid_input")
        assert "finite" in bad.value.message
        with pytest.raises(ValueError, match="rows of shape"):
            lane.predict(np.zeros((2, 5), np.float32))
        with pytest.raises(RequestFailed) as unknown:
            lane.predict(observations(1)[0], model="nope")
        assert unknown.value.status == 404
        with pytest.raises(RequestFailed) as output:
            lane.predict(observations(1)[0], outputs=("actions", "q_values"))
        assert output.value.status == 422
        assert "q_values" in output.value.message
        assert lane.predict(observations(1)[0]).model == "cartpole"  # the lane still serves


def test_a_killed_client_costs_the_server_nothing(lane_server: tuple[Server, Path]) -> None:
    server, path = lane_server
    script = (
        "import numpy as np, sys\n"
        "from client.lane import LaneClient\n"
        "lane = LaneClient(sys.argv[1])\n"
        "print(lane.predict(np.zeros(4, np.float32)).model, flush=True)\n"
        "while True: lane.predict(np.zeros(4, np.float32))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "cartpole"
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    with LaneClient(path) as lane, server.client() as http:
        assert lane.predict(observations(1)[0]).model == "cartpole"
        assert http.get("/health").status_code == 200


def test_a_client_cannot_resize_the_slot_under_the_server(
    lane_server: tuple[Server, Path],
) -> None:
    """A client that keeps the slot's descriptor and truncates it (which would take the
    server's mapped pages away: SIGBUS) is refused by the seals; its call is answered."""
    server, path = lane_server
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        hello = {"model": None, "version": None, "rows": 1, "outputs": ["actions"]}
        sock.sendall(wire.frame(hello))
        fds = array.array("i")
        head, ancillary, _, _ = sock.recvmsg(wire.FRAME.size, socket.CMSG_SPACE(fds.itemsize))
        fds.frombytes(ancillary[0][2])
        welcome = json.loads(sock.recv(wire.frame_length(head)))
        layout = wire.Layout.from_json(welcome["layout"])
        fd = fds[0]
        try:
            for size in (0, layout.size // 2, layout.size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, size)
            assert os.fstat(fd).st_size == layout.size
            slot = mmap.mmap(fd, layout.size)
            area = layout.inputs[0]
            slot[area.offset : area.offset + area.row_bytes] = observations(1).tobytes()
            wire.REQUEST.pack_into(slot, wire.REQUEST_OFFSET, 1, 1, wire.Flags.DETERMINISTIC, 0, 0)
            sock.sendall(wire.DOORBELL)
            assert sock.recv(1) == wire.DOORBELL
            answer = wire.ANSWER.unpack_from(slot, wire.ANSWER_OFFSET)
            assert (answer[0], wire.Status(answer[1])) == (1, wire.Status.OK)
            slot.close()
        finally:
            os.close(fd)
    with server.client() as http:
        assert http.get("/health").status_code == 200


def test_the_lane_goes_with_its_server(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    path = tmp_path / "lane.sock"
    path.touch()  # not a socket: refused, never removed
    refused = Server.rlserve(repository, "--lane", str(path), log=tmp_path / "refused")
    assert refused.process.wait(30) != 0
    assert path.is_file()
    assert "not a socket" in refused.output()
    path.unlink()
    shm_before = set(os.listdir("/dev/shm"))
    server = Server.rlserve(repository, "--lane", str(path), log=tmp_path / "log")
    try:
        server.wait_ready()
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        with PolicyClient(server.url, lane=path) as client:
            assert client.predict(observations(1)[0]).model == "cartpole"
            # the slot is a memfd, named nowhere; other test files' regions (a worker beside
            # this one) may come and go in /dev/shm meanwhile
            new = set(os.listdir("/dev/shm")) - shm_before
            assert [name for name in new if not name.startswith(OTHER_TESTS_SHM)] == []
            maps = Path(f"/proc/{server.process.pid}/maps").read_text()
            assert "memfd:rlserve-lane" in maps
    finally:
        server.stop()
    assert not path.exists()
    with pytest.raises(LaneUnavailable):
        LaneClient(path).predict(observations(1)[0])


def collect(server_url: str, buffer: Path, *flags: str) -> dict[str, object]:
    """``rlserve collect`` for 256 steps of 4 CartPole envs; its JSON summary."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--env", "CartPole-v1",
         "--server", server_url, "--buffer", buffer.as_uri(), "--num-envs", "4",
         "--steps", "256", "--retry-for-s", "5", "--logdir", "none", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_collect_asks_through_the_lane(lane_server: tuple[Server, Path], tmp_path: Path) -> None:
    _, path = lane_server
    # Nothing listens on port 9: every step the worker makes came through the lane.
    summary = collect("http://127.0.0.1:9", tmp_path / "buffer", "--lane", str(path))
    assert summary["env_steps"] == summary["published"] == 256
    assert summary["predict_retries"] == 0


def test_collect_falls_back_to_http_without_a_lane(
    lane_server: tuple[Server, Path], tmp_path: Path
) -> None:
    server, _ = lane_server
    summary = collect(server.url, tmp_path / "buffer", "--lane", str(tmp_path / "none.sock"))
    assert summary["env_steps"] == summary["published"] == 256


def test_a_lane_client_survives_a_killed_and_restarted_server(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    path = tmp_path / "lane.sock"
    shm_before = set(os.listdir("/dev/shm"))
    server = Server.rlserve(repository, "--lane", str(path), log=tmp_path / "log-1")
    server.wait_ready()
    with LaneClient(path) as client:
        before = client.predict(observations(8), outputs=OUTPUTS)
        server.process.kill()  # SIGKILL: the socket file stays behind
        server.process.wait(30)
        with pytest.raises(LaneUnavailable):
            client.predict(observations(8))
        restarted = Server.rlserve(repository, "--lane", str(path), log=tmp_path / "log-2")
        try:
            restarted.wait_ready()  # the stale socket was taken over
            after = client.predict(observations(8), outputs=OUTPUTS)  # the same client
        finally:
            restarted.stop()
    np.testing.assert_array_equal(before.actions, after.actions)
    np.testing.assert_allclose(before.values, after.values, rtol=1e-6)
    new = set(os.listdir("/dev/shm")) - shm_before  # a killed server leaves nothing named
    assert [name for name in new if not name.startswith(OTHER_TESTS_SHM)] == []
    assert not path.exists()


def test_policy_client_tries_the_lane_again_after_it_failed(
    lane_server: tuple[Server, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, path = lane_server
    monkeypatch.setattr("client.policy.LANE_RETRY_S", 0.0)
    later = tmp_path / "later.sock"
    # Nothing listens on port 9: a prediction that succeeds came through the lane.
    with PolicyClient("http://127.0.0.1:9", lane=later) as client:
        with pytest.raises((OSError, RequestFailed)):
            client.predict(observations(1)[0])  # no lane yet: over HTTP, which is down
        later.symlink_to(path)  # the lane appears
        assert client.predict(observations(1)[0]).model == "cartpole"


def test_a_client_past_the_connection_limit_gets_503_never_a_broken_pipe(tmp_path: Path) -> None:
    """With lane_max_connections 1 held by one client, every other client's call is refused
    with the 503 the server sends, whether its hello was sent before or after the server
    closed the connection (a BrokenPipeError then, before this was fixed)."""
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    path = tmp_path / "lane.sock"
    server = Server.rlserve(
        repository, "--lane", str(path), "--lane-max-connections", "1", log=tmp_path / "log"
    )
    server.wait_ready()
    refusals: list[int] = []
    try:
        with LaneClient(path) as holder:
            holder.predict(observations(1)[0])  # holds the one connection
            for _ in range(200):
                with LaneClient(path) as late, pytest.raises(RequestFailed) as refused:
                    late.predict(observations(1)[0])
                refusals.append(refused.value.status)
            assert holder.predict(observations(1)[0]).actions.shape == ()
    finally:
        server.stop()
    assert set(refusals) == {503}


CALLS = 51  # fewer than the 64 answers after which a client drops the rings it left


@pytest.mark.parametrize("spin_us", [0.0, 1e6])
def test_ends_that_are_awake_are_not_rung(tmp_path: Path, spin_us: float) -> None:
    """With both ends spinning longer than any call takes, the serving thread says it is
    awake and so does the client: no doorbell byte travels either way. A client that sleeps
    at once (spin 0) is rung for every answer and never waits past one (a ring lost would
    hold a call to its 5 s timeout); it reads the rings it waits on, and leaves unread the
    ring of an answer that was there before it waited (on busy cores the ring it sent can
    hand its core to the server, which answers before the client looks): at most one per
    call."""
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    path = tmp_path / "lane.sock"
    spin = ["--lane-serving", "thread", "--lane-spin-us", str(int(spin_us))]
    server = Server.rlserve(repository, "--lane", str(path), *spin, log=tmp_path / "log")
    try:
        server.wait_ready()
        with LaneClient(path, spin_us=spin_us, timeout_s=5) as lane:
            lane.predict(observations(1)[0])  # the lane is open and the thread awake
            for seed in range(CALLS - 1):
                lane.predict(observations(1, seed)[0])
            (opened,) = lane._opened
            rung = _unread(opened.sock)
    finally:
        server.stop()
    assert rung <= (0 if spin_us else CALLS)  # spinning: nothing was rung


def _unread(sock: socket.socket) -> int:
    pending = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending, True)
    return pending[0]
