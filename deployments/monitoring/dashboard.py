"""rmgate's Grafana dashboard, built with the Grafana Foundation SDK.

Built from code so that each query sits next to the panel it feeds and a test can parse
every one of them (``tests/unit/test_monitoring.py``): a renamed metric fails the test
instead of leaving an empty panel. Every metric is per ingress replica, so queries sum
over replicas (Prometheus' ``instance``) unless the panel is about one replica's state.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

UID = "rmgate"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Every panel's model filter (``$model``: the template variable; All is ``.*``).
M = 'model=~"$model"'
RATE = "$__rate_interval"
#: Panel width (of Grafana's 24 columns) and height.
WIDTH, HEIGHT = 8, 8


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )


def graph(
    title: str,
    description: str,
    unit: str,
    *targets: tuple[str, str],
    width: int = WIDTH,
) -> timeseries.Panel:
    """A time series panel of ``targets`` (expression, legend), one query each."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(HEIGHT)
        .span(width)
        .min(0)
        .legend(
            gc.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    for n, (expr, legend) in enumerate(targets):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + n)))
    return panel


def quantiles(
    metric: str, by: str, where: str = M, qs: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> list[tuple[str, str]]:
    """(expression, legend) of each quantile of histogram ``metric`` by ``by``."""
    legend = " ".join("{{%s}}" % label.strip() for label in by.split(","))
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{where}}}[{RATE}])))",
            f"p{round(q * 100)} {legend}",
        )
        for q in qs
    ]


def requests_row() -> list[Any]:
    by = "sum by (endpoint, model)"
    return [
        gd.Row("Requests"),
        graph(
            "Requests",
            "HTTP requests answered per second, by endpoint and model.",
            "reqps",
            (f"{by} (rate(rmgate_requests_total{{{M}}}[{RATE}]))", "{{endpoint}} {{model}}"),
        ),
        graph(
            "5xx answers",
            "Gateway and engine errors per second (502 engine, 503 overload or slot "
            "unavailable, 504 deadline), by endpoint, model and status.",
            "reqps",
            (
                "sum by (endpoint, model, status) "
                f'(rate(rmgate_requests_total{{{M}, status=~"5.."}}[{RATE}]))',
                "{{status}} {{endpoint}} {{model}}",
            ),
        ),
        graph(
            "4xx answers",
            "Requests refused per second (400/422: the request; 401: auth; 404: model or "
            "receipt; 499: the client left), by endpoint, model and status.",
            "reqps",
            (
                "sum by (endpoint, model, status) "
                f'(rate(rmgate_requests_total{{{M}, status=~"4.."}}[{RATE}]))',
                "{{status}} {{endpoint}} {{model}}",
            ),
        ),
        graph(
            "Gateway latency",
            "Percentiles of each HTTP request's time in the gateway, by endpoint.",
            "s",
            *quantiles("rmgate_request_seconds", "endpoint"),
            width=12,
        ),
        graph(
            "Gateway latency by model",
            "The 99th percentile by model.",
            "s",
            *quantiles("rmgate_request_seconds", "model", qs=(0.99,)),
            width=12,
        ),
    ]


def queues_row() -> list[Any]:
    return [
        gd.Row("Queues"),
        graph(
            "Queue depth",
            "Requests waiting for a place in each slot's gate (summed over ingress replicas).",
            "short",
            (f"sum by (model, slot) (rmgate_slot_queued{{{M}}})", "{{model}}-{{slot}}"),
        ),
        graph(
            "Queue waiting time",
            "Time engine requests waited for a place in their slot's gate or class queue, "
            "by numerics class (0 when a place was free).",
            "s",
            *quantiles("rmgate_queue_wait_seconds", "model, numerics_class", qs=(0.5, 0.99)),
        ),
        graph(
            "Queue full refusals",
            "Engine requests refused at once per second (503 queue_full): the waiting "
            "room was full.",
            "reqps",
            (
                f"sum by (model, numerics_class) (rate(rmgate_queue_full_total{{{M}}}[{RATE}]))",
                "{{model}} {{numerics_class}}",
            ),
        ),
    ]


def slots_row() -> list[Any]:
    return [
        gd.Row("Slots"),
        graph(
            "In flight",
            "Engine requests in each slot's engine (summed over ingress replicas).",
            "short",
            (f"sum by (model, slot) (rmgate_slot_inflight{{{M}}})", "{{model}}-{{slot}}"),
        ),
        graph(
            "Unavailable retries",
            "Retries per second while a slot's engine was unreachable (waiting for Serve "
            "to restart it).",
            "reqps",
            (
                f"sum by (model, slot) (rate(rmgate_slot_unavailable_total{{{M}}}[{RATE}]))",
                "{{model}}-{{slot}}",
            ),
        ),
        graph(
            "Slots up and awake",
            "Slots whose replica answers (up: awake or asleep, as last seen by the "
            "transport) and slots awake, per model, against the configured count.",
            "short",
            (f"max by (model) (rmgate_slots{{{M}}})", "configured {{model}}"),
            (
                f"sum by (model) (max by (model, slot) (rmgate_slot_up{{{M}}}))",
                "up {{model}}",
            ),
            (
                f"sum by (model) (max by (model, slot) (rmgate_slot_awake{{{M}}}))",
                "awake {{model}}",
            ),
        ),
        table.Panel()
        .title("Numerics classes")
        .description(
            "Each slot's numerics class as last reported: drift-* (the canary saw its probe "
            "digest change) and audit-* (the auditor drained it) are set aside."
        )
        .datasource(DATASOURCE)
        .height(HEIGHT)
        .span(12)
        .show_header(True)
        .with_target(
            query(
                f"max by (model, slot, numerics_class) (rmgate_slot_class{{{M}}})",
                "{{model}}-{{slot}} {{numerics_class}}",
            )
            .instant()
            .format(PromQueryFormat.TABLE)
        ),
        graph(
            "Class changes",
            "Slots that left their class per hour: canary drift, audit drain, kept out "
            "after a wake.",
            "short",
            (
                f"sum by (model, slot) (increase(rmgate_canary_drift_total{{{M}}}[1h]))",
                "drift {{model}}-{{slot}}",
            ),
            (
                f"sum by (model, slot) (increase(rmgate_audit_drained_total{{{M}}}[1h]))",
                "audit {{model}}-{{slot}}",
            ),
            (
                f"sum by (model, slot) (increase(rmgate_slot_kept_out_total{{{M}}}[1h]))",
                "kept out {{model}}-{{slot}}",
            ),
            width=12,
        ),
    ]


def cache_row() -> list[Any]:
    return [
        gd.Row("Cache"),
        graph(
            "Cache hit rate",
            "Share of engine requests answered without their own engine call: from the "
            "ledger (hit) or by an identical request's call in flight (shared).",
            "percentunit",
            (
                f'sum by (model) (rate(rmgate_cache_total{{{M}, outcome=~"hit|shared"}}[{RATE}]))'
                f" / sum by (model) (rate(rmgate_cache_total{{{M}}}[{RATE}]))",
                "{{model}}",
            ),
            width=12,
        ),
        graph(
            "Cache outcomes",
            "Engine requests per second by how the cache answered them.",
            "reqps",
            (
                f"sum by (model, outcome) (rate(rmgate_cache_total{{{M}}}[{RATE}]))",
                "{{outcome}} {{model}}",
            ),
            width=12,
        ),
    ]


def ledger_row() -> list[Any]:
    return [
        gd.Row("Ledger"),
        graph(
            "Ledger write lag",
            "Time from a row handed to the ledger's writer to the commit of its batch.",
            "s",
            *quantiles("rmgate_ledger_write_lag_seconds", "instance", where=""),
        ),
        graph(
            "Ledger buffer",
            "Rows waiting for the writer, per ingress replica (dropped once the buffer is full).",
            "short",
            ("sum by (instance) (rmgate_ledger_buffered)", "{{instance}}"),
        ),
        graph(
            "Ledger rows",
            "Rows written, rows dropped (not recorded) and batches the store refused, per second.",
            "short",
            (f"sum (rate(rmgate_ledger_rows_written_total[{RATE}]))", "written"),
            (f"sum (rate(rmgate_ledger_rows_dropped_total[{RATE}]))", "dropped"),
            (f"sum (rate(rmgate_ledger_write_errors_total[{RATE}]))", "write errors"),
        ),
    ]


def audit_row() -> list[Any]:
    return [
        gd.Row("Audit"),
        graph(
            "Audit outcomes",
            "Recorded rewards re-answered on a class mate per second, by outcome: same, "
            "different (the class's slots disagree), failed (no answer to compare).",
            "reqps",
            (
                f"sum by (model, outcome) (rate(rmgate_audit_total{{{M}}}[{RATE}]))",
                "{{outcome}} {{model}}",
            ),
            (
                f"sum by (model, reason) (rate(rmgate_audit_skipped_total{{{M}}}[{RATE}]))",
                "skipped {{reason}} {{model}}",
            ),
        ),
        graph(
            "Suspect classes",
            "1 while an audit found a numerics class's slots answering differently.",
            "short",
            (
                f"max by (model, numerics_class) (rmgate_audit_suspect{{{M}}})",
                "{{model}} {{numerics_class}}",
            ),
        ),
        graph(
            "Audit queue and drained slots",
            "Sampled rows waiting for an idle class mate, and slots the auditor drained.",
            "short",
            ("sum (rmgate_audit_queued)", "queued"),
            (
                f"sum by (model, slot) (increase(rmgate_audit_drained_total{{{M}}}[1h]))",
                "drained {{model}}-{{slot}} (per hour)",
            ),
        ),
    ]


def programs_row() -> list[Any]:
    return [
        gd.Row("Reward programs"),
        graph(
            "Rule-pool timeouts",
            "Rule checks ended at their timeout per second, by program and component.",
            "reqps",
            (
                "sum by (program, component) "
                f'(rate(rmgate_reward_component_failures_total{{reason="timeout"}}[{RATE}]))',
                "{{program}} {{component}}",
            ),
            width=12,
        ),
        graph(
            "Component failures",
            "Reward program components that failed per second, by reason, and items that "
            "got their program's default.",
            "reqps",
            (
                f"sum by (program, reason) (rate(rmgate_reward_component_failures_total[{RATE}]))",
                "{{reason}} {{program}}",
            ),
            (
                f"sum by (program) (rate(rmgate_reward_defaults_total[{RATE}]))",
                "default {{program}}",
            ),
            width=12,
        ),
    ]


def engines_row() -> list[Any]:
    return [
        gd.Row("Engines"),
        graph(
            "Engine throughput",
            "Engine requests answered per second, by slot.",
            "reqps",
            (
                f"sum by (model, slot) (rate(rmgate_engine_requests_total{{{M}}}[{RATE}]))",
                "{{model}}-{{slot}}",
            ),
        ),
        graph(
            "Engine latency",
            "Percentiles of each engine request's round trip, by slot.",
            "s",
            *quantiles("rmgate_engine_seconds", "model, slot", qs=(0.5, 0.99)),
        ),
        graph(
            "Engine errors and aborts",
            "Engine answers other than 200 per second, and engine requests abandoned "
            "(deadline passed or cancelled), by slot.",
            "reqps",
            (
                "sum by (model, slot, status) "
                f'(rate(rmgate_engine_requests_total{{{M}, status!="200"}}[{RATE}]))',
                "{{status}} {{model}}-{{slot}}",
            ),
            (
                "sum by (model, slot, reason) "
                f"(rate(rmgate_engine_requests_aborted_total{{{M}}}[{RATE}]))",
                "{{reason}} {{model}}-{{slot}}",
            ),
        ),
    ]


def variables() -> list[Any]:
    return [
        gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
        gd.QueryVariable("model")
        .label("Model")
        .datasource(DATASOURCE)
        .query("label_values(rmgate_requests_total, model)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all")),
    ]


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict, ready for ``json.dumps``)."""
    board = (
        gd.Dashboard("rmgate")
        .uid(UID)
        .description(
            "rmgate's ingress metrics (GET /metrics of every ingress replica). Generated "
            "by `python -m deployments.monitoring`; edit the generator, not this JSON."
        )
        .tags(["rmgate"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
    )
    for variable in variables():
        board = board.with_variable(variable)
    rows = (
        requests_row,
        queues_row,
        slots_row,
        engines_row,
        cache_row,
        ledger_row,
        audit_row,
        programs_row,
    )
    panel_id = 0
    for row in rows:
        for item in row():
            panel_id += 1
            item = item.id(panel_id)
            board = board.with_row(item) if isinstance(item, gd.Row) else board.with_panel(item)
    # the SDK's encoder turns its models (nested ones too) into JSON's types
    built: dict[str, Any] = json.loads(JSONEncoder().encode(board.build()))
    return built
