"""The load client of the ``lm`` scenario (bench/lm.py starts it pinned to the load core);
each mode prints one JSON line on stdout.

    python -m bench.lm_child load --url URL --model NAME --prompts FILE --new-tokens N \\
        --concurrency C --seconds S --warmup W
    python -m bench.lm_child ttft --url URL --model NAME --prompts FILE --long-tokens L \\
        --probe-tokens P --trials T

Every request is ``POST /v1/models/{model}/generate`` with ``"stream": true``, greedy,
``"ignore_eos": true`` (so each one runs exactly its ``max_new_tokens``), and one of the
prompts of the JSON file (a list of texts, every one the same number of tokens). Times
are the client's (``time.perf_counter``): a request's time-to-first-token runs from just
before it is sent to the arrival of the network read holding its first ``event: token``;
every token of one read shares that read's arrival time, so an inter-token gap is the time
between two reads that brought tokens (0 for tokens of one read).

``load``: ``concurrency`` closed-loop streams (asyncio, one keep-alive connection each,
answers parsed by httptools: the client must cost far less per token than the server;
httpx only reads ``/metrics``), each sending its next request when the previous answer
ends. ``warmup`` seconds, then
``seconds`` measured: tokens/s counts the tokens that arrived in the window; requests,
TTFT and inter-token gaps are those of the requests sent in it (they are let finish). The
server's ``rlserve_lm_step_sequences`` histogram and ``rlserve_lm_generated_tokens``
counter are read at both ends of the window: the mean sequences per decoding step in it.

``ttft``: a probe request (``probe_tokens`` new tokens) on the idle server, ``2 x trials``
times; then ``trials`` times: 7 long generations (``long_tokens`` each) are started, and
once every one of them has streamed tokens the probe is sent; its TTFT is recorded, with
whether all 7 were still decoding when the probe's first token came.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.children import percentile_ms

RUNNING = 7  # long generations running while the TTFT probe arrives
STARTED_TOKENS = 4  # every long generation has streamed this many before the probe goes
TIMEOUT_S = 300.0
PAUSE_S = 0.05  # between idle probes, and after a trial's long generations end
_TOKEN, _RESULT, _ERROR = b"event: token", b"event: result", b"event: error"


@dataclass
class Stream:
    """One streamed generation as the client saw it."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    ended: float = 0.0
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    def gaps(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. httptools (C, uvicorn's
    parser) reads the answers: the client must stay cheaper per token than the server."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._sink: Callable[[bytes, float], None] | None = None
        self._done: asyncio.Future[tuple[int, bool]] | None = None
        self._now = 0.0

    async def request(self, message: bytes, sink: Callable[[bytes, float], None]) -> int:
        """Send ``message``; ``sink`` gets the answer's body pieces (chunked encoding
        undone) with their arrival times. The answer's status; raises ConnectionError."""
        if self.closed or self.transport is None:
            raise ConnectionError("the connection is closed")
        self._sink = sink
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(message)
        status, keep_alive = await self._done
        if not keep_alive:
            self.close()
        return status

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"an answer httptools cannot parse: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"the server closed the connection ({exc or 'EOF'})")

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink(body, self._now)

    def on_message_complete(self) -> None:
        done, self._done, self._sink = self._done, None, None
        if done is not None and not done.done():
            done.set_result((self.parser.get_status_code(), self.parser.should_keep_alive()))

    def _fail(self, why: str) -> None:
        done, self._done, self._sink = self._done, None, None
        if done is not None and not done.done():
            done.set_exception(ConnectionError(why))


class _Chunks:
    """OpenAI completion chunks (``data: {...}`` server-sent events) of one answer into its
    :class:`Stream`: each chunk's tokens (its ``token_ids``) arrive at its read's time; the
    usage chunk gives the counts."""

    def __init__(self, record: Stream, started: asyncio.Event | None) -> None:
        self.record, self.started = record, started
        self.pending = b""

    def feed(self, data: bytes, now: float) -> None:
        record = self.record
        self.pending += data
        *events, self.pending = self.pending.split(b"\n\n")
        for event in events:
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            chunk = json.loads(event[6:])
            if "error" in chunk or chunk.get("object") == "error":
                record.error = event.decode(errors="replace")[:200]
                continue
            for choice in chunk.get("choices") or ():
                ids = choice.get("token_ids") or ()
                record.token_times.extend([now] * len(ids) if ids else [now])
                if choice.get("finish_reason"):
                    record.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                record.prompt_tokens = usage["prompt_tokens"]
                record.completion_tokens = usage["completion_tokens"]
        if self.started is not None and len(record.token_times) >= STARTED_TOKENS:
            self.started.set()


class _Events:
    """Server-sent events of one answer into its :class:`Stream` as they arrive."""

    def __init__(self, record: Stream, started: asyncio.Event | None) -> None:
        self.record, self.started = record, started
        self.pending = b""  # an incomplete event (or an error answer's JSON body)

    def feed(self, data: bytes, now: float) -> None:
        record = self.record
        self.pending += data
        *events, self.pending = self.pending.split(b"\n\n")
        for event in events:
            if event.startswith(_TOKEN):
                record.token_times.append(now)
            elif event.startswith(_RESULT):
                result = json.loads(event.split(b"data: ", 1)[1])
                choices = result.get("choices", [result])  # a group answers its choices
                reasons = {choice["finish_reason"] for choice in choices}
                record.finish_reason = reasons.pop() if len(reasons) == 1 else "mixed"
                record.prompt_tokens = result["prompt_tokens"]
                record.completion_tokens = sum(c["completion_tokens"] for c in choices)
            elif event.startswith(_ERROR):
                record.error = event.decode(errors="replace")[:200]
        if self.started is not None and len(record.token_times) >= STARTED_TOKENS:
            self.started.set()


class Api(Enum):
    """What the load client speaks: rlserve's own generate call, or the OpenAI completions
    API (how it measures a peer: vLLM)."""

    NATIVE = "native"
    OPENAI = "openai"


class Generator:
    """Streaming generate requests against one model, over keep-alive connections."""

    def __init__(self, url: str, model: str, prompt_tokens: int, api: Api = Api.NATIVE) -> None:
        address = urlsplit(url)
        self.host, self.port = address.hostname or "127.0.0.1", address.port or 80
        self.model, self.api = model, api
        self.path = f"/v1/models/{model}/generate" if api is Api.NATIVE else "/v1/completions"
        self.prompt_tokens = prompt_tokens
        self._idle: list[_Connection] = []

    async def stream(
        self,
        prompt: str,
        new_tokens: int,
        started: asyncio.Event | None = None,
        *,
        n: int = 1,
        seed: int | None = None,
    ) -> Stream:
        """One generation (``n``: a group of them, sampled from ``seed``) to its end;
        ``started`` is set once STARTED_TOKENS arrived."""
        fields: dict[str, Any] = {"prompt": prompt, "max_new_tokens": new_tokens,
                                  "ignore_eos": True, "stream": True}  # fmt: skip
        if self.api is Api.OPENAI:  # token ids in every chunk: a chunk may carry several
            fields = {"model": self.model, "prompt": prompt, "max_tokens": new_tokens,
                      "ignore_eos": True, "stream": True, "return_token_ids": True,
                      "stream_options": {"include_usage": True}}  # fmt: skip
        if seed is None:
            fields["temperature"] = 0
        else:
            fields.update(temperature=1.0, seed=seed)
        if n > 1:
            fields["n"] = n
        body = json.dumps(fields).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        record = Stream(time.perf_counter())
        try:
            return await self._stream(head.encode() + body, record, new_tokens * n, started)
        finally:
            if started is not None:
                started.set()  # ended or failed before STARTED_TOKENS: nobody waits for it

    async def _stream(
        self, message: bytes, record: Stream, new_tokens: int, started: asyncio.Event | None
    ) -> Stream:
        events = _Events(record, started) if self.api is Api.NATIVE else _Chunks(record, started)
        connection: _Connection | None = None
        try:
            connection = await self._connection()
            status = await asyncio.wait_for(connection.request(message, events.feed), TIMEOUT_S)
        except (OSError, TimeoutError) as exc:  # ConnectionError is an OSError
            if connection is not None:
                connection.close()  # its answer may still come: never reuse it
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        record.ended = time.perf_counter()
        if not connection.closed:
            self._idle.append(connection)
        if status != 200:
            record.error = f"HTTP {status}: {events.pending.decode(errors='replace')[:200]}"
        elif not record.error:
            record.error = self._check(record, new_tokens)
        return record

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(_Connection, self.host, self.port)
        return connection

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _check(self, record: Stream, new_tokens: int) -> str:
        """Why an answer is not what every engine is measured on, or ""."""
        if record.prompt_tokens != self.prompt_tokens:
            return f"the server saw {record.prompt_tokens} prompt tokens, not {self.prompt_tokens}"
        if record.completion_tokens != new_tokens or len(record.token_times) != new_tokens:
            return (
                f"{record.completion_tokens} tokens answered, {len(record.token_times)} "
                f"streamed; {new_tokens} asked"
            )
        if record.finish_reason != "length":
            return f"finish_reason {record.finish_reason!r}, not 'length'"
        return ""


# --- load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    new_tokens: int
    seconds: float  # the measured window
    tokens: int  # arrived in the window
    requests: int  # sent in the window and answered in full
    errors: int  # sent in the window (or before) and failed
    error_sample: str
    ttft_p50_ms: float
    ttft_p99_ms: float
    inter_token_p50_ms: float
    inter_token_p99_ms: float
    all_tokens: int  # warm-up included
    step_sequences_mean: float  # the server's mean sequences per decoding step in the window
    decode_steps: int  # the server's batched decoding calls in the window
    server_tokens: int  # tokens the server counted in the window
    client_busy: float  # the client's CPU time over the window, as a share of one core

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class ServerCounts:
    step_sequences_sum: float
    decode_steps: float
    tokens: float


async def server_counts(client: httpx.AsyncClient, model: str) -> ServerCounts:
    text = (await client.get("/metrics")).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == model:
                values[sample.name] = sample.value
    return ServerCounts(
        values.get("rlserve_lm_step_sequences_sum", 0.0),
        values.get("rlserve_lm_step_sequences_count", 0.0),
        values.get("rlserve_lm_generated_tokens_total", 0.0),
    )


async def load(
    url: str, model: str, prompts: list[str], prompt_tokens: int, new_tokens: int,
    concurrency: int, seconds: float, warmup: float, api: Api = Api.NATIVE,
) -> LoadResult:  # fmt: skip
    generator = Generator(url, model, prompt_tokens, api)
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:  # /metrics only
        streams: list[Stream] = []
        ending = asyncio.Event()

        async def worker(index: int) -> None:
            n = index
            while not ending.is_set():
                streams.append(await generator.stream(prompts[n % len(prompts)], new_tokens))
                n += concurrency

        workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        await asyncio.sleep(warmup)
        before = await server_counts(client, model)
        start, cpu_start = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        end, cpu_end = time.perf_counter(), time.process_time()
        ending.set()
        after = await server_counts(client, model)
        await asyncio.gather(*workers)
    generator.close()
    return _tally(streams, start, end, before, after, concurrency, new_tokens, cpu_end - cpu_start)


def _tally(
    streams: list[Stream], start: float, end: float, before: ServerCounts, after: ServerCounts,
    concurrency: int, new_tokens: int, cpu_s: float,
) -> LoadResult:  # fmt: skip
    sent = [s for s in streams if start <= s.sent < end]
    answered = [s for s in sent if not s.error]
    failed = [s for s in streams if s.error and s.sent < end]
    tokens = sum(1 for s in streams for t in s.token_times if start <= t < end)
    ttft = [s.ttft for s in answered if s.ttft is not None]
    gaps = [g for s in answered for g in s.gaps()]
    steps = after.decode_steps - before.decode_steps
    occupancy = (after.step_sequences_sum - before.step_sequences_sum) / steps if steps else 0.0
    return LoadResult(
        concurrency, new_tokens, end - start, tokens, len(answered), len(failed),
        failed[0].error if failed else "", percentile_ms(ttft, 50), percentile_ms(ttft, 99),
        percentile_ms(gaps, 50), percentile_ms(gaps, 99),
        sum(len(s.token_times) for s in streams), occupancy, int(steps),
        int(after.tokens - before.tokens), cpu_s / (end - start),
    )  # fmt: skip


# --- ttft under load -----------------------------------------------------------------------


@dataclass(frozen=True)
class TtftResult:
    probe_tokens: int
    long_tokens: int
    running: int
    idle_ms: list[float]
    loaded_ms: list[float]
    still_running: list[bool]  # per loaded trial: all long generations were still decoding
    errors: int
    error_sample: str

    @property
    def idle_p50_ms(self) -> float:
        return float(np.median(self.idle_ms)) if self.idle_ms else 0.0

    @property
    def loaded_p50_ms(self) -> float:
        return float(np.median(self.loaded_ms)) if self.loaded_ms else 0.0

    @property
    def ratio(self) -> float:
        return self.loaded_p50_ms / self.idle_p50_ms if self.idle_p50_ms else 0.0


async def ttft(
    url: str, model: str, prompts: list[str], prompt_tokens: int, long_tokens: int,
    probe_tokens: int, trials: int,
) -> TtftResult:  # fmt: skip
    generator = Generator(url, model, prompt_tokens)
    probe = prompts[0]
    try:
        # warm calls, and a connection for each request of a trial (none is opened in one)
        await asyncio.gather(*(generator.stream(probe, probe_tokens) for _ in range(RUNNING + 1)))
        failures: list[Stream] = []
        idle: list[float] = []
        for _ in range(2 * trials):
            record = await generator.stream(probe, probe_tokens)
            _keep(record, idle, failures)
            await asyncio.sleep(PAUSE_S)
        loaded: list[float] = []
        running: list[bool] = []
        for trial in range(trials):
            events = [asyncio.Event() for _ in range(RUNNING)]
            long = [
                asyncio.create_task(
                    generator.stream(prompts[(trial + i + 1) % len(prompts)], long_tokens, e)
                )
                for i, e in enumerate(events)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=TIMEOUT_S)
            record = await generator.stream(probe, probe_tokens)
            _keep(record, loaded, failures)
            first = record.token_times[0] if record.token_times else time.perf_counter()
            ended = await asyncio.gather(*long)
            running.append(all(s.ended > first for s in ended))
            failures += [s for s in ended if s.error]
            await asyncio.sleep(PAUSE_S)
    finally:
        generator.close()
    return TtftResult(
        probe_tokens, long_tokens, RUNNING, idle, loaded, running, len(failures),
        failures[0].error if failures else "",
    )  # fmt: skip


def _keep(record: Stream, into: list[float], failures: list[Stream]) -> None:
    if record.error or record.ttft is None:
        failures.append(record)
    else:
        into.append(record.ttft * 1e3)


# --- groups ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupResult:
    prompts: int
    n: int
    new_tokens: int
    trials: int
    grouped_s: list[float]  # per trial: all the prompts' groups, sent at once, to the end
    separate_s: list[float]  # per trial: the same generations as separate requests
    grouped_first_ms: list[float]  # each group call's first token
    separate_first_ms: list[float]  # each separate call's first token
    idle_first_ms: list[float]  # a lone one-token-at-a-time request on the idle server
    grouped_prompt_tokens: float  # the server's prefilled prompt tokens per trial (mean)
    separate_prompt_tokens: float
    errors: int
    error_sample: str

    @property
    def tokens(self) -> int:
        return self.prompts * self.n * self.new_tokens

    @property
    def grouped_tokens_per_s(self) -> float:
        return self.tokens / float(np.median(self.grouped_s)) if self.grouped_s else 0.0

    @property
    def separate_tokens_per_s(self) -> float:
        return self.tokens / float(np.median(self.separate_s)) if self.separate_s else 0.0


async def groups(
    url: str, model: str, prompts: list[str], prompt_tokens: int, new_tokens: int,
    group_prompts: int, n: int, trials: int,
) -> GroupResult:  # fmt: skip
    """Per trial, side by side: ``group_prompts`` calls with ``n`` each, all sent at once,
    then the same generations (the same seeds: ``choice_seed``) as separate calls, all sent
    at once; sampled (temperature 1), ``ignore_eos``, ``new_tokens`` each."""
    from serve.lm.requests import choice_seed

    generator = Generator(url, model, prompt_tokens)
    chosen = prompts[:group_prompts]
    grouped_s: list[float] = []
    separate_s: list[float] = []
    grouped_first: list[float] = []
    separate_first: list[float] = []
    idle: list[float] = []
    grouped_prompt: list[float] = []
    separate_prompt: list[float] = []
    failures: list[Stream] = []
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
        # warm calls, and a connection for every request of a trial
        await asyncio.gather(*(generator.stream(chosen[0], 2) for _ in range(len(chosen) * n)))
        for _ in range(2 * trials):
            _keep(await generator.stream(chosen[0], PROBE_FIRST), idle, failures)
            await asyncio.sleep(PAUSE_S)
        for trial in range(trials):
            seeds = [1000 * trial + p for p in range(len(chosen))]
            calls = [
                generator.stream(prompt, new_tokens, n=n, seed=seed)
                for prompt, seed in zip(chosen, seeds, strict=True)
            ]
            seconds, prefilled, records = await _timed(client, model, calls)
            grouped_s.append(seconds)
            grouped_prompt.append(prefilled)
            for record in records:
                _keep(record, grouped_first, failures)
            calls = [
                generator.stream(prompt, new_tokens, seed=choice_seed(seed, i))
                for prompt, seed in zip(chosen, seeds, strict=True)
                for i in range(n)
            ]
            seconds, prefilled, records = await _timed(client, model, calls)
            separate_s.append(seconds)
            separate_prompt.append(prefilled)
            for record in records:
                _keep(record, separate_first, failures)
            await asyncio.sleep(PAUSE_S)
    generator.close()
    return GroupResult(
        len(chosen), n, new_tokens, trials, grouped_s, separate_s, grouped_first,
        separate_first, idle, float(np.mean(grouped_prompt)), float(np.mean(separate_prompt)),
        len(failures), failures[0].error if failures else "",
    )  # fmt: skip


PROBE_FIRST = 8  # the idle request's new tokens: its first token is what is compared


async def _timed(
    client: httpx.AsyncClient, model: str, calls: list[Any]
) -> tuple[float, float, list[Stream]]:
    """Run ``calls`` at once: their wall time, the prompt tokens the server prefilled for
    them, their records."""
    before = await _prompt_tokens(client, model)
    started = time.perf_counter()
    records = await asyncio.gather(*calls)
    seconds = time.perf_counter() - started
    return seconds, await _prompt_tokens(client, model) - before, list(records)


async def _prompt_tokens(client: httpx.AsyncClient, model: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "rlserve_lm_prompt_tokens_total"
                and sample.labels.get("model") == model
            ):
                return sample.value
    return 0.0


# --- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("mode", choices=["load", "ttft", "groups"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of texts")
    parser.add_argument("--prompt-tokens", type=int, required=True, help="tokens of each prompt")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--long-tokens", type=int, default=224)
    parser.add_argument("--probe-tokens", type=int, default=8)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--group-prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument(
        "--api", type=Api, default=Api.NATIVE, choices=list(Api),
        help="native: rlserve's generate call; openai: /v1/completions (load mode only)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    prompts = json.loads(args.prompts.read_text())
    a = args
    if a.mode == "load":
        load_run = load(
            a.url, a.model, prompts, a.prompt_tokens, a.new_tokens, a.concurrency, a.seconds,
            a.warmup, a.api,
        )  # fmt: skip
        result = asdict(asyncio.run(load_run))
    elif a.mode == "ttft":
        ttft_run = ttft(
            a.url, a.model, prompts, a.prompt_tokens, a.long_tokens, a.probe_tokens, a.trials
        )
        result = asdict(asyncio.run(ttft_run))
    else:
        group_run = groups(
            a.url, a.model, prompts, a.prompt_tokens, a.new_tokens, a.group_prompts, a.n,
            a.trials,
        )  # fmt: skip
        result = asdict(asyncio.run(group_run))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
