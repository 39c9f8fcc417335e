"""Which metric names a PromQL expression reads, and which ones a gateway exposes.

A dashboard or an alert that names a metric the gateway does not expose shows "No data"
or never fires, silently. These helpers let a test compare the two: ``metric_names``
walks the expression's syntax tree (``promql_parser``, the Prometheus grammar), never a
regex over the text; ``exposed_names`` reads a ``/metrics`` page, the ``# TYPE`` lines
included, because a labelled metric that has seen no event yet exposes no sample but is
still there; ``family_names`` does the same from the registry's own families.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import promql_parser

#: Grafana's built-in interval variables, and what stands for them when an expression is
#: parsed outside Grafana (a Prometheus range needs a literal duration).
GRAFANA_INTERVALS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}

#: The sample suffixes each family type exposes (Prometheus' text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def grafana_to_promql(expr: str) -> str:
    """The expression with Grafana's interval variables replaced by durations (template
    variables inside label values, ``"$model"``, are plain strings to the parser)."""
    for var, duration in GRAFANA_INTERVALS.items():
        expr = expr.replace(var, duration)
    return expr


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` selects: vector and matrix selectors (inside functions,
    aggregations, subqueries, binary and unary operations) by name or by an exact
    ``__name__`` matcher. A ``__name__`` regex is returned as ``~<regex>``. Raises
    ``ValueError`` when ``expr`` is not PromQL."""
    found: set[str] = set()
    _walk(promql_parser.parse(grafana_to_promql(expr)), found)
    return found


def _walk(node: Any, found: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            found.add(node.name)
        matchers = [*node.matchers.matchers, *(m for g in node.matchers.or_matchers for m in g)]
        for m in matchers:
            if m.name == "__name__":
                exact = m.op == promql_parser.MatchOp.Equal
                found.add(m.value if exact else f"~{m.value}")
    elif isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, found)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, found)
    elif isinstance(node, promql_parser.AggregateExpr):
        _walk(node.expr, found)
        if isinstance(node.param, promql_parser.Expr):  # topk(scalar(x), ...)
            _walk(node.param, found)
    elif isinstance(node, promql_parser.BinaryExpr):
        _walk(node.lhs, found)
        _walk(node.rhs, found)
    elif isinstance(
        node, promql_parser.UnaryExpr | promql_parser.ParenExpr | promql_parser.SubqueryExpr
    ):
        _walk(node.expr, found)
    elif not isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral):
        # a node this walk does not know could hide a selector: fail, never skip it
        raise TypeError(f"unknown PromQL node {type(node).__name__}: {node}")


_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)")
_SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


def exposed_names(exposition: str) -> set[str]:
    """The sample names a ``/metrics`` page exposes: its sample lines' names, and for every
    ``# TYPE`` line the names its type's samples take, present or not yet."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if m := _TYPE_LINE.match(line):
            name, kind = m.groups()
            if kind == "counter" and name.endswith("_total"):
                base = name.removesuffix("_total")
                names.update(base + s for s in SUFFIXES["counter"])
            else:
                names.update(name + s for s in SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#") and (m := _SAMPLE_NAME.match(line)):
            names.add(m.group(1))
    return names


def family_names(families: Iterable[Any]) -> set[str]:
    """The sample names a registry's families expose (``registry.collect()``: each with
    ``name``, ``type`` and ``samples``), whether they have samples yet or not."""
    names: set[str] = set()
    for family in families:
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def unknown_names(used: Iterable[str], exposed: set[str]) -> set[str]:
    """The names in ``used`` that ``exposed`` lacks (a ``~regex`` matching none of them)."""
    missing = set()
    for name in used:
        if name.startswith("~"):
            pattern = re.compile(name[1:])
            if not any(pattern.fullmatch(e) for e in exposed):
                missing.add(name)
        elif name not in exposed:
            missing.add(name)
    return missing
