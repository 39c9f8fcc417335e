"""The scoring endpoints, declared once: what FastAPI mounts and the hot path serves.

Each route names the ``RewardService`` method that answers it (raw body, the request's
deadline, its cache ask -> a typed result). ``gateway.http.app`` mounts every route on
FastAPI (with its request schema for the OpenAPI document); ``gateway.http.hot_path``
sends a POST to one of these paths straight to the same handler, in front of FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import Request

from gateway.core.api.schemas import (
    ChatCompletionRequest,
    ClassifyRequest,
    CompletionRequest,
    EmbeddingRequest,
    GetRewardRequest,
    RewardsRequest,
    SlimeRewardRequest,
)
from gateway.core.api.slime import SLIME_PATH
from gateway.core.service import RewardService
from gateway.http.auth import auth_dependencies
from gateway.http.errors import ERROR_RESPONSES
from gateway.http.handler import CoreCall, serve


@dataclass(frozen=True)
class ScoringRoute:
    """One scoring endpoint: its path, the service method that answers it, the request
    schema the OpenAPI document shows, its name and tag."""

    path: str
    #: The ``RewardService`` method that answers it.
    endpoint: CoreCall
    schema: type[BaseModel]
    tag: str
    description: str = ""

    @property
    def name(self) -> str:
        return self.endpoint.__name__

    def handler(self) -> Callable[[Request], Awaitable[Response]]:
        """The route function (FastAPI's and the hot path's)."""
        path, endpoint = self.path, self.endpoint

        async def answer(request: Request) -> Response:
            return await serve(request, path, endpoint)

        answer.__name__ = self.name
        return answer


SCORING_ROUTES: tuple[ScoringRoute, ...] = (
    ScoringRoute(
        "/v1/chat/completions", RewardService.chat_completions, ChatCompletionRequest, "generative"
    ),
    ScoringRoute("/v1/completions", RewardService.completions, CompletionRequest, "generative"),
    ScoringRoute("/classify", RewardService.classify, ClassifyRequest, "discriminative"),
    ScoringRoute("/pooling", RewardService.pooling, ClassifyRequest, "discriminative"),
    # SGLang serves a classifier's logits as its embedding; verl's SGLang reward path
    # reads data[-1].embedding[-1]: the DisRM's /classify score, same bits.
    ScoringRoute("/v1/embeddings", RewardService.embeddings, EmbeddingRequest, "discriminative"),
    ScoringRoute(
        "/v1/rewards",
        RewardService.rewards,
        RewardsRequest,
        "rewards",
        "One reward per item (prompt or messages, response, label), in item order.",
    ),
    ScoringRoute(
        "/get_reward",
        RewardService.get_reward,
        GetRewardRequest,
        "rewards",
        "OpenRLHF's remote reward protocol: query/prompts/labels -> rewards/scores.",
    ),
    ScoringRoute(
        SLIME_PATH,
        RewardService.slime_reward,
        SlimeRewardRequest,
        "rewards",
        "slime's remote reward model (--rm-type remote_rm): {prompt, response, label} -> "
        "the reward (a JSON number); a list of samples -> the list of rewards. Each sample "
        "is scored with gateway.default_reward_model in the group of its prompt.",
    ),
)


def body_doc(schema: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a handler that reads the raw body itself (size limit,
    bad JSON -> 400, schema -> 422, in ``gateway.core.api.parsing``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": schema.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    }


def scoring_router(auth: bool = True) -> APIRouter:
    """Every scoring route on FastAPI (the API-key check where keys are configured)."""
    router = APIRouter(dependencies=auth_dependencies(auth), responses=ERROR_RESPONSES)
    for route in SCORING_ROUTES:
        router.add_api_route(
            route.path,
            route.handler(),
            methods=["POST"],
            tags=[route.tag],
            name=route.name,
            openapi_extra=body_doc(route.schema),
            description=route.description,
        )
    return router
