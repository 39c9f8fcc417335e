"""API-key auth as a FastAPI dependency (swap it in tests with ``app.dependency_overrides``).

Keys come from the gateway's config (``gateway.api_keys_env`` / ``api_keys_file``); with
none configured, auth is off. ``Authorization: Bearer <key>``, ``X-Api-Key: <key>``, or the
key as the URL path prefix ``/keys/<key>/...`` for clients that cannot send headers;
``/health`` and ``/metrics`` do not depend on it.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from gateway.core.errors import AuthenticationFailed, GatewayStarting
from gateway.core.service import RewardGateway

_bearer = HTTPBearer(auto_error=False, description="an rmgate API key")
_api_key = APIKeyHeader(name="X-Api-Key", auto_error=False, description="an rmgate API key")


def get_gateway(request: Request) -> RewardGateway:
    """The core of the replica serving this app (``app.state.gateway``)."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise GatewayStarting("the gateway is starting")
    return gateway


def check_api_key(token: str | None, keys: frozenset[str]) -> None:
    """401 unless ``token`` is one of ``keys`` (when any is configured)."""
    if keys and (not token or not any(hmac.compare_digest(token, k) for k in keys)):
        raise AuthenticationFailed()


#: Route prefix that carries the key in the URL path, for trainers whose reward clients
#: cannot send a header (verl's and OpenRLHF's): ``http://host:port/keys/<key>/get_reward``.
KEY_PATH_PREFIX = "/keys/{api_key}"


async def current_gateway(request: Request) -> RewardGateway:
    """``get_gateway`` as a dependency: async, so FastAPI calls it in the event loop instead
    of sending a sync function to its thread pool on every request."""
    return get_gateway(request)


async def require_api_key(request: Request, gateway: RewardGateway = Depends(current_gateway),
                          bearer: HTTPAuthorizationCredentials | None = Security(_bearer),
                          api_key: str | None = Security(_api_key)) -> None:
    """The key from the header, else from the ``/keys/<key>/`` path prefix."""
    token = bearer.credentials.strip() if bearer else api_key
    check_api_key(token or request.path_params.get("api_key"), gateway.api_keys)


def auth_dependencies(enabled: bool) -> list:
    """The routes' dependencies: the API-key check, or none when no key is configured (the
    check would pass every request anyway; FastAPI's dependency solving costs about a fifth
    of the ingress's own work per request: ``benchmarks/ingress_cpu.py``)."""
    return [Depends(require_api_key)] if enabled else []
