"""API-key auth as a FastAPI dependency (swap it in tests with ``app.dependency_overrides``).

Keys come from the gateway's config (``gateway.api_keys_env`` / ``api_keys_file``); with
none configured, auth is off. ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``;
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


async def require_api_key(gateway: RewardGateway = Depends(get_gateway),
                          bearer: HTTPAuthorizationCredentials | None = Security(_bearer),
                          api_key: str | None = Security(_api_key)) -> None:
    check_api_key(bearer.credentials.strip() if bearer else api_key, gateway.api_keys)
