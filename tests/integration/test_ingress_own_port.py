"""The ingress replicas' own port (``rmgate serve --direct-port``) on the session's real
gateway: the same answers, bit for bit, as through Serve's port, the same errors, and a
client that leaves stops its engine's work."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from gateway.core.api.answers import answer_value
from gateway.harness.running import metric_total
from tests.integration.stalls import (
    engine_metric,
    engine_port,
    long_judge_request_then_leave,
    until_quiet,
)

pytestmark = pytest.mark.integration

CALLS = [
    ("/classify", {"model": "rm", "input": ["2+3=5", "2+3=6", "7*6=42"]}),
    (
        "/v1/chat/completions",
        {
            "model": "judge",
            "seed": 5,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "2+3=?"}],
        },
    ),
    ("/v1/rewards", {"model": "rm", "items": [{"prompt": "2+3=", "response": "5"}]}),
]


@pytest.mark.parametrize("path,body", CALLS, ids=[c[0] for c in CALLS])
def test_the_direct_port_answers_what_serves_port_answers(gateway, gateway_direct_url, path, body):
    url, _ = gateway
    via_serve = httpx.post(url + path, json=body, timeout=120)
    direct = httpx.post(gateway_direct_url + path, json=body, timeout=120)
    assert via_serve.status_code == direct.status_code == 200, (via_serve.text, direct.text)
    # the answer's bits (gateway.core.api.answers: vLLM's own ids and clocks are not compared)
    assert answer_value(path, direct.json()) == answer_value(path, via_serve.json())
    same = {
        k: v
        for k, v in via_serve.headers.items()
        if k.startswith("x-rmgate") and k not in ("x-rmgate-receipt", "x-rmgate-cache")
    }
    assert same and all(direct.headers.get(k) == v for k, v in same.items()), (same, direct.headers)


def test_the_direct_port_answers_errors_as_json(gateway_direct_url):
    bad = httpx.post(
        gateway_direct_url + "/classify",
        content=b"{nope",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    missing = httpx.get(gateway_direct_url + "/nowhere", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert "rmgate_requests_total" in httpx.get(gateway_direct_url + "/metrics", timeout=30).text


def test_a_client_that_leaves_the_direct_port_stops_its_engine(gateway, gateway_direct_url):
    """Judge requests for 8 x 1,000 tokens (about 16 s of generation here), the client's
    socket closed after 0.5 s: the handler is cancelled (counted) and vLLM aborts."""
    engines = Path(os.environ["RMGATE_TEST_LOG_ROOT"]) / "engines"
    ports = [engine_port(engines, f"judge-{s}") for s in (0, 1)]

    def generated() -> float:
        return sum(engine_metric(p, "vllm:generation_tokens_total") for p in ports)

    counted = 0.0
    tokens: list[float] = []
    for attempt in range(3):
        disconnects = metric_total(gateway_direct_url, "rmgate_client_disconnects_total")
        before = generated()
        long_judge_request_then_leave(gateway_direct_url, 170 + attempt, 30, 0.5)
        stopped = until_quiet(generated, 40)
        tokens.append(stopped - before)
        counted = metric_total(gateway_direct_url, "rmgate_client_disconnects_total") - disconnects
        if counted >= 1 and tokens[-1] < 4000:
            break
    assert counted >= 1 and tokens[-1] < 4000, (counted, tokens)  # 8,000 when not aborted
