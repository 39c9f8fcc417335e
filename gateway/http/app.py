"""The HTTP surface: a FastAPI app over one ``RewardService``.

``create_app(gateway)`` assembles the routers (scoring from ``routes``, the ledger, ops), the error
handlers and auth; the gateway lives in ``app.state.gateway`` (no module globals). It works
without Ray: unit tests drive it with a fake transport, and the Serve ingress
(``gateway.serve.app``) builds it inside its replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI

from gateway.core.service import RewardService
from gateway.http.auth import KEY_PATH_PREFIX
from gateway.http.errors import install_error_handlers
from gateway.http.hot_path import HotPath
from gateway.http.routers import audit, elastic, ops
from gateway.http.routers import ledger as ledger_routes
from gateway.http.routes import scoring_router

VERSION = "0.1.0"


def create_app(
    gateway: RewardService | None = None,
    background: Sequence[Callable[[], Awaitable[Any]]] = (),
    ledger: Any = None,
    auditor: Any = None,
) -> FastAPI:
    """The ingress app; without ``gateway`` it answers 503 until one is installed.
    ``background`` coroutines (the canary, the ledger's writer) run while the app runs,
    cancelled at shutdown (the ledger flushes then). ``ledger`` answers
    ``GET /v1/ledger/{receipt}``, ``auditor`` ``/v1/audit``."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.ensure_future(job()) for job in background]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(
        title="rmgate",
        version=VERSION,
        lifespan=lifespan,
        description="Deterministic reward-model gateway: the same request body "
        "gives the same reward bits.",
    )
    app.state.gateway = gateway
    app.state.ledger = ledger
    app.state.auditor = auditor
    install_error_handlers(app)
    # the API-key check only where a key is configured (a gateway installed later: always)
    auth = gateway is None or bool(gateway.api_keys)
    for make in (scoring_router, ledger_routes.router, ops.router, elastic.router, audit.router):
        app.include_router(make(auth))
        # the same routes under /keys/<key>/ (auth for clients that cannot send a header)
        app.include_router(make(auth), prefix=KEY_PATH_PREFIX, include_in_schema=False)
    return app


def ingress_app(
    gateway: RewardService | None = None,
    background: Sequence[Callable[[], Awaitable[Any]]] = (),
    ledger: Any = None,
    auditor: Any = None,
) -> HotPath:
    """What an ingress replica serves: the app of ``create_app`` behind the scoring
    endpoints' hot path (``gateway.http.hot_path``)."""
    return HotPath(create_app(gateway, background, ledger, auditor))
