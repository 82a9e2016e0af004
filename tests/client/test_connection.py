"""The client's HTTP/1.1 connection (client.connection) against a standard-library
HTTP server: framing by length, by chunks and by close; keep-alive; the server closing."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from client.connection import Connection, ConnectionClosed, UnreadableAnswer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/echo":
            self._answer(200, body, {"Content-Length": str(len(body))})
        elif self.path == "/busy":
            self._answer(429, b"{}", {"Content-Length": "2", "Retry-After": "3"})
        elif self.path == "/chunked":
            self._answer(200, b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"})
        elif self.path == "/until-close":
            self.close_connection = True
            self._answer(200, b"all of it", {"Connection": "close"})
        elif self.path == "/closing":
            self.close_connection = True
            self._answer(200, b"ok", {"Content-Length": "2", "Connection": "close"})
        elif self.path == "/garbage":
            self.close_connection = True
            self.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")
        elif self.path == "/hang-up":
            self.close_connection = True  # no answer at all

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response_only(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_answers_framed_by_length_keep_the_connection_for_the_next_call(port: int) -> None:
    connection = Connection("127.0.0.1", port, tls=False, timeout_s=5)
    large = bytes(range(256)) * 1024  # sent apart from the head
    for body in (b"small", large, b""):
        answer = connection.exchange("POST", "/echo", {"X-Test": "1"}, body)
        assert (answer.status, answer.body, answer.keep_alive) == (200, body, True)
    connection.close()


def test_retry_after_is_read(port: int) -> None:
    connection = Connection("127.0.0.1", port, tls=False, timeout_s=5)
    answer = connection.exchange("POST", "/busy", {}, b"x")
    assert (answer.status, answer.retry_after) == (429, "3")
    connection.close()


def test_chunked_and_close_delimited_answers_are_read_whole(port: int) -> None:
    connection = Connection("127.0.0.1", port, tls=False, timeout_s=5)
    assert connection.exchange("POST", "/chunked", {}, b"x").body == b"abcde"
    until_close = connection.exchange("POST", "/until-close", {}, b"x")
    assert (until_close.body, until_close.keep_alive) == (b"all of it", False)
    closing = connection.exchange("POST", "/closing", {}, b"x")  # opened again
    assert (closing.body, closing.keep_alive) == (b"ok", False)


def test_a_server_that_hangs_up_without_answering_is_told_apart(port: int) -> None:
    connection = Connection("127.0.0.1", port, tls=False, timeout_s=5)
    with pytest.raises(ConnectionClosed, match="without answering"):
        connection.exchange("POST", "/hang-up", {}, b"x")
    connection.close()


def test_an_answer_that_is_not_http_is_an_unreadable_answer(port: int) -> None:
    connection = Connection("127.0.0.1", port, tls=False, timeout_s=5)
    with pytest.raises(UnreadableAnswer, match=r"not readable HTTP/1\.1"):
        connection.exchange("POST", "/garbage", {}, b"x")
    connection.close()
