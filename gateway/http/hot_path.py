"""The scoring endpoints' hot path: a POST to one of ``gateway.http.routes``'
``SCORING_ROUTES`` goes straight to its route function, in front of FastAPI.

FastAPI's middleware stack, routing (a regex per route until one matches) and dependency
solving cost about a tenth of the ingress's CPU per request (py-spy,
``benchmarks/ingress_stack.py``), for endpoints that read their raw body themselves and
need none of it. The route functions are the ones FastAPI mounts (the same table), the
API-key check is the same (``auth.check_request``), errors render the same way
(``errors.error_response``), so answers, errors, headers and metrics are the same.
Everything else (other methods and paths, ``/keys/<key>/...``, the docs, ``/metrics``)
goes through FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette._utils import get_route_path

from gateway.core.api.errors import RmgateError
from gateway.http.auth import check_request
from gateway.http.errors import error_response, unexpected_error
from gateway.http.routes import SCORING_ROUTES
from gateway.observability import metrics

logger = logging.getLogger("ray.serve")

RouteFunction = Callable[[Request], Awaitable[Response]]


def hot_routes() -> dict[str, RouteFunction]:
    """path -> route function of every scoring endpoint."""
    return {route.path: route.handler() for route in SCORING_ROUTES}


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
        route = (
            self.hot.get(get_route_path(scope))
            if (scope["type"] == "http" and scope["method"] == "POST")
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what FastAPI sets: request.app.state holds the gateway
        request = Request(scope, receive)
        try:
            check_request(request)
            response = await route(request)
        except RmgateError as err:  # refused before the route ran (auth, starting)
            response = error_response(err)
            metrics.record_request("", get_route_path(scope), response.status_code, None)
        except Exception as exc:  # noqa: BLE001 (what FastAPI's handler would turn into a 500)
            response = unexpected_error(get_route_path(scope), exc)
        await response(scope, receive, send)
