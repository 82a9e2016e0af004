"""One HTTP/1.1 keep-alive connection of the Python client: a call at a time, written in one
send, its answer parsed by httptools (the C parser uvicorn serves with).

The standard library's ``http.client`` spends about 105 µs of CPU per call on a small
answer (it reads the status line and headers a line at a time and parses them with the
``email`` package); a lone RL actor pays that at every environment step. Here a call costs
about 30 µs: the request is one ``sendall``, the answer is read in blocks and fed to
``httptools.HttpResponseParser``, and only the headers the client reads are kept.

Only what :mod:`client.policy` asks of a connection is supported: requests with a body or
none (never ``HEAD``), answers with a ``Content-Length``, chunked, or ended by the server
closing the connection; ``https`` with the default certificate checks.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

import httptools

_BLOCK = 1 << 16
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a Content-Length even without a body


class ConnectionClosed(ConnectionResetError):
    """The server closed the connection before its answer was whole (a kept-alive one it
    closed while idle, when the answer has not begun)."""


class UnreadableAnswer(ConnectionError):
    """The server's answer is not HTTP/1.1 that httptools can read."""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer as the clients read it (``client.policy``'s transports alike)."""

    status: int
    body: bytes
    retry_after: str | None
    keep_alive: bool = True  # the connection may carry the next call (httpx's pool decides)


@dataclass
class _Parsed:
    """What the parser's callbacks collect of one answer."""

    retry_after: str | None = None
    body: list[bytes] = field(default_factory=list)
    headers_done: bool = False
    framed: bool = False  # the answer says where it ends (a length, or chunks)
    done: bool = False
    keep_alive: bool = False  # asked of the parser as the answer completes (it resets then)
    received: int = 0  # bytes read for this answer
    parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif lowered in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.done, self.keep_alive = True, self.parser.should_keep_alive()


class Connection:
    """A connection to ``host:port`` (TLS when ``tls``), opened by the first call."""

    def __init__(self, host: str, port: int | None, *, tls: bool, timeout_s: float) -> None:
        self._address = (host, port or (443 if tls else 80))
        self._host_header = _host_header(host, port)
        self._tls = tls
        self._timeout_s = timeout_s
        self._socket: socket.socket | None = None

    def exchange(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None
    ) -> Answer:
        """Send one request and read its whole answer."""
        sock = self._socket or self._open()
        head = [f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        if body is not None or method in _BODY_METHODS:
            head.append(f"Content-Length: {0 if body is None else len(body)}\r\n")
        written = "".join(head).encode("latin-1") + b"\r\n"
        if body is not None and len(body) <= _BLOCK:
            sock.sendall(written + body)
        else:
            sock.sendall(written)
            if body:
                sock.sendall(body)
        return self._answer(sock)

    def _answer(self, sock: socket.socket) -> Answer:
        parsed = _Parsed()
        parser = parsed.parser = httptools.HttpResponseParser(parsed)
        while not parsed.done:
            block = sock.recv(_BLOCK)
            if not block:
                if parsed.headers_done and not parsed.framed:
                    break  # the body ran to the end of the connection
                raise ConnectionClosed(
                    "the server closed the connection before its answer was complete"
                    if parsed.received
                    else "the server closed the connection without answering"
                )
            parsed.received += len(block)
            try:
                parser.feed_data(block)
            except httptools.HttpParserError as exc:
                raise UnreadableAnswer(
                    f"the server's answer is not readable HTTP/1.1: {exc}"
                ) from None
        if not parsed.keep_alive:
            self.close()
        status = parser.get_status_code()
        return Answer(status, b"".join(parsed.body), parsed.retry_after, parsed.keep_alive)

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._address[0])
        self._socket = sock
        return sock

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _host_header(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"
