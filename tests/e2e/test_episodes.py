"""Episode reports against a real server: CartPole episodes played through the server, each
reported with the version that served it, show in the model's episode tally and metrics;
bad reports are refused clearly; a server with an episode token refuses reports without it.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client import AsyncPolicyClient, EpisodeOutcome, PolicyClient, Prediction, RequestFailed
from examples import canary_actors
from tests.e2e.conftest import DEMO
from tests.e2e.server import Server

TOKEN = "episode-reports-token-1234"


def serve(tmp: Path, env: dict[str, str] | None = None) -> Server:
    repository = tmp / "repository"
    repository.mkdir()
    (repository / "cartpole").symlink_to(DEMO)
    server = Server.rlserve(repository, env=env, log=tmp / "log")
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = serve(tmp_path_factory.mktemp("episodes"))
    yield running
    running.stop()


def play(client: PolicyClient, seed: int) -> dict[str, object]:
    """One CartPole episode through the server (examples/canary_actors.py's); its report."""
    episode = canary_actors.play(client, "cartpole", f"episode-{seed}", seed)
    (version,) = episode["versions"]  # one version served the whole episode
    return {
        "model_version": version, "episode_return": episode["return"],
        "length": episode["length"], "terminated": episode["terminated"],
        "truncated": episode["truncated"],
    }  # fmt: skip


def test_reported_episodes_are_tallied_by_version(server: Server) -> None:
    with PolicyClient(server.url) as client:
        reports = [play(client, seed) for seed in range(4)]
        for report in reports:
            accepted = client.report_episode("cartpole", **report)  # type: ignore[arg-type]
            assert accepted == {"model": "cartpole", "model_version": 1}
        tally = client.episodes("cartpole")
    (version,) = tally["versions"]
    returns = [float(r["episode_return"]) for r in reports]  # type: ignore[arg-type]
    assert version["version"] == 1
    assert version["episodes"] == len(reports)
    assert version["mean_return"] == pytest.approx(statistics.fmean(returns))
    assert version["return_stddev"] == pytest.approx(statistics.stdev(returns))
    assert version["mean_length"] == pytest.approx(statistics.fmean(r["length"] for r in reports))  # type: ignore[misc]
    assert version["terminated"] + version["truncated"] == len(reports)
    assert min(returns) <= version["return_quantiles"]["p50"] <= max(returns)
    with server.client() as http:
        counted = server.metric(http, "rlserve_episode_return_count", model="cartpole", version="1")
        summed = server.metric(http, "rlserve_episode_returns_sum", model="cartpole", version="1")
        ended = server.metric(http, "rlserve_episodes_total", model="cartpole", version="1")
    assert counted == ended == len(reports)
    assert summed == pytest.approx(sum(returns))


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"return": 10.0}, "model_version: expected the version"),
        ({"model_version": 1, "return": True}, "return: expected a finite number"),
        ({"model_version": 1, "return": 1.0, "length": 0}, "length: expected a positive"),
        ({"model_version": 1, "return": 1.0, "terminated": "yes"}, "terminated: expected true"),
        ({"model_version": 1, "return": 1.0, "reward": 1}, "unknown field(s) ['reward']"),
        ({"episodes": []}, "1 to 256 reports"),
        ({"episodes": [{"model_version": 1, "return": 1.0}] * 257}, "1 to 256 reports"),
        ({"episodes": {"model_version": 1}}, "1 to 256 reports"),
        ({"episodes": [{"model_version": 1, "return": 1}], "extra": 1}, "nothing else"),
        (  # one bad report refuses the batch: none of it counts
            {"episodes": [{"model_version": 1, "return": 1.0}, {"model_version": 1}]},
            "episodes[1]: return: expected a finite number",
        ),
        ({"episodes": [{"model_version": 1, "return": 1.0}, 7]}, "episodes[1]: expected an"),
    ],
)
def test_bad_reports_are_refused_and_counted_nowhere(
    server: Server, body: dict[str, object], words: str
) -> None:
    with server.client() as http:
        before = server.metric(http, "rlserve_episodes_total", model="cartpole")
        response = http.post("/v1/models/cartpole/episodes", json=body)
        after = server.metric(http, "rlserve_episodes_total", model="cartpole")
    assert response.status_code == 422, response.text
    assert words in response.json()["error"]["message"]
    assert after == before


def test_a_batch_of_reports_counts_each(server: Server) -> None:
    outcomes = [EpisodeOutcome(1, float(n), n + 1, terminated=True) for n in range(5)]
    with PolicyClient(server.url) as client:
        before = sum(v["episodes"] for v in client.episodes("cartpole")["versions"])
        accepted = client.report_episodes("cartpole", outcomes)
        after = sum(v["episodes"] for v in client.episodes("cartpole")["versions"])
    assert accepted == {"model": "cartpole", "episodes": 5}
    assert after - before == 5


def test_the_async_client_predicts_and_reports_as_the_sync_one(server: Server) -> None:
    """AsyncPolicyClient against the same server: the same action for the same observation,
    a batch of reports counted, and a refusal raised as RequestFailed."""
    observation = [0.01, -0.02, 0.03, 0.04]
    outcomes = [EpisodeOutcome(1, 20.0 + n, 20 + n, truncated=True) for n in range(3)]

    async def session() -> tuple[Prediction, dict[str, object], int, int]:
        async with AsyncPolicyClient(server.url) as client:
            predicted = await client.predict(observation, model="cartpole")
            before = (await client.episodes("cartpole"))["versions"]
            accepted = await client.report_episodes("cartpole", outcomes)
            after = (await client.episodes("cartpole"))["versions"]
            with pytest.raises(RequestFailed) as refused:
                await client.report_episodes("nope", outcomes)
        counted = sum(v["episodes"] for v in after) - sum(v["episodes"] for v in before)
        return predicted, accepted, counted, refused.value.status

    predicted, accepted, counted, refused = asyncio.run(session())
    with PolicyClient(server.url) as client:
        expected = client.predict(observation, model="cartpole")
    assert (predicted.actions, predicted.model_version) == (
        expected.actions,
        expected.model_version,
    )
    assert accepted == {"model": "cartpole", "episodes": 3}
    assert (counted, refused) == (3, 404)


def test_reports_for_an_unknown_model_get_404(server: Server) -> None:
    with server.client() as http:
        response = http.post("/v1/models/nope/episodes", json={"model_version": 1, "return": 1})
    assert response.status_code == 404
    assert "'nope'" in response.json()["error"]["message"]


def test_a_server_with_an_episode_token_wants_it(tmp_path: Path) -> None:
    running = serve(tmp_path, env={"RLSERVE_EPISODE_TOKEN": TOKEN})
    try:
        with PolicyClient(running.url) as client:
            with pytest.raises(RequestFailed) as refused:
                client.report_episode("cartpole", model_version=1, episode_return=9.0)
            accepted = client.report_episode(
                "cartpole", model_version=1, episode_return=9.0, token=TOKEN
            )
        with httpx.Client(base_url=running.url) as http:
            tally = http.get("/v1/models/cartpole/episodes").json()
    finally:
        running.stop()
    assert refused.value.status == 401
    assert accepted["model_version"] == 1
    assert tally["versions"][0]["episodes"] == 1
