"""What the benchmark measures: each scenario a model, a request body and a connection count.

Scenario names are what ``python -m bench --only`` accepts. The wrk scenarios post one
observation per request (seeded, so every run sends the same bytes) to every server setup;
``raw`` times onnxruntime alone, ``actor`` runs the CartPole actor (see bench/actor.py),
``overload`` measures goodput at saturation and at 10x (see bench/overload.py), ``oip``
the Open Inference Protocol under Triton's perf_analyzer (see bench/oip.py), ``loop``
the inference side of RL training: rollout workers and experience buffers (see
bench/loop.py), ``lm`` language-model generation with continuous batching against
transformers and onnxruntime-genai (see bench/lm.py), ``cache`` the result cache's hit
and miss paths against a model run (see bench/cache.py), ``recurrent`` 64 sequences
of a recurrent policy with client-held and server-held state (see bench/recurrent.py),
``features`` observations by entity from Redis against inline (see bench/features.py), and
``grpo`` GRPO learning through the server in both layouts (see bench/grpo.py), and ``lane``
CartPole actors and a rollout worker over HTTP and over the local lane (see bench/lane.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from bench import models, servers
from bench.servers import Setup

RAW = "raw"
ACTOR = "actor"
OVERLOAD = "overload"
OIP = "oip"
LOOP = "loop"
LM = "lm"
CACHE = "cache"
RECURRENT = "recurrent"
FEATURES = "features"
GRPO = "grpo"
LANE = "lane"
GRPC = "grpc"
STOCHASTIC_OUTPUTS = ("actions", "log_probs", "values")


@dataclass(frozen=True)
class Scenario:
    name: str  # what --only selects
    section: str  # the document section its rows go to
    model: str  # the model's name in the benchmark repository
    connections: int
    stochastic: bool = False  # sample actions and ask for log_probs and values too


WRK = (
    Scenario("mlp-64", "mlp", "mlp", 64),
    Scenario("mlp-8", "mlp", "mlp", 8),
    Scenario("mlp-1", "mlp", "mlp", 1),
    Scenario("mlp-stochastic-64", "mlp-stochastic", "mlp", 64, stochastic=True),
    Scenario("mlp-stochastic-8", "mlp-stochastic", "mlp", 8, stochastic=True),
    Scenario("cnn-64", "cnn", "cnn", 64),
    Scenario("cartpole-64", "cartpole", "cartpole", 64),
)
NAMES = (
    *(s.name for s in WRK), RAW, ACTOR, OVERLOAD, OIP, LOOP, LM, CACHE, RECURRENT, FEATURES, GRPO,
    LANE, GRPC,
)  # fmt: skip
SPLICED = (
    OIP,
    LOOP,
    LM,
    CACHE,
    RECURRENT,
    FEATURES,
    GRPO,
    LANE,
    GRPC,
)  # alone into an existing document: replace only their own section
MODELS = ("cartpole", "mlp", "cnn")  # every model of the repository, in document order


def chosen(only: list[str] | None) -> tuple[str, ...]:
    """The scenarios ``--only`` picks, in the document's order: each value one name or
    several separated by commas (``mlp-1,mlp-8,mlp-64``); all of them without ``--only``.
    ValueError naming what is no scenario, and what would be."""
    if only is None:
        return NAMES
    picked = {name.strip() for value in only for name in value.split(",") if name.strip()}
    unknown = sorted(picked - set(NAMES))
    if unknown or not picked:
        given = ", ".join(map(repr, unknown)) if unknown else "no scenario name"
        raise ValueError(f"--only: {given} is no scenario; choose from {', '.join(NAMES)}")
    return tuple(n for n in NAMES if n in picked)


def deterministic_twin(scenario: Scenario) -> str:
    """The name of the deterministic scenario on the same model and connections."""
    return f"{scenario.model}-{scenario.connections}"


def setups(scenario: Scenario, workers: int) -> list[Setup]:
    """The servers a scenario runs on: the floors (bare ASGI on uvicorn, and a raw
    asyncio protocol under it) and the plain FastAPI baseline first, then rlserve's; no
    reference can sample, so a stochastic scenario runs rlserve's alone."""
    rlserve = [servers.SERVE, servers.GUNICORN_1, servers.gunicorn_unpinned(workers)]
    references = [servers.FLOOR, servers.BASELINE, servers.RAW_FLOOR]
    return rlserve if scenario.stochastic else [*references, *rlserve]


def body(scenario: Scenario) -> bytes:
    """The JSON request body every connection of ``scenario`` sends."""
    payload: dict[str, Any] = {"observations": observation(scenario.model)}
    if scenario.stochastic:
        payload.update(deterministic=False, outputs=list(STOCHASTIC_OUTPUTS))
    return orjson.dumps(payload)


def observation(model: str) -> Any:
    """One observation of ``model`` as JSON-ready lists (seeded random for mlp and cnn)."""
    rng = np.random.default_rng(0)
    if model == "cartpole":
        return [0.01, -0.02, 0.03, 0.04]
    if model == models.MLP.name:
        return rng.standard_normal(models.MLP.observation["shape"]).astype(np.float32).tolist()
    if model == models.CNN.name:
        return rng.integers(0, 256, models.CNN.observation["shape"]).tolist()
    raise ValueError(f"no observation for model {model!r}")


def bench_models(names: list[str]) -> tuple[models.BenchModel, ...]:
    """The exported models the selected scenarios need (cartpole is bundled, not exported)."""
    needed = {s.model for s in WRK if s.name in names}
    if RAW in names:
        needed |= set(MODELS)
    if OVERLOAD in names:
        needed.add(models.MLP.name)
    if OIP in names or CACHE in names:
        needed |= {models.MLP.name, models.CNN.name}
    if FEATURES in names:
        needed.add(models.MLP.name)
    return tuple(m for m in (models.MLP, models.CNN) if m.name in needed)
