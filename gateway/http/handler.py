"""The one handler of every scoring endpoint: read the body, set the request's one
deadline, call the service, render the typed result (or the error), record the metrics.

A client that goes away cancels the handler: Ray Serve does it on both HTTP paths (its
direct ingress races the handler against ``http.disconnect`` and cancels it,
``ray/serve/_private/replica.py``; its Python proxy cancels the request), so the handler
does not listen a second time; it counts the cancellation, and the cancellation closes
the engine connections under it, which makes vLLM abort their requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from gateway.core.api.errors import RmgateError
from gateway.core.api.results import GatewayResult
from gateway.core.routing.deadline import Deadline
from gateway.core.service import RewardService
from gateway.http.auth import get_gateway
from gateway.http.body import cache_asked, on_sleep_asked, read_body, request_timeout
from gateway.http.errors import error_response
from gateway.http.headers import result_headers
from gateway.observability import metrics, tracing

#: (service, body, the request's deadline, what it asked of the cache: on/off/None)
CoreCall = Callable[[RewardService, bytes, Deadline, "bool | None"], Awaitable[GatewayResult]]

#: The status recorded for a request whose client left before its answer (nginx's
#: "client closed request"); nobody receives it.
CLIENT_CLOSED = 499


def render(result: GatewayResult) -> Response:
    return Response(
        result.body,
        status_code=result.status,
        headers=result_headers(result),
        media_type="application/json",
    )


def serve(request: Request, endpoint: str, call: CoreCall) -> Coroutine[Any, Any, Response]:
    """Answer one request; ``endpoint`` is the canonical path (keyed and sent to the
    engine), whatever route prefix the application is mounted under.

    Every edge reaches this one function (the hot path, FastAPI's routes, the direct
    port), so the request's server span starts here when tracing is on
    (``gateway.observability.tracing``); off, the untraced coroutine itself is returned."""
    if not tracing.ENABLED:
        return _serve(request, endpoint, call)
    return _traced(request, endpoint, call)


async def _traced(request: Request, endpoint: str, call: CoreCall) -> Response:
    """``_serve`` under the request's server span, a child of its ``traceparent``."""
    with tracing.server_span(endpoint, request.scope) as edge:
        response = await _serve(request, endpoint, call)
        edge.answered(response.status_code, response.headers, bytes(response.body))
        return response


async def _serve(request: Request, endpoint: str, call: CoreCall) -> Response:
    start = time.monotonic()
    model = ""
    try:
        gateway = get_gateway(request)
        # the request's one deadline, and what it does if its slot sleeps
        deadline = gateway.deadline(request_timeout(request), on_sleep_asked(request))
        raw = await read_body(request, gateway.config.gateway.max_body_bytes)
        result = await call(gateway, raw, deadline, cache_asked(request))
        model = result.model
        metrics.record_cache(model, result.routes)
        metrics.record_program(result)
        if result.seed_derived:
            metrics.SEEDS_DERIVED.labels(model).inc()
        for _, _, reason in result.placements:
            metrics.PLACED_AWAY.labels(model, reason).inc()
        response: Response = render(result)
    except RmgateError as err:
        model = err.routed.model if err.routed is not None else ""
        response = error_response(err)
    except asyncio.CancelledError:
        # Serve cancelled the handler: its client left (engine requests aborted, per slot)
        metrics.CLIENT_DISCONNECTS.labels(endpoint).inc()
        metrics.record_request(model, endpoint, CLIENT_CLOSED, time.monotonic() - start)
        raise
    metrics.record_request(model, endpoint, response.status_code, time.monotonic() - start)
    return response
