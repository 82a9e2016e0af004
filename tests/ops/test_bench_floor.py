"""The benchmark's HTTP floor (issue #20): the bare ASGI app on the wire, and the pure parts
that read rlserve's figures against it and against plain FastAPI: the ratios, the targets
judged on them, the document's table of them, and ``--only``'s scenario names.

The floor itself is started as the benchmark starts it (uvicorn with rlserve's options,
pinned to the server core) and called with httpx; the rest are functions of numbers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket

import httpx
import pytest

from bench import cpu, floor, ratios, report, scenarios, servers, targets
from bench.actor import ActorResult, Client
from bench.load import LoadResult
from bench.results import ActorRun, Conditions, LoadRun, Results
from bench.scenarios import Scenario
from bench.servers import Setup

MLP_64, MLP_8, MLP_1 = scenarios.WRK[:3]
STOCHASTIC_64 = next(s for s in scenarios.WRK if s.stochastic)
SECONDS = 8.0


def load_run(
    scenario: Scenario,
    setup: Setup,
    requests_per_s: float,
    p50_ms: float,
    p99_ms: float,
    cpu_us: float,
    *,
    errors: int = 0,
) -> LoadRun:
    """A measured run of ``SECONDS`` at these figures; ``cpu_us`` per request."""
    requests = round(requests_per_s * SECONDS)
    result = LoadResult(
        requests=requests, requests_per_s=requests_per_s, p50_ms=p50_ms, p99_ms=p99_ms,
        errors=errors, seconds=SECONDS, socket_errors=0, statuses=None,
    )  # fmt: skip
    return LoadRun(scenario, setup, result, server_cpu_s=cpu_us * requests / 1e6)


def results_of(*runs: LoadRun) -> Results:
    conditions = Conditions(
        when="now", machine="x86_64", cpus=2, python="3.11", seconds=int(SECONDS), warmup_s=2,
        workers=2, scenarios=tuple(dict.fromkeys(r.scenario.name for r in runs)),
        all_scenarios=False,
    )  # fmt: skip
    return Results(conditions, load=list(runs))


def verdict(results: Results, start: str) -> targets.Verdict:
    (found,) = [v for v in targets.judge(results) if v.target.startswith(start)]
    return found


# The floor on the wire


@pytest.fixture(params=[servers.FLOOR, servers.RAW_FLOOR], ids=lambda s: s.key)
def floor_server(request, tmp_path):
    if shutil.which("taskset") is None or cpu.SERVER_CORE not in os.sched_getaffinity(0):
        pytest.skip(f"needs taskset and core {cpu.SERVER_CORE}, as the benchmark does")
    probe = scenarios.body(MLP_64)
    server = servers.start(request.param, tmp_path / "mlp", tmp_path, probe, timeout_s=30)
    yield server
    server.stop()


def test_the_floor_reads_any_body_and_answers_its_fixed_json(floor_server):
    bodies = [scenarios.body(MLP_64), b"", b"x" * 300_000]  # the last in several reads
    with httpx.Client(base_url=floor_server.url) as client:
        for body in bodies:
            answer = client.post("/predict", content=body)
            assert answer.status_code == 200
            assert answer.content == floor.ANSWER
            assert answer.headers["content-type"] == "application/json"
            assert "server" not in answer.headers, "rlserve's uvicorn sends no Server header"
        assert client.get("/anything").content == floor.ANSWER


def test_the_floor_answers_pipelined_requests_in_order(floor_server):
    one = b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    port = int(floor_server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(one * 3)
        received = b""
        while received.count(floor.ANSWER) < 3:
            chunk = conn.recv(65536)
            assert chunk, f"closed after {received!r}"
            received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 3


def test_the_floor_runs_on_the_server_core_and_its_cpu_time_is_read(floor_server):
    """CPU time is read in clock ticks (10 ms): the raw floor answers 300 requests in less
    than one, so requests go in rounds of 300 until a tick shows (20 rounds at most)."""
    before = floor_server.cpu_seconds()
    with httpx.Client(base_url=floor_server.url) as client:
        for _ in range(20):
            for _ in range(300):
                client.post("/predict", content=scenarios.body(MLP_64))
            if floor_server.cpu_seconds() > before:
                break
    assert floor_server.cpu_seconds() > before
    affinity = os.sched_getaffinity(floor_server.process.pid)
    assert affinity == {cpu.SERVER_CORE}


# Which servers run, which scenarios --only picks


def test_every_deterministic_scenario_runs_the_floors_and_fastapi_before_rlserve():
    references = [servers.FLOOR.key, servers.BASELINE.key, servers.RAW_FLOOR.key]
    for scenario in scenarios.WRK:
        keys = [s.key for s in scenarios.setups(scenario, workers=2)]
        if scenario.stochastic:
            assert not set(references) & set(keys)
        else:
            assert keys[:4] == [*references, servers.SERVE.key]


def test_only_takes_names_separated_by_commas_and_repeated_in_the_documents_order():
    assert scenarios.chosen(["mlp-1,mlp-8,mlp-64"]) == ("mlp-64", "mlp-8", "mlp-1")
    assert scenarios.chosen(["actor", "mlp-1, mlp-8", "mlp-1"]) == ("mlp-8", "mlp-1", "actor")
    assert scenarios.chosen(None) == scenarios.NAMES


def test_only_names_what_is_no_scenario_and_what_would_be():
    with pytest.raises(ValueError, match=r"'mlp-2'.*'mpl-1'.*choose from mlp-64, mlp-8"):
        scenarios.chosen(["mlp-64,mlp-2", "mpl-1"])
    with pytest.raises(ValueError, match="no scenario name"):
        scenarios.chosen([","])


# Ratios


def test_ratios_divide_each_figure_by_the_references():
    run = load_run(MLP_1, servers.SERVE, 3000, 0.46, 0.82, 300)
    reference = load_run(MLP_1, servers.FLOOR, 6000, 0.21, 0.40, 100)
    found = ratios.against(run, reference)
    assert found.requests_per_s == pytest.approx(3000 / 6000)
    assert found.p50 == pytest.approx(0.46 / 0.21)
    assert found.p99 == pytest.approx(0.82 / 0.40)
    assert found.cpu_per_request == pytest.approx(300 / 100, rel=1e-3)
    assert found.p50_gap_ms == pytest.approx(0.46 - 0.21)


def test_a_reference_that_measured_nothing_gives_no_ratio():
    run = load_run(MLP_1, servers.SERVE, 3000, 0.46, 0.82, 300)
    idle = load_run(MLP_1, servers.FLOOR, 0, 0, 0, 0)
    found = ratios.against(run, idle)
    assert (found.requests_per_s, found.p50, found.p99, found.cpu_per_request) == (None,) * 4


# Targets


def cpu_results(serve_us: float, floor_us: float, *, floor_errors: int = 0) -> Results:
    return results_of(
        load_run(MLP_64, servers.FLOOR, 20000, 3.0, 4.0, floor_us, errors=floor_errors),
        load_run(MLP_64, servers.BASELINE, 3000, 21.0, 26.0, 340),
        load_run(MLP_64, servers.SERVE, 12000, 5.0, 6.0, serve_us),
    )


def test_cpu_per_request_within_one_and_a_half_times_the_floors_is_met():
    found = verdict(cpu_results(60, 40), "mlp-64: rlserve serve CPU")
    assert "≤ 1.5x the floor's" in found.target
    assert found.met is True
    assert found.measured.startswith(f"{60 / 40:.2f}x")
    assert "60 against 40 µs" in found.measured


def test_cpu_per_request_above_one_and_a_half_times_the_floors_is_missed():
    found = verdict(cpu_results(62, 40), "mlp-64: rlserve serve CPU")
    assert found.met is False
    assert found.measured.startswith(f"{62 / 40:.2f}x")


def test_the_cpu_target_is_missed_when_the_floor_had_errors():
    found = verdict(cpu_results(60, 40, floor_errors=3), "mlp-64: rlserve serve CPU")
    assert found.met is False
    assert "3 errors" in found.measured


def test_the_floor_targets_are_not_measured_without_the_floor():
    results = results_of(
        load_run(MLP_64, servers.SERVE, 12000, 5.0, 6.0, 100),
        load_run(MLP_1, servers.SERVE, 3000, 0.3, 0.5, 300),
    )
    for start in ("mlp-64: rlserve serve CPU", "mlp-1: rlserve serve p50 ≤ the floor"):
        found = verdict(results, start)
        assert (found.met, found.measured) == (None, "not run")


def p50_results(serve_ms: float, floor_ms: float) -> Results:
    return results_of(
        load_run(MLP_1, servers.FLOOR, 1 / floor_ms * 1e3, floor_ms, 0.4, 100),
        load_run(MLP_1, servers.SERVE, 1 / serve_ms * 1e3, serve_ms, 0.8, 300),
    )


def test_a_p50_exactly_75_us_above_the_floors_is_met():
    found = verdict(p50_results(0.295, 0.22), "mlp-1: rlserve serve p50 ≤ the floor")
    assert found.target.endswith("the floor's p50 + 75 µs")
    assert found.met is True
    assert found.measured == "+75 µs: 0.295 against 0.220 ms"


def test_a_p50_more_than_75_us_above_the_floors_is_missed():
    found = verdict(p50_results(0.46, 0.21), "mlp-1: rlserve serve p50 ≤ the floor")
    assert found.met is False
    assert found.measured.startswith(f"+{(0.46 - 0.21) * 1e3:,.0f} µs")


def test_the_fastapi_ratio_target_shows_both_rates():
    found = verdict(cpu_results(100, 40), "mlp-64: rlserve serve ≥ 8.0x plain FastAPI")
    assert found.met is False
    assert found.measured == f"{12000 / 3000:.2f}x: 12,000 against 3,000 requests/s"


def actor_results(steps_per_s: float) -> Results:
    results = results_of()
    for client in Client:
        steps = round(steps_per_s * SECONDS)
        actor = ActorResult(client.value, steps, SECONDS, steps_per_s, 10, 100)
        results.actor.append(ActorRun(actor, server_cpu_s=1.0))
    return results


def test_the_projects_client_needs_3000_steps_per_second_and_the_bare_one_2000():
    results = actor_results(2500)
    policy = verdict(results, "CartPole actor, policy client")
    bare = verdict(results, "CartPole actor, http client")
    assert "≥ 3,000 env steps/s" in policy.target
    assert policy.met is False
    assert "≥ 2,000 env steps/s" in bare.target
    assert bare.met is True
    assert verdict(actor_results(3000), "CartPole actor, policy client").met is True


# The document


def mlp_results() -> Results:
    return results_of(
        load_run(MLP_1, servers.FLOOR, 5000, 0.20, 0.30, 90),
        load_run(MLP_1, servers.BASELINE, 2700, 0.35, 0.80, 366),
        load_run(MLP_1, servers.SERVE, 2100, 0.46, 0.82, 461),
        load_run(MLP_1, servers.GUNICORN_1, 2000, 0.47, 1.25, 463),
        load_run(STOCHASTIC_64, servers.SERVE, 6800, 9.3, 11.8, 148),
    )


def section(document: str, heading: str) -> str:
    start = document.index(heading)
    end = document.find("\n## ", start + 1)
    return document[start : end if end >= 0 else None]


def test_the_document_divides_each_rlserve_figure_by_the_floors_and_fastapis():
    results = mlp_results()
    document = report.render(results, targets.judge(results))
    mlp = section(document, "## mlp: one observation per request")
    assert report.VERSUS_HEADING in mlp
    assert "| floor: bare ASGI on uvicorn | 1 | 5,000 | 0.20 | 0.30 | 0 | 90 |" in mlp
    expected = [
        f"{2100 / 5000:.2f}x", f"{2100 / 2700:.2f}x",
        f"{0.46 / 0.20:.2f}x", f"{0.46 / 0.35:.2f}x", f"{(0.46 - 0.20) * 1e3:+,.0f}",
        f"{0.82 / 0.30:.2f}x", f"{0.82 / 0.80:.2f}x",
        f"{461 / 90:.2f}x", f"{461 / 366:.2f}x",
    ]  # fmt: skip
    assert f"| rlserve serve (1 process) | 1 | {' | '.join(expected)} |" in mlp
    versus = mlp[mlp.index(report.VERSUS_HEADING) :]
    assert "| rlserve gunicorn (1 worker) | 1 |" in versus
    assert "plain FastAPI" not in versus.split("\n| setup")[1], "references are not rows"


def test_a_reference_that_did_not_run_shows_as_na():
    results = results_of(
        load_run(MLP_8, servers.BASELINE, 2900, 2.7, 3.7, 342),
        load_run(MLP_8, servers.SERVE, 4700, 1.7, 2.3, 214),
    )
    document = report.render(results, targets.judge(results))
    row = next(
        line
        for line in section(document, report.VERSUS_HEADING).splitlines()
        if line.startswith("| rlserve serve")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    floor_cells = [cells[i] for i in (2, 4, 6, 7, 9)]  # ÷ floor, and p50 over the floor
    assert floor_cells == ["n/a"] * 5
    assert cells[3] == f"{4700 / 2900:.2f}x"  # requests/s ÷ FastAPI
    assert cells[10] == f"{214 / 342:.2f}x"  # CPU µs/request ÷ FastAPI


def test_the_stochastic_section_has_no_table_against_references_it_cannot_have():
    results = mlp_results()
    document = report.render(results, targets.judge(results))
    stochastic = section(document, "## mlp: stochastic")
    assert report.VERSUS_HEADING not in stochastic


# A subset run into an existing document


CNN_64 = next(s for s in scenarios.WRK if s.name == "cnn-64")


def previous_document() -> str:
    """A whole run's document: mlp at 64 and cnn, one server each with its references."""
    results = results_of(
        load_run(MLP_64, servers.FLOOR, 20000, 3.0, 4.0, 40),
        load_run(MLP_64, servers.BASELINE, 3000, 21.0, 26.0, 340),
        load_run(MLP_64, servers.SERVE, 8000, 8.0, 9.7, 127),
        load_run(CNN_64, servers.BASELINE, 600, 100.0, 1160.0, 1659),
        load_run(CNN_64, servers.SERVE, 1250, 50.0, 64.0, 803),
    )
    document = report.render(results, targets.judge(results))
    return document.replace(
        "## Reading the numbers", "## GPU path (bench/gpu.sh)\n\nkept\n\n## Reading the numbers"
    )


def test_a_subset_run_replaces_its_own_sections_and_target_rows_only():
    old = previous_document()
    results = results_of(
        load_run(MLP_64, servers.FLOOR, 21000, 2.9, 3.9, 41),
        load_run(MLP_64, servers.BASELINE, 3100, 20.0, 25.0, 330),
        load_run(MLP_64, servers.SERVE, 13000, 4.9, 6.0, 99),
    )
    results.conditions = dataclasses.replace(results.conditions, when="later")
    verdicts = targets.judge(results)
    new = report.splice_subset(old, results, verdicts)
    assert new is not None
    fresh = report.render(results, verdicts)
    mlp = "## mlp: one observation per request"
    assert section(new, mlp) == section(fresh, mlp)
    for kept in ("## cnn: one image", "## GPU path (bench/gpu.sh)"):
        assert section(new, kept) == section(old, kept)
    rows = section(new, "## Targets").splitlines()
    mine = [line for line in rows if line.startswith("| mlp-64: ")]
    assert mine == [
        f"| {v.target} | {v.measured} | {v.status} |"
        for v in verdicts
        if v.target.startswith("mlp-64: ")
    ]
    old_cnn = [
        line for line in section(old, "## Targets").splitlines() if line.startswith("| cnn-64: ")
    ]
    assert old_cnn
    assert old_cnn == [line for line in rows if line.startswith("| cnn-64: ")]
    unmeasured = [line for line in section(old, "## Targets").splitlines() if "| not run |" in line]
    assert unmeasured, "what this run did not measure either keeps the old document's rows"
    assert all(line in rows for line in unmeasured if not line.startswith("| mlp-64: "))
    header = new[: new.index("## Targets")]
    # the section measured again says when; the header lists no runs, and says how to read
    # a document of several
    stamp = "*Measured on later (`--only mlp-64`; 2 s of warm-up, then 8 s measured).*"
    assert section(new, mlp).splitlines()[2] == stamp
    assert "Measured again" not in new
    assert report.ONE_RUN in old
    assert report.ONE_RUN not in header
    assert report.SEVERAL_RUNS in header


def test_a_subset_is_not_spliced_into_what_is_no_benchmarks_document():
    results = results_of(load_run(MLP_64, servers.SERVE, 13000, 4.9, 6.0, 99))
    assert report.splice_subset("# Notes\n", results, targets.judge(results)) is None


def test_a_targets_key_is_its_text_up_to_the_first_colon():
    assert report.target_key("mlp-64: rlserve serve p99 ≤ 10 ms") == "mlp-64: "
    assert report.target_key("CartPole actor, policy client: ≥ 3,000") == (
        "CartPole actor, policy client: "
    )
    whole = "gunicorn (1 worker) CPU µs/request within 10% of rlserve serve, in every scenario"
    assert report.target_key(whole) == whole
