"""k8s/rl/dashboards: the RL loop's Grafana dashboard is well formed, every metric its PromQL
names is one the server (serve.metrics.Metrics) or the trainer (loop.controller.LoopMetrics)
registers, with the labels it selects on, and the expressions parse (with promtool, where
it is installed: Debian's ``prometheus`` package; the parse test skips without it)."""

from __future__ import annotations

import re
from collections import deque
from functools import cache
from pathlib import Path

import kubernetes_validate
from prometheus_client import CollectorRegistry

from loop.collect import Counters
from loop.controller import LoopMetrics
from loop.worker_metrics import WorkerCollector
from serve.metrics import Metrics
from tests.ops import grafana, promql
from tests.ops.conftest import K8S, REPO, render_path
from tests.ops.promql import Series, metric_names

DASHBOARDS = K8S / "rl" / "dashboards"
DASHBOARD = DASHBOARDS / "rl-loop.json"
REFERENCE = "sum(rate(rl_inference_latency_seconds_bucket[5m])) by (le)"


@cache
def exported() -> dict[str, Series]:
    """Every series name the server and the trainer export, from their registries'
    families, with the label names their metrics declare (the workers' collector: the
    labels of its samples)."""
    server, trainer = Metrics(CollectorRegistry()), LoopMetrics(CollectorRegistry())
    worker = CollectorRegistry()
    worker.register(WorkerCollector(Counters(recent_returns=deque([1.0])), "w"))
    labels = promql.declared_labels([server, trainer])
    for name, found in promql.collected_labels(worker).items():
        labels.setdefault(name, set()).update(found)
    return promql.exported([server.registry, trainer.registry, worker], labels)


def dashboard() -> grafana.Board:
    return grafana.load(DASHBOARD)


def expressions() -> list[str]:
    """Every PromQL expression in the dashboard: targets, annotations, variables."""
    return promql.exprs_in(dashboard())


# -- structure ------------------------------------------------------------------------------


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_variable():
    grafana.check_provisioned(dashboard(), "rlserve-rl-loop")


def test_panel_ids_are_unique_and_every_graph_queries_the_variable_datasource():
    grafana.check_panels(dashboard(), min_graphs=10)


def test_panels_sit_on_the_24_column_grid_without_overlapping():
    grafana.check_grid(dashboard())


def test_it_shows_the_reference_guides_query_and_the_loops_signals():
    exprs = expressions()
    for quantile in ("0.5", "0.99"):
        assert f"histogram_quantile({quantile}, {REFERENCE})" in exprs
    used = set().union(*map(metric_names, exprs))
    assert {
        "rl_inference_latency_seconds_bucket",
        "rl_policy_version",
        "rl_experience_staleness_bucket",
        "rl_experience_consumed_total",
        "rl_experience_dropped_total",
        "rl_experience_routed_total",
        "rl_experience_duplicates_total",
        "rl_buffer_latency_seconds_bucket",
        "rl_buffer_pending",
        "rl_trainer_busy_ratio",
        "rlserve_requests_total",
    } <= used
    statuses = {m for e in exprs for m in re.findall(r'status="(\d+)"', e)}
    assert {"429", "504"} <= statuses


# -- the metrics exist ----------------------------------------------------------------------


def test_the_registries_export_what_the_loop_documents():
    names = exported()
    # The server's (pid: one series per gunicorn worker); the trainer's has none.
    assert names["rl_policy_version"].labels == {"model", "pid"}
    assert names["rl_experience_staleness_bucket"].type == "histogram"
    assert names["rlserve_requests_total"].labels == {"model", "version", "status"}


def test_every_metric_the_dashboard_reads_is_exported():
    names = exported()
    for expr in expressions():
        missing = metric_names(expr) - set(names)
        assert not missing, f"{expr}: not exported by server or trainer: {sorted(missing)}"


def test_env_steps_per_second_come_from_the_workers_own_counter():
    used = set().union(*map(metric_names, expressions()))
    assert {"rl_env_steps_total", "rl_experience_published_total"} <= used


def test_label_matchers_and_groupings_name_labels_the_metrics_have():
    names = exported()
    for expr in expressions():
        assert not promql.label_problems(expr, names), expr


def test_rates_are_of_counters_and_quantiles_of_buckets_by_le():
    names = exported()
    for expr in expressions():
        assert not promql.rate_problems(expr, names), expr
        if "_bucket" in expr:
            assert "by (le)" in expr, f"{expr}: buckets summed without keeping le"


# -- PromQL parses --------------------------------------------------------------------------


def test_every_expression_parses_with_promtool(tmp_path: Path):
    promql.check_exprs_parse(expressions(), tmp_path, "rl-loop-dashboard")


# -- the ConfigMap --------------------------------------------------------------------------


def test_the_kustomization_makes_a_sidecar_config_map_of_the_json():
    (config_map,) = render_path(DASHBOARDS)
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["name"] == "rlserve-rl-loop-dashboard", "no hash suffix"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"rl-loop.json": DASHBOARD.read_text()}
    kubernetes_validate.validate(config_map, "1.33", strict=True)


def test_the_docs_give_the_reference_query_and_how_to_load_the_dashboard():
    text = (REPO / "docs" / "rl-loop.md").read_text()
    section = text.split("## Metrics and dashboard", 1)[1].split("\n## ", 1)[0]
    assert REFERENCE in section
    assert "k8s/rl/dashboards" in section
    for name in exported():
        family = exported()[name].family
        if family.startswith("rl_"):
            assert family in section, f"{family} is not in the metric table"
