"""k8s/optional/argo-rollouts/canary-analysis.yaml: the Argo Rollouts analyses of a policy
canary read what rlserve exports.

Every query reads series the server exports, with the labels it selects on (the scrape
target's included), and parses with promtool once Argo's ``{{args.*}}`` are filled in; the
templates' arguments cover what the queries use; and the conditions say what the gate's
verdict means: the watch fails only on a rollback verdict, the final step succeeds only on
promote, fails on rollback and is left inconclusive (a pause for a person) otherwise. That
the server sets these gauges as its gate judges, and clears them once a canary ends, is
tests/e2e/test_canary.py's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.ops import promql
from tests.ops.conftest import K8S
from tests.ops.promql import Series, metric_names
from tests.ops.test_monitoring import served

TEMPLATES = K8S / "optional" / "argo-rollouts" / "canary-analysis.yaml"
ARGS = re.compile(r"\{\{\s*args\.([\w-]+)\s*\}\}")
VERDICTS = {"promote": 1.0, "continue": 0.0, "rollback": -1.0}


def templates() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(TEMPLATES.read_text()))


def metrics() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(t, m) for t in templates() for m in t["spec"]["metrics"]]


def filled(query: str, template: dict[str, Any]) -> str:
    """The query as Argo sends it: each argument replaced by its default, or a model name."""
    defaults = {a["name"]: a.get("value", "cartpole") for a in template["spec"]["args"]}
    return ARGS.sub(lambda m: defaults[m.group(1)], query)


def known() -> dict[str, Series]:
    return {
        n: Series(s.family, s.type, s.labels | promql.TARGET_LABELS) for n, s in served().items()
    }


def test_they_are_argo_analysis_templates_outside_every_overlay() -> None:
    kinds = {(t["apiVersion"], t["kind"]) for t in templates()}
    assert kinds == {("argoproj.io/v1alpha1", "AnalysisTemplate")}
    names = [t["metadata"]["name"] for t in templates()]
    assert names == ["rlserve-canary-watch", "rlserve-canary-verdict"]


def test_every_argument_a_query_uses_is_declared() -> None:
    for template, metric in metrics():
        declared = {a["name"] for a in template["spec"]["args"]}
        prometheus = metric["provider"]["prometheus"]
        used = set(ARGS.findall(prometheus["query"] + prometheus["address"]))
        assert used <= declared, (metric["name"], used - declared)


def test_every_query_reads_exported_series_by_their_labels() -> None:
    names = known()
    for template, metric in metrics():
        query = filled(metric["provider"]["prometheus"]["query"], template)
        assert metric_names(query) <= set(names), query
        assert not promql.label_problems(query, names), promql.label_problems(query, names)
        assert metric_names(query) <= {"rlserve_canary_verdict", "rlserve_canary_return_difference"}


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    queries = [filled(m["provider"]["prometheus"]["query"], t) for t, m in metrics()]
    promql.check_exprs_parse(queries, tmp_path, "rlserve-canary-analysis")


def outcome(metric: dict[str, Any], value: float) -> str:
    """What Argo makes of one measurement: failed, successful or inconclusive (its
    conditions, read for the expressions they are: a comparison of result[0])."""
    result = [value]

    def holds(condition: str) -> bool:
        expression = (
            condition.replace("||", " or ").replace("&&", " and ").replace("isNaN", "is_nan")
        )
        return bool(
            eval(expression, {"len": len, "is_nan": _is_nan, "true": True}, {"result": result})
        )

    if "failureCondition" in metric and holds(metric["failureCondition"]):
        return "failed"
    if holds(metric["successCondition"]):
        return "successful"
    return "inconclusive"


def _is_nan(value: float) -> bool:
    return value != value


def test_the_watch_fails_only_when_the_gate_says_roll_back() -> None:
    (watch,) = [m for t, m in metrics() if t["metadata"]["name"] == "rlserve-canary-watch"]
    assert outcome(watch, VERDICTS["rollback"]) == "failed"
    assert outcome(watch, VERDICTS["continue"]) == "successful"
    assert outcome(watch, VERDICTS["promote"]) == "successful"
    assert outcome(watch, float("nan")) == "successful"  # ended: the final step decides
    assert watch["failureLimit"] == 0


def test_the_final_step_promotes_only_on_the_gates_promote() -> None:
    verdict, _ = [m for t, m in metrics() if t["metadata"]["name"] == "rlserve-canary-verdict"]
    assert outcome(verdict, VERDICTS["promote"]) == "successful"
    assert outcome(verdict, VERDICTS["rollback"]) == "failed"
    assert outcome(verdict, VERDICTS["continue"]) == "inconclusive"  # a pause for a person
    assert outcome(verdict, float("nan")) == "inconclusive"
