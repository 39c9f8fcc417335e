"""The engine secret middleware (what vLLM's --api-key leaves open: /classify, /pooling)."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from deployments.engine.guard import EngineSecretMiddleware


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/classify")
    async def classify() -> dict:
        return {"ok": True}

    @app.get("/health")
    async def health() -> dict:
        return {}

    app.add_middleware(EngineSecretMiddleware, secret="s3cret")
    return app


@pytest.mark.parametrize(
    "headers,status",
    [
        ({}, 401),
        ({"Authorization": "Bearer nope"}, 401),
        ({"Authorization": "Basic s3cret"}, 401),
        ({"Authorization": "Bearer s3cret"}, 200),
        ({"authorization": "bearer s3cret"}, 200),
    ],
)
async def test_only_the_gateways_secret_passes(headers, status):
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app()), base_url="http://e"
    ) as c:
        r = await c.post("/classify", json={}, headers=headers)
        assert r.status_code == status
        if status == 401:
            assert "rmgate" in r.json()["error"]
        assert (await c.get("/health")).status_code == 200  # liveness stays open


def test_no_secret_refuses_to_start(monkeypatch):
    monkeypatch.delenv("RMGATE_ENGINE_SECRET", raising=False)
    with pytest.raises(RuntimeError, match="open"):
        EngineSecretMiddleware(_app())


def test_a_node_engine_plan_carries_the_guard_and_its_secret_only_in_the_environment():
    from deployments.engine.args import (
        ENGINE_GUARD,
        SLEEP_GATE,
        Platform,
        engine_headers,
        plan_engine,
    )
    from gateway.core.config.settings import ModelSpec
    from gateway.core.routing.engine_access import SlotInfo

    spec = ModelSpec(name="rm", kind="discriminative", model_path="/m", engine_host="node")
    plan = plan_engine(spec, Platform("cpu", "cpu"), port=9, host="10.0.0.7", secret="xyz")
    given = [plan.args[i + 1] for i, a in enumerate(plan.args) if a == "--middleware"]
    assert given == [SLEEP_GATE, ENGINE_GUARD]  # vLLM appends: the guard ends outermost
    assert "xyz" not in " ".join(plan.args) and plan.env["RMGATE_ENGINE_SECRET"] == "xyz"
    assert engine_headers(plan) == {"authorization": "Bearer xyz"}
    info = SlotInfo.from_endpoint(
        "rm", 0, {"url": "http://10.0.0.7:9", "mode": "serialize", "secret": "xyz"}
    )
    assert info.headers["authorization"] == "Bearer xyz" and "xyz" not in repr(info)
    loopback = plan_engine(
        ModelSpec(name="rm", kind="discriminative", model_path="/m"), Platform("cpu", "cpu"), port=9
    )
    assert "--middleware" not in loopback.args and engine_headers(loopback) == {}


def test_per_slot_actor_options_place_each_slot_by_its_index():
    from gateway.core.config.settings import ModelSpec

    spec = ModelSpec(
        name="rm",
        kind="discriminative",
        model_path="/m",
        ray_actor_options={"num_cpus": 1, "resources": {"rmgate": 0.01}},
        slot_ray_actor_options=[{"resources": {"nodeA": 0.01}}, {"resources": {"nodeB": 0.01}}],
    )
    assert spec.actor_options(0) == {"num_cpus": 1, "resources": {"rmgate": 0.01, "nodeA": 0.01}}
    assert spec.actor_options(1)["resources"] == {"rmgate": 0.01, "nodeB": 0.01}
    assert spec.actor_options(2) == spec.actor_options(0)  # wrapping: by index only
    plain = ModelSpec(name="rm", kind="discriminative", model_path="/m")
    assert plain.actor_options(5) == {"num_cpus": 0}
