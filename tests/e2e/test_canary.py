"""Policy canaries against real servers and real actors (issue 45).

A CartPole model has three versions: 1, the live one (an untrained policy that balances
for a few dozen steps), 2 (a worse untrained one, that falls at once) and 3 (the bundled,
trained demo, that balances to the limit). Actor processes play episodes through the
server, each episode naming its key, and report each return with the version stamp its
steps got. A canary of version 2 is rolled back by the gate and one of version 3 promoted;
no episode ever mixes versions; the episodes each took stay near what the gate's design
predicts for the returns seen.

The actors are examples/canary_actors.py's, as docs/rollouts.md runs them. Under gunicorn,
a key gets the same version whichever worker answers, and keeps it across
a live push of the live version.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from client import LaneClient, PolicyClient, RequestFailed
from serve.control.return_gate import GateSettings, Verdict, half_width, verdict_of
from tests.e2e.conftest import DEMO, export_untrained
from tests.e2e.server import Server
from tests.load.gunicorn_server import start_gunicorn, stop_gunicorn

MODEL = "cartpole"
TOKEN = "canary-admin-token-1234"
ACTORS = 3
GATE = {"min_episodes": 20, "planned_episodes": 200, "alpha": 0.05}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cartpole/1 (untrained, seed 0), /2 (untrained, seed 2: worse), /3 (the trained demo)."""
    tmp = tmp_path_factory.mktemp("canary-models")
    repo = tmp / "repository"
    export_untrained(tmp, repo, MODEL, "CartPole-v1", [16], seed=0)
    export_untrained(tmp, repo, MODEL, "CartPole-v1", [16], seed=2)
    shutil.copytree(DEMO / "1", repo / MODEL / "3")
    return repo


def live_on_one(versions: Path, tmp: Path) -> Path:
    """A copy of the repository that serves version 1 (the others load when asked for)."""
    repo = tmp / "repository"
    shutil.copytree(versions, repo)
    (repo / MODEL / "config.yaml").write_text("version_policy:\n  specific: [1]\n")
    return repo


@pytest.fixture(scope="module")
def server(versions: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("canary-server")
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_ACCESS_LOG": "false"}
    running = Server.rlserve(live_on_one(versions, tmp), env=env, log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def run_actors(url: str) -> list[dict[str, Any]]:
    """Every actor's episodes (examples/canary_actors.py, as a user runs it), once the canary
    has ended. Only an actor's last episode, in play when the canary ended, may have steps
    of two versions: it was cut over (and not reported). Every other ran on one version."""
    command = [sys.executable, "-m", "examples.canary_actors", "--url", url, "--model", MODEL,
               "--actors", str(ACTORS), "--json"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    played = [orjson.loads(line) for line in done.stdout.splitlines()]
    by_actor: dict[str, list[dict[str, Any]]] = {}
    for episode in played:
        by_actor.setdefault(episode["key"].split("/")[0], []).append(episode)
    assert len(by_actor) == ACTORS
    for episodes in by_actor.values():
        assert all(len(e["versions"]) == 1 for e in episodes[:-1]), "an episode mixed versions"
    return [e for e in played if len(e["versions"]) == 1]


def predicted_episodes(live: list[float], canary: list[float], settings: GateSettings) -> int:
    """The episodes (both versions together, half on each) after which the gate's interval,
    for returns spread as these were, leaves out what it decides on: the design's own
    arithmetic, not a run of the server."""
    counts = np.arange(settings.min_episodes, 20_000, dtype=np.float64)
    difference = float(np.mean(canary) - np.mean(live))
    spreads = np.float64(np.var(live, ddof=1)), np.float64(np.var(canary, ddof=1))
    half = half_width(counts, spreads[0], counts, spreads[1], settings)
    decided = verdict_of(difference - half, difference + half, settings.margin) != "continue"
    return 2 * int(counts[np.argmax(decided)])


def judge_run(server: Server, version: int, expected: Verdict) -> dict[str, Any]:
    with PolicyClient(server.url, admin_token=TOKEN) as admin:
        started = admin.start_canary(MODEL, version, 0.5, action="auto", **GATE)  # type: ignore[arg-type]
        assert started["canary"]["version"] == version
        episodes = run_actors(server.url)
        model = admin.model(MODEL)
        with pytest.raises(RequestFailed) as ended:
            admin.canary(MODEL)
    assert ended.value.status == 404
    by_version: dict[int, list[float]] = {}
    for episode in episodes:
        by_version.setdefault(episode["versions"][0], []).append(episode["return"])
    live = by_version[1]
    canary = by_version[version]
    assert model["canary"] is None
    assert model["active_version"] == (version if expected is Verdict.PROMOTE else 1)
    with server.client() as http:
        verdicts = server.metric(
            http, "rlserve_canary_verdicts_total", model=MODEL, verdict=expected.value, by="gate"
        )
        calls = server.metric(http, "rlserve_canary_calls_total", model=MODEL)
        keyed = server.metric(http, "rlserve_canary_calls_total", model=MODEL, assignment="keyed")
    assert verdicts == 1
    with server.client() as http:
        assert math.isnan(server.metric(http, "rlserve_canary_verdict", model=MODEL))
    assert calls == keyed >= sum(e["length"] for e in episodes[: len(episodes) // 2])
    settings = GateSettings(**GATE)  # type: ignore[arg-type]
    predicted = predicted_episodes(live, canary, settings)
    # the gate decides after the report that makes it decisive; each actor may have an
    # episode in play then, and the hash splits keys about evenly, not exactly
    took = len(live) + len(canary)
    print(f"canary {version}: {expected.value} after {took} episodes, predicted {predicted}")
    assert 0.5 * predicted <= took <= 2 * predicted + 2 * ACTORS
    return {"took": took, "predicted": predicted}


def test_a_worse_canary_is_rolled_back_and_a_better_one_promoted(server: Server) -> None:
    judge_run(server, 2, Verdict.ROLLBACK)
    judge_run(server, 3, Verdict.PROMOTE)


def test_a_canary_is_refused_clearly(server: Server) -> None:
    with server.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        live = http.get(f"/v1/models/{MODEL}").json()["active_version"]
        cases = [
            ({"version": live, "share": 0.1}, 409, "live version already"),
            ({"version": 9, "share": 0.1}, 404, "9"),
            ({"version": 2, "share": 1.5}, 422, "share"),
            ({"version": 2}, 422, "share"),
            ({"version": 2, "share": 0.1, "action": "sometimes"}, 422, "action"),
        ]
        for body, status, words in cases:
            answer = http.post(f"/v1/models/{MODEL}/canary", json=body)
            assert answer.status_code == status, (body, answer.text)
            assert words in answer.json()["error"]["message"], answer.text
        assert http.get(f"/v1/models/{MODEL}/canary").status_code == 404
        assert http.post(f"/v1/models/{MODEL}/canary/promote").status_code == 404
        long_key = {"X-Episode-Key": "k" * 200}
        refused = http.post(f"/v1/models/{MODEL}/predict", json={"observations": [0.0] * 4},
                            headers=long_key)  # fmt: skip
        assert refused.status_code == 400
        assert "X-Episode-Key" in refused.json()["error"]["message"]
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.post(f"/v1/models/{MODEL}/canary", json={}).status_code in (401, 403)


@pytest.fixture
def gunicorn(versions: Path, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    repo = live_on_one(versions, tmp_path)
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_SYNC_INTERVAL_S": "0.2"}
    server = start_gunicorn(repo, tmp_path, **env)
    yield server, repo
    stop_gunicorn(server)


def versions_of_keys(url: str, keys: list[str]) -> dict[str, set[int]]:
    """Each key's version stamps over three calls, each on a new connection (gunicorn hands
    each to whichever worker accepts it first)."""
    seen: dict[str, set[int]] = {key: set() for key in keys}
    for _ in range(3):
        for key in keys:
            with httpx.Client(base_url=url) as fresh:
                answer = fresh.post(f"/v1/models/{MODEL}/predict",
                                    json={"observations": [0.0] * 4},
                                    headers={"X-Episode-Key": key})  # fmt: skip
                assert answer.status_code == 200, answer.text
                seen[key].add(answer.json()["model_version"])
    return seen


def test_a_key_keeps_its_version_across_workers_and_a_live_push(
    gunicorn: tuple[Server, Path],
) -> None:
    server, repo = gunicorn
    keys = [f"episode-{n}" for n in range(40)]
    with PolicyClient(server.url, admin_token=TOKEN) as admin:
        started = admin.start_canary(MODEL, 2, 0.5)
        assert started["all_workers"], started
        assert len(started["workers"]) == 2, started
        before = versions_of_keys(server.url, keys)
        assert all(len(v) == 1 for v in before.values()), before
        assert {next(iter(v)) for v in before.values()} == {1, 2}
        live = (repo / MODEL / "1" / "model.onnx").read_bytes()
        pushed = admin.push(MODEL, 4, live)  # the live version, pushed anew as 4
        assert pushed["active_version"] == 4, pushed
        assert pushed["all_workers"], pushed
        after = versions_of_keys(server.url, keys)
    for key in keys:
        (was,) = before[key]
        assert after[key] == ({2} if was == 2 else {4}), (key, before[key], after[key])
    reported = report_on_fresh_connections(server.url, {4: 20, 2: 20})
    counted = episodes_counted(server.url, reported)
    # every worker's, whichever got which (the files' own exchange: test_canary_evidence.py)
    assert counted == {"live": 20, "canary": 20}


def report_on_fresh_connections(url: str, episodes: dict[int, int]) -> int:
    """Report ``episodes[version]`` episodes of each version, each on a new connection (so
    both workers get some); how many in all."""
    for version, count in episodes.items():
        for n in range(count):
            with httpx.Client(base_url=url) as fresh:
                body = {"model_version": version, "return": float(n), "length": 10}
                assert fresh.post(f"/v1/models/{MODEL}/episodes", json=body).status_code == 202
    return sum(episodes.values())


def episodes_counted(url: str, reported: int) -> dict[str, int]:
    """Each side's episodes as a worker counts them on every worker's files, once they add
    up to ``reported`` (each worker writes its counts just after it answers a report)."""
    deadline = time.monotonic() + 20
    with PolicyClient(url) as client:
        while True:
            sides = {s["arm"]: s["episodes"] for s in client.canary(MODEL)["versions"]}
            if sum(sides.values()) == reported or time.monotonic() > deadline:
                return sides
            time.sleep(0.05)


def test_the_predicted_count_follows_the_design() -> None:
    """The test's own arithmetic: a clear difference is decided at the minimum, a small
    one takes many more episodes."""
    rng = np.random.default_rng(0)
    settings = GateSettings(**GATE)  # type: ignore[arg-type]
    clear = predicted_episodes(list(rng.normal(40, 15, 50)), list(rng.normal(10, 1, 50)), settings)
    small = predicted_episodes(list(rng.normal(40, 15, 50)), list(rng.normal(35, 15, 50)), settings)
    assert clear == 2 * settings.min_episodes
    assert small > 2 * clear


def rollout_canary(server: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    """``rlserve rollout canary ARGV`` as a user runs it, against ``server``."""
    return subprocess.run(
        [sys.executable, "-m", "cli", "rollout", "canary", *argv, MODEL, "--url", server.url],
        env={**os.environ, "RLSERVE_ADMIN_TOKEN": TOKEN}, capture_output=True, text=True,
        cwd=ROOT, timeout=60,
    )  # fmt: skip


def test_the_command_starts_reports_and_ends_a_canary(server: Server) -> None:
    with PolicyClient(server.url) as client:
        live = client.model(MODEL)["active_version"]
    other = 2 if live != 2 else 1
    started = rollout_canary(server, "start", "--version", str(other), "--share", "0.25")
    assert started.returncode == 0, started.stderr
    assert f"canary version {other} serves 0.25 of episodes (report)" in started.stdout
    status = rollout_canary(server, "status")
    assert status.returncode == 0, status.stderr
    assert "verdict: continue" in status.stdout
    with server.client() as http:  # what an Argo Rollouts analysis reads (k8s/optional)
        assert server.metric(http, "rlserve_canary_verdict", model=MODEL) == 0
        lower = server.metric(http, "rlserve_canary_return_difference", bound="lower")
    assert lower == -math.inf  # no episodes yet
    assert re.search(rf"^live\s+{live}\s+0\s+-", status.stdout, re.MULTILINE), status.stdout
    again = rollout_canary(server, "start", "--version", str(other))
    assert again.returncode == 1
    assert "has a canary already" in again.stderr
    ended = rollout_canary(server, "rollback")
    assert ended.returncode == 0, ended.stderr
    assert f"version {live} serves every episode" in ended.stdout
    gone = rollout_canary(server, "status")
    assert gone.returncode == 1
    assert "no canary running" in gone.stderr
    with server.client() as http:
        assert math.isnan(server.metric(http, "rlserve_canary_verdict", model=MODEL))


@pytest.fixture(params=["thread", "loop"])
def lane_server(
    versions: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Server, Path]]:
    path = tmp_path / "lane.sock"
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_ACCESS_LOG": "false"}
    flags = ["--lane", str(path), "--lane-serving", request.param]
    server = Server.rlserve(live_on_one(versions, tmp_path), *flags, env=env, log=tmp_path / "log")
    server.wait_ready()
    yield server, path
    server.stop()


def test_a_lane_is_served_on_one_side_of_a_canary(lane_server: tuple[Server, Path]) -> None:
    """A lane is one actor's connection: every call of it gets the side its lane drew, on
    either serving; lanes together get both sides."""
    server, path = lane_server
    with PolicyClient(server.url, admin_token=TOKEN) as admin:
        admin.start_canary(MODEL, 2, 0.5)
    lanes = [LaneClient(path) for _ in range(16)]
    try:
        seen = [{lane.predict([0.0] * 4).model_version for _ in range(5)} for lane in lanes]
        together = [lane.predict([0.01] * 4).model_version for lane in lanes]
    finally:
        for lane in lanes:
            lane.close()
    assert all(len(versions) == 1 for versions in seen), seen
    assert [next(iter(v)) for v in seen] == together
    assert set(together) == {1, 2}


def kl(live: np.ndarray, canary: np.ndarray) -> float:
    """KL(live || canary) of two categoricals given by logits."""
    p, q = np.exp(live - logsumexp(live)), live - logsumexp(live)
    return float(np.sum(p * (q - (canary - logsumexp(canary)))))


def logsumexp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + float(np.log(np.sum(np.exp(x - top))))


def test_a_shadow_canary_serves_nothing_and_reports_agreement_and_kl(server: Server) -> None:
    """Every call is answered by the live version; the canary runs on mirrored batches, and
    its agreement and KL are those of the two versions' own answers on that observation."""
    observation = [0.02, -0.3, 0.05, 0.4]
    with PolicyClient(server.url, admin_token=TOKEN) as client:
        live = client.model(MODEL)["active_version"]
        other = 2 if live != 2 else 1
        with pytest.raises(RequestFailed) as auto:
            client.start_canary(MODEL, other, 0.9, mode="shadow", action="auto")
        assert auto.value.status == 422
        assert "shadow" in auto.value.message
        started = rollout_canary(server, "start", "--version", str(other), "--share", "0.9",
                                 "--shadow")  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert "runs in shadow on 0.9 of live batches" in started.stdout
        asked = {"outputs": ("actions", "distribution")}  # each version's own answer
        mine = client.predict(observation, model=MODEL, version=live, **asked)  # type: ignore[arg-type]
        theirs = client.predict(observation, model=MODEL, version=other, **asked)  # type: ignore[arg-type]
        stamps = {client.predict(observation, model=MODEL).model_version for _ in range(50)}
        assert stamps == {live}  # the canary answered nothing
        deadline = time.monotonic() + 30
        while (shadow := client.canary(MODEL)["shadow"])["rows"] < 20:
            assert time.monotonic() < deadline, shadow
            time.sleep(0.05)
        status = rollout_canary(server, "status")
        client.rollback_canary(MODEL)
    agree = int(np.asarray(mine.actions)) == int(np.asarray(theirs.actions))
    assert shadow["agreement"] == (1.0 if agree else 0.0)
    expected = kl(
        np.asarray(mine.distribution["logits"]), np.asarray(theirs.distribution["logits"])
    )
    assert shadow["mean_kl"] == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert status.returncode == 0, status.stderr
    assert "rows compared:" in status.stdout
    assert "verdict: none" in status.stdout
    with server.client() as http:
        rows = server.metric(http, "rlserve_canary_shadow_rows_total", model=MODEL)
    assert rows >= shadow["rows"]


def test_a_canary_in_a_models_config_starts_with_it_once(versions: Path, tmp_path: Path) -> None:
    """config.yaml's canary is running when the server is ready; once it ended, a restart
    does not start it again (the serving state remembers)."""
    repo = live_on_one(versions, tmp_path)
    config = repo / MODEL / "config.yaml"
    config.write_text(config.read_text() + "canary: {version: 2, share: 0.25, mode: episodes}\n")
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_ACCESS_LOG": "false"}
    first = Server.rlserve(repo, env=env, log=tmp_path / "first.log")
    try:
        first.wait_ready()
        with PolicyClient(first.url, admin_token=TOKEN) as admin:
            status = admin.canary(MODEL)
            admin.rollback_canary(MODEL)
    finally:
        first.stop()
    assert status["canary"]["version"] == 2
    assert status["canary"]["share"] == 0.25
    again = Server.rlserve(repo, env=env, log=tmp_path / "again.log")
    try:
        again.wait_ready()
        with PolicyClient(again.url) as client, pytest.raises(RequestFailed) as none:
            client.canary(MODEL)
    finally:
        again.stop()
    assert none.value.status == 404
