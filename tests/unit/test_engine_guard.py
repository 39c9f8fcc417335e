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


@pytest.mark.parametrize("headers,status", [
    ({}, 401), ({"Authorization": "Bearer nope"}, 401), ({"Authorization": "Basic s3cret"}, 401),
    ({"Authorization": "Bearer s3cret"}, 200), ({"authorization": "bearer s3cret"}, 200)])
async def test_only_the_gateways_secret_passes(headers, status):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                 base_url="http://e") as c:
        r = await c.post("/classify", json={}, headers=headers)
        assert r.status_code == status
        if status == 401:
            assert "rmgate" in r.json()["error"]
        assert (await c.get("/health")).status_code == 200  # liveness stays open


def test_no_secret_refuses_to_start(monkeypatch):
    monkeypatch.delenv("RMGATE_ENGINE_SECRET", raising=False)
    with pytest.raises(RuntimeError, match="open"):
        EngineSecretMiddleware(_app())
