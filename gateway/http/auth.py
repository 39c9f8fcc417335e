"""API keys: the one parser of a request's key, and the check both HTTP paths make.

Keys come from the gateway's config (``gateway.api_keys_env`` / ``api_keys_file``); with
none configured, auth is off. ``Authorization: Bearer <key>``, ``X-Api-Key: <key>``, or the
key as the URL path prefix ``/keys/<key>/...`` for clients that cannot send headers;
``/health`` and ``/metrics`` do not depend on it. FastAPI's routes check it as a
dependency (``require_api_key``); the hot path calls ``check_request`` itself.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Depends, Request

from gateway.core.api.errors import AdminRequired, AuthenticationFailed, GatewayStarting
from gateway.core.service import RewardService

#: Route prefix that carries the key in the URL path, for trainers whose reward clients
#: cannot send a header (verl's and OpenRLHF's): ``http://host:port/keys/<key>/get_reward``.
KEY_PATH_PREFIX = "/keys/{api_key}"


def get_gateway(request: Request) -> RewardService:
    """The core of the replica serving this app (``app.state.gateway``)."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise GatewayStarting("the gateway is starting")
    return gateway


def api_key_of(request: Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>``, else ``X-Api-Key``,
    else the ``/keys/<key>/`` path prefix (FastAPI's routes under it only)."""
    value = request.headers.get("authorization")
    if value:
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return request.headers.get("x-api-key") or request.path_params.get("api_key")


def check_api_key(token: str | None, keys: frozenset[str]) -> None:
    """401 unless ``token`` is one of ``keys`` (when any is configured)."""
    if keys and (not token or not any(hmac.compare_digest(token, k) for k in keys)):
        raise AuthenticationFailed()


def _is_one_of(token: str | None, keys: frozenset[str]) -> bool:
    return bool(token) and any(hmac.compare_digest(token or "", k) for k in keys)


async def admin_gateway(request: Request) -> RewardService:
    """The replica's service, for a route that changes the deployment (sleep, wake): with
    API keys configured, only an admin key (``gateway.admin_api_keys_env``) passes; a user
    key is refused with 403, anything else with 401. Without keys, auth is off."""
    gateway = get_gateway(request)
    if not gateway.api_keys and not gateway.admin_keys:
        return gateway
    token = api_key_of(request)
    if _is_one_of(token, gateway.admin_keys):
        return gateway
    if _is_one_of(token, gateway.api_keys):
        raise AdminRequired(
            "this route changes the deployment: it takes an admin key "
            "(gateway.admin_api_keys_env), not an API key"
        )
    raise AuthenticationFailed()


def check_request(request: Request) -> RewardService:
    """The replica's service, once ``request`` carries one of its keys (if it has any; an
    admin key is one of them too)."""
    gateway = get_gateway(request)
    if gateway.api_keys:
        check_api_key(api_key_of(request), gateway.api_keys | gateway.admin_keys)
    return gateway


async def current_gateway(request: Request) -> RewardService:
    """``get_gateway`` as a dependency: async, so FastAPI calls it in the event loop instead
    of sending a sync function to its thread pool on every request."""
    return get_gateway(request)


async def require_api_key(request: Request) -> None:
    """The API-key check as a FastAPI dependency."""
    check_request(request)


def auth_dependencies(enabled: bool) -> list[Any]:
    """The routes' dependencies: the API-key check, or none when no key is configured (the
    check would pass every request anyway; FastAPI's dependency solving costs about a fifth
    of the ingress's own work per request: ``benchmarks/ingress_cpu.py``)."""
    return [Depends(require_api_key)] if enabled else []
