"""Checking the PromQL in our dashboards and alert rules against what the processes export.

Shared by the ops tests of the RL-loop dashboard (test_rl_dashboard.py) and of the serving
dashboard and alerts (test_monitoring.py): the series names a set of registries exports (with
the label names their metrics declare), the metric names and label matchers an expression
uses, the checks that tie the two together, and promtool's parse (Debian's ``prometheus``
package; the tests that need it skip without it).

The word-level reading of PromQL here is deliberately simple (no parser of our own): it is
enough for the expressions we write, and promtool checks that they really parse.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

# Words of PromQL the expressions may use that are not metric names.
FUNCTIONS = {
    "abs", "absent", "avg", "avg_over_time", "ceil", "changes", "clamp_max", "clamp_min",
    "count", "count_values", "delta", "deriv", "group", "histogram_quantile", "idelta",
    "increase", "irate", "label_replace", "max", "max_over_time", "min", "min_over_time",
    "quantile", "rate", "resets", "round", "scalar", "sum", "time", "topk", "vector",
}  # fmt: skip
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right",
}  # fmt: skip
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
WORD = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)")
RATED = re.compile(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)")
QUANTILE = re.compile(r"\bhistogram_quantile\(")
# Labels Prometheus adds to every series it scrapes through a PodMonitor (the target's).
TARGET_LABELS = frozenset({"namespace", "pod", "container", "endpoint", "job", "instance"})
# Grafana's own variables, replaced by a value promtool accepts before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


@dataclass
class Series:
    """A series name as Prometheus stores it (``x_total``, ``x_bucket``, ``x``)."""

    family: str
    type: str  # counter, gauge, histogram
    labels: set[str] = field(default_factory=set)


def wrappers(owner: object) -> Iterator[MetricWrapperBase]:
    """The metrics an object (``serve.metrics.Metrics``, ...) holds as attributes."""
    return (v for v in vars(owner).values() if isinstance(v, MetricWrapperBase))


def declared_labels(owners: Iterable[object]) -> dict[str, set[str]]:
    """The label names each metric family of these objects declares. A gauge whose
    multiprocess mode keeps every worker's value (``all``, ``liveall``) also carries the
    ``pid`` label that prometheus_client adds under gunicorn."""
    labels: dict[str, set[str]] = {}
    for owner in owners:
        for metric in wrappers(owner):
            found = labels.setdefault(metric._name, set())
            found.update(metric._labelnames)
            if getattr(metric, "_multiprocess_mode", None) in ("all", "liveall"):
                found.add("pid")
    return labels


def collected_labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    """The label names of a registry's collected samples, by family: for custom collectors,
    whose families declare no label names of their own."""
    labels: dict[str, set[str]] = {}
    for family in registry.collect():
        labels.setdefault(family.name, set()).update(
            k for sample in family.samples for k in sample.labels
        )
    return labels


def exported(
    registries: Iterable[CollectorRegistry], labels: Mapping[str, set[str]]
) -> dict[str, Series]:
    """Every series name the registries' families give, with the label names in
    ``labels`` (by family; ``le`` on buckets)."""
    names: dict[str, Series] = {}
    for registry in registries:
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"),
            }[family.type]
            for suffix in suffixes:
                series = names.setdefault(family.name + suffix, Series(family.name, family.type))
                assert series.type == family.type, f"{family.name}: two types"
                series.labels |= labels[family.name] | ({"le"} if suffix == "_bucket" else set())
    return names


# -- reading expressions ---------------------------------------------------------------------


def exprs_in(node: Any) -> list[str]:
    """Every ``expr`` string in a JSON/YAML tree (dashboard targets, annotations, rules)."""
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


def made_labels(expr: str) -> set[str]:
    """Labels an expression creates itself: ``label_replace(v, "dst", ...)``'s ``dst``."""
    made = set()
    for start in (m.end() for m in re.finditer(r"\blabel_replace\(", expr)):
        depth, i = 0, start
        while i < len(expr) and not (expr[i] == "," and depth == 0):
            depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(expr[i], 0)
            i += 1
        found = re.match(r'\s*,\s*"(\w+)"', expr[i:])
        assert found, f"{expr}: label_replace without a destination label"
        made.add(found.group(1))
    return made


def label_problems(
    expr: str, names: Mapping[str, Series], extra: frozenset[str] = frozenset()
) -> list[str]:
    """Label matchers that name a label their metric lacks, and grouping clauses over a
    label none of the expression's metrics has. ``extra``: labels every series has besides
    its own (the scrape target's); labels made by ``label_replace`` count for grouping."""
    problems = []
    for name, matchers in SELECTOR.findall(expr):
        for label in MATCHER.findall(matchers):
            if label not in names[name].labels | extra:
                problems.append(f"{name} has no label {label}")
    read = set().union(extra, made_labels(expr), *(names[n].labels for n in metric_names(expr)))
    for clause, labels in GROUPING.findall(expr):
        for label in filter(None, (s.strip() for s in labels.split(","))):
            if label not in read:
                problems.append(f"{clause} ({label}) on no metric's label")
    return problems


def rate_problems(expr: str, names: Mapping[str, Series]) -> list[str]:
    """Rates of gauges, and quantiles of something else than buckets grouped by ``le``."""
    problems = []
    for name in RATED.findall(expr):
        if names[name].type not in ("counter", "histogram"):
            problems.append(f"rate of {name}, a {names[name].type}")
    for match in QUANTILE.finditer(expr):
        argument = expr[match.end() :]
        if "_bucket" not in argument:
            problems.append("histogram_quantile of no buckets")
        grouped = [labels for clause, labels in GROUPING.findall(argument) if clause == "by"]
        if not any("le" in (s.strip() for s in labels.split(",")) for labels in grouped):
            problems.append("histogram_quantile over buckets summed without keeping le")
    return problems


def parseable(expr: str) -> str:
    """The expression with Grafana's own variables replaced by values PromQL accepts
    (dashboard variables such as ``$model`` sit inside strings and parse as they are)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


# -- promtool -------------------------------------------------------------------------------


def promtool() -> str:
    """promtool's path; skips the test where it is not installed (``make test`` installs
    it: Debian's ``prometheus`` package)."""
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, check=False, timeout=60
    )


def check_exprs_parse(exprs: list[str], tmp_path: Path, group: str) -> None:
    """Every expression parses: promtool checks them as the recording rules of one group."""
    rules = {
        "groups": [
            {
                "name": group,
                "rules": [
                    {"record": f"rlserve_check:expr_{i}", "expr": parseable(expr)}
                    for i, expr in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / f"{group}.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = run_promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout
