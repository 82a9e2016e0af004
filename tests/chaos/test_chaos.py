"""The chaos suite in its short form: gunicorn (2 workers) under locust load while every
fault is injected once, and no request lost, no error other than 429/503/504.

The full form is ``make chaos`` (60 s); this one runs the same code for 20 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadtests.chaos._accounting import Outcome, outcome
from loadtests.chaos._cli import START_ENV, main, parser
from loadtests.chaos._faults import DEFAULT_FAULTS, FaultKind, KillEvent
from loadtests.chaos._records import RequestRecord, Source, Stage
from tests.e2e.server import Server
from tests.load.conftest import DEMO_REPOSITORY
from tests.load.gunicorn_server import start_gunicorn, stop_gunicorn
from tests.ops.conftest import K8S, render
from tests.ops.ops_manifests import matches, named, of_kind, pod_labels, server

TOKEN = "chaos-suite-admin-token"
# As --start-server sets them: a drain delay, and a queue that the burst overflows.
SERVER_ENV = {**START_ENV, "RLSERVE_ADMIN_TOKEN": TOKEN}
SHORT = ["--duration", "20", "--warmup", "2", "--cooldown", "2", "--burst-s", "2"]
SHORT += ["--slow-s", "2", "--repository-away-s", "2"]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A copy of the demo repository: the faults write into it and rename it."""
    copy = tmp_path / "repository"
    shutil.copytree(DEMO_REPOSITORY, copy)
    return copy


@pytest.fixture
def gunicorn(repository: Path, tmp_path: Path) -> Iterator[Server]:
    server = start_gunicorn(repository, tmp_path, **SERVER_ENV)
    yield server
    stop_gunicorn(server)


def run(tmp: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    report = tmp / "chaos.json"
    code = main([*argv, "--json", str(report), "--work-dir", str(tmp / "chaos")])
    return code, json.loads(report.read_text()) if report.exists() else {}


def test_every_fault_once_under_load_loses_no_request(
    gunicorn: Server, repository: Path, tmp_path: Path
) -> None:
    # No --gunicorn-pid: the suite finds the master listening on the port.
    code, report = run(
        tmp_path, "--host", gunicorn.url, "--admin-token", TOKEN,
        "--model-repository", str(repository), *SHORT,
    )  # fmt: skip
    total = report["account"]["total"]
    assert [f["kind"] for f in report["faults"]] == [k.value for k in DEFAULT_FAULTS]
    results = {f["kind"]: f["result"] for f in report["faults"]}
    assert results == {k.value: "ok" for k in DEFAULT_FAULTS}, report["faults"]
    assert total["lost"] == 0, report["account"]["lost"]
    assert total["error"] == 0, report["account"]["errors"]
    assert total["answered"] > 1000
    assert report["account"]["latency"]["p99_ms"] <= 1000
    assert len(report["kills"]) == 1
    assert total["killed"] <= report["kills"][0]["connections"]
    assert code == 0, gunicorn.output()


def test_one_command_starts_the_server_itself(tmp_path: Path) -> None:
    code, report = run(
        tmp_path, "--start-server", "--model-repository", str(DEMO_REPOSITORY),
        "--faults", "hold,kill", "--duration", "4", "--warmup", "1", "--cooldown", "1",
    )  # fmt: skip
    assert code == 0, report
    assert report["workers"] == 2
    assert [f["result"] for f in report["faults"]] == ["ok", "ok"]
    assert not (DEMO_REPOSITORY / "cartpole" / "2").exists()  # it served a copy


def test_help_explains_every_option() -> None:
    options = [a for a in parser()._actions if a.option_strings]
    assert all(a.help for a in options), [a.option_strings for a in options if not a.help]
    text = parser().format_help()
    for kind in FaultKind:
        assert kind.value in text


def test_bad_options_are_refused_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--host", "http://127.0.0.1:1", "--faults", "kill,meteor"])
    assert exit_.value.code == 2
    assert "unknown ['meteor']" in capsys.readouterr().err


def record(status: int = 0, port: int = 40000, started: float = 10.0) -> RequestRecord:
    stage = Stage.DONE if status else Stage.RECEIVE
    return RequestRecord(Source.STEADY, started, started + 0.01, status, stage, "", port)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (record(200), Outcome.ANSWERED),
        (record(429), Outcome.REFUSED),
        (record(503), Outcome.REFUSED),
        (record(504), Outcome.REFUSED),
        (record(500), Outcome.ERROR),
        (record(400), Outcome.ERROR),
        (record(0, port=40000), Outcome.KILLED),  # on a connection the killed worker held
        (record(0, port=40001), Outcome.LOST),  # on another connection
        (record(0, port=40000, started=20.0), Outcome.LOST),  # long after: the port is reused
    ],
)
def test_every_request_lands_in_exactly_one_row(given: RequestRecord, expected: Outcome) -> None:
    kill = KillEvent(pid=1, stopped_at=10.0, killed_at=10.005, ports=frozenset({40000}))
    assert outcome(given, [kill], timeout_s=10) is expected


def test_the_chaos_mesh_experiments_hit_one_pod_of_the_active_color() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    done = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "optional" / "chaos-mesh")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    experiments = [d for d in yaml.safe_load_all(done.stdout) if d]
    production = render("production")
    service = named(production, "Service", "rlserve")
    active = named(production, "Deployment", "rlserve-" + service["spec"]["selector"]["color"])
    assert {e["kind"] for e in experiments} == {"PodChaos", "NetworkChaos", "StressChaos"}
    for experiment in experiments:
        selector, namespace = experiment["spec"]["selector"], experiment["metadata"]["namespace"]
        assert experiment["apiVersion"] == "chaos-mesh.org/v1alpha1"
        assert experiment["spec"]["mode"] == "one"
        targets = [
            d["metadata"]["name"]
            for d in of_kind(production, "Deployment")
            if matches(selector["labelSelectors"], pod_labels(d))
        ]
        assert targets == [active["metadata"]["name"]]  # the active color, nothing else
        assert selector["namespaces"] == [namespace] == [active["metadata"]["namespace"]]
    stress = next(e for e in experiments if e["kind"] == "StressChaos")
    assert stress["spec"]["containerNames"] == [server(active)["name"]]
    assert all(d["kind"] not in {e["kind"] for e in experiments} for d in production)
