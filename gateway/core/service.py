"""The gateway's core: from a request body to a deterministic engine call and back.

Free of Ray, FastAPI, HTTP clients and Prometheus (``tests/unit/test_layers.py`` holds it
to that), so its logic (model resolution, keys, slots, seeds, list splitting, reassembly)
is unit-testable against a fake ``Transport``. It returns typed ``GatewayResult``s and
raises ``RmgateError``s; the HTTP layer renders both, the transport does the I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

from gateway.core.config import AppConfig, Kind, ModelSpec
from gateway.core.errors import (EngineFailed, EngineRejected, ModelNotFound, ModelRequired,
                                 Rescaling, RmgateError, SeedRequired, SlotRemoved,
                                 StreamUnsupported, WrongModelKind, InvalidSchema,
                                 engine_error_message)
from gateway.core.concurrency import all_or_cancel
from gateway.core.deadline import GUARD_MARGIN_S, Deadline
from gateway.core.embeddings import classify_body, embeddings_from_classify
from gateway.core.keys import canonical_json, derive_seed, key_hex, request_key
from gateway.core.placement import Placement, place, place_in_class
from gateway.core.protocols import (ChatCompletionRequest, ClassifyRequest, CompletionRequest,
                                    EmbeddingRequest, ModelCard, ModelList)
from gateway.core.requests import normalize_activation, parse_json_object, split_inputs, validate
from gateway.core.results import GatewayResult, Route
from gateway.core.reuse import Ask, RewardLedger, RewardReuse, cache_decision
from gateway.core.scorers.base import RuleRunner
from gateway.core.scorers.registry import Scorers
from gateway.core.slots import SlotTable
from gateway.core.transport import EngineReply, Transport

logger = logging.getLogger("rmgate")

#: How often one request may be re-routed because scaling removed its slot under it.
MAX_REROUTES = 4

GENERATE_ENDPOINTS = {"/v1/chat/completions": ChatCompletionRequest,
                      "/v1/completions": CompletionRequest}


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


class RewardGateway:
    """Routes requests for the configured models over ``transport``."""

    def __init__(self, config: AppConfig, transport: Transport,
                 slots: SlotTable | None = None, ledger: RewardLedger | None = None,
                 rules: RuleRunner | None = None) -> None:
        self.config = config
        self.transport = transport
        #: OpenAI's ``created`` of every /v1/models entry.
        self.started_at = int(time.time())
        #: Current slot counts (shared with the transport; ``set_slot_counts`` changes them).
        self.slots = slots or SlotTable.from_config(config)
        self.api_keys = config.gateway.load_api_keys()
        #: GRM sampling defaults per model, read once (``sampling_defaults_from``).
        self.sampling_defaults: dict[str, dict[str, Any]] = {
            m.name: m.effective_sampling_defaults() for m in config.models}
        #: Every model's and program component's scorer, built once (not per request).
        self.scorers = Scorers(config)
        #: Where rule checks run (``gateway.rules.RulePool``; None: no program has rules).
        self.rules = rules
        #: The ledger's cache and recording (None: no ledger, nothing recorded).
        self.reuse = (RewardReuse(ledger, config.gateway.ledger.keep_bodies)
                      if ledger is not None else None)

    def set_slot_counts(self, counts: dict[str, Any]) -> dict[str, int]:
        """Route each named model over its new count from now on (a scale event). Checked
        as a whole first (``InvalidSlotCounts``, 400); jump hashing moves only the keys
        it must."""
        return self.slots.update(counts)

    # ---- model resolution -------------------------------------------------------------
    def resolve_model(self, name: str | None, kind: Kind | None,
                      default: str | None = None) -> ModelSpec:
        """The model a request names (its name or its path), else ``default``, else the
        only model of ``kind`` (of any kind when ``kind`` is None)."""
        name = name if name is not None else default
        if name is not None:
            spec = self.config.model(name)
            if spec is None:
                raise ModelNotFound(f"The model `{name}` does not exist. Served models (and "
                                    f"the other names they answer to): "
                                    f"{self.config.model_names()}", param="model")
            if kind is not None and spec.kind != kind:
                other = "/v1/chat/completions" if spec.kind == "generative" else "/classify"
                raise WrongModelKind(f"model `{name}` is {spec.kind}; use {other}",
                                     param="model")
            return spec
        candidates = [m for m in self.config.models if kind is None or m.kind == kind]
        if len(candidates) == 1:
            return candidates[0]
        what = f"{kind} models" if kind else "models"
        if not candidates:
            raise ModelNotFound(f"no {kind} model is served", param="model")
        hint = "" if kind else " and no default_reward_model is configured"
        raise ModelRequired(f"`model` is required: {len(candidates)} {what} are served "
                            f"({[m.name for m in candidates]}){hint}", param="model")

    # ---- one engine request -----------------------------------------------------------
    async def _answer(self, spec: ModelSpec, key: int, path: str, body: bytes,
                      deadline: Deadline, seed: int | None = None,
                      use_cache: bool | None = None) -> tuple[Route, EngineReply]:
        """The answer to one canonical engine body: from the ledger or an identical call in
        flight when the cache may answer (``gateway.core.reuse``), else the engine's, and
        recorded. Nothing waits past ``deadline``: a last-resort guard answers 504
        ``GUARD_MARGIN_S`` after it whatever happened (the transport ends its own waits
        at the deadline)."""
        placement = self.placement(spec, key)
        call = lambda: self._post_key(spec, key, path, body, deadline, placement)  # noqa: E731
        try:
            async with asyncio.timeout(deadline.remaining() + GUARD_MARGIN_S):
                if self.reuse is None:
                    return await call()
                return await self.reuse.answer(Ask(
                    spec.name, path, body, key, placement.numerics_class, seed,
                    cacheable=cache_decision(self.config.gateway.cache, use_cache)
                    and spec.determinism != "off"),
                    call)
        except TimeoutError:
            raise deadline.exceeded(f"routing it to {spec.name}'s slots") from None

    async def _post_key(self, spec: ModelSpec, key: int, path: str, body: bytes,
                        deadline: Deadline, placement: Placement | None = None
                        ) -> tuple[Route, EngineReply]:
        """Send to the key's placement; when a scale-down removes the slot under the
        request, place it again under the new count (same bits: homogeneous replicas), and
        when a chosen class mate turned out to be of another class now, place it again
        under the slots' current classes."""
        for _ in range(MAX_REROUTES):
            placement = placement or self.placement(spec, key)
            try:
                reply = await self.transport.post(spec.name, placement, path, body, deadline)
            except SlotRemoved as exc:
                logger.info("%s; routing %s again", exc, key_hex(key))
                placement = None
                continue
            reason = None
            if placement.within_class and reply.slot != placement.home:
                reason = reply.reason or (placement.reason if reply.slot == placement.first
                                          and placement.reason != "preferred"
                                          else "unavailable")
            return Route(key, placement.home, reply.slot, reply.fingerprint,
                         reply.numerics_class, placement.within_class, reason), reply
        raise Rescaling(f"model {spec.name} is being rescaled; retry")

    def placement(self, spec: ModelSpec, key: int) -> Placement:
        """The placement policy's decision for ``key`` (pure: ``gateway.core.placement``)."""
        settings = self.config.gateway
        n = self.slots.count(spec.name)
        if settings.placement == "class" and n > 1:
            view = self.transport.slot_view(spec.name, n)
            return place_in_class(key, view.classes, view.load, failover=settings.failover,
                                  slot_wait_s=settings.slot_wait_s,
                                  failover_after_s=settings.failover_after_s,
                                  load_bound=settings.load_bound,
                                  service_s=view.service_s
                                  if settings.load_weight == "answer_time" else None)
        pinned = place(key, n, settings.failover, settings.slot_wait_s,
                       settings.failover_after_s)
        if self.reuse is None:
            return pinned
        # the class its own slot reports: what names the reward in the ledger
        home_class = self.transport.slot_view(spec.name, n).classes.classes[pinned.home]
        return dataclasses.replace(pinned, numerics_class=home_class)

    def deadline(self, timeout_s: float | None = None) -> Deadline:
        """A request's one deadline, set at its arrival: ``timeout_s`` (the client's
        ``x-rmgate-timeout``) capped at ``gateway.request_timeout_s``, or that setting."""
        limit = self.config.gateway.request_timeout_s
        return Deadline.after(limit if timeout_s is None else min(timeout_s, limit))

    # ---- generative -------------------------------------------------------------------
    async def generate(self, path: str, raw: bytes, deadline: Deadline | None = None,
                       use_cache: bool | None = None) -> GatewayResult:
        deadline = deadline or self.deadline()
        body = parse_json_object(raw)
        req = validate(GENERATE_ENDPOINTS[path], body)
        if req.stream:
            raise StreamUnsupported("stream=true is not supported: rmgate returns whole, "
                                    "deterministic responses; send stream=false",
                                    param="stream")
        spec = self.resolve_model(req.model, "generative")
        body["model"] = spec.name
        clamped = clamp_max_tokens(body, spec.max_model_len)
        if body.get("seed", 0) is None:
            del body["seed"]  # an explicit null is the same request as no seed
        key = request_key(path, body)
        seed = body.get("seed")
        derived = False
        if seed is None:
            if spec.seed.policy == "require":
                raise SeedRequired(f"model `{spec.name}` requires a `seed` (seed policy "
                                   "'require')", param="seed")
            if spec.seed.policy == "derive":
                seed, derived = derive_seed(key, spec.seed.base), True
        engine_body = {**self.sampling_defaults[spec.name], **body}
        if seed is not None:
            engine_body["seed"] = seed
        engine_body.pop("stream", None)
        engine_body.pop("stream_options", None)
        route, reply = await self._answer(spec, key, path, canonical_json(engine_body),
                                          deadline, seed, use_cache)
        result = GatewayResult(model=spec.name, body=reply.body, key=key, routes=(route,),
                               seed=seed, seed_derived=derived, endpoint=path,
                               max_tokens_clamped=clamped)
        if logger.isEnabledFor(logging.DEBUG):  # not built per request unless asked for
            logger.debug("request %s", json.dumps({
                "endpoint": path, "model": spec.name, "key": key_hex(key),
                "slot": route.answered_by, "seed": seed, "status": reply.status}))
        if reply.status != 200:
            raise self._engine_error(reply, result)
        return result

    # ---- discriminative ---------------------------------------------------------------
    async def pool(self, path: str, raw: bytes, deadline: Deadline | None = None,
                   use_cache: bool | None = None) -> GatewayResult:
        deadline = deadline or self.deadline()
        body = normalize_activation(parse_json_object(raw))
        req = validate(ClassifyRequest, body)
        spec = self.resolve_model(req.model, "discriminative")
        body["model"] = spec.name
        whole_key = request_key(path, body)
        if body.get("input") is None:
            if body.get("messages") is None:
                raise InvalidSchema("one of `input` or `messages` is required", param="input")
            items, is_list = [None], False
        else:
            items, is_list = split_inputs(body["input"])
            if not items:
                raise InvalidSchema("input must not be an empty list", param="input")
        item_bodies = [body if item is None else {**body, "input": item} for item in items]
        # one input: its item body is the whole body, so is its key (not computed twice)
        keys = [request_key(path, b) for b in item_bodies] if is_list else [whole_key]
        whole = whole_key

        async def item(index: int, item_body: dict[str, Any], key: int
                       ) -> tuple[Route, EngineReply]:
            route, reply = await self._answer(spec, key, path, canonical_json(item_body),
                                              deadline, use_cache=use_cache)
            if reply.status != 200:  # fails the request now: its siblings are cancelled
                err = self._engine_error(reply, GatewayResult(
                    model=spec.name, key=whole, routes=(route,), endpoint=path))
                raise err.for_item(index) if is_list else err
            return route, reply

        # one failed item fails the request: its siblings are cancelled (engines abort them)
        routed = await all_or_cancel(item(i, b, k)
                                     for i, (b, k) in enumerate(zip(item_bodies, keys)))
        routes = tuple(route for route, _ in routed)
        replies = [reply for _, reply in routed]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("request %s", json.dumps({
                "endpoint": path, "model": spec.name, "key": key_hex(whole),
                "items": len(items), "slots": [r.answered_by for r in routes]}))
        body_out = replies[0].body if not is_list else self._merge_pooling(replies, whole_key)
        return GatewayResult(model=spec.name, body=body_out, key=whole, routes=routes,
                             endpoint=path)

    async def embed(self, raw: bytes, deadline: Deadline | None = None,
                    use_cache: bool | None = None) -> GatewayResult:
        """``/v1/embeddings`` for a DisRM: its ``/classify`` request with raw logits
        (``gateway.core.embeddings``), answered in OpenAI's embeddings shape."""
        req = validate(EmbeddingRequest, parse_json_object(raw))
        spec = self.resolve_model(req.model, "discriminative")
        pooled = await self.pool("/classify", canonical_json(classify_body(req, spec.name)),
                                 deadline, use_cache)
        return dataclasses.replace(pooled, endpoint="/v1/embeddings", body=embeddings_from_classify(
            pooled.body, spec.name, req.encoding_format))

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
    def _engine_error(reply: EngineReply, routed: GatewayResult) -> RmgateError:
        message = engine_error_message(reply.body)
        if 400 <= reply.status < 500:
            return EngineRejected(message, engine_status=reply.status, routed=routed)
        return EngineFailed(message, routed=routed)

    # ---- models -----------------------------------------------------------------------
    async def models(self, timeout_s: float = 2.0) -> ModelList:
        cards = []
        for spec in self.config.models:
            n = self.slots.count(spec.name)
            infos = await asyncio.gather(*(self.transport.describe(spec.name, s, timeout_s)
                                           for s in range(n)))
            health = await asyncio.gather(*(self.transport.health(spec.name, s, timeout_s)
                                            for s in range(n)))
            modes = {i.mode for i in infos if i is not None}
            view = self.transport.slot_view(spec.name, n)
            cards.append(ModelCard(
                id=spec.name, kind=spec.kind, created=self.started_at,
                aliases=self.config.model_names()[spec.name], max_model_len=spec.max_model_len,
                determinism=modes.pop() if len(modes) == 1 else spec.determinism,
                slots=n,
                seed_policy=spec.seed.policy if spec.kind == "generative" else None,
                fingerprints=[i.fingerprint if i else None for i in infos],
                health=list(health),
                selftest=[i.raw.get("selftest") if i else None for i in infos],
                placement=self.config.gateway.placement,
                numerics_classes=list(view.classes.classes),
                classes=view.classes.groups,
                drained={str(s): r for s in range(n)
                         if (r := view.classes.drain_reason(s)) is not None},
                numerics=[i.raw.get("numerics") if i else None for i in infos],
                nodes=[i.raw.get("node") if i else None for i in infos],
                scorer=spec.scorer.model_dump()))
        return ModelList(data=cards, programs=[p.model_dump() for p in self.config.programs])
