"""rmgate's error vocabulary: one exception per failure a caller can see.

Each class carries its HTTP status and a string ``code`` as class attributes, so the status
is chosen once, here, and not at every raise site; the HTTP layer (``gateway.http.errors``)
renders any of them as OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
Trainers react to the status: verl retries 5xx and never 4xx, OpenRLHF retries everything
and then drops the reward. So bad input is a 4xx (never a 500), an engine's own 4xx passes
through with its status, and only gateway or engine trouble is a 5xx.

Framework-free (no FastAPI): the core raises these, every layer above may catch them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from gateway.core.api.results import GatewayResult

#: OpenAI's ``type`` per status.
ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "bad_gateway_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class RmgateError(Exception):
    """A failure with a definite status and a message meant for the caller.

    ``routed`` holds what was decided before the failure (model, key, slots, seed), so the
    HTTP layer can still say which slot refused; ``headers`` adds transport headers such as
    ``Retry-After``.
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    #: ``Retry-After`` seconds for statuses a client should retry (503).
    retry_after: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        routed: GatewayResult | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.routed = routed
        self.headers: dict[str, str] = dict(headers or {})
        if self.retry_after is not None:
            self.headers.setdefault("Retry-After", self.retry_after)

    @property
    def http_status(self) -> int:
        return self.status

    @property
    def error_type(self) -> str:
        return ERROR_TYPES.get(self.http_status, "api_error")

    def for_item(self, index: int) -> RmgateError:
        """The same error, its message naming the batch item that caused it."""
        self.message = f"item {index}: {self.message}"
        self.args = (self.message,)
        return self

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


# ---- 4xx: the request ---------------------------------------------------------------------
class InvalidJSON(RmgateError):
    status, code = 400, "invalid_json"


class InvalidRequest(RmgateError):
    status, code = 400, "invalid_request"


class InvalidSchema(RmgateError):
    status, code = 422, "invalid_schema"


class BodyTooLarge(RmgateError):
    status, code = 413, "body_too_large"


class AuthenticationFailed(RmgateError):
    status, code = 401, "invalid_api_key"

    def __init__(
        self, message: str = "missing or invalid API key (Authorization: Bearer <key>)", **kw: Any
    ) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"}, **kw)


class AdminRequired(RmgateError):
    """A valid API key that is not an admin key, on a route that changes the deployment."""

    status, code = 403, "admin_required"


class ModelNotFound(RmgateError):
    status, code = 404, "model_not_found"


class WrongModelKind(RmgateError):
    status, code = 400, "wrong_model_kind"


class ModelRequired(RmgateError):
    status, code = 400, "model_required"


class SeedRequired(RmgateError):
    status, code = 400, "seed_required"


class StreamUnsupported(RmgateError):
    status, code = 400, "stream_unsupported"


class InvalidTimeout(RmgateError):
    status, code = 400, "invalid_timeout"


class InvalidSlotCounts(RmgateError):
    """A scale request (``user_config`` slots, ``rmgate scale``) that cannot be applied."""

    status, code = 400, "invalid_slot_counts"


class ReceiptNotFound(RmgateError):
    status, code = 404, "receipt_not_found"


class LedgerOff(RmgateError):
    status, code = 404, "ledger_off"


class RewardComponentFailed(RmgateError):
    """A reward program's component failed for an item (a rule check that timed out,
    crashed or raised; a judge answer without a score) under ``on_failure: error``, or
    every component failed. Retrying the same item fails the same way."""

    status, code = 422, "reward_component_failed"


class RouteNotFound(RmgateError):
    status, code = 404, "not_found"


class MethodNotAllowed(RmgateError):
    status, code = 405, "method_not_allowed"


class EngineRejected(RmgateError):
    """The engine's own 4xx (e.g. vLLM's 400 for ``max_tokens: -1``), passed through with
    its status: the caller sent something the engine refuses, retrying cannot help."""

    status, code = 400, "engine_rejected"

    def __init__(self, message: str, *, engine_status: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.engine_status = engine_status

    @property
    def http_status(self) -> int:
        return self.engine_status


# ---- 5xx: the gateway or the engine ---------------------------------------------------------
class InternalError(RmgateError):
    status, code = 500, "internal_error"


class GatewayStarting(RmgateError):
    status, code, retry_after = 503, "starting", "1"


class QueueFull(RmgateError):
    """A slot's waiting room is full: refuse now rather than hoard work (503 + Retry-After)."""

    status, code, retry_after = 503, "queue_full", "1"


class SlotUnavailable(RmgateError):
    """A slot's engine stayed unreachable for the whole wait."""

    status, code, retry_after = 503, "slot_unavailable", "5"


class SlotRemoved(SlotUnavailable):
    """The slot was scaled away while a request was bound for it; the core routes the
    request again under the new slot count (its key's slot there, not a failover)."""

    code, retry_after = "slot_removed", "1"


class SlotClassChanged(SlotRemoved):
    """A slot the placement chose now reports another numerics class (it restarted with
    other numerics, or the canary drained it): answering there could change bits, so the
    core places the request again under the slots' current classes."""

    code = "slot_class_changed"


class ModelAsleep(SlotUnavailable):
    """The model's slot sleeps and its ``on_sleep`` is ``refuse``: wake it (``POST
    /wake_up``) or come back later."""

    code, retry_after = "model_asleep", "10"


class Rescaling(SlotUnavailable):
    """A request kept landing on slots that scaling removed under it."""

    code, retry_after = "slot_unavailable", "1"


class EngineFailed(RmgateError):
    """The engine answered 5xx (after retries): 502, never a 500 of the gateway's own."""

    status, code = 502, "engine_error"


class ScoreUnreadable(RmgateError):
    """An engine answered 200 without what the model's scorer reads (a judge's answer
    without the label log-probabilities it was asked for)."""

    status, code = 502, "score_unreadable"


class RuleCheckFailed(RmgateError):
    """A rule check did not give a value: ``reason`` is ``timeout`` (ended at its
    ``timeout_s``), ``crashed`` (its worker process died) or ``error`` (it raised). Only
    ever a component's failure, reported per item."""

    status, code = 422, "rule_check_failed"

    def __init__(self, message: str, *, reason: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason


class DeadlineExceeded(RmgateError):
    """The request's deadline (``x-rmgate-timeout`` or ``gateway.request_timeout_s``)
    passed before it was answered, wherever it was: waiting at a slot's gate, in an engine,
    backing off, or on another candidate. Safe to retry (every request is idempotent)."""

    status, code = 504, "deadline_exceeded"


def validation_message(errors: Iterable[Mapping[str, Any]], limit: int = 10) -> str:
    """One line per schema error, ``loc: msg`` (the leading ``body`` of FastAPI's locations
    dropped), for pydantic's and FastAPI's validation errors alike."""
    parts = []
    for n, e in enumerate(errors):
        if n >= limit:
            break
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg')}")
    return "; ".join(parts) or "invalid request"


def engine_error_message(raw: bytes) -> str:
    """The message inside an engine's error body, whatever shape vLLM gave it."""
    import json

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
