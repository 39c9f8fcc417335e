"""Every PromQL query of the shipped files, with where it sits (for the checks).

Read from the checked-in files, not from the generator: what an operator loads is what is
checked (the freshness test ties the two together).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from deployments.monitoring.render import ALERTS, DASHBOARD, GENERATED


def shipped_dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((GENERATED / DASHBOARD).read_text(encoding="utf-8"))
    return board


def shipped_rules() -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load((GENERATED / ALERTS).read_text(encoding="utf-8"))
    return rules


def panels_of(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, collapsed rows' nested panels included."""
    out = []
    for panel in board.get("panels", []):
        out.append(panel)
        out += panel.get("panels") or []
    return out


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) of every panel target."""
    return [
        (f"panel {p['title']!r} {t['refId']}", t["expr"])
        for p in panels_of(board)
        for t in p.get("targets") or []
    ]


def alert_queries(rule_file: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) of every rule."""
    return [(f"alert {r['alert']}", r["expr"]) for g in rule_file["groups"] for r in g["rules"]]


def shipped_queries() -> list[tuple[str, str]]:
    return dashboard_queries(shipped_dashboard()) + alert_queries(shipped_rules())
