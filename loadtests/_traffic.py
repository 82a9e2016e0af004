"""What the users send: predict bodies drawn from the served model's policy contract.

The contract comes once per process from ``GET /v1/models/{model}`` (the active version's);
observations are drawn from its observation space with ``kernel.spaces.sample``. A pool of
bodies is serialised once per process and batch size, before the first request, so that
the load generator spends its CPU on sending rather than on building JSON.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from pydantic import TypeAdapter

from kernel.spaces import Dict, Leaf, Space, leaves, sample

POOL_SIZE = 256


class ModelUnavailable(Exception):
    """The server cannot tell which model to load, or what its observations look like."""


@dataclass(frozen=True)
class Traffic:
    model: str
    path: str
    bodies: list[bytes]


_made: dict[tuple[str, str, bool, int | None], Traffic] = {}
_making = threading.Lock()  # gevent makes this a cooperative lock under locust


def traffic_for(host: str, model: str, deterministic: bool, rows: int | None) -> Traffic:
    """Bodies of one observation each (rows None) or of ``rows`` observations, for ``model``
    (or the server's first model); made once per process."""
    key = (host, model, deterministic, rows)
    with _making:
        if key not in _made:
            name, space = _observation_space(host, model)
            bodies = [_body(space, deterministic, rows, seed) for seed in range(POOL_SIZE)]
            _made[key] = Traffic(name, f"/v1/models/{name}/predict", bodies)
        return _made[key]


def _body(space: Leaf | Dict, deterministic: bool, rows: int | None, seed: int) -> bytes:
    observations = _draw(space, np.random.default_rng(seed), rows)
    return json.dumps({"observations": observations, "deterministic": deterministic}).encode()


def _draw(space: Leaf | Dict, rng: np.random.Generator, rows: int | None) -> Any:
    """Observations in request JSON form: a single one when rows is None, else a list."""
    drawn = {key: sample(leaf, rng, rows or 1) for key, leaf in leaves(space)}
    plain = {key: (array if rows else array[0]).tolist() for key, array in drawn.items()}
    return plain.get(None, plain)


# ---------------------------------------------------------------------- the contract, once


@functools.cache
def _observation_space(host: str, model: str) -> tuple[str, Leaf | Dict]:
    with httpx.Client(base_url=host, timeout=30) as client:
        name = model or _first_model(client)
        described = _get(client, f"/v1/models/{name}")
    contract = _active_contract(described)
    return name, TypeAdapter(Space).validate_python(contract["observation_space"])


def _first_model(client: httpx.Client) -> str:
    models = _get(client, "/v1/models")["models"]
    if not models:
        raise ModelUnavailable(f"{client.base_url} serves no model")
    return str(models[0]["name"])


def _active_contract(described: dict[str, Any]) -> dict[str, Any]:
    for version in described["versions"]:
        if version["version"] == described["active_version"]:
            return dict(version["contract"])
    raise ModelUnavailable(f"model {described['name']!r} has no ready version to load")


def _get(client: httpx.Client, path: str) -> Any:
    try:
        response = client.get(path)
    except httpx.TransportError as exc:
        raise ModelUnavailable(f"GET {client.base_url}{path}: {exc!r}") from None
    if not response.is_success:
        answer = f"{response.status_code} {response.text}"
        raise ModelUnavailable(f"GET {client.base_url}{path}: {answer}")
    return response.json()
