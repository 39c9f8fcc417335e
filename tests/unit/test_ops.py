"""Auth, the timeout override, /metrics, and a property test of every endpoint."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.routing.engine_access import SlotView
from gateway.core.routing.numerics import ModelClasses
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit.test_ingress import CONFIG, FakeTransport


def make_client(transport=None, **gateway_settings) -> httpx.AsyncClient:
    cfg = AppConfig.model_validate({**CONFIG, "gateway": {**CONFIG["gateway"], **gateway_settings}})
    gw = RewardService(cfg, transport or FakeTransport())
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    )


async def test_api_keys_from_env_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_KEYS", "k1, k2")
    keyfile = tmp_path / "keys"
    keyfile.write_text("k3\n\n")
    async with make_client(api_keys_env="MY_KEYS", api_keys_file=str(keyfile)) as c:
        body = {"input": "x"}
        assert (await c.post("/classify", json=body)).status_code == 401
        bad = await c.post("/classify", json=body, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        for headers in (
            {"Authorization": "Bearer k1"},
            {"authorization": "bearer k2"},
            {"X-Api-Key": "k3"},
        ):
            assert (await c.post("/classify", json=body, headers=headers)).status_code == 200
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200


async def test_auth_is_off_without_keys(monkeypatch):
    monkeypatch.delenv("RMGATE_API_KEYS", raising=False)
    async with make_client() as c:
        assert (await c.post("/classify", json={"input": "x"})).status_code == 200


class SlowTransport(FakeTransport):
    """Records the timeout the request carried (FakeTransport keeps it)."""


@pytest.mark.parametrize(
    "header,status,seen",
    [
        (None, 200, 300.0),
        ("2.5", 200, 2.5),
        ("99999", 200, 300.0),
        ("0", 400, None),
        ("abc", 400, None),
        ("nan", 400, None),
        ("-1", 400, None),
    ],
)
async def test_timeout_header(header, status, seen):
    transport = SlowTransport()
    async with make_client(transport) as c:
        headers = {"x-rmgate-timeout": header} if header else {}
        r = await c.post("/classify", json={"input": "x"}, headers=headers)
    assert r.status_code == status
    if status == 200:
        assert transport.deadline.budget_s == seen


async def test_metrics_exposition_counts_requests():
    async with make_client() as c:
        await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
        await c.post("/classify", content=b"{bad")
        text = (await c.get("/metrics")).text
    assert (
        'rmgate_requests_total{endpoint="/v1/chat/completions",model="judge",status="200"}' in text
    )
    assert 'rmgate_requests_total{endpoint="/classify",model="",status="400"}' in text
    assert 'rmgate_seeds_derived_total{model="judge"}' in text
    assert 'rmgate_slots{model="judge"} 3.0' in text
    assert "rmgate_request_seconds_bucket" in text


# ---- property test: no input makes the gateway answer 5xx or non-JSON ----------------------


class EchoTransport:
    """A well-behaved engine whatever it is sent (the fuzz target is the gateway)."""

    async def post(self, model, placement, path, body, deadline):
        json.loads(body)  # the gateway must only ever forward valid JSON
        if path in ("/classify", "/pooling"):
            out = {"object": "list", "data": [{"index": 0, "probs": [0.5], "data": [0.5]}]}
        else:
            out = {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Score: 1"},
                        "text": "1",
                    }
                ]
            }
        return EngineReply(200, json.dumps(out).encode(), "fp", placement.home)

    async def describe(self, model, slot, timeout_s):
        return None

    async def health(self, model, slot, timeout_s):
        return "unavailable"

    async def slot_state(self, model, slot, timeout_s):
        return {"slot": slot, "state": "awake"}

    def slot_view(self, model, slots):
        return SlotView(ModelClasses((None,) * slots))


ENDPOINTS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/classify",
    "/pooling",
    "/v1/rewards",
    "/get_reward",
    "/v1/embeddings",
    "/keys/k/get_reward",
    "/v1/models",
    "/health",
    "/metrics",
    "/nope",
]
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=50),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
field_names = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "input",
        "items",
        "query",
        "prompts",
        "labels",
        "seed",
        "stream",
        "use_activation",
        "activation",
        "softmax",
        "response",
        "label",
        "n",
        "unknown_x",
        "max_tokens",
        "encoding_format",
    ]
)
plausible = st.dictionaries(
    field_names,
    st.one_of(
        json_value,
        st.just("judge"),
        st.just("rm"),
        st.just([{"role": "user", "content": "hi"}]),
        st.lists(
            st.fixed_dictionaries({"prompt": st.text(max_size=5), "response": st.text(max_size=5)}),
            max_size=3,
        ),
        st.lists(st.text(max_size=8), max_size=4),
    ),
    max_size=6,
)


def _encode(kind: str, value, raw: bytes) -> bytes:
    if kind == "json":
        return json.dumps(value).encode()
    if kind == "raw":
        return raw
    if kind == "huge":
        return json.dumps({"input": "x" * 5000, "prompt": "y" * 5000}).encode()
    if kind == "deep":
        return ('{"input": ' + "[" * 1500 + "]" * 1500 + "}").encode()
    return b'{"input": "\xff\xfe bad utf8"}'


@functools.lru_cache(maxsize=1)
def _fuzz_app():
    """One app for every example: building the config, the gateway and the app per example
    was most of this test's time (4 min of CI's suite at 2,000 examples)."""
    cfg = AppConfig.model_validate(
        {**CONFIG, "gateway": {"max_body_bytes": 8192, "default_reward_model": "rm"}}
    )
    return create_app(RewardService(cfg, EchoTransport()))


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    method=st.sampled_from(["POST", "POST", "POST", "GET"]),
    kind=st.sampled_from(["json", "json", "json", "raw", "huge", "deep", "badutf8"]),
    value=st.one_of(plausible, json_value),
    raw=st.binary(max_size=200),
)
def test_no_input_yields_5xx_or_non_json(endpoint, method, kind, value, raw):
    import asyncio

    app = _fuzz_app()

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw"
        ) as c:
            return await c.request(
                method,
                endpoint,
                content=_encode(kind, value, raw),
                headers={"content-type": "application/json"},
            )

    r = asyncio.run(go())
    assert r.status_code < 500, r.text
    if endpoint != "/metrics":
        assert r.headers["content-type"] == "application/json"
        r.json()


def test_the_ingress_deployment_pickles_and_builds_its_app_in_the_replica():
    """Ray Serve pickles the deployment class (by value for the ingress wrapper): it must
    pickle, and the app is built after the constructor around that replica's gateway."""
    from ray import cloudpickle

    import gateway.serve.app as app_module

    cls = cloudpickle.loads(cloudpickle.dumps(app_module.IngressReplica.func_or_class))
    assert hasattr(cls, "__serve_build_asgi_app__")


async def test_error_codes_are_strings_and_the_error_model_is_in_openapi():
    async with make_client() as c:
        missing = await c.post("/nope", json={})
        wrong = await c.get("/classify")
        schema = (await c.get("/openapi.json")).json()
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "ErrorResponse" in schema["components"]["schemas"]
    for path in ("/v1/chat/completions", "/classify", "/v1/rewards", "/get_reward"):
        responses = schema["paths"][path]["post"]["responses"]
        assert responses["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse"
        ), path


def test_every_error_class_has_a_status_and_a_string_code():
    from gateway.core.api import errors

    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.RmgateError)
    ]
    assert len(classes) > 15
    for cls in classes:
        assert isinstance(cls.code, str) and cls.code and 400 <= cls.status < 600, cls
