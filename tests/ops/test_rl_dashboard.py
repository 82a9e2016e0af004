"""k8s/rl/dashboards: the RL loop's Grafana dashboard is well formed, every metric its PromQL
names is one the server (serve.metrics.Metrics) or the trainer (loop.controller.LoopMetrics)
registers, with the labels it selects on, and the expressions parse (with promtool, where
it is installed: Debian's ``prometheus`` package; the parse test skips without it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from loop.collect import Counters
from loop.controller import LoopMetrics
from loop.worker_metrics import WorkerCollector
from serve.metrics import Metrics
from tests.ops.conftest import K8S, REPO, render_path

DASHBOARDS = K8S / "rl" / "dashboards"
DASHBOARD = DASHBOARDS / "rl-loop.json"
REFERENCE = "sum(rate(rl_inference_latency_seconds_bucket[5m])) by (le)"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Words of PromQL the expressions may use that are not metric names.
FUNCTIONS = {
    "abs", "avg", "avg_over_time", "ceil", "changes", "clamp_max", "clamp_min", "count",
    "delta", "deriv", "histogram_quantile", "idelta", "increase", "irate", "label_replace",
    "max", "max_over_time", "min", "min_over_time", "quantile", "rate", "resets", "round",
    "scalar", "sum", "time", "topk", "vector",
}  # fmt: skip
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
WORD = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)")
RATED = re.compile(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)")


@dataclass
class Series:
    """A series name as Prometheus stores it (``x_total``, ``x_bucket``, ``x``)."""

    family: str
    type: str  # counter, gauge, histogram
    labels: set[str] = field(default_factory=set)


def wrappers(owner: object) -> Iterator[MetricWrapperBase]:
    return (v for v in vars(owner).values() if isinstance(v, MetricWrapperBase))


@cache
def exported() -> dict[str, Series]:
    """Every series name the server and the trainer export, from their registries'
    families, with the label names their metrics declare."""
    server, trainer = Metrics(CollectorRegistry()), LoopMetrics(CollectorRegistry())
    labels: dict[str, set[str]] = {}
    for metric in [*wrappers(server), *wrappers(trainer)]:
        labels.setdefault(metric._name, set()).update(metric._labelnames)
    names: dict[str, Series] = {}
    worker = CollectorRegistry()
    worker.register(WorkerCollector(Counters(recent_returns=deque([1.0])), "w"))
    for family in worker.collect():  # collected families: their samples carry the labels
        labels.setdefault(family.name, set()).update(
            k for sample in family.samples for k in sample.labels
        )
    for registry in (server.registry, trainer.registry, worker):
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count"),
            }[family.type]
            for suffix in suffixes:
                series = names.setdefault(family.name + suffix, Series(family.name, family.type))
                assert series.type == family.type, f"{family.name}: two types"
                series.labels |= labels[family.name] | ({"le"} if suffix == "_bucket" else set())
    return names


@cache
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in dashboard()["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def graphs() -> list[dict[str, Any]]:
    return [p for p in panels() if p["type"] != "row"]


def expressions() -> list[str]:
    """Every PromQL expression in the dashboard: targets, annotations, variables."""
    return exprs_in(dashboard())


def exprs_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in exprs_in(v)]
    if isinstance(node, list):
        return [e for v in node for e in exprs_in(v)]
    return []


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: its words less PromQL's own, once strings,
    label matchers, ranges and grouping clauses are taken out."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = GROUPING.sub("", bare)
    words = set(WORD.findall(bare))
    return {w for w in words if w not in FUNCTIONS | KEYWORDS}


# -- structure ------------------------------------------------------------------------------


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_variable():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] == "rlserve-rl-loop"
    assert board["title"]
    assert board["id"] is None, "a provisioned dashboard carries no database id"
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert variable["name"] == "datasource"
    assert variable["query"] == "prometheus"


def test_panel_ids_are_unique_and_every_graph_queries_the_variable_datasource():
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    assert len(graphs()) >= 10
    for panel in graphs():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no targets"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_panels_sit_on_the_24_column_grid_without_overlapping():
    boxes = []
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] < pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((panel["title"], pos))
    for i, (title, a) in enumerate(boxes):
        for other, b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, f"{title!r} overlaps {other!r}"


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
    assert names["rl_policy_version"].labels == {"model"}, "the server's; the trainer's: none"
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
        for name, matchers in SELECTOR.findall(expr):
            for label in MATCHER.findall(matchers):
                assert label in names[name].labels, f"{expr}: {name} has no label {label}"
        read = set().union(*(names[n].labels for n in metric_names(expr)))
        for clause, labels in GROUPING.findall(expr):
            for label in filter(None, (s.strip() for s in labels.split(","))):
                assert label in read, f"{expr}: {clause} ({label}) on no metric's label"


def test_rates_are_of_counters_and_quantiles_of_buckets_by_le():
    names = exported()
    for expr in expressions():
        for name in RATED.findall(expr):
            series = names[name]
            assert series.type in ("counter", "histogram"), f"{expr}: rate of a {series.type}"
        if "_bucket" in expr:
            assert "by (le)" in expr, f"{expr}: buckets summed without keeping le"
        if "histogram_quantile" in expr:
            assert "_bucket" in expr, expr


# -- PromQL parses --------------------------------------------------------------------------


def test_every_expression_parses_with_promtool(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    rules = {
        "groups": [
            {
                "name": "rl-loop-dashboard",
                "rules": [
                    {"record": f"rlserve_dashboard:expr_{i}", "expr": expr}
                    for i, expr in enumerate(expressions())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(expressions())} rules found" in done.stdout


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
