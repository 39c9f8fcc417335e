"""The shipped dashboard and alert rules: current, valid PromQL, and about metrics the
gateway exposes; the metrics they added are observed where the brief says.

Every query is parsed with ``promql_parser`` (Prometheus' grammar) and its syntax tree
walked for the metric names it selects; each must be one the gateway's registry exposes
(``tests/integration/test_monitoring_live.py`` checks them against a running gateway's
``/metrics`` too). A made-up name is reported: the negative control.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from deployments.monitoring import alerts, dashboard
from deployments.monitoring.names import (
    exposed_names,
    family_names,
    metric_names,
    unknown_names,
)
from deployments.monitoring.queries import (
    dashboard_queries,
    panels_of,
    shipped_dashboard,
    shipped_queries,
    shipped_rules,
)
from deployments.monitoring.render import ALERTS, GENERATED, render, stale
from gateway.core.api.errors import QueueFull
from gateway.core.config.settings import GatewaySettings
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.gate import SlotGate
from gateway.core.routing.placement import Placement
from gateway.core.routing.slots import SlotTable
from gateway.ledger.writer import LedgerWriter
from gateway.observability import metrics
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.queue_wait import timed_wait
from gateway.transport.slot_transport import SlotTransport
from tests.unit.test_routing import _Call

REGENERATE = ".venv/bin/python -m deployments.monitoring"


def registry_names() -> set[str]:
    return family_names(metrics.REGISTRY.collect())


# ---- the files are what the code generates ------------------------------------------------


def test_the_committed_files_are_what_the_generator_writes():
    assert stale(GENERATED) == [], f"stale generated files: regenerate with `{REGENERATE}`"


def test_the_generator_writes_every_file(tmp_path):
    from deployments.monitoring.__main__ import main

    assert main(["--out", str(tmp_path)]) == 0
    assert stale(tmp_path) == []
    assert main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / ALERTS).write_text("groups: []\n")
    assert main(["--out", str(tmp_path), "--check"]) == 1  # the check sees a stale file


def test_rendering_is_deterministic():
    assert render() == render()


# ---- every query parses and names exposed metrics -----------------------------------------


@pytest.mark.parametrize("where,expr", shipped_queries(), ids=[w for w, _ in shipped_queries()])
def test_every_query_parses_and_names_exposed_metrics(where, expr):
    names = metric_names(expr)
    assert names, f"{where}: selects no metric: {expr}"
    missing = unknown_names(names, registry_names())
    assert not missing, f"{where}: names metrics the gateway does not expose: {missing}"


def test_the_model_variable_reads_an_exposed_metric():
    variables = {v["name"]: v for v in shipped_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["includeAll"] and model["allValue"] == ".*"
    inner = model["query"].removeprefix("label_values(").removesuffix(")")
    metric, label = (s.strip() for s in inner.split(","))
    assert label == "model" and metric in registry_names()


def test_a_made_up_metric_is_reported():
    """The negative control: the same check over an expression naming a metric that
    does not exist (in a matrix selector, under a function and an aggregation)."""
    expr = 'sum by (model) (rate(rmgate_requests_totl{model=~"$model"}[$__rate_interval]))'
    assert metric_names(expr) == {"rmgate_requests_totl"}
    assert unknown_names(metric_names(expr), registry_names()) == {"rmgate_requests_totl"}
    assert unknown_names({"~rmgate_nothing_.*"}, registry_names()) == {"~rmgate_nothing_.*"}
    assert unknown_names({"~rmgate_requests_.*"}, registry_names()) == set()


def test_the_walk_finds_names_in_every_kind_of_node():
    expr = (
        "sum by (le) (rate(a_bucket[5m])) / ignoring (x) group_left b"
        ' + {__name__="c", job="j"} and on () topk(scalar(d), e)'
        " + max_over_time((f > bool 1)[10m:1m]) - -g"
        ' + label_replace(h, "dst", "$1", "src", "(.*)") + count_values("v", i)'
        ' + {__name__="j" or __name__="l"} + {__name__=~"m_.*"} + 2'
    )
    assert metric_names(expr) == {"a_bucket", *"bcdefghij", "l", "~m_.*"}


def test_a_query_that_is_not_promql_is_refused():
    with pytest.raises(ValueError):
        metric_names("sum(rate(rmgate_requests_total[5m])")


def test_exposed_names_reads_type_lines_and_samples():
    text = (
        "# HELP r_total Requests\n# TYPE r_total counter\n"  # no sample yet
        '# TYPE h histogram\nh_bucket{le="+Inf"} 1.0\nh_count 1.0\nh_sum 0.5\n'
        '# TYPE g gauge\ng{model="rm"} 3.0\n'
        "untyped_sample 1\n"
    )
    names = exposed_names(text)
    assert {"r_total", "r_created", "h_bucket", "h_count", "h_sum", "g", "untyped_sample"} <= (
        names
    )
    assert "r" not in names and "g_total" not in names


def test_exposed_names_of_the_exposition_match_the_registry():
    """The reader of a live page and the registry's own families agree."""
    text = generate_latest(metrics.REGISTRY).decode()
    assert exposed_names(text) == registry_names()


# ---- the dashboard -------------------------------------------------------------------------


def test_the_dashboard_shows_what_operators_watch():
    board = shipped_dashboard()
    assert board["uid"] == dashboard.UID
    named = set().union(*(metric_names(e) for _, e in dashboard_queries(board)))
    for metric in (
        "rmgate_requests_total",
        "rmgate_request_seconds_bucket",
        "rmgate_slot_queued",
        "rmgate_queue_wait_seconds_bucket",
        "rmgate_slot_inflight",
        "rmgate_slot_unavailable_total",
        "rmgate_slot_awake",
        "rmgate_slot_class",
        "rmgate_cache_total",
        "rmgate_ledger_write_lag_seconds_bucket",
        "rmgate_ledger_rows_dropped_total",
        "rmgate_ledger_buffered",
        "rmgate_ledger_write_errors_total",
        "rmgate_audit_total",
        "rmgate_audit_suspect",
        "rmgate_audit_drained_total",
        "rmgate_reward_component_failures_total",
        "rmgate_engine_requests_total",
        "rmgate_engine_seconds_bucket",
    ):
        assert metric in named, metric
    exprs = [e for _, e in dashboard_queries(board)]
    for q in ("0.5", "0.9", "0.99"):
        assert any(f"histogram_quantile({q}" in e and "rmgate_request_seconds" in e for e in exprs)
    assert any('status=~"5.."' in e for e in exprs) and any('status=~"4.."' in e for e in exprs)
    assert any('reason="timeout"' in e for e in exprs)


def test_every_panel_queries_the_datasource_variable():
    panels = panels_of(shipped_dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
        # every model-labelled series follows the model variable
        for t in p["targets"]:
            if "model" in t["expr"] and "rmgate_reward" not in t["expr"]:
                assert '$model"' in t["expr"], (p["title"], t["expr"])


# ---- the alert rules -----------------------------------------------------------------------

REQUIRED_ALERTS = {
    "RmgateAuditMismatch",
    "RmgateAuditSuspectClass",
    "RmgateHigh5xxRate",
    "RmgateDeadlineExceeded",
    "RmgateQueueFull",
    "RmgateLedgerRowsDropped",
    "RmgateSlotOutOfClass",
    "RmgateSlotKeptOut",
    "RmgateNoSlotServing",
}


def test_the_rule_file_is_the_rules():
    assert shipped_rules() == alerts.rule_file()


def test_every_alert_has_the_required_fields():
    rules = [r for g in shipped_rules()["groups"] for r in g["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    assert REQUIRED_ALERTS <= set(names)
    for r in rules:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", r["for"]), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"].strip(), r["alert"]
        assert r["annotations"]["description"].strip(), r["alert"]


def test_the_alerts_watch_the_right_signals():
    exprs = {r["alert"]: r["expr"] for g in shipped_rules()["groups"] for r in g["rules"]}
    assert 'outcome="different"' in exprs["RmgateAuditMismatch"]
    assert "rmgate_audit_suspect" in exprs["RmgateAuditSuspectClass"]
    assert 'status=~"5.."' in exprs["RmgateHigh5xxRate"]
    # the gateway answers a passed deadline with 504, a full queue with 503 queue_full
    from gateway.core.api.errors import DeadlineExceeded

    assert f'status="{DeadlineExceeded.status}"' in exprs["RmgateDeadlineExceeded"]
    assert QueueFull.status == 503 and "rmgate_queue_full_total" in exprs["RmgateQueueFull"]
    assert "rmgate_ledger_rows_dropped_total" in exprs["RmgateLedgerRowsDropped"]
    assert "drift-" in exprs["RmgateSlotOutOfClass"] and "audit-" in exprs["RmgateSlotOutOfClass"]
    assert "rmgate_slot_kept_out_total" in exprs["RmgateSlotKeptOut"]
    assert "rmgate_slot_up" in exprs["RmgateNoSlotServing"]


def test_the_out_of_class_prefixes_are_the_cores():
    from gateway.core.routing.numerics import SET_ASIDE

    expr = next(a.expr for a in alerts.ALERTS if a.name == "RmgateSlotOutOfClass")
    for prefix in SET_ASIDE:
        assert f"{prefix}.*" in expr


# ---- the metrics the dashboard added are observed ------------------------------------------


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_a_gate_wait_is_timed_and_a_full_room_counted():
    labels = {"model": "mon-gate", "numerics_class": "c1"}
    count = sample("rmgate_queue_wait_seconds_count", labels)
    full = sample("rmgate_queue_full_total", labels)
    now = [0.0]
    gate = SlotGate(1, 1)
    with timed_wait("mon-gate", "c1", lambda: now[0]):
        await gate.acquire(1.0)  # a free place: a wait of 0
    waiting = asyncio.ensure_future(_timed_acquire(gate, now))
    await asyncio.sleep(0)
    now[0] = 2.0
    with pytest.raises(QueueFull):  # the one waiting place is taken
        with timed_wait("mon-gate", "c1", lambda: now[0]):
            await gate.acquire(1.0)
    gate.release()
    await waiting
    assert sample("rmgate_queue_wait_seconds_count", labels) == count + 2
    assert sample("rmgate_queue_wait_seconds_bucket", {**labels, "le": "0.001"}) >= 1
    assert sample("rmgate_queue_wait_seconds_sum", labels) >= 2.0
    assert sample("rmgate_queue_full_total", labels) == full + 1


async def _timed_acquire(gate: SlotGate, now: list[float]) -> None:
    with timed_wait("mon-gate", "c1", lambda: now[0]):
        await gate.acquire(5.0)


async def test_a_wait_its_deadline_ends_is_observed():
    labels = {"model": "mon-gate", "numerics_class": "unknown"}
    count = sample("rmgate_queue_wait_seconds_count", labels)
    gate = SlotGate(1, 1)
    await gate.acquire()
    with pytest.raises(TimeoutError):
        with timed_wait("mon-gate", None, lambda: 0.0):
            await gate.acquire(0.01)
    assert sample("rmgate_queue_wait_seconds_count", labels) == count + 1


class _Handle:
    def __init__(self, info) -> None:
        self.endpoint = _Call(info)


async def test_the_transport_times_gate_waits_and_marks_slots_up():
    info = {"url": "http://alive", "mode": "serialize", "numerics": {"class_id": "k1"}}
    handles = {"mon-t": [_Handle(info), _Handle(RuntimeError("dead")), _Handle(info)]}
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    t = SlotTransport(
        handles,
        GatewaySettings(),
        SlotTable({"mon-t": 3}),
        engine_client=HttpxEngineClient(client),
    )
    labels = {"model": "mon-t", "numerics_class": "k1"}
    count = sample("rmgate_queue_wait_seconds_count", labels)
    await t.post("mon-t", Placement(((0, 5.0),)), "/classify", b"{}", Deadline.after(30))
    assert sample("rmgate_queue_wait_seconds_count", labels) == count + 1
    assert sample("rmgate_slot_up", {"model": "mon-t", "slot": "0"}) == 1
    assert await t.directory.describe("mon-t", 1, 1.0) is None
    assert sample("rmgate_slot_up", {"model": "mon-t", "slot": "1"}) == 0
    await t.directory.describe("mon-t", 2, 1.0)
    t.slots.update({"mon-t": 2})  # slot 2 scaled away: its series goes
    assert t.directory.cached("mon-t", 2) is None
    assert (
        metrics.REGISTRY.get_sample_value("rmgate_slot_up", {"model": "mon-t", "slot": "2"}) is None
    )
    await client.aclose()


async def test_a_kept_out_slot_is_not_up():
    kept = {"url": "http://x", "mode": "serialize", "state": "kept_out"}
    asleep = {"url": "http://x", "mode": "serialize", "state": "asleep"}
    t = SlotTransport(
        {"mon-k": [_Handle(kept), _Handle(asleep)]}, GatewaySettings(), SlotTable({"mon-k": 2})
    )
    for slot in (0, 1):
        assert await t.directory.describe("mon-k", slot, 1.0) is None
    assert sample("rmgate_slot_up", {"model": "mon-k", "slot": "0"}) == 0
    assert sample("rmgate_slot_up", {"model": "mon-k", "slot": "1"}) == 1  # wakes to serve


class _Store:
    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.rows: list[Any] = []

    def write(self, rows, counts=None, groups=()):
        if self.fail:
            self.fail -= 1
            raise OSError("store down")
        self.rows += rows

    def get(self, identity):
        return None

    def close(self):
        pass


async def test_the_ledger_write_lag_is_observed_per_committed_row():
    from tests.unit.test_ledger_store import row

    count = sample("rmgate_ledger_write_lag_seconds_count")
    store = _Store(fail=1)
    writer = LedgerWriter(store, batch_rows=2)
    for i in range(3):
        writer.record(row(i))
    assert await writer.flush() is False  # the store refused: no lag observed yet
    assert sample("rmgate_ledger_write_lag_seconds_count") == count
    assert await writer.flush() is True
    assert len(store.rows) == 3
    assert sample("rmgate_ledger_write_lag_seconds_count") == count + 3
