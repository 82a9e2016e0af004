"""Where a lone predict call's CPU goes inside rlserve, without uvicorn: one mlp
observation per call, every call awaited before the next, so each finds the model idle
and runs alone at batch 1 (the ``mlp-1`` scenario's call, with HTTP taken away).

Each row is measured on its own, in one process on one core, as CPU time per call:

- the whole ASGI call, ``POST /v1/models/mlp/predict`` as uvicorn would make it
  (``create_app()``, lifespan run, the body handed over in one message, the answer's two
  messages taken);
- the scheduler's part: ``submit`` to answer of a prepared request (admission, queue, plan,
  inline run, record, metrics sink, answer), the model's run included;
- the model's run alone (``execute``: onnxruntime and the policy heads);
- decoding the JSON body; validating it into prepared rows (``prepare``);
- the frontend's part: the whole call less the scheduler's part, decoding and validation
  (routing, deadline, admission, the call wrapper, encoding, stamping, the asyncio hops).

``--modules`` lists instead the modules of ours (every package: ``kernel``, ``serve``, ...)
whose functions run during one whole call (and the batch it makes), traced with
``sys.setprofile`` on every thread: what a reader following the call in the code meets, the
helpers it calls included (uvicorn's protocol, which every call over HTTP also crosses, is
not part of the ASGI call). ``--modules --chat`` does the same for one chat completion
(``POST /v1/chat/completions``, 8 new tokens, not streamed) of the lm scenario's tiny DPO
policy (built once by ``bench.lm`` into .cache; ``--lm-repository`` names another).

Rows measured alone run warm: in a whole call the model's weights (about 1 MB for mlp)
and the interpreter's data leave the caches between stages, so a stage costs more in
place than alone, and that difference lands in the rows computed by subtraction (the
scheduler's: ``bench.lone_request`` measures it with a model that costs nothing).

    .venv/bin/python -m bench.predict_path [--calls 5000] [--repeats 5] [--modules [--chat]]

Prints the best of ``--repeats`` runs of each (the machine is noisy; CPU time is less
disturbed than wall time). The access log is off. The exported mlp is kept in
.cache/bench-predict-path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from bench import lm, models, scenarios
from serve import config
from serve.dataplane.messages import InferenceRequest
from serve.process.app import RLServeApp, create_app

Message = MutableMapping[str, Any]
PATH = "/v1/models/mlp/predict"
CACHE = models.ROOT / ".cache" / "bench-predict-path"  # the exported mlp, kept


@dataclass(frozen=True)
class Stage:
    name: str
    us_per_call: float


def _http_scope(body: bytes, path: str = PATH) -> dict[str, Any]:
    return {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
        "query_string": b"", "scheme": "http", "http_version": "1.1",
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }  # fmt: skip


async def _started(app: RLServeApp) -> Callable[[], Awaitable[None]]:
    """Run the app's lifespan until its models are loaded; the call to stop it."""
    events: asyncio.Queue[Message] = asyncio.Queue()
    await events.put({"type": "lifespan.startup"})

    async def send(message: Message) -> None:
        return None

    lifespan = asyncio.create_task(app({"type": "lifespan"}, events.get, send))
    await asyncio.wait_for(app.state.phases.loaded.wait(), 120)

    async def stop() -> None:
        await events.put({"type": "lifespan.shutdown"})
        await lifespan

    return stop


async def _best(call: Callable[[], Awaitable[Any]], calls: int, repeats: int) -> float:
    for _ in range(min(calls, 500)):  # warm: run times measured, caches filled
        await call()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            await call()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def _whole_call(app: RLServeApp, body: bytes, path: str = PATH) -> Callable[[], Awaitable[None]]:
    """One whole ASGI call of ``body`` to ``path`` (a predict, by default), as uvicorn would
    make it; RuntimeError unless it is answered 200."""
    scope, message = _http_scope(body, path), {"type": "http.request", "body": body}
    answers: list[Message] = []

    async def receive() -> Message:
        return message

    async def send(sent: Message) -> None:
        answers.append(sent)

    async def whole() -> None:
        answers.clear()
        await app(dict(scope), receive, send)
        if answers[0]["status"] != 200:
            raise RuntimeError(f"{scope['path']} answered {answers}")

    return whole


def _mlp_body() -> bytes:
    return scenarios.body(scenarios.Scenario("mlp-1", "mlp", "mlp", 1))


async def measure(repository: Path, calls: int, repeats: int) -> list[Stage]:
    app = create_app(config.load(model_repository=repository, access_log=False))
    stop = await _started(app)
    body = _mlp_body()
    whole = _whole_call(app, body)
    route = app.transports.predict.router.resolve(models.MLP.name, None)
    model, scheduler = route.row_model(), route.row_scheduler()
    payload = app.transports.predict.bodies.decode(body)

    def request() -> InferenceRequest:
        now = time.monotonic()
        return InferenceRequest(payload, {}, "bench", now, now + 60.0)

    prepared = model.prepare(request())

    async def through_scheduler() -> None:
        await scheduler.submit(model.prepare(request()), None)

    async def prepare_alone() -> None:
        model.prepare(request())

    async def run_alone() -> None:
        model.execute(prepared.feeds, [prepared])

    async def decode_alone() -> None:
        app.transports.predict.bodies.decode(body)

    try:
        measured = {
            "whole call": await _best(whole, calls, repeats),
            "scheduler": await _best(through_scheduler, calls, repeats),
            "prepare": await _best(prepare_alone, calls, repeats),
            "run": await _best(run_alone, calls, repeats),
            "decode": await _best(decode_alone, calls, repeats),
        }
    finally:
        await stop()
    frontend = measured["whole call"] - measured["scheduler"] - measured["decode"]
    queueing = measured["scheduler"] - measured["prepare"] - measured["run"]
    return [
        Stage("whole ASGI call (no uvicorn)", measured["whole call"]),
        Stage("  decoding the JSON body", measured["decode"]),
        Stage("  validating it (prepare)", measured["prepare"]),
        Stage("  the model's run (onnxruntime + heads)", measured["run"]),
        Stage("  the scheduler, less the run measured alone", queueing),
        Stage("  the frontend, the rest", frontend),
    ]


OURS = ("kernel", "cli", "client", "serve", "ops", "export", "loop")
CHAT_PATH = "/v1/chat/completions"


def _chat_body(model: str) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "The cat sat"}],
            "max_tokens": 8,
            "temperature": 0,
        }
    )


async def crossed_modules(repository: Path, path: str, body: bytes) -> Counter[str]:
    """The modules of ours whose functions run in one whole call, on any thread, with how
    many of their functions' calls each saw (a warm call: routes, run times and caches
    settled)."""
    app = create_app(config.load(model_repository=repository, access_log=False))
    root = str(Path(__file__).resolve().parents[1]) + os.sep
    packages = tuple(root + name + os.sep for name in OURS)
    calls: Counter[str] = Counter()
    tracing = False

    def count(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if tracing and event == "call" and name.startswith(packages):
            calls[name[len(root) :]] += 1

    threading.setprofile(count)  # threads started from here on (the decoding thread)
    try:
        stop = await _started(app)
        whole = _whole_call(app, body, path)
        try:
            for _ in range(20 if path == CHAT_PATH else 100):
                await whole()
            tracing = True
            sys.setprofile(count)
            try:
                await whole()
            finally:
                sys.setprofile(None)
                tracing = False
        finally:
            await stop()
    finally:
        threading.setprofile(None)
    return calls


def _chat_repository(given: Path | None) -> tuple[Path, str]:
    """The lm scenario's tiny DPO policy in a model repository, and its model's name."""
    if given is not None:
        return given, next(p.name for p in given.iterdir() if p.is_dir())
    repository = CACHE / "lm-repository"
    if not (repository / lm.POLICY).is_dir():
        repository.mkdir(parents=True, exist_ok=True)
        lm.export(lm.policy(), repository)
    return repository, lm.POLICY


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000, help="calls per measured run")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each; the best is shown")
    parser.add_argument(
        "--modules", action="store_true", help="list the modules of ours one call runs code of"
    )
    parser.add_argument(
        "--chat", action="store_true", help="with --modules: one chat completion, not a predict"
    )
    parser.add_argument(
        "--lm-repository", type=Path, default=None,
        help="with --chat: a model repository holding one language model (default: built)",
    )  # fmt: skip
    args: Any = parser.parse_args(argv)
    if args.modules and args.chat:
        lm_repository, name = _chat_repository(args.lm_repository)
        crossed = asyncio.run(crossed_modules(lm_repository, CHAT_PATH, _chat_body(name)))
        _print_modules(crossed, "chat completion")
        return
    repository = models.build_repository(CACHE / "repository", (models.MLP,))
    if args.modules:
        _print_modules(asyncio.run(crossed_modules(repository, PATH, _mlp_body())), "predict call")
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})  # one core, as the servers are pinned
    stages = asyncio.run(measure(repository, args.calls, args.repeats))
    print("| where | CPU µs per call |\n|---|---:|")
    for stage in stages:
        print(f"| {stage.name} | {stage.us_per_call:.1f} |")


def _print_modules(crossed: Counter[str], call: str) -> None:
    print(f"{len(crossed)} modules of ours run code in one {call}:")
    print("| module | function calls |\n|---|---:|")
    for module, count in sorted(crossed.items()):
        print(f"| `{module}` | {count} |")


if __name__ == "__main__":
    main()
