"""The HTTP surface (DESIGN.md §3): a FastAPI app, served by Ray Serve as the ingress.

The app reads raw bodies itself (size limit, bad JSON -> 400, schema -> 422) and hands
them to ``RewardGateway``; the OpenAPI document still shows each endpoint's schema.
``create_app`` works without Ray, so unit tests drive it with a fake transport.
"""

from __future__ import annotations

import hmac
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.observability import metrics
from gateway.transport import slot_transport as routing
from gateway.http.errors import GatewayError, error_response, install_error_handlers
from gateway.core.protocols import ChatCompletionRequest, ClassifyRequest, CompletionRequest
from gateway.core.rewards import GetRewardRequest, RewardScorer, RewardsRequest
from gateway.core.service import GatewayResponse, RewardGateway


_CURRENT: dict[str, RewardGateway] = {}


def set_current_gateway(gateway: RewardGateway) -> None:
    """Install the replica's gateway core. A module-level function on purpose: Ray pickles
    the ingress class by value, so state must live in an importable module, not in globals
    captured with the class."""
    _CURRENT["gateway"] = gateway


def current_gateway() -> RewardGateway:
    try:
        return _CURRENT["gateway"]
    except KeyError:
        raise GatewayError(503, "the gateway is starting", "starting",
                           headers={"Retry-After": "1"}) from None


def _body_doc(schema: type) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything larger than ``limit`` bytes early."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"request body is {declared} bytes; the limit is {limit}",
                           "body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"request body exceeds the limit of {limit} bytes",
                               "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


OPEN_PATHS = frozenset({"/health", "/metrics"})
TIMEOUT_HEADER = "x-rmgate-timeout"


def check_api_key(request: Request, keys: frozenset[str]) -> None:
    """401 unless the request carries one of ``keys`` (when any is configured)."""
    if not keys:
        return
    auth = request.headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    if not token or not any(hmac.compare_digest(token, k) for k in keys):
        raise GatewayError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                           "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def request_timeout(request: Request, limit: float) -> float | None:
    """The ``x-rmgate-timeout`` override in seconds (capped at the configured timeout)."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise GatewayError(400, f"{TIMEOUT_HEADER} must be a positive number of seconds",
                           "invalid_timeout")
    return min(value, limit)


def _to_response(result: GatewayResponse) -> Response:
    return Response(result.body, status_code=result.status, headers=result.headers,
                    media_type="application/json")


def create_app(get_gateway: Callable[[], RewardGateway] = current_gateway) -> FastAPI:
    """The ingress app; ``get_gateway`` returns the core of the replica serving it."""
    app = FastAPI(title="rmgate", version="0.1.0",
                  description="Deterministic reward-model gateway: the same request body "
                              "gives the same reward bits.")
    install_error_handlers(app)

    async def _handle(request: Request, call: Callable, endpoint: str) -> Response:
        # ``endpoint`` is the canonical path (keyed and sent to the engine), whatever
        # route prefix the application is mounted under.
        start = time.monotonic()
        try:
            gw = get_gateway()
            check_api_key(request, gw.api_keys)
            # Through the module, not a name bound here: Ray pickles this closure, and a
            # ContextVar cannot be pickled.
            token = routing.REQUEST_TIMEOUT_S.set(
                request_timeout(request, gw.config.gateway.request_timeout_s))
            try:
                raw = await read_body(request, gw.config.gateway.max_body_bytes)
                response = _to_response(await call(gw, endpoint, raw))
            finally:
                routing.REQUEST_TIMEOUT_S.reset(token)
        except GatewayError as err:
            response = error_response(err)
        model = response.headers.get("x-rmgate-model", "")
        metrics.REQUESTS.labels(model, endpoint, str(response.status_code)).inc()
        metrics.REQUEST_SECONDS.labels(model, endpoint).observe(time.monotonic() - start)
        return response

    def _route(endpoint: str, call: Callable) -> Callable:
        async def route(request: Request) -> Response:
            return await _handle(request, call, endpoint)
        return route

    for path, schema, call, tag in (
        ("/v1/chat/completions", ChatCompletionRequest, RewardGateway.generate, "generative"),
        ("/v1/completions", CompletionRequest, RewardGateway.generate, "generative"),
        ("/classify", ClassifyRequest, RewardGateway.pool, "discriminative"),
        ("/pooling", ClassifyRequest, RewardGateway.pool, "discriminative"),
    ):
        app.add_api_route(path, _route(path, call), methods=["POST"], tags=[tag],
                          openapi_extra=_body_doc(schema), name=path.strip("/").replace("/", "_"))

    @app.post("/v1/rewards", openapi_extra=_body_doc(RewardsRequest), tags=["rewards"])
    async def rewards(request: Request) -> Response:
        """One reward per item (prompt or messages, response, label), in item order."""
        return await _handle(request, lambda gw, p, raw: RewardScorer(gw).rewards(p, raw),
                             "/v1/rewards")

    @app.post("/get_reward", openapi_extra=_body_doc(GetRewardRequest), tags=["rewards"])
    async def get_reward(request: Request) -> Response:
        """OpenRLHF's remote reward protocol: query/prompts/labels -> rewards/scores."""
        return await _handle(request, lambda gw, p, raw: RewardScorer(gw).get_reward(p, raw),
                             "/get_reward")

    @app.get("/v1/models", tags=["ops"])
    async def models(request: Request) -> JSONResponse:
        gw = get_gateway()
        check_api_key(request, gw.api_keys)
        return JSONResponse((await gw.models()).model_dump())

    @app.get("/metrics", tags=["ops"])
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/health", tags=["ops"])
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app
