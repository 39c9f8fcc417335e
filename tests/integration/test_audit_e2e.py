"""The continuous audit end to end: real engines behind real Ray Serve, under load.

A gateway of its own (``benchmarks.audit.config``): ``rm``, two slots of one class, and
``rm_bad``, the same model whose slot 1 answers every second ``/classify`` one ulp off
(``deployments.engine.fault``: its fingerprint, class and probe answers unchanged, so the
start-up check and the canary cannot see it). Every recorded answer is audited
(``sample: 1.0``). Under a load of distinct requests on both models:

* ``rm``: re-answers on class mates, all ``same``, nothing suspect, nothing drained;
* ``rm_bad``: slot 1 caught, drained and named within a bounded time, slot 0 never; then
  every ``rm_bad`` answer is slot 0's and bitwise ``rm``'s;
* the ledger holds an audit row per re-answer; ``rmgate ledger audit`` re-checks on demand;
  ``rmgate status`` shows it.

The gateway also traces (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set to a receiver in the
test that decodes the real OTLP protobuf): a request sent with a ``traceparent`` gives the
edge span and the stage spans in the trainer's trace.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from benchmarks.audit import config
from gateway.harness.otlp_receiver import otlp_receiver
from gateway.harness.processes import NO_CACHE
from gateway.harness.running import REPO, metric_total, running_gateway

pytestmark = pytest.mark.integration

CAUGHT_WITHIN_S = 240


@pytest.fixture(scope="module")
def audited(demo_models, tmp_path_factory):
    work = tmp_path_factory.mktemp("audit")
    path = work / "audit.yaml"
    path.write_text(yaml.safe_dump(config(demo_models / "disrm", work / "state", 1.0, True)))
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        with running_gateway(path, work, env=env) as (url, _):
            yield url, receiver


def classify(client: httpx.Client, url: str, model: str, text: str) -> httpx.Response:
    r = client.post(url + "/classify", json={"model": model, "input": text}, headers=NO_CACHE)
    assert r.status_code == 200, r.text
    return r


async def keep_loading(url: str, stop: threading.Event, sent: list[int]) -> None:
    """Distinct requests to both models at concurrency 2 each until ``stop``."""

    async def worker(client: httpx.AsyncClient, model: str, k: int) -> None:
        n = 0
        while not stop.is_set():
            r = await client.post(
                url + "/classify",
                json={"model": model, "input": f"load {k} {n}: {n % 7}+{k}="},
                headers=NO_CACHE,
            )
            assert r.status_code == 200, r.text
            sent.append(1)
            n += 1

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client, m, k) for m in ("rm", "rm_bad") for k in range(2)))


def test_the_audit_catches_and_drains_only_the_slot_that_answers_otherwise(audited):
    url, _ = audited
    stop, sent = threading.Event(), []
    loader = threading.Thread(target=lambda: asyncio.run(keep_loading(url, stop, sent)))
    start = time.monotonic()
    loader.start()
    try:
        report: dict = {}
        while time.monotonic() - start < CAUGHT_WITHIN_S:
            report = httpx.get(url + "/v1/audit", timeout=30).json()
            if report["drained"]:
                break
            time.sleep(2)
        caught_s = time.monotonic() - start
        time.sleep(10)  # more load and audits after the drain
    finally:
        stop.set()
        loader.join(timeout=600)
    assert report["drained"], f"not caught within {CAUGHT_WITHIN_S}s: {report}"
    print(f"caught after {caught_s:.0f}s under load ({len(sent)} requests)")
    report = httpx.get(url + "/v1/audit", timeout=30).json()
    assert [(d["model"], d["slot"]) for d in report["drained"]] == [("rm_bad", 1)], report
    by_model = {c["model"]: c for c in report["classes"]}
    assert by_model["rm"]["same"] > 0 and by_model["rm"]["different"] == 0, report
    assert not by_model["rm"]["suspect"]
    assert by_model["rm_bad"]["different"] >= 1 and by_model["rm_bad"]["suspect"]
    last = report["last_mismatch"]
    assert last["model"] == "rm_bad" and 1 in (last["recorded_slot"], last["audit_slot"])
    assert metric_total(url, 'rmgate_audit_total{model="rm",numerics_class') >= 0
    text = httpx.get(url + "/metrics", timeout=30).text
    assert 'rmgate_audit_drained_total{model="rm_bad",slot="1"} 1.0' in text
    assert not any(
        line.startswith('rmgate_audit_total{model="rm",') and 'outcome="different"' in line
        for line in text.splitlines()
    )
    # drained: rm_bad's keys go to slot 0, whose answers are rm's, bit for bit
    with httpx.Client(timeout=600) as client:
        for i in range(24):
            text_in = f"after {i}: {i}+{i}="
            bad = classify(client, url, "rm_bad", text_in)
            good = classify(client, url, "rm", text_in)
            assert bad.headers["x-rmgate-slot"] == "0"
            assert bad.json()["data"] == good.json()["data"]
    card = next(
        c for c in httpx.get(url + "/v1/models", timeout=60).json()["data"] if c["id"] == "rm_bad"
    )
    assert "audit" in json.dumps(card), card  # the drained slot is named with its reason


def test_the_record_and_the_commands_show_the_audit(audited):
    url, _ = audited
    # on demand: rm's recorded rows re-answered now, all the same (exit 0)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "ledger",
            "audit",
            url,
            "--model",
            "rm",
            "--sample",
            "12",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "audited 12 recorded rewards on class mates: 12 same, 0 different" in out.stdout
    status = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "status", url, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    rows = {r["model"]: r for r in json.loads(status.stdout)}
    assert rows["rm"]["audit"]["different"] == 0 and rows["rm"]["audit"]["same"] >= 12
    assert rows["rm_bad"]["audit"]["drained"] == [1]


def test_a_trainers_trace_gets_the_gateways_stage_spans(audited):
    url, receiver = audited
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = "00f067aa0ba902b7"
    r = httpx.post(
        url + "/classify",
        json={"model": "rm", "input": "traced: 2+2="},
        headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    wanted = {"rmgate.answer", "rmgate.queue", "rmgate.engine", "rmgate.ledger.write"}

    def ours(spans):
        return [s for s in spans if s.trace_id == trace_id]

    spans = ours(receiver.wait_for(lambda got: wanted <= {s.name for s in ours(got)}, 60))
    names = {s.name for s in spans}
    assert wanted <= names, names
    edge = next(s for s in spans if s.parent_span_id == parent)  # child of the trainer's span
    assert edge.attributes["http.response.status_code"] == 200, edge.attributes
    answer = next(s for s in spans if s.name == "rmgate.answer")
    assert answer.attributes["rmgate.model"] == "rm"
    assert answer.attributes["rmgate.receipt"] == r.headers["x-rmgate-receipt"]
    assert answer.attributes["rmgate.numerics_class"] == r.headers["x-rmgate-class"]
    assert {s.service for s in spans} == {"rmgate"}
