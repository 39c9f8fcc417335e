"""OpenAI-style JSON errors and the status each failure maps to (DESIGN.md §3).

Trainers react to the status: verl retries 5xx and never 4xx, OpenRLHF retries everything
then drops the reward. So bad input must be a 4xx (never a 500), an engine's 4xx is passed
through with its status, and only gateway/engine trouble is a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "bad_gateway_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A failure with a definite HTTP status and a message meant for the caller."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"),
                      "param": param, "code": code if code is not None else status}}


def error_response(err: GatewayError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.code, err.param),
                        status_code=err.status, headers={**err.headers, **(extra_headers or {})})


def engine_error_message(raw: bytes) -> str:
    """The message inside an engine's error body, whatever shape vLLM gave it."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:2000]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in data:
            return json.dumps(data["detail"])[:2000]
    return json.dumps(data)[:2000]


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:10]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app can produce becomes ``{"error": {...}}`` with a JSON content type."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(422, _validation_message(exc), "invalid_schema"),
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return JSONResponse(error_body(exc.status_code, msg), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:  # pragma: no cover
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}",
                                       "internal_error"), status_code=500)
