"""The client side of ``python -m bench.gpu``: Open Inference Protocol requests with binary
tensors, a closed-loop load over keep-alive connections, and the server's GPU figures read
while it runs.

Requests go to ``POST /v2/models/{model}/infer`` with the observations as binary tensor
data (``Inference-Header-Content-Length``): a 64-row cnn batch is 1.8 MB of uint8 frames,
which as JSON numbers would be several times that and would measure the JSON parser rather
than the GPU. The load runs ``connections`` asyncio connections, each sending its next
request as soon as the previous answer is in (answers parsed by httptools, so the client
costs far less per request than the server); the latency of a request runs from just before
it is written to the end of its answer.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx
import numpy as np
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.children import percentile_ms

_DATATYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int64): "INT64",
}
_NUMPY: dict[str, np.dtype[Any]] = {name: dtype for dtype, name in _DATATYPES.items()}


def infer_body(
    inputs: dict[str, np.ndarray], outputs: list[str], *, binary_outputs: bool
) -> tuple[bytes, dict[str, str]]:
    """An infer request: the JSON header, then each input's bytes; and its HTTP headers."""
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": _DATATYPES[array.dtype],
                "shape": list(array.shape),
                "parameters": {"binary_data_size": array.nbytes},
            }
            for name, array in inputs.items()
        ],
        "outputs": [{"name": name} for name in outputs],
        "parameters": {"binary_data_output": binary_outputs},
    }
    text = orjson.dumps(header)
    body = text + b"".join(np.ascontiguousarray(a).tobytes() for a in inputs.values())
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(text)),
    }
    return body, headers


def json_outputs(answer: dict[str, Any]) -> dict[str, np.ndarray]:
    """The outputs of an infer answer given as JSON data, as arrays of their shapes."""
    return {
        out["name"]: np.asarray(out["data"], dtype=_NUMPY[out["datatype"]]).reshape(out["shape"])
        for out in answer["outputs"]
    }


def infer(
    client: httpx.Client, model: str, inputs: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    """One infer call with binary inputs and JSON outputs; raises on a non-200 answer."""
    body, headers = infer_body(inputs, outputs, binary_outputs=False)
    answer = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    if answer.status_code != 200:
        raise RuntimeError(f"{model}: infer answered {answer.status_code}: {answer.text[:500]}")
    return json_outputs(answer.json())


# ---------------------------------------------------------------------------- load


@dataclass(frozen=True)
class LoadResult:
    requests: int  # answered in the measured window
    seconds: float
    latencies_s: list[float] = field(repr=False)
    statuses: dict[int, int]
    failures: int  # connections lost

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def errors(self) -> int:
        return self.requests - self.ok + self.failures

    @property
    def errors_named(self) -> str:
        """The errors with what they were: ``0``, or ``11 (429 x9, 504 x2)``."""
        parts = [f"{status} x{n}" for status, n in sorted(self.statuses.items()) if status != 200]
        if self.failures:
            parts.append(f"lost connection x{self.failures}")
        return f"{self.errors} ({', '.join(parts)})" if parts else str(self.errors)

    @property
    def p50_ms(self) -> float:
        return percentile_ms(self.latencies_s, 50)

    @property
    def p99_ms(self) -> float:
        return percentile_ms(self.latencies_s, 99)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its status once the answer has ended."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(self._parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(ConnectionError(f"connection lost ({exc})"))

    async def request(self, message: bytes) -> int:
        assert self._transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(message)
        return await self._answer


def _message(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def closed_loop(
    url: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    connections: int,
    warmup_s: float,
    seconds: float,
) -> LoadResult:
    """``connections`` closed loops for ``warmup_s`` then ``seconds``: the requests sent in
    the measured window, each let finish."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    message = _message(url, path, body, headers)
    loop = asyncio.get_running_loop()
    opened = [await loop.create_connection(_Connection, host, port) for _ in range(connections)]
    start = time.perf_counter() + warmup_s
    end = start + seconds
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    failures = 0
    last = start

    async def run(connection: _Connection) -> None:
        nonlocal failures, last
        while (sent := time.perf_counter()) < end:
            try:
                status = await connection.request(message)
            except ConnectionError:
                failures += sent >= start
                return
            answered = time.perf_counter()
            if sent >= start:
                latencies.append(answered - sent)
                statuses[status] += 1
                last = max(last, answered)

    try:
        await asyncio.gather(*(run(protocol) for _, protocol in opened))
    finally:
        for transport, _ in opened:
            transport.close()
    return LoadResult(len(latencies), max(last - start, 1e-9), latencies, dict(statuses), failures)


# ---------------------------------------------------------------------------- GPU figures


@dataclass
class GpuSamples:
    """What the server said about its GPUs while the load ran (None where it said nothing)."""

    metrics_utilization: list[float] = field(default_factory=list)  # rlserve_gpu_utilization_ratio
    health_utilization: list[float] = field(default_factory=list)  # /health gpu_utilization
    memory_used_bytes: list[float] = field(default_factory=list)
    scrapes: int = 0

    @staticmethod
    def summary(values: list[float]) -> tuple[float, float] | None:
        return (statistics.fmean(values), max(values)) if values else None


def metric_values(text: str, name: str) -> list[float]:
    """Every sample of the metric ``name`` in a Prometheus exposition."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def metric_labels(text: str, name: str) -> list[dict[str, str]]:
    return [
        dict(sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def sample_gpu(url: str, until: float, every_s: float = 0.5) -> GpuSamples:
    """Scrape ``/metrics`` and ``/health`` every ``every_s`` until ``until`` (perf_counter)."""
    samples = GpuSamples()
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        while time.perf_counter() < until:
            metrics, health = await asyncio.gather(client.get("/metrics"), client.get("/health"))
            samples.scrapes += 1
            per_gpu = metric_values(metrics.text, "rlserve_gpu_utilization_ratio")
            if per_gpu:
                samples.metrics_utilization.append(statistics.fmean(per_gpu))
            samples.memory_used_bytes += metric_values(
                metrics.text, "rlserve_gpu_memory_used_bytes"
            )
            busy = health.json().get("gpu_utilization")
            if busy is not None:
                samples.health_utilization.append(float(busy))
            await asyncio.sleep(every_s)
    return samples


def batch_rows(text: str, model: str) -> tuple[float, float]:
    """(sum, count) of the ``rlserve_batch_rows`` histogram of ``model``."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "rlserve_batch_rows_sum":
                total += sample.value
            elif sample.name == "rlserve_batch_rows_count":
                count += sample.value
    return total, count
