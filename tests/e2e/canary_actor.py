"""One CartPole actor of the canary tests, as its own process: it plays episodes through
the server, each naming its own episode key, reports each one's return with the version
that served it (not one in play when the canary ended: its steps got two versions), and
stops once the model's canary has ended (or after ``--most`` episodes). It prints one JSON
line per episode: its key, every version stamp its steps got, its return.

    python -m tests.e2e.canary_actor URL MODEL ACTOR [--most N]
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import orjson

from client import PolicyClient, RequestFailed


def play(client: PolicyClient, model: str, key: str, seed: int) -> dict[str, Any]:
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=seed)
    total, steps, versions = 0.0, 0, set()
    while True:
        answer = client.predict(observation, model=model, episode_key=key)
        versions.add(answer.model_version)
        observation, reward, terminated, truncated, _ = env.step(int(answer.actions))
        total, steps = total + float(reward), steps + 1
        if terminated or truncated:
            break
    env.close()
    return {"key": key, "versions": sorted(versions), "return": total, "length": steps,
            "terminated": terminated, "truncated": truncated}  # fmt: skip


def canary_running(client: PolicyClient, model: str) -> bool:
    try:
        client.canary(model)
    except RequestFailed as exc:
        if exc.status == 404:
            return False
        raise
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("actor", type=int)
    parser.add_argument("--most", type=int, default=400)
    args = parser.parse_args()
    with PolicyClient(args.url) as client:
        for number in range(args.most):
            if not canary_running(client, args.model):
                break
            key = f"actor-{args.actor}/episode-{number}"
            episode = play(client, args.model, key, seed=args.actor * 100_000 + number)
            print(orjson.dumps(episode).decode(), flush=True)
            if len(episode["versions"]) > 1:
                continue  # in play when the canary ended: it says nothing of either version
            (version,) = episode["versions"]
            client.report_episode(
                args.model, model_version=version, episode_return=episode["return"],
                length=episode["length"], terminated=episode["terminated"],
                truncated=episode["truncated"],
            )  # fmt: skip


if __name__ == "__main__":
    main()
