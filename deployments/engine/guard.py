"""The engine's own door: every request but ``/health`` needs the slot's secret.

vLLM's ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and
``/cohere`` (``vllm/entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX``): a DisRM
engine's ``/classify`` and ``/pooling``, ``/tokenize`` and, in dev mode, ``/collective_rpc``
stay open. An engine that listens on its node's address (multi-node: the ingress is on
another node) must refuse every caller but the gateway, so rmgate adds this middleware with
vLLM's own ``--middleware`` option. It reads the secret from ``RMGATE_ENGINE_SECRET`` (set
in the engine's environment by its slot replica, never on the command line, where ``ps``
would show it) and compares ``Authorization: Bearer <secret>`` in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

SECRET_ENV = "RMGATE_ENGINE_SECRET"
#: Paths anyone may call: Serve's and the launcher's liveness checks.
OPEN_PATHS = frozenset({"/health"})

Scope = dict[str, Any]
ASGIApp = Callable[
    [Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]


class EngineSecretMiddleware:
    """Pure ASGI middleware (vLLM adds it with ``app.add_middleware(cls)``)."""

    def __init__(self, app: ASGIApp, secret: str | None = None) -> None:
        self.app = app
        secret = secret if secret is not None else os.environ.get(SECRET_ENV, "")
        if not secret:
            raise RuntimeError(f"{SECRET_ENV} is not set: the engine would be open")
        self._digest = hashlib.sha256(secret.encode()).digest()

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self._digest
                )
        return False

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[..., Awaitable[Any]],
        send: Callable[..., Awaitable[Any]],
    ) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or scope["path"] in OPEN_PATHS
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"error": "Unauthorized: this engine answers only its rmgate gateway"}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
