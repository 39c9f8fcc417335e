"""The one definition of "the same answer": what a reward consumer reads from a response.

``rmgate check``, the engines' start-up self-test (alone vs batched) and the benchmarks all
claim "bitwise identical"; they all mean :func:`answer_of` (``a == b``) or
:func:`same_answer`, so a benchmark's "0 differing" is exactly the self-test's claim.

An answer is the response reduced to the fields below, written as canonical JSON
(``sort_keys``, ``separators=(",", ":")``, ``allow_nan=False``) after parsing. JSON floats
round-trip exactly (Python writes the shortest repr that parses back to the same double),
so equal canonical JSON means equal bits: a one-ulp change in any compared float differs,
and so do ``0.0`` vs ``-0.0`` and ``1`` vs ``1.0``. A field that is absent and a field
that is ``null`` are the same answer (two vLLM builds may write either).

Compared, per endpoint (``path`` without query string or trailing slash):

``/v1/chat/completions``
    every choice, in index order: ``index``; the message's ``content``, ``reasoning``,
    ``reasoning_content``, ``refusal``, ``function_call`` and ``tool_calls`` (each call
    without its ``id``); ``logprobs`` (the full structure: tokens, logprobs, bytes,
    top_logprobs); ``finish_reason``; ``stop_reason``; and the token ids and prompt
    logprobs wherever vLLM returns them (choice ``token_ids`` with ``return_token_ids``,
    choice or response ``prompt_token_ids``, ``prompt_logprobs``).
``/v1/completions``
    every choice, in index order: ``index``, ``text``, ``logprobs``, ``finish_reason``,
    ``stop_reason``, ``token_ids``, ``prompt_token_ids``, ``prompt_logprobs`` (choice or
    response level).
``/classify``, ``/pooling``
    every item, in index order: ``index`` and its vector (``probs`` for ``/classify``,
    ``data`` for ``/pooling``). ``label`` and ``num_classes`` are left out: they follow
    from the vector and the model's config.
``/v1/rewards``
    ``rewards``, and per item of ``details``: ``index``, ``raw_score`` (DisRM),
    ``judge_text``, ``parsed`` and ``error`` (GRM). The judge's text and parse flag are
    compared because they are what the reward was computed from and what trainers log
    (verl reads ``parsed``): a reward that stays equal while the judge's text changed is
    still a batch-variance bug, only a luckier one. ``key``, ``seed`` and ``slot`` are
    left out: they are routing provenance, not the answer (key and seed are functions of
    the request; ``rmgate check`` compares slots from the ``x-rmgate-slot`` header).
``/get_reward`` (OpenRLHF)
    ``rewards``, ``scores`` and all of ``extra_logs`` (OpenRLHF logs it as training
    metrics, so it holds only request-determined values; the slot is not among them).
any other path
    the whole body less the top-level fields below (stricter, never weaker).

Never compared: ``id``, ``object``, ``created``, ``model``, ``usage``,
``system_fingerprint``, ``service_tier``, ``kv_transfer_params``, tool call ids, headers:
they legitimately differ between two identical runs (random ids, clocks, the served name)
or describe the bill, not the answer.

A payload that is not an answer of its endpoint (not a JSON object, no ``choices`` /
``data`` / ``rewards`` list, a pooling item without its vector) or that holds NaN or an
infinity (vLLM clamps logprobs to -9999.0, so non-finite means broken) raises
``ValueError``. Standard library only: this is the pure layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Top-level fields that are never part of an answer (the fallback for unknown paths).
VOLATILE_FIELDS = frozenset(
    {
        "id",
        "object",
        "created",
        "model",
        "usage",
        "system_fingerprint",
        "service_tier",
        "kv_transfer_params",
    }
)

#: Token ids and prompt logprobs, wherever vLLM puts them (choice or response level).
TOKEN_FIELDS = ("token_ids", "prompt_token_ids", "prompt_logprobs")
#: Fields of a chat choice's ``message`` (``tool_calls`` is handled apart: ids dropped).
MESSAGE_FIELDS = ("content", "reasoning", "reasoning_content", "refusal", "function_call")
CHAT_CHOICE_FIELDS = ("logprobs", "finish_reason", "stop_reason") + TOKEN_FIELDS
COMPLETION_CHOICE_FIELDS = ("text", "logprobs", "finish_reason", "stop_reason") + TOKEN_FIELDS
#: The vector of a pooling item, per endpoint.
POOLING_VECTOR = {"/classify": "probs", "/pooling": "data"}
REWARD_DETAIL_FIELDS = (
    "raw_score",
    "judge_text",
    "parsed",
    "error",
    "label_logprobs",
    "program",
    "failed",
    "default_used",
)
#: A reward program's component, as compared (its slot, receipt and cache are not: they
#: say who answered, not what).
COMPONENT_FIELDS = (
    "name",
    "status",
    "weight",
    "score",
    "transformed",
    "reason",
    "raw_score",
    "judge_text",
    "parsed",
    "label_logprobs",
)


def canonical_json(obj: Any) -> str:
    """Sorted keys, compact separators, UTF-8 (no ASCII escapes), NaN and infinities refused."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@dataclass(frozen=True)
class Answer:
    """What a consumer reads from one response. Equality (and hash) is on ``canonical``
    only, the bitwise comparison; ``value`` is the same answer as plain JSON values (for
    reports such as ``rmgate check``'s max |diff|)."""

    canonical: str
    value: Any = field(compare=False, repr=False)


def _norm_path(path: str) -> str:
    return path.split("?", 1)[0].rstrip("/") or "/"


def _pick(obj: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``names`` of ``obj`` that are present and not null (absent == null)."""
    return {k: obj[k] for k in names if obj.get(k) is not None}


def _in_index_order(items: Any, what: str) -> list[tuple[Any, dict[str, Any]]]:
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise ValueError(f"not an answer: `{what}` is not a list of objects")
    pairs = [(x.get("index", pos), x) for pos, x in enumerate(items)]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i, _ in pairs):
        raise ValueError(f"not an answer: a `{what}` index is not an integer")
    return sorted(pairs, key=lambda p: p[0])


def _tool_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    return [{k: v for k, v in c.items() if k != "id"} if isinstance(c, dict) else c for c in calls]


def _choices(payload: dict[str, Any], chat: bool) -> dict[str, Any]:
    if not payload.get("choices"):
        raise ValueError("not an answer: no `choices`")
    out = []
    for index, ch in _in_index_order(payload["choices"], "choices"):
        one: dict[str, Any] = {"index": index}
        if chat:
            msg = ch.get("message")
            if not isinstance(msg, dict):
                raise ValueError("not an answer: a chat choice without `message`")
            m = _pick(msg, MESSAGE_FIELDS)
            if msg.get("tool_calls"):  # [] and null: no tool calls
                m["tool_calls"] = _tool_calls(msg["tool_calls"])
            one["message"] = m
            one.update(_pick(ch, CHAT_CHOICE_FIELDS))
        else:
            one.update(_pick(ch, COMPLETION_CHOICE_FIELDS))
        out.append(one)
    return {"choices": out, **_pick(payload, TOKEN_FIELDS)}


def _pooling(payload: dict[str, Any], vector: str) -> list[Any]:
    out = []
    for index, item in _in_index_order(payload.get("data"), "data"):
        if vector not in item:
            raise ValueError(f"not an answer: a `data` item without `{vector}`")
        out.append([index, item[vector]])
    return out


def _rewards(payload: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(payload.get("rewards"), list):
        raise ValueError("not an answer: no `rewards` list")
    out: dict[str, Any] = {"rewards": payload["rewards"]}
    if payload.get("details") is not None:
        out["details"] = [
            _reward_detail(index, d) for index, d in _in_index_order(payload["details"], "details")
        ]
    return out


def _reward_detail(index: int, detail: dict[str, Any]) -> dict[str, Any]:
    out = {"index": index, **_pick(detail, REWARD_DETAIL_FIELDS)}
    if isinstance(detail.get("components"), list):
        out["components"] = [
            _pick(c, COMPONENT_FIELDS) if isinstance(c, dict) else c for c in detail["components"]
        ]
    return out


def _get_reward(payload: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(payload.get("rewards"), list):
        raise ValueError("not an answer: no `rewards` list")
    out = _pick(payload, ("rewards", "scores"))
    extra = payload.get("extra_logs")
    if isinstance(extra, dict):
        out["extra_logs"] = extra
    return out


def answer_value(path: str, payload: Any) -> Any:
    """The compared part of ``payload`` (a response of ``path``) as plain JSON values."""
    if not isinstance(payload, dict):
        raise ValueError(f"not an answer: a {type(payload).__name__}, not a JSON object")
    p = _norm_path(path)
    if p in ("/v1/chat/completions", "/v1/completions"):
        return _choices(payload, chat=p == "/v1/chat/completions")
    if p in POOLING_VECTOR:
        return _pooling(payload, POOLING_VECTOR[p])
    if p == "/v1/rewards":
        return _rewards(payload)
    if p == "/get_reward":
        return _get_reward(payload)
    return {k: v for k, v in payload.items() if k not in VOLATILE_FIELDS}


def answer_of(path: str, payload: Any) -> Answer:
    """The answer of one response (``payload``: its parsed JSON body) of ``path``."""
    value = answer_value(path, payload)
    return Answer(canonical_json(value), value)


def same_answer(path: str, a: Any, b: Any) -> bool:
    """True when two responses of ``path`` give a consumer the same answer, bitwise."""
    return answer_of(path, a) == answer_of(path, b)
