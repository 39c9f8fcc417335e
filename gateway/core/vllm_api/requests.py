"""The engine requests a vLLM-shaped body stands for: canonical, keyed and seeded once.

The one place a body becomes ``EngineRequest``s, used both by the vLLM-shaped endpoints
(after checking a client's body) and by the scorers of ``/v1/rewards`` and
``/get_reward`` (which build their bodies as a client would), so a reward has the key,
seed, slot, ledger row and bits of the same request sent on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.api.errors import InvalidSchema, SeedRequired
from gateway.core.api.parsing import split_inputs
from gateway.core.config.settings import ModelSpec
from gateway.core.routing.keys import canonical_json, derive_seed, request_key
from gateway.core.routing.router import EngineRequest


def clamp_max_tokens(body: dict[str, Any], max_model_len: int) -> tuple[str, int, int] | None:
    """Cap ``max_tokens``/``max_completion_tokens`` at the model's context length, in place.

    verl's generative-RM examples ask a small judge for far more tokens than its context
    holds, which vLLM refuses (400) and verl does not check. vLLM already shortens a
    request that fits the context to what is left after the prompt; capping at the context
    length makes the larger asks the same request (same key, same bits) as asking for the
    whole context. Returns ``(field, asked, sent)`` when it capped, for the header."""
    clamped = None
    for name in ("max_tokens", "max_completion_tokens"):
        asked = body.get(name)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > max_model_len:
            body[name] = max_model_len
            clamped = (name, asked, max_model_len)
    return clamped


def generative_request(
    spec: ModelSpec, path: str, body: dict[str, Any], sampling_defaults: dict[str, Any]
) -> EngineRequest:
    """A chat or completion body for ``spec`` as its engine request (``body`` is changed
    in place: the model's own name, the output-token cap, no explicit null seed).

    The key is over what was asked; the engine gets the model's sampling defaults under
    it and the seed the model's seed policy decides (``derive``: from the key)."""
    body["model"] = spec.name
    clamped = clamp_max_tokens(body, spec.max_model_len)
    if body.get("seed", 0) is None:
        del body["seed"]  # an explicit null is the same request as no seed
    key = request_key(path, body)
    seed = body.get("seed")
    derived = False
    if seed is None:
        if spec.seed.policy == "require":
            raise SeedRequired(
                f"model `{spec.name}` requires a `seed` (seed policy 'require')", param="seed"
            )
        if spec.seed.policy == "derive":
            seed, derived = derive_seed(key, spec.seed.base), True
    engine_body = {**sampling_defaults, **body}
    if seed is not None:
        engine_body["seed"] = seed
    engine_body.pop("stream", None)
    engine_body.pop("stream_options", None)
    return EngineRequest(spec, path, canonical_json(engine_body), key, seed, derived, clamped)


@dataclass(frozen=True)
class PoolingRequests:
    """A ``/classify`` or ``/pooling`` body as one engine request per input."""

    items: list[EngineRequest]
    #: Whether ``input`` was a list (the answer is then merged from the items').
    is_list: bool
    #: The key of the whole body (a list input: the list's key).
    key: int


def pooling_requests(spec: ModelSpec, path: str, body: dict[str, Any]) -> PoolingRequests:
    """A pooling body for ``spec`` (activation flags already folded) as one engine request
    per input: a list input is split so that each input is keyed, placed and recorded on
    its own, its answer the same whichever list it came in."""
    body["model"] = spec.name
    whole_key = request_key(path, body)
    if body.get("input") is None:
        if body.get("messages") is None:
            raise InvalidSchema("one of `input` or `messages` is required", param="input")
        return PoolingRequests(
            [EngineRequest(spec, path, canonical_json(body), whole_key)], False, whole_key
        )
    inputs, is_list = split_inputs(body["input"])
    if not inputs:
        raise InvalidSchema("input must not be an empty list", param="input")
    if not is_list:  # one input: its item body is the whole body, so is its key
        item = {**body, "input": inputs[0]}
        return PoolingRequests(
            [EngineRequest(spec, path, canonical_json(item), whole_key)], False, whole_key
        )
    items = []
    for value in inputs:
        item = {**body, "input": value}
        items.append(EngineRequest(spec, path, canonical_json(item), request_key(path, item)))
    return PoolingRequests(items, True, whole_key)
