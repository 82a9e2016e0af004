"""A CartPole actor: one gymnasium env stepped with actions the server computes, one by one.

    python -m bench.actor --url http://127.0.0.1:8000 --seconds 8 --client policy|http|lane

For every step the actor POSTs the observation to ``/predict`` and steps the env with the
returned action, resetting when an episode ends: the loop of an RL actor that keeps its
policy on a server. ``policy`` uses the project's client (``client.PolicyClient``);
``http`` the standard library's ``http.client`` on a keep-alive connection, so what each
client costs per step shows;
``lane`` the server's local lane (``--lane PATH``: arrays in shared memory, no HTTP).
Prints one JSON line: client, steps, seconds, steps_per_s, episodes, warmup_steps.
"""

from __future__ import annotations

import argparse
import enum
import http.client
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson

from cli.arguments import add_arguments, arg, from_namespace

Policy = Callable[[np.ndarray], int]


class Client(enum.Enum):
    POLICY = "policy"
    HTTP = "http"
    LANE = "lane"  # the server's local lane (rlserve serve --lane PATH), given as --lane


# The clients `python -m bench` runs the actor with (the lane is measured on its own so far:
# docs/lane.md).
OVER_HTTP = (Client.POLICY, Client.HTTP)


@dataclass
class ActorArgs:
    url: str = field(metadata=arg("the server's base URL, e.g. http://127.0.0.1:8000"))
    seconds: float = field(default=8.0, metadata=arg("seconds of measured stepping"))
    warmup: float = field(default=1.0, metadata=arg("seconds of stepping before measuring"))
    client: Client = field(default=Client.POLICY, metadata=arg("how to call the server"))
    lane: str | None = field(
        default=None, metadata=arg("the server's local-lane socket, for --client lane")
    )


@dataclass(frozen=True)
class ActorResult:
    client: str
    steps: int
    seconds: float
    steps_per_s: float
    episodes: int
    warmup_steps: int


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.actor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, ActorArgs)
    args = from_namespace(ActorArgs, parser.parse_args())
    close, policy = _policy(args.client, args.url, args.lane)
    try:
        result = run(policy, args.client.value, args.seconds, args.warmup)
    finally:
        close()
    print(orjson.dumps(asdict(result)).decode(), flush=True)


def run(policy: Policy, client: str, seconds: float, warmup: float) -> ActorResult:
    """Step CartPole-v1 with ``policy`` for ``warmup`` seconds, then ``seconds`` measured."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    try:
        stepper = _Stepper(env, policy)
        warmup_steps, _, _ = stepper.run_for(warmup)
        steps, episodes, elapsed = stepper.run_for(seconds)
    finally:
        env.close()
    return ActorResult(client, steps, elapsed, steps / elapsed, episodes, warmup_steps)


class _Stepper:
    """One env and its current observation, stepped with the policy's actions."""

    def __init__(self, env: Any, policy: Policy) -> None:
        self.env, self.policy = env, policy
        self.observation, _ = env.reset(seed=0)

    def run_for(self, seconds: float) -> tuple[int, int, float]:
        """Steps, finished episodes and elapsed seconds of stepping for ``seconds``."""
        steps = episodes = 0
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            self.observation, _, terminated, truncated, _ = self.env.step(
                self.policy(self.observation)
            )
            steps += 1
            if terminated or truncated:
                self.observation, _ = self.env.reset()
                episodes += 1
        return steps, episodes, elapsed


def _policy(client: Client, url: str, lane: str | None) -> tuple[Callable[[], None], Policy]:
    """A close function and a policy that asks the server at ``url`` for each action."""
    if client is Client.LANE:
        from client import LaneClient

        if lane is None:
            raise SystemExit("--client lane: give the server's lane socket as --lane PATH")
        lane_client = LaneClient(lane)
        return lane_client.close, lambda obs: int(lane_client.predict(obs).actions)
    if client is Client.POLICY:
        from client import PolicyClient

        policy_client = PolicyClient(url)
        return policy_client.close, lambda obs: int(policy_client.predict(obs).actions)
    return _http_policy(url)


def _http_policy(url: str) -> tuple[Callable[[], None], Policy]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
    path = parts.path.rstrip("/") + "/predict"
    headers = {"Content-Type": "application/json"}

    def policy(observation: np.ndarray) -> int:
        body = orjson.dumps({"observations": observation}, option=orjson.OPT_SERIALIZE_NUMPY)
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        answer: Any = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {path}: {response.status} {answer[:300]!r}")
        return int(orjson.loads(answer)["actions"])

    return connection.close, policy


if __name__ == "__main__":
    main()
