"""Grafana dashboards of the repository (``k8s/**/dashboards/*.json``) as the ops tests read
them, and the checks every one of them passes: provisioned as a file, every graph querying
the ``${datasource}`` variable, panels on the 24-column grid without overlapping."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

Board = dict[str, Any]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@cache
def load(path: Path) -> Board:
    loaded: Board = json.loads(path.read_text())
    return loaded


def panels(board: Board) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def graphs(board: Board) -> list[dict[str, Any]]:
    return [p for p in panels(board) if p["type"] != "row"]


def variables(board: Board) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def check_provisioned(board: Board, uid: str) -> None:
    """A dashboard provisioned from a file: a schema Grafana 10-12 reads, a fixed uid, a
    title, no database id, and a Prometheus datasource variable named ``datasource``."""
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] == uid
    assert board["title"]
    assert board["id"] is None, "a provisioned dashboard carries no database id"
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert variable["name"] == "datasource"
    assert variable["query"] == "prometheus"


def check_panels(board: Board, min_graphs: int) -> None:
    """Unique integer ids; every graph titled, on the datasource variable, with targets of
    distinct refIds each holding an expression."""
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) for i in ids)
    assert len(graphs(board)) >= min_graphs
    for panel in graphs(board):
        assert panel["title"], panel["id"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no targets"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert isinstance(target["expr"], str), panel["title"]
            assert target["expr"].strip(), panel["title"]


def check_grid(board: Board) -> None:
    """The top-level panels sit on the 24-column grid, none overlapping another."""
    boxes = []
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] < pos["x"] + pos["w"] <= 24, panel["title"]
        assert pos["h"] > 0, panel["title"]
        assert pos["y"] >= 0, panel["title"]
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
