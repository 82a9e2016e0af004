"""CartPole actors for a policy canary: each plays episodes through the server, names each
episode by its own key (so the canary serves the whole episode on one version), reports
each episode's return with the version that served it, and stops once the model's canary
has ended. docs/rollouts.md walks through a run.

Read top to bottom: one episode, one actor's loop, then the actors as processes.

    python -m examples.canary_actors --url http://127.0.0.1:8000 --model cartpole \
        [--actors 3] [--most 400] [--json]

Prints, per version, the episodes played and their mean return (``--json``: one line per
episode instead: its key, every version stamp its steps got, its return and length).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import orjson

from cli.arguments import add_arguments, arg, from_namespace
from client import PolicyClient, RequestFailed


@dataclass
class Args:
    url: str = field(default="http://127.0.0.1:8000", metadata=arg("the server"))
    model: str = field(default="cartpole", metadata=arg("the model with a canary"))
    actors: int = field(default=3, metadata=arg("actor processes"))
    most: int = field(default=400, metadata=arg("episodes per actor at most"))
    json: bool = field(default=False, metadata=arg("print one JSON line per episode"))


def play(client: PolicyClient, model: str, key: str, seed: int) -> dict[str, Any]:
    """One episode, every step's action from the server, every call naming ``key``."""
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


def actor(url: str, model: str, number: int, most: int) -> list[dict[str, Any]]:
    """Episodes until the canary ends. An episode in play when it ended got steps of two
    versions (the canary's were cut over): it says nothing of either, and is not reported."""
    played = []
    with PolicyClient(url) as client:
        for episode_number in range(most):
            if not canary_running(client, model):
                break
            key = f"actor-{number}/episode-{episode_number}"
            episode = play(client, model, key, seed=number * 100_000 + episode_number)
            played.append(episode)
            if len(episode["versions"]) > 1:
                continue
            (version,) = episode["versions"]
            client.report_episode(
                model, model_version=version, episode_return=episode["return"],
                length=episode["length"], terminated=episode["terminated"],
                truncated=episode["truncated"],
            )  # fmt: skip
    return played


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, Args)
    args = from_namespace(Args, parser.parse_args(argv))
    jobs = [(args.url, args.model, n, args.most) for n in range(args.actors)]
    with multiprocessing.get_context("spawn").Pool(args.actors) as pool:
        episodes = [e for played in pool.starmap(actor, jobs) for e in played]
    if args.json:
        for episode in episodes:
            print(orjson.dumps(episode).decode())
        return
    by_version: dict[int, list[float]] = {}
    for episode in episodes:
        if len(episode["versions"]) == 1:
            by_version.setdefault(episode["versions"][0], []).append(episode["return"])
    for version, returns in sorted(by_version.items()):
        print(f"version {version}: {len(returns)} episodes, mean return "
              f"{statistics.fmean(returns):.1f}")  # fmt: skip
    cut = sum(len(e["versions"]) > 1 for e in episodes)
    print(f"{cut} episode(s) in play when the canary ended (cut over, not reported)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
