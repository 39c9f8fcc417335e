"""Reading what a request carries besides its JSON: the body under a size limit, and the
``x-rmgate-timeout`` and ``x-rmgate-on-sleep`` overrides."""

from __future__ import annotations

from fastapi import Request

from gateway.core.api.errors import BodyTooLarge, InvalidRequest, InvalidTimeout
from gateway.http.headers import (
    CACHE_HEADER,
    CACHE_OFF_VALUES,
    ON_SLEEP_HEADER,
    ON_SLEEP_VALUES,
    TIMEOUT_HEADER,
)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything larger than ``limit`` bytes early."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def request_timeout(request: Request) -> float | None:
    """The ``x-rmgate-timeout`` override in seconds (the core caps it at the configured
    ``request_timeout_s``); None when absent."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise InvalidTimeout(f"{TIMEOUT_HEADER} must be a positive number of seconds")
    return value


def on_sleep_asked(request: Request) -> str | None:
    """``x-rmgate-on-sleep: wake|wait|refuse``: what this request does if its slot sleeps
    (else its model's ``on_sleep``)."""
    value = request.headers.get(ON_SLEEP_HEADER)
    if value is None:
        return None
    value = value.strip().lower()
    if value not in ON_SLEEP_VALUES:
        raise InvalidRequest(f"{ON_SLEEP_HEADER} must be one of {sorted(ON_SLEEP_VALUES)}")
    return value


def cache_asked(request: Request) -> bool | None:
    """What the request asks of the ledger's cache: ``x-rmgate-cache: off`` (also
    ``no-cache``, ``bypass``) False: an engine's answer, not the ledger's (``rmgate check``,
    ``rmgate ledger replay`` and the benchmarks send it); ``on`` True; anything else, or
    nothing, None: the gateway's ``cache`` setting decides
    (``gateway.core.ledger_policy.reuse``)."""
    value = request.headers.get(CACHE_HEADER, "").strip().lower()
    if value in CACHE_OFF_VALUES:
        return False
    return True if value == "on" else None
