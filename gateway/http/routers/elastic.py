"""vLLM's sleep routes over a whole gateway: ``POST /sleep?level=1|2[&model=M]``, ``POST
/wake_up[?model=M]``, ``GET /is_sleeping[?model=M]``, with the meaning vLLM gives them, so
code that sleeps a vLLM server sleeps rmgate too (``gateway.core.elastic.control``).
Sleep and wake take an admin key when API keys are configured."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from gateway.core.service import RewardService
from gateway.http.auth import admin_gateway, auth_dependencies, current_gateway
from gateway.http.body import request_timeout

ModelParam = Annotated[str | None, Query(description="One model (default: every model).")]


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(tags=["ops"])

    @r.post("/sleep")
    async def sleep(
        level: Annotated[int, Query(ge=0, le=2)] = 1,
        model: ModelParam = None,
        gateway: RewardService = Depends(admin_gateway),
    ) -> JSONResponse:
        """Sleep every slot of ``model``: 1 frees the engine's memory keeping the weights in
        host memory, 2 drops them too (engines without sleep mode stop), 0 only pauses."""
        return JSONResponse(await gateway.elastic.sleep(model, level))

    @r.post("/wake_up")
    async def wake_up(
        model: ModelParam = None,
        gateway: RewardService = Depends(admin_gateway),
        timeout_s: float | None = Depends(request_timeout),
    ) -> JSONResponse:
        """Wake every slot of ``model``; each re-proves its numerics class before it serves."""
        return JSONResponse(await gateway.elastic.wake_up(model, gateway.deadline(timeout_s)))

    @r.get("/is_sleeping", dependencies=auth_dependencies(auth))
    async def is_sleeping(
        model: ModelParam = None, gateway: RewardService = Depends(current_gateway)
    ) -> JSONResponse:
        return JSONResponse(await gateway.elastic.is_sleeping(model))

    return r
