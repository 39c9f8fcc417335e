"""The scoring endpoints' hot path (``gateway.http.hot_path.HotPath``) answers exactly what
the FastAPI app answers (status, body, rmgate's headers), checks API keys the same way, and
leaves every other request to FastAPI."""

from __future__ import annotations

import httpx
import pytest

from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.http.app import create_app, ingress_app
from gateway.http.hot_path import HotPath, hot_routes
from tests.unit.test_ingress import CONFIG, FakeTransport


def clients(**gateway_settings) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """(through FastAPI alone, through the hot path) over one gateway."""
    cfg = AppConfig.model_validate({**CONFIG, "gateway": {**CONFIG["gateway"], **gateway_settings}})
    app = create_app(RewardService(cfg, FakeTransport()))
    return (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=HotPath(app)), base_url="http://gw"),
    )


CASES = [
    ("/classify", {"model": "rm", "input": "2+3=5"}, {}),
    ("/classify", {"model": "rm", "input": ["a", "bb", "ccc"]}, {}),
    ("/pooling", {"model": "rm", "input": "2+3=5"}, {}),
    (
        "/v1/chat/completions",
        {"model": "judge", "seed": 3, "messages": [{"role": "user", "content": "hi"}]},
        {},
    ),
    ("/v1/completions", {"model": "judge", "prompt": "hi", "seed": 1}, {}),
    ("/v1/embeddings", {"model": "rm", "input": "2+3=5"}, {}),
    ("/v1/rewards", {"model": "judge", "items": [{"prompt": "2+3=", "response": "5"}]}, {}),
    ("/get_reward", {"query": ["2+3=5"]}, {}),
    ("/classify", b"{not json", {}),
    ("/classify", {"model": "nope", "input": "x"}, {}),
    ("/classify", {"model": "judge", "input": "x"}, {}),
    ("/classify", {"model": "rm", "input": "x" * 5000}, {}),
    ("/v1/chat/completions", {"model": "judge", "messages": []}, {}),
    ("/classify", {"model": "rm", "input": "x"}, {"x-rmgate-timeout": "-1"}),
]


@pytest.mark.parametrize("path,body,headers", CASES)
async def test_the_hot_path_answers_what_fastapi_answers(path, body, headers):
    plain, hot = clients(default_reward_model="rm")
    async with plain, hot:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        a = await plain.post(path, headers=headers, **kw)
        b = await hot.post(path, headers=headers, **kw)
    assert (b.status_code, b.content) == (a.status_code, a.content)
    mine = {k: v for k, v in a.headers.items() if k.startswith("x-rmgate")}
    assert {k: v for k, v in b.headers.items() if k.startswith("x-rmgate")} == mine
    assert b.headers["content-type"] == a.headers["content-type"]


async def test_the_hot_path_checks_api_keys_as_fastapi_does(monkeypatch):
    monkeypatch.setenv("MY_KEYS", "k1, k2")
    _, hot = clients(api_keys_env="MY_KEYS")
    async with hot as c:
        body = {"model": "rm", "input": "x"}
        assert (await c.post("/classify", json=body)).status_code == 401
        bad = await c.post("/v1/rewards", json=body, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        for headers in (
            {"Authorization": "Bearer k1"},
            {"authorization": "bearer k2"},
            {"X-Api-Key": "k1"},
        ):
            assert (await c.post("/classify", json=body, headers=headers)).status_code == 200
        # the key in the path (verl, OpenRLHF) goes through FastAPI's routes
        assert (await c.post("/keys/k2/classify", json=body)).status_code == 200
        assert (await c.post("/keys/zz/classify", json=body)).status_code == 401


async def test_everything_else_goes_to_fastapi():
    _, hot = clients()
    async with hot as c:
        assert (await c.get("/classify")).json()["error"]["code"] == "method_not_allowed"
        assert (await c.post("/nowhere", json={})).json()["error"]["code"] == "not_found"
        assert (await c.get("/health")).status_code == 200
        assert "rmgate_requests_total" in (await c.get("/metrics")).text


def test_every_scoring_endpoint_of_the_app_is_on_the_hot_path():
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), FakeTransport()))
    posts = {
        r.path
        for r in app.routes
        if "POST" in getattr(r, "methods", ())
        and not r.path.startswith("/keys/")
        and not r.path.startswith("/v1/ledger")
    }
    # the ops routes that change the deployment (sleep, wake, an audit now) are not scoring
    assert posts - {"/admin/slots", "/sleep", "/wake_up", "/v1/audit"} <= set(hot_routes()) | {
        p for p in posts if p.startswith("/admin")
    }
    assert set(hot_routes()) <= posts


async def test_scoring_posts_never_reach_fastapi_in_the_ingress_app():
    """What an ingress replica serves (``ingress_app``) answers every scoring POST on the
    hot path: FastAPI's app is never called for one (it is for everything else). Fails
    when the hot path is left out or a route is missing from it."""
    from gateway.http.routes import SCORING_ROUTES

    app = ingress_app(RewardService(AppConfig.model_validate(CONFIG), FakeTransport()))
    assert isinstance(app, HotPath)
    reached = []
    inner = app.app

    async def counting(scope, receive, send):
        reached.append(scope["path"])
        await inner(scope, receive, send)

    app.app = counting
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        for route in SCORING_ROUTES:
            await c.post(route.path, json={})
        assert reached == []
        await c.get("/health")
    assert reached == ["/health"]
