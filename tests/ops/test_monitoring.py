"""k8s/monitoring: the policy servers' Grafana dashboard and their alerts (a PrometheusRule).

The dashboard is well formed Grafana JSON; every metric the dashboard and the rules read is
one the server exports (serve.metrics.Metrics, ops.gpu's NVML collector) with the labels
they select and group on, or one of the external metrics listed here with their source;
every expression parses with promtool, the rule group passes ``promtool check rules``, and
``promtool test rules`` runs alerts-test.yaml: the alerts fire, and stay quiet, as intended.
The fallback alert's signal is checked on a real server asked for a GPU provider it lacks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from ops.gpu import NvmlCollector
from serve.metrics import Metrics
from serve.plugins import register_metrics
from serve.status import HTTP_STATUS
from tests.e2e.server import Server
from tests.ops import grafana, promql
from tests.ops.conftest import K8S, REPO, render_path
from tests.ops.grafana import DATASOURCE
from tests.ops.promql import Series, metric_names

MONITORING = K8S / "monitoring"
DASHBOARD = MONITORING / "dashboards" / "rlserve-serving.json"
ALERTS = MONITORING / "alerts.yaml"
ALERTS_TEST = MONITORING / "alerts-test.yaml"
DOCS = REPO / "docs" / "alerts.md"
DEMO = REPO / "examples" / "model_repository"
SEVERITIES = {"critical", "warning"}
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


@dataclass(frozen=True)
class External:
    """A metric the rules read that rlserve does not export."""

    source: str
    type: str
    labels: frozenset[str]


KSM = "kube-state-metrics (>= 2.6; kube-prometheus-stack installs it)"
EXTERNAL = {
    "kube_endpoint_info": External(KSM, "gauge", frozenset({"namespace", "endpoint"})),
    "kube_endpoint_address": External(
        KSM, "gauge", frozenset({"namespace", "endpoint", "ip", "ready"})
    ),
    "kube_deployment_status_replicas": External(
        KSM, "gauge", frozenset({"namespace", "deployment"})
    ),
    "kube_deployment_status_replicas_updated": External(
        KSM, "gauge", frozenset({"namespace", "deployment"})
    ),
    "kube_pod_deletion_timestamp": External(KSM, "gauge", frozenset({"namespace", "pod", "uid"})),
}
# Labels kube-state-metrics' own scrape adds (its target's); rlserve's series get
# promql.TARGET_LABELS from the PodMonitors.
KSM_TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "service"})


class _Device(SimpleNamespace):
    pass


class StandInNvml:
    """Two GPUs as NVML (pynvml) reports them, for machines without one: enough for the
    collector to yield its families with their labels."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - NVML's own names
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Device:  # noqa: N802
        return _Device(gpu=40 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Device:  # noqa: N802
        return _Device(used=2**30, total=80 * 2**30)


@cache
def served() -> dict[str, Series]:
    """Every series name rlserve's /metrics can carry, with its labels."""
    server = Metrics(CollectorRegistry())
    register_metrics(server)  # every kind's own series, as the server registers them
    gpu = CollectorRegistry()
    gpu.register(NvmlCollector(StandInNvml()))
    labels = promql.declared_labels([server, *server.kinds.values()])
    labels.update(promql.collected_labels(gpu))
    return promql.exported([server.registry, gpu], labels)


@cache
def known() -> dict[str, Series]:
    """What an expression may read: rlserve's series with their scrape target's labels, the
    external metrics, and the series the rule group records."""
    names = {
        name: Series(s.family, s.type, s.labels | promql.TARGET_LABELS)
        for name, s in served().items()
    }
    for name, external in EXTERNAL.items():
        names[name] = Series(name, external.type, set(external.labels | KSM_TARGET_LABELS))
    for rule in rules():
        if "record" in rule:
            read = set().union(*(names[n].labels for n in metric_names(rule["expr"])))
            labels = read | promql.made_labels(rule["expr"])
            names[rule["record"]] = Series(rule["record"], "gauge", labels)
    return names


def dashboard() -> grafana.Board:
    return grafana.load(DASHBOARD)


def variable_queries() -> list[tuple[str, str]]:
    """(selector, label) of every ``label_values(selector, label)`` variable."""
    found = []
    for variable in grafana.variables(dashboard()).values():
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"]["query"])
            assert match, f"${variable['name']}: not a label_values query"
            assert variable["definition"] == variable["query"]["query"]
            found.append((match.group(1), match.group(2)))
    return found


def dashboard_exprs() -> list[str]:
    return promql.exprs_in(dashboard())


@cache
def prometheus_rule() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return loaded


def rules() -> list[dict[str, Any]]:
    return [r for group in prometheus_rule()["spec"]["groups"] for r in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def rule_exprs() -> list[str]:
    return [r["expr"] for r in rules()]


def all_exprs() -> list[str]:
    return dashboard_exprs() + rule_exprs() + [s for s, _ in variable_queries()]


# -- the dashboard's structure --------------------------------------------------------------


def test_the_dashboard_is_grafana_json_with_datasource_namespace_and_model_variables():
    grafana.check_provisioned(dashboard(), "rlserve-serving")
    found = grafana.variables(dashboard())
    for name in ("namespace", "model"):
        variable = found[name]
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        assert variable["multi"]
        assert variable["includeAll"]
        assert variable["allValue"] == ".*", "All must match every value, the empty one too"
    assert variable_queries()[-1][1] == "model"


def test_panel_ids_are_unique_and_every_graph_queries_the_variable_datasource():
    grafana.check_panels(dashboard(), min_graphs=15)


def test_panels_sit_on_the_24_column_grid_without_overlapping():
    grafana.check_grid(dashboard())


def test_it_shows_what_the_issue_asks_for():
    exprs = dashboard_exprs()
    used = set().union(*map(metric_names, exprs))
    assert {
        "rlserve_requests_total",
        "rlserve_rejections_total",
        "rlserve_request_latency_seconds_bucket",
        "rl_inference_latency_seconds_bucket",
        "rlserve_queue_wait_seconds_bucket",
        "rlserve_batch_rows_bucket",
        "rlserve_pending_rows",
        "rl_policy_version",
        "rlserve_provider_fallback",
        "rlserve_gpu_utilization_ratio",
        "rlserve_gpu_memory_used_bytes",
        "rlserve_lm_generated_tokens_total",
        "rlserve_lm_time_to_first_token_seconds_bucket",
    } <= used
    for metric in ("rlserve_request_latency_seconds", "rl_inference_latency_seconds"):
        for quantile in ("0.5", "0.99"):
            assert any(
                f"histogram_quantile({quantile}, " in e and f"{metric}_bucket" in e for e in exprs
            ), f"no p{quantile} of {metric}"
    statuses = {m for e in exprs for m in re.findall(r'status="(\d+)"', e)}
    assert {"429", "504"} <= statuses
    heatmaps = [p for p in grafana.graphs(dashboard()) if p["type"] == "heatmap"]
    assert any("rlserve_batch_rows_bucket" in t["expr"] for p in heatmaps for t in p["targets"])
    assert all(t.get("format") == "heatmap" for p in heatmaps for t in p["targets"])


def test_every_query_follows_the_namespace_and_model_variables():
    names = known()
    for expr in dashboard_exprs():
        for name, matchers in promql.SELECTOR.findall(expr):
            assert 'namespace=~"$namespace"' in matchers, f"{expr}: {name} ignores $namespace"
            if "model" in names[name].labels:
                assert 'model=~"$model"' in matchers, f"{expr}: {name} ignores $model"


# -- the metrics exist ----------------------------------------------------------------------


def test_the_server_exports_the_families_the_monitoring_reads():
    names = served()
    assert names["rlserve_provider_fallback"].labels == {"model", "version"}
    assert names["rlserve_gpu_utilization_ratio"].labels == {"gpu"}
    assert names["rl_policy_version"].labels == {"model", "pid"}
    assert names["rlserve_requests_total"].labels == {"model", "version", "status"}
    assert not set(EXTERNAL) & set(names), "an external metric that rlserve exports"


def test_every_metric_read_is_exported_or_a_listed_external_one():
    names = known()
    for expr in all_exprs():
        missing = metric_names(expr) - set(names)
        assert not missing, f"{expr}: neither exported by rlserve nor external: {sorted(missing)}"
    used = set().union(*map(metric_names, all_exprs()))
    assert set(EXTERNAL) <= used, f"listed but unused: {sorted(set(EXTERNAL) - used)}"


def test_label_matchers_and_groupings_name_labels_the_metrics_have():
    names = known()
    for expr in all_exprs():
        assert not promql.label_problems(expr, names), (expr, promql.label_problems(expr, names))


def test_variables_list_labels_their_metric_has():
    names = known()
    for selector, label in variable_queries():
        (name,) = metric_names(selector)
        assert label in names[name].labels, f"{selector}: no label {label}"


def test_rates_are_of_counters_and_quantiles_of_buckets_grouped_by_le():
    names = known()
    for expr in all_exprs():
        assert not promql.rate_problems(expr, names), (expr, promql.rate_problems(expr, names))


# -- PromQL parses, the rules load and do what they say -------------------------------------


def test_every_dashboard_expression_parses_with_promtool(tmp_path: Path):
    exprs = dashboard_exprs() + [s for s, _ in variable_queries()]
    promql.check_exprs_parse(exprs, tmp_path, "rlserve-serving-dashboard")


def rule_file(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a Prometheus rule file, beside a copy of the tests."""
    path = tmp_path / "alerts.rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rule()["spec"]))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    return path


def test_the_rule_group_passes_promtool_check_rules(tmp_path: Path):
    done = promql.run_promtool("check", "rules", str(rule_file(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_the_alerts_fire_and_stay_quiet_as_promtools_unit_tests_expect(tmp_path: Path):
    rule_file(tmp_path)
    done = promql.run_promtool("test", "rules", str(tmp_path / ALERTS_TEST.name))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_see_every_alert_fire_and_stay_quiet():
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == ["alerts.rules.yaml"]
    cases = [case for test in tests["tests"] for case in test["alert_rule_test"]]
    tested = {case["alertname"] for case in cases}
    assert tested <= set(alerts()), f"tests of no such alert: {tested - set(alerts())}"
    for name in alerts():
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: never expected to fire"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: never expected quiet"


# -- the PrometheusRule ---------------------------------------------------------------------


def test_the_prometheus_rule_has_the_operators_shape():
    rule = prometheus_rule()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] == "rlserve-alerts"
    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    for group in groups:
        assert set(group) <= {"name", "interval", "rules"}, group["name"]
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r), r
            assert isinstance(r["expr"], str)
            assert r["expr"].strip()
            if "record" in r:
                assert set(r) <= {"record", "expr", "labels"}, r["record"]
                assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z_]+", r["record"]), r["record"]
                continue
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
            assert re.fullmatch(r"Rlserve[A-Za-z0-9]+", r["alert"])
            assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
            assert r["labels"]["severity"] in SEVERITIES, r["alert"]
            assert set(r["annotations"]) == {"summary", "description", "runbook"}, r["alert"]
            assert r["annotations"]["runbook"] == f"docs/alerts.md#{r['alert'].lower()}"


def test_it_alerts_on_what_the_issue_names():
    assert set(alerts()) == {
        "RlserveLatencyP99OverSLO",
        "RlserveErrorRatioHigh",
        "RlservePolicyVersionsDisagree",
        "RlserveQueueFullSustained",
        "RlserveGpuProviderFallback",
        "RlserveNoReadyPods",
    }
    assert alerts()["RlservePolicyVersionsDisagree"]["for"] == "1m"
    assert "rlserve_request_latency_seconds_bucket" in alerts()["RlserveLatencyP99OverSLO"]["expr"]
    assert "rlserve_provider_fallback" in alerts()["RlserveGpuProviderFallback"]["expr"]


def gate(flag: str) -> float:
    """A default of the load tests' pass/fail gates (loadtests/_options.py)."""
    source = (REPO / "loadtests" / "_options.py").read_text()
    match = re.search(rf'"{flag}", type=float, default=([\d.]+)', source)
    assert match, f"{flag} not found in loadtests/_options.py"
    return float(match.group(1))


def test_the_slo_thresholds_are_the_load_tests_gates_and_the_docs_numbers():
    latency = alerts()["RlserveLatencyP99OverSLO"]
    p99_s = gate("--p99-ms") / 1000
    assert re.search(rf"\)\s*> {p99_s:g}\n", latency["expr"]), latency["expr"]
    assert f"{gate('--p99-ms'):g} ms" in latency["annotations"]["summary"]
    errors = alerts()["RlserveErrorRatioHigh"]
    assert errors["expr"].rstrip().endswith(f"> {gate('--max-fail-ratio'):g}")
    assert f"{gate('--max-fail-ratio') * 100:g} %" in errors["annotations"]["description"]
    docs = DOCS.read_text()
    assert f"{gate('--p99-ms'):g} ms" in docs
    assert f"{gate('--max-fail-ratio') * 100:g} %" in docs


def test_the_error_ratio_counts_5xx_and_429_as_failures_and_no_other_answer():
    (statuses,) = re.findall(r'status=~"([^"]+)"', alerts()["RlserveErrorRatioHigh"]["expr"])
    failures = re.compile(statuses)  # Prometheus anchors its regexes: fullmatch
    for code, status in HTTP_STATUS.items():
        failed = status >= 500 or status == 429
        assert bool(failures.fullmatch(str(status))) == failed, (code, status)
    assert not failures.fullmatch("200")


def test_the_rule_carries_the_release_label_the_pod_monitors_carry():
    """kube-prometheus-stack selects PodMonitors and PrometheusRules by the same label."""
    monitor = yaml.safe_load((K8S / "base" / "podmonitor.yaml").read_text())
    release = monitor["metadata"]["labels"]["release"]
    assert prometheus_rule()["metadata"]["labels"]["release"] == release


# -- the kustomization ----------------------------------------------------------------------


def test_the_kustomization_renders_the_dashboard_config_map_and_the_rule():
    rendered = {d["kind"]: d for d in render_path(MONITORING)}
    assert set(rendered) == {"ConfigMap", "PrometheusRule"}
    config_map = rendered["ConfigMap"]
    assert config_map["metadata"]["name"] == "rlserve-serving-dashboard", "no hash suffix"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    kubernetes_validate.validate(config_map, "1.33", strict=True)
    rule = rendered["PrometheusRule"]
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["spec"] == prometheus_rule()["spec"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


# -- the docs -------------------------------------------------------------------------------


def test_the_docs_have_a_runbook_section_per_alert_and_the_readme_links_them():
    headings = re.findall(r"^### (\S+)$", DOCS.read_text(), flags=re.MULTILINE)
    assert sorted(headings) == sorted(alerts()), "one '### AlertName' section per alert"
    text = DOCS.read_text()
    for name, external in EXTERNAL.items():
        assert name in text, f"{name} ({external.source}) is not in the docs"
    assert "release: kube-prometheus-stack" in text
    assert "k8s/monitoring" in text
    assert "docs/alerts.md" in (REPO / "README.md").read_text()


# -- the fallback alert's signal on a real server -------------------------------------------


def fallback_of(server: Server) -> tuple[float, str]:
    """rlserve_provider_fallback of cartpole v1 and the provider rlserve_model_info names."""
    server.wait_until(lambda c: c.get("/ready").json()["phase"] == "ready", 60, "loaded")
    with server.client() as client:
        text = client.get("/metrics").text
    values = re.findall(
        r'^rlserve_provider_fallback\{model="cartpole",version="1"\} (\S+)$', text, re.M
    )
    providers = re.findall(r'^rlserve_model_info\{[^}]*provider="(\w+)"', text, re.M)
    assert len(values) == 1, text
    assert len(providers) == 1, text
    return float(values[0]), providers[0]


@pytest.mark.parametrize(
    ("providers", "expected"),
    [('["CUDAExecutionProvider", "CPUExecutionProvider"]', 1.0), ('["CPUExecutionProvider"]', 0.0)],
)
def test_a_server_missing_a_requested_gpu_provider_reports_the_fallback(
    tmp_path: Path, providers: str, expected: float
):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime has the CUDA provider here: nothing falls back")
    repository = tmp_path / "repository"
    shutil.copytree(DEMO, repository)
    server = Server.rlserve(repository, env={"RLSERVE_PROVIDERS": providers}, log=tmp_path / "log")
    try:
        fallback, provider = fallback_of(server)
        with server.client() as client:
            ready = client.get("/ready")
    finally:
        server.stop()
    assert (fallback, provider) == (expected, "CPUExecutionProvider")
    assert (ready.status_code == 503) == bool(expected), ready.text  # unready on fallback


RETIRED = """
import sys
from pathlib import Path
from serve import config
from serve.control import repository
from serve.metrics import Metrics
settings = config.load(providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
loaded = repository.load_file("m", 3, Path(sys.argv[1]), settings, settings.for_model({}))
assert loaded.provider_report.missing == ("CUDAExecutionProvider",)  # a CPU onnxruntime
metrics = Metrics()
metrics.version_loaded("m", loaded)
print(metrics.exposition()[0].decode())
print("--- unloaded ---")
metrics.version_unloaded("m", 3, loaded.provider, loaded.sha256)
print(metrics.exposition()[0].decode())
"""


def test_under_gunicorn_a_retired_versions_fallback_reads_0_not_1(tmp_path: Path):
    """prometheus_client cannot remove a series in multiprocess mode (it stays in the
    worker's file): an unloaded version must not keep the alert firing."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RETIRED, str(DEMO / "cartpole/1/model.onnx")],
        capture_output=True, text=True, check=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip
    loaded, retired = done.stdout.split("--- unloaded ---")
    series = re.compile(r'^rlserve_provider_fallback\{model="m",version="3"\} (\S+)$', re.M)
    assert series.findall(loaded) == ["1.0"]
    assert series.findall(retired) == ["0.0"]
