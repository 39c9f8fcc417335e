"""Trainer-facing scoring: ``/v1/rewards`` (rmgate's own) and ``/get_reward`` (OpenRLHF)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.core.rewards import GetRewardRequest, RewardScorer, RewardsRequest
from gateway.http.auth import auth_dependencies
from gateway.http.errors import ERROR_RESPONSES
from gateway.http.routers.common import CoreCall, handler
from gateway.http.routers.engine import body_doc


#: (path, request schema, core call, route name, description) of the trainer-facing endpoints.
ENDPOINTS: tuple[tuple[str, type, CoreCall, str, str], ...] = (
    ("/v1/rewards", RewardsRequest,
     lambda gw, raw, t, cache: RewardScorer(gw, t, cache).rewards(raw), "rewards",
     "One reward per item (prompt or messages, response, label), in item order."),
    ("/get_reward", GetRewardRequest,
     lambda gw, raw, t, cache: RewardScorer(gw, t, cache).get_reward(raw), "get_reward",
     "OpenRLHF's remote reward protocol: query/prompts/labels -> rewards/scores."),
)


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(dependencies=auth_dependencies(auth), responses=ERROR_RESPONSES,
                  tags=["rewards"])
    for path, schema, call, name, doc in ENDPOINTS:
        r.add_api_route(path, handler(path, call), methods=["POST"], name=name,
                        openapi_extra=body_doc(schema), description=doc)
    return r
