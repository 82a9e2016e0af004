"""bench/probe.py's connections follow the protocol: after a refusal that names a
Retry-After they wait that long before they send again, and stopping the probe ends the
wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.probe import Probe


class Refusing(BaseHTTPRequestHandler):
    """Answers every request 429 with a long Retry-After, and counts them."""

    protocol_version = "HTTP/1.1"
    arrived: list[threading.Event] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"error": {"code": "queue_full", "message": "full"}}'
        self.send_response(429)
        self.send_header("Retry-After", "30")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        for event in self.arrived:
            if not event.is_set():
                event.set()
                break

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def refusing() -> Iterator[str]:
    Refusing.arrived = [threading.Event(), threading.Event()]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    server.shutdown()
    server.server_close()


def test_a_refused_probe_waits_its_retry_after_and_stops_at_once(refusing: str) -> None:
    first, second = Refusing.arrived
    with Probe(refusing, b"{}", {}, connections=1, timeout_s=5):
        assert first.wait(5)
        assert not second.wait(0.5)  # without the wait it would send again at once
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 2  # the 30 s wait ends with the probe
