"""vLLM-shaped endpoints: ``/v1/chat/completions``, ``/v1/completions`` (GRM) and
``/classify``, ``/pooling``, ``/v1/embeddings`` (DisRM). The app reads raw bodies itself
(size limit, bad JSON -> 400, schema -> 422, in ``gateway.core.requests``); the OpenAPI
document still shows each endpoint's request schema and the error model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.core.protocols import (ChatCompletionRequest, ClassifyRequest, CompletionRequest,
                                    EmbeddingRequest)
from gateway.core.service import RewardGateway
from gateway.http.auth import auth_dependencies
from gateway.http.errors import ERROR_RESPONSES
from gateway.http.routers.common import CoreCall, handler


def body_doc(schema: type) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a handler that reads the raw body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": schema.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def _generate(path: str) -> CoreCall:
    return lambda gw, raw, deadline, cache: gw.generate(path, raw, deadline, cache)


def _pool(path: str) -> CoreCall:
    return lambda gw, raw, deadline, cache: gw.pool(path, raw, deadline, cache)


#: (path, request schema, core call, tag) of every engine-shaped endpoint.
ENDPOINTS: tuple[tuple[str, type, CoreCall, str], ...] = (
    ("/v1/chat/completions", ChatCompletionRequest, _generate("/v1/chat/completions"),
     "generative"),
    ("/v1/completions", CompletionRequest, _generate("/v1/completions"), "generative"),
    ("/classify", ClassifyRequest, _pool("/classify"), "discriminative"),
    ("/pooling", ClassifyRequest, _pool("/pooling"), "discriminative"),
    # SGLang serves a classifier's logits as its embedding; verl's SGLang reward path
    # reads data[-1].embedding[-1]: the DisRM's /classify score, same bits.
    ("/v1/embeddings", EmbeddingRequest, lambda gw, raw, t, cache: gw.embed(raw, t, cache), "discriminative"),
)


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(dependencies=auth_dependencies(auth), responses=ERROR_RESPONSES)
    for path, schema, call, tag in ENDPOINTS:
        r.add_api_route(path, handler(path, call), methods=["POST"], tags=[tag],
                        openapi_extra=body_doc(schema),
                        name=path.strip("/").replace("/", "_"))
    return r


__all__ = ["router", "ENDPOINTS", "body_doc", "RewardGateway"]
