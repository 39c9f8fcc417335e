"""The scoring endpoints' hot path: a POST to ``/classify``, ``/v1/chat/completions``,
``/v1/rewards``, ``/get_reward`` (and the other engine-shaped endpoints) goes straight to
its route function, in front of FastAPI.

FastAPI's middleware stack, routing (a regex per route until one matches) and dependency
solving cost about a tenth of the ingress's CPU per request (py-spy,
``benchmarks/ingress_stack.py``), for endpoints that read their raw body themselves and
need none of it. The route functions are the same ones FastAPI mounts
(``routers.common.handler``), so answers, errors, headers and metrics are the same; the
API-key check is the same function (``auth.check_api_key``). Everything else (other
methods and paths, ``/keys/<key>/...``, the docs, ``/metrics``) goes through FastAPI.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette._utils import get_route_path

from gateway.core.errors import InternalError, RmgateError
from gateway.http.auth import check_api_key, get_gateway
from gateway.http.errors import error_response
from gateway.http.routers import engine, rewards
from gateway.http.routers.common import handler
from gateway.observability import metrics

logger = logging.getLogger("ray.serve")

Route = Callable[[Request], Awaitable[Response]]


def hot_routes() -> dict[str, Route]:
    """path -> route function of every scoring endpoint."""
    out = {path: handler(path, call) for path, _, call, _ in engine.ENDPOINTS}
    out.update({path: handler(path, call) for path, _, call, _, _ in rewards.ENDPOINTS})
    return out


def api_key_of(request: Request) -> str | None:
    """``Authorization: Bearer <key>`` or ``X-Api-Key: <key>`` (as ``auth.require_api_key``)."""
    value = request.headers.get("authorization")
    if value:
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return request.headers.get("x-api-key")


class HotPath:
    """ASGI app: the scoring endpoints' POSTs to their route functions, the rest to ``app``."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.hot = hot_routes()

    def __getattr__(self, name: str) -> Any:
        """The FastAPI app's own attributes (``routes``, ``state``, exception handlers):
        Serve reads them from the app it is given."""
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.hot.get(get_route_path(scope)) if (
            scope["type"] == "http" and scope["method"] == "POST") else None
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what FastAPI sets: request.app.state holds the gateway
        request = Request(scope, receive)
        try:
            check_api_key(api_key_of(request), get_gateway(request).api_keys)
            response = await route(request)
        except RmgateError as err:  # refused before the route ran (auth, starting)
            response = error_response(err)
            metrics.record_request("", get_route_path(scope), response.status_code, None)
        except Exception as exc:  # noqa: BLE001 (what FastAPI's handler would turn into a 500)
            logger.exception("unexpected error on %s", get_route_path(scope))
            response = error_response(InternalError(
                f"internal error: {type(exc).__name__}: {exc}"))
        await response(scope, receive, send)
