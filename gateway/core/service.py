"""The gateway's core: from a request body to a deterministic engine call and back.

Kept free of Ray and FastAPI so its logic (model resolution, keys, slots, seeds, list
splitting, reassembly) is unit-testable against a fake transport; ``gateway.http.app``
only adapts HTTP to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.observability import metrics
from gateway.core.config import AppConfig, ModelSpec
from gateway.http.errors import GatewayError, engine_error_message
from gateway.core.hashing import slot_for_key, slot_ranking
from gateway.core.keys import canonical_json, derive_seed, key_hex, request_key
from gateway.core.protocols import (ChatCompletionRequest, ClassifyRequest, CompletionRequest,
                               ModelCard, ModelList)
from gateway.transport.slot_transport import EngineReply, SlotRemoved, Transport
from gateway.core.scoring import make_parser

logger = logging.getLogger("rmgate")

#: How often one request may be re-routed because scaling removed its slot under it.
MAX_REROUTES = 4

ACTIVATION_SYNONYMS = ("activation", "softmax")
GENERATE_ENDPOINTS = {"/v1/chat/completions": ChatCompletionRequest,
                      "/v1/completions": CompletionRequest}
POOLING_ENDPOINTS = {"/classify": "probs", "/pooling": "data"}


@dataclass
class GatewayResponse:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise GatewayError(400, "request body is empty; expected a JSON object", "invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GatewayError(400, f"request body is not valid UTF-8: {exc}", "invalid_json") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise GatewayError(400, "request body is nested too deeply", "invalid_json") from exc
    except ValueError as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}", "invalid_json") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, f"request body must be a JSON object, not {type(data).__name__}",
                           "invalid_json")
    return data


def validate(schema: type[BaseModel], body: dict[str, Any]) -> BaseModel:
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        parts = [f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:10]]
        raise GatewayError(422, "; ".join(parts), "invalid_schema") from None
    except RecursionError:
        raise GatewayError(400, "request body is nested too deeply", "invalid_json") from None


def normalize_activation(body: dict[str, Any]) -> dict[str, Any]:
    """Fold ``activation``/``softmax`` into ``use_activation`` (one key, one value)."""
    values = {k: body[k] for k in ("use_activation", *ACTIVATION_SYNONYMS)
              if body.get(k) is not None}
    out = {k: v for k, v in body.items() if k not in ACTIVATION_SYNONYMS}
    wrong = [k for k, v in values.items() if not isinstance(v, bool)]
    if wrong:
        raise GatewayError(422, f"{wrong[0]}: Input should be a valid boolean", "invalid_schema",
                           param=wrong[0])
    if len(set(values.values())) > 1:
        raise GatewayError(400, f"conflicting activation flags: {values}", "invalid_request",
                           param="use_activation")
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
    raise GatewayError(422, "input must be a string, a list of strings, a list of token ids "
                       "or a list of token-id lists", "invalid_schema", param="input")


class RewardGateway:
    """Routes requests for the configured models over ``transport``."""

    def __init__(self, config: AppConfig, transport: Transport) -> None:
        self.config = config
        self.transport = transport
        self.api_keys = config.gateway.load_api_keys()
        #: Score parsers per model, built once (not per /v1/rewards request).
        self.parsers = {m.name: make_parser(m.scorer) for m in config.models}
        self.set_slot_counts({spec.name: spec.replicas for spec in config.models})

    def set_slot_counts(self, counts: dict[str, int]) -> None:
        """Route ``model`` over ``counts[model]`` slots from now on (a scale event: the
        ingress's ``user_config`` changed). Jump hashing moves only the keys it must."""
        for spec in self.config.models:
            if spec.name in counts:
                spec.replicas = counts[spec.name]
                metrics.SLOTS.labels(spec.name).set(spec.replicas)
        unknown = set(counts) - {m.name for m in self.config.models}
        if unknown:
            logger.warning("slot counts for unknown models ignored: %s", sorted(unknown))
        setter = getattr(self.transport, "set_slot_counts", None)
        if setter is not None:
            setter({m.name: m.replicas for m in self.config.models})

    async def _post_key(self, spec: ModelSpec, key: int, path: str,
                        body: bytes) -> tuple[int, EngineReply]:
        """Send to the key's slot; when a scale-down removes that slot under the request,
        send it to the key's slot under the new count (same bits: homogeneous replicas)."""
        for _ in range(MAX_REROUTES):
            slot = slot_for_key(key, spec.replicas)
            try:
                return slot, await self.transport.post(spec.name, slot, path, body,
                                                       fallbacks=self._fallbacks(key, spec))
            except SlotRemoved:
                logger.info("slot %s-%d was scaled away; routing %s again", spec.name, slot,
                            key_hex(key))
        raise GatewayError(503, f"model {spec.name} is being rescaled; retry", "slot_unavailable",
                           headers={"Retry-After": "1"})

    # ---- model resolution -------------------------------------------------------------
    def resolve_model(self, name: str | None, kind: str) -> ModelSpec:
        if name is not None:
            spec = self.config.model(name)
            if spec is None:
                raise GatewayError(404, f"The model `{name}` does not exist. Served models: "
                                   f"{[m.name for m in self.config.models]}", "model_not_found",
                                   param="model")
            if spec.kind != kind:
                other = "/v1/chat/completions" if spec.kind == "generative" else "/classify"
                raise GatewayError(400, f"model `{name}` is {spec.kind}; use {other}",
                                   "wrong_model_kind", param="model")
            return spec
        candidates = [m for m in self.config.models if m.kind == kind]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise GatewayError(404, f"no {kind} model is served", "model_not_found", param="model")
        raise GatewayError(400, f"`model` is required: {len(candidates)} {kind} models are served "
                           f"({[m.name for m in candidates]})", "model_required", param="model")

    # ---- generative -------------------------------------------------------------------
    async def generate(self, path: str, raw: bytes) -> GatewayResponse:
        body = parse_json_object(raw)
        req = validate(GENERATE_ENDPOINTS[path], body)
        if req.stream:  # type: ignore[attr-defined]
            raise GatewayError(400, "stream=true is not supported: rmgate returns whole, "
                               "deterministic responses; send stream=false", "stream_unsupported",
                               param="stream")
        spec = self.resolve_model(req.model, "generative")
        body["model"] = spec.name
        if body.get("seed", 0) is None:
            del body["seed"]  # an explicit null is the same request as no seed
        key = request_key(path, body)
        headers = {"x-rmgate-model": spec.name, "x-rmgate-key": key_hex(key)}
        seed = body.get("seed")
        if seed is None:
            if spec.seed.policy == "require":
                raise GatewayError(400, f"model `{spec.name}` requires a `seed` (seed policy "
                                   "'require')", "seed_required", param="seed")
            if spec.seed.policy == "derive":
                seed = derive_seed(key, spec.seed.base)
                metrics.SEEDS_DERIVED.labels(spec.name).inc()
        engine_body = {**spec.sampling_defaults, **body}
        if seed is not None:
            engine_body["seed"] = seed
            headers["x-rmgate-seed"] = str(seed)
        engine_body.pop("stream", None)
        engine_body.pop("stream_options", None)
        slot, reply = await self._post_key(spec, key, path, canonical_json(engine_body))
        headers["x-rmgate-slot"] = str(slot)
        self._note_failover(headers, [slot], [reply])
        logger.debug("request %s", json.dumps({"endpoint": path, "model": spec.name,
                                                "key": headers["x-rmgate-key"],
                                                "slot": headers["x-rmgate-slot"], "seed": seed,
                                                "status": reply.status}))
        if reply.fingerprint:
            headers["x-rmgate-fingerprint"] = reply.fingerprint
        if reply.status != 200:
            raise self._engine_error(reply, headers)
        return GatewayResponse(200, reply.body, headers)

    # ---- discriminative ---------------------------------------------------------------
    async def pool(self, path: str, raw: bytes) -> GatewayResponse:
        body = normalize_activation(parse_json_object(raw))
        req = validate(ClassifyRequest, body)
        spec = self.resolve_model(req.model, "discriminative")
        body["model"] = spec.name
        whole_key = request_key(path, body)
        if body.get("input") is None:
            if body.get("messages") is None:
                raise GatewayError(422, "one of `input` or `messages` is required",
                                   "invalid_schema", param="input")
            items, is_list = [None], False
        else:
            items, is_list = split_inputs(body["input"])
            if not items:
                raise GatewayError(422, "input must not be an empty list", "invalid_schema",
                                   param="input")
        item_bodies = [body if item is None else {**body, "input": item} for item in items]
        keys = [request_key(path, b) for b in item_bodies]
        routed = await asyncio.gather(*(self._post_key(spec, k, path, canonical_json(b))
                                        for b, k in zip(item_bodies, keys)))
        slots = [slot for slot, _ in routed]
        replies = [reply for _, reply in routed]
        headers = {"x-rmgate-model": spec.name,
                   "x-rmgate-key": key_hex(whole_key if is_list else keys[0]),
                   "x-rmgate-slot": ",".join(map(str, slots))}
        self._note_failover(headers, slots, replies)
        logger.debug("request %s", json.dumps({"endpoint": path, "model": spec.name,
                                                "key": headers["x-rmgate-key"],
                                                "slot": headers["x-rmgate-slot"],
                                                "items": len(items)}))
        prints = sorted({r.fingerprint for r in replies if r.fingerprint})
        if prints:
            headers["x-rmgate-fingerprint"] = ",".join(prints)
        for reply in replies:
            if reply.status != 200:
                raise self._engine_error(reply, headers)
        if not is_list:
            return GatewayResponse(200, replies[0].body, headers)
        return GatewayResponse(200, self._merge_pooling(replies, whole_key), headers)

    def _fallbacks(self, key: int, spec: ModelSpec) -> list[int]:
        if self.config.gateway.failover != "next_slot" or spec.replicas < 2:
            return []
        return slot_ranking(key, spec.replicas)[1:]

    @staticmethod
    def _note_failover(headers: dict[str, str], slots: list[int], replies: list[EngineReply]) -> None:
        """Report the slots that really answered, and mark any failover."""
        actual = [r.slot if r.slot is not None else s for s, r in zip(slots, replies)]
        if actual != slots:
            headers["x-rmgate-slot"] = ",".join(map(str, actual))
            headers["x-rmgate-failover"] = ",".join(f"{a}->{b}" for a, b in zip(slots, actual)
                                                    if a != b)

    @staticmethod
    def _merge_pooling(replies: list[EngineReply], whole_key: int) -> bytes:
        """One vLLM-shaped list response from per-item responses, in input order."""
        parts = [json.loads(r.body) for r in replies]
        data, usage = [], {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0}
        for i, part in enumerate(parts):
            for item in part.get("data", []):
                data.append({**item, "index": i})
            for k in usage:
                usage[k] += int((part.get("usage") or {}).get(k) or 0)
        first = parts[0]
        merged = {**first, "data": data, "usage": {**(first.get("usage") or {}), **usage}}
        prefix = str(first.get("id", "pool")).split("-")[0]
        merged["id"] = f"{prefix}-rmgate-{key_hex(whole_key)}"
        return json.dumps(merged, ensure_ascii=False, allow_nan=False).encode("utf-8")

    @staticmethod
    def _engine_error(reply: EngineReply, headers: dict[str, str]) -> GatewayError:
        status = reply.status if 400 <= reply.status < 500 else 502
        return GatewayError(status, engine_error_message(reply.body), "engine_rejected"
                            if status < 500 else "engine_error", headers=headers)

    # ---- models -----------------------------------------------------------------------
    async def models(self, timeout_s: float = 2.0) -> ModelList:
        cards = []
        for spec in self.config.models:
            infos = await asyncio.gather(*(self.transport.describe(spec.name, s, timeout_s)
                                           for s in range(spec.replicas)))
            health = await asyncio.gather(*(self.transport.health(spec.name, s, timeout_s)
                                            for s in range(spec.replicas)))
            modes = {i.mode for i in infos if i is not None}
            cards.append(ModelCard(
                id=spec.name, kind=spec.kind,
                determinism=modes.pop() if len(modes) == 1 else spec.determinism,
                slots=spec.replicas,
                seed_policy=spec.seed.policy if spec.kind == "generative" else None,
                fingerprints=[i.fingerprint if i else None for i in infos],
                health=list(health),
                selftest=[i.raw.get("selftest") if i else None for i in infos]))
        return ModelList(data=cards)
