"""The shipped dashboard and alert rules against a running gateway's ``/metrics``.

The unit tests check the queries against the registry's definitions; this checks them
against what a real ingress replica serves (its ``# TYPE`` lines count: a labelled
metric that has seen no event yet has no sample but is exposed), and that the metrics the
dashboard added get samples once requests flow.
"""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments.monitoring.names import exposed_names, metric_names, unknown_names
from deployments.monitoring.queries import shipped_queries

pytestmark = pytest.mark.integration


def samples(text: str, name: str, **labels: str) -> list[float]:
    """The values of ``name``'s samples whose labels include ``labels``."""
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def test_every_shipped_query_names_a_metric_the_gateway_serves(gateway):
    url, _ = gateway
    exposed = exposed_names(httpx.get(url + "/metrics", timeout=30).text)
    assert "rmgate_requests_total" in exposed and "process_cpu_seconds_total" in exposed
    missing = {
        where: unknown_names(metric_names(expr), exposed)
        for where, expr in shipped_queries()
        if unknown_names(metric_names(expr), exposed)
    }
    assert missing == {}


def test_the_added_metrics_get_samples_when_requests_flow(gateway):
    """One ingress replica (the session's config): /metrics is the one that answered."""
    url, _ = gateway
    r = httpx.post(
        url + "/classify", json={"model": "rm", "input": ["monitoring 2+3=5"]}, timeout=120
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while True:  # the ledger's writer commits within its flush interval (or after a retry)
        text = httpx.get(url + "/metrics", timeout=30).text
        lagged = sum(samples(text, "rmgate_ledger_write_lag_seconds_count"))
        if lagged > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert lagged > 0, "no ledger row was committed within 60 s"
    assert sum(samples(text, "rmgate_queue_wait_seconds_count", model="rm")) >= 1
    # the slot that answered is up as the transport last saw it ("no slot serving" reads it)
    assert 1.0 in samples(text, "rmgate_slot_up", model="rm")
