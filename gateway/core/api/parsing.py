"""From raw request bytes to a checked JSON object: the 400s and 422s of every endpoint.

One place decides what a bad body is: empty, not UTF-8, not JSON (NaN and Infinity
included: they would not round-trip), nested too deeply, not an object (400), or not the
endpoint's schema (422, messages formatted by ``errors.validation_message``).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.core.api.errors import InvalidJSON, InvalidRequest, InvalidSchema, validation_message

S = TypeVar("S", bound=BaseModel)

ACTIVATION_SYNONYMS = ("activation", "softmax")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    data = parse_json(raw, "a JSON object")
    if not isinstance(data, dict):
        raise InvalidJSON(f"request body must be a JSON object, not {type(data).__name__}")
    return data


def parse_json(raw: bytes, expected: str) -> Any:
    """The body as JSON of any type (``expected`` names what the endpoint takes, for the
    400 of an empty body), or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise InvalidJSON(f"request body is empty; expected {expected}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"request body is not valid UTF-8: {exc}") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise InvalidJSON("request body is nested too deeply") from exc
    except ValueError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    return data


def validate(schema: type[S], body: Any) -> S:
    """``body`` checked against ``schema`` (422 with every problem, in one line)."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise InvalidSchema(validation_message(exc.errors())) from None
    except RecursionError:
        raise InvalidJSON("request body is nested too deeply") from None


def normalize_activation(body: dict[str, Any]) -> dict[str, Any]:
    """Fold ``activation``/``softmax`` into ``use_activation`` (one key, one value)."""
    values = {
        k: body[k] for k in ("use_activation", *ACTIVATION_SYNONYMS) if body.get(k) is not None
    }
    out = {k: v for k, v in body.items() if k not in ACTIVATION_SYNONYMS}
    wrong = [k for k, v in values.items() if not isinstance(v, bool)]
    if wrong:
        raise InvalidSchema(f"{wrong[0]}: Input should be a valid boolean", param=wrong[0])
    if len(set(values.values())) > 1:
        raise InvalidRequest(f"conflicting activation flags: {values}", param="use_activation")
    if values:
        out["use_activation"] = next(iter(values.values()))
    return out


def split_inputs(value: Any) -> tuple[list[Any], bool]:
    """The engine inputs of a /classify or /pooling ``input`` and whether it was a list.

    A string or a single token-id list is one input; a list of strings or of token-id
    lists is one input per element.
    """
    if isinstance(value, str):
        return [value], False
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [value], False
    if isinstance(value, list):
        return list(value), True
    raise InvalidSchema(
        "input must be a string, a list of strings, a list of token ids "
        "or a list of token-id lists",
        param="input",
    )
