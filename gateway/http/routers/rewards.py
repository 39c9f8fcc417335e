"""Trainer-facing scoring: ``/v1/rewards`` (rmgate's own) and ``/get_reward`` (OpenRLHF)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.core.rewards import GetRewardRequest, RewardScorer, RewardsRequest
from gateway.http.auth import auth_dependencies
from gateway.http.errors import ERROR_RESPONSES
from gateway.http.routers.common import serve
from gateway.http.routers.engine import body_doc


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(dependencies=auth_dependencies(auth), responses=ERROR_RESPONSES,
                  tags=["rewards"])

    @r.post("/v1/rewards", openapi_extra=body_doc(RewardsRequest))
    async def rewards(request: Request) -> Response:
        """One reward per item (prompt or messages, response, label), in item order."""
        return await serve(request, "/v1/rewards",
                           lambda gw, raw, t, cache: RewardScorer(gw, t, cache).rewards(raw))

    @r.post("/get_reward", openapi_extra=body_doc(GetRewardRequest))
    async def get_reward(request: Request) -> Response:
        """OpenRLHF's remote reward protocol: query/prompts/labels -> rewards/scores."""
        return await serve(request, "/get_reward",
                           lambda gw, raw, t, cache: RewardScorer(gw, t, cache).get_reward(raw))

    return r
