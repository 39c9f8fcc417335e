"""Errors at the HTTP edge: every ``RmgateError`` (and FastAPI's own 404/405/422) becomes
OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with a JSON content type and a
string ``code``, in one place. ``ErrorResponse`` documents that shape in the OpenAPI schema.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.core.api.errors import (
    InternalError,
    InvalidSchema,
    MethodNotAllowed,
    RmgateError,
    RouteNotFound,
    validation_message,
)
from gateway.http.headers import result_headers
from gateway.observability import metrics

logger = logging.getLogger("rmgate")


class ErrorInfo(BaseModel):
    message: str = Field(description="What went wrong, for a person.")
    type: str = Field(description="OpenAI's error type (invalid_request_error, ...).")
    param: str | None = Field(default=None, description="The request field at fault.")
    code: str = Field(description="rmgate's error code (model_not_found, queue_full, ...).")


class ErrorResponse(BaseModel):
    """The body of every non-200 answer."""

    error: ErrorInfo


#: Statuses each engine endpoint can answer besides 200 (for the OpenAPI document).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "bad JSON, unknown parameter combination, or the engine's own 4xx"),
        (401, "missing or invalid API key (when auth is on)"),
        (404, "unknown model"),
        (413, "body over gateway.max_body_bytes"),
        (422, "wrong types"),
        (502, "the engine failed"),
        (503, "slot queue full or slot unavailable (Retry-After)"),
        (504, "the engine did not answer in time"),
    )
}


def error_response(err: RmgateError) -> JSONResponse:
    """``err`` as the JSON answer, with what was decided before it failed in headers."""
    headers = {**(result_headers(err.routed) if err.routed is not None else {}), **err.headers}
    return JSONResponse(err.body(), status_code=err.http_status, headers=headers)


def unexpected_error(path: str, exc: Exception) -> JSONResponse:
    """A failure no layer expected: logged with its traceback, answered as a 500 in the
    same shape as every other error."""
    logger.exception("unexpected error on %s", path, exc_info=exc)
    return error_response(InternalError(f"internal error: {type(exc).__name__}: {exc}"))


def _http_error(exc: StarletteHTTPException) -> RmgateError:
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404:
        return RouteNotFound(detail)
    if exc.status_code == 405:
        return MethodNotAllowed(detail)
    err = RmgateError(detail, headers=getattr(exc, "headers", None) or {})
    err.status = exc.status_code  # type: ignore[misc]  # an instance-level status, rare
    err.code = f"http_{exc.status_code}"  # type: ignore[misc]
    return err


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app can produce becomes ``{"error": {...}}`` (never an HTML page)."""

    def _answer(request: Request, err: RmgateError) -> JSONResponse:
        response = error_response(err)
        route = request.scope.get("route")  # None for unknown paths: no label per path
        if route is not None:
            metrics.record_request("", getattr(route, "path", ""), response.status_code, None)
        return response

    @app.exception_handler(RmgateError)
    async def _rmgate_error(request: Request, exc: RmgateError) -> JSONResponse:
        return _answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _answer(request, InvalidSchema(validation_message(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _answer(request, _http_error(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover
        response = unexpected_error(request.url.path, exc)
        route = request.scope.get("route")
        if route is not None:
            metrics.record_request("", getattr(route, "path", ""), response.status_code, None)
        return response
