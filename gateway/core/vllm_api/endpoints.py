"""The vLLM-shaped endpoints: a client's body checked, made into engine requests
(``gateway.core.vllm_api.requests``), answered by the router, and the answer shaped as
vLLM's own.

``/v1/chat/completions`` and ``/v1/completions`` for a generative model; ``/classify``,
``/pooling`` and ``/v1/embeddings`` for a discriminative one; ``/v1/models``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

from gateway.core.api.errors import RmgateError, StreamUnsupported
from gateway.core.api.parsing import normalize_activation, parse_json_object, validate
from gateway.core.api.results import EngineReply, GatewayResult, Route, key_hex
from gateway.core.api.schemas import (
    ChatCompletionRequest,
    ClassifyRequest,
    CompletionRequest,
    EmbeddingRequest,
    ModelCard,
    ModelList,
)
from gateway.core.config.settings import ModelSpec
from gateway.core.elastic.sleep import model_state
from gateway.core.routing.concurrency import all_or_cancel
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.placement import Placement
from gateway.core.routing.router import EngineRequest, Router, engine_error
from gateway.core.vllm_api.embeddings import classify_body, embeddings_from_classify
from gateway.core.vllm_api.requests import PoolingRequests, generative_request, pooling_requests

logger = logging.getLogger("rmgate")

GENERATE_SCHEMAS: dict[str, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}


def generative_result(request: EngineRequest, route: Route, reply: EngineReply) -> GatewayResult:
    """A generative engine request's answer as the request's typed outcome; an engine's
    non-200 raised as rmgate's error (with what was decided, for the headers)."""
    result = GatewayResult(
        model=request.model.name,
        body=reply.body,
        key=request.key,
        routes=(route,),
        seed=request.seed,
        seed_derived=request.seed_derived,
        endpoint=request.path,
        max_tokens_clamped=request.max_tokens_clamped,
    )
    if logger.isEnabledFor(logging.DEBUG):  # not built per request unless asked for
        logger.debug(
            "request %s",
            json.dumps(
                {
                    "endpoint": request.path,
                    "model": request.model.name,
                    "key": key_hex(request.key),
                    "slot": route.answered_by,
                    "seed": request.seed,
                    "status": reply.status,
                }
            ),
        )
    if reply.status != 200:
        raise engine_error(reply, result)
    return result


async def answer_pooled(
    router: Router,
    requests: PoolingRequests,
    index: int,
    deadline: Deadline,
    use_cache: bool | None,
    placement: Placement | None = None,
) -> tuple[Route, EngineReply]:
    """Input ``index`` of a pooling body, answered; an engine's non-200 raised as rmgate's
    error, named for the whole body (``requests.key``)."""
    request = requests.items[index]
    route, reply = await router.answer(request, deadline, use_cache, placement)
    if reply.status != 200:
        raise engine_error(
            reply,
            GatewayResult(
                model=request.model.name, key=requests.key, routes=(route,), endpoint=request.path
            ),
        )
    return route, reply


def merge_pooling(replies: list[EngineReply], whole_key: int) -> bytes:
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


class VllmEndpoints:
    """The vLLM-shaped endpoints over one router."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def generate(
        self, path: str, raw: bytes, deadline: Deadline, use_cache: bool | None = None
    ) -> GatewayResult:
        """``/v1/chat/completions`` or ``/v1/completions`` (``path``)."""
        body = parse_json_object(raw)
        req = validate(GENERATE_SCHEMAS[path], body)
        if req.stream:
            raise StreamUnsupported(
                "stream=true is not supported: rmgate returns whole, "
                "deterministic responses; send stream=false",
                param="stream",
            )
        spec = self.router.resolve_model(req.model, "generative")
        request = generative_request(spec, path, body, self.router.sampling_defaults[spec.name])
        route, reply = await self.router.answer(request, deadline, use_cache)
        return generative_result(request, route, reply)

    async def pool(
        self, path: str, raw: bytes, deadline: Deadline, use_cache: bool | None = None
    ) -> GatewayResult:
        """``/classify`` or ``/pooling`` (``path``): one engine request per input."""
        body = normalize_activation(parse_json_object(raw))
        req = validate(ClassifyRequest, body)
        spec = self.router.resolve_model(req.model, "discriminative")
        return await self._pool(spec, path, body, deadline, use_cache)

    async def embed(
        self, raw: bytes, deadline: Deadline, use_cache: bool | None = None
    ) -> GatewayResult:
        """``/v1/embeddings`` for a DisRM: its ``/classify`` request with raw logits
        (``gateway.core.vllm_api.embeddings``), answered in OpenAI's embeddings shape."""
        req = validate(EmbeddingRequest, parse_json_object(raw))
        spec = self.router.resolve_model(req.model, "discriminative")
        pooled = await self._pool(
            spec, "/classify", classify_body(req, spec.name), deadline, use_cache
        )
        return dataclasses.replace(
            pooled,
            endpoint="/v1/embeddings",
            body=embeddings_from_classify(pooled.body, spec.name, req.encoding_format),
        )

    async def _pool(
        self,
        spec: ModelSpec,
        path: str,
        body: dict[str, Any],
        deadline: Deadline,
        use_cache: bool | None,
    ) -> GatewayResult:
        requests = pooling_requests(spec, path, body)

        async def item(index: int) -> tuple[Route, EngineReply]:
            try:
                return await answer_pooled(self.router, requests, index, deadline, use_cache)
            except RmgateError as err:  # fails the request now: its siblings are cancelled
                if not requests.is_list:
                    raise
                raise err.for_item(index) from err

        # one failed item fails the request: its siblings are cancelled (engines abort them)
        routed = await all_or_cancel(item(i) for i in range(len(requests.items)))
        routes = tuple(route for route, _ in routed)
        replies = [reply for _, reply in routed]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "request %s",
                json.dumps(
                    {
                        "endpoint": path,
                        "model": spec.name,
                        "key": key_hex(requests.key),
                        "items": len(requests.items),
                        "slots": [r.answered_by for r in routes],
                    }
                ),
            )
        body_out = merge_pooling(replies, requests.key) if requests.is_list else replies[0].body
        return GatewayResult(
            model=spec.name, body=body_out, key=requests.key, routes=routes, endpoint=path
        )

    async def models(self, timeout_s: float = 2.0) -> ModelList:
        """``/v1/models``: each model's slots, fingerprints, health, classes, self-test."""
        router, config = self.router, self.router.config
        cards = []
        for spec in config.models:
            n = router.slots.count(spec.name)
            infos = await asyncio.gather(
                *(router.transport.describe(spec.name, s, timeout_s) for s in range(n))
            )
            health = await asyncio.gather(
                *(router.transport.health(spec.name, s, timeout_s) for s in range(n))
            )
            states = await asyncio.gather(
                *(router.transport.slot_state(spec.name, s, timeout_s) for s in range(n))
            )
            modes = {i.mode for i in infos if i is not None}
            view = router.transport.slot_view(spec.name, n)
            cards.append(
                ModelCard(
                    id=spec.name,
                    kind=spec.kind,
                    created=router.started_at,
                    aliases=config.model_names()[spec.name],
                    max_model_len=spec.max_model_len,
                    determinism=modes.pop() if len(modes) == 1 else spec.determinism,
                    slots=n,
                    seed_policy=spec.seed.policy if spec.kind == "generative" else None,
                    fingerprints=[i.fingerprint if i else None for i in infos],
                    health=list(health),
                    selftest=[i.raw.get("selftest") if i else None for i in infos],
                    prefix_cache=[i.raw.get("prefix_cache") if i else None for i in infos],
                    placement=config.gateway.placement,
                    numerics_classes=list(view.classes.classes),
                    classes=view.classes.groups,
                    drained={
                        str(s): r
                        for s in range(n)
                        if (r := view.classes.drain_reason(s)) is not None
                    },
                    numerics=[i.raw.get("numerics") if i else None for i in infos],
                    nodes=[i.raw.get("node") if i else None for i in infos],
                    scorer=spec.scorer.model_dump(),
                    state=router.scaling_state(spec.name)
                    or model_state([st.get("state", "unavailable") for st in states]),
                    slot_states=list(states),
                    autoscaling={
                        **spec.autoscaling.model_dump(),
                        **router.autoscaling.get(spec.name, {}),
                    }
                    if spec.autoscaling
                    else None,
                )
            )
        return ModelList(data=cards, programs=[p.model_dump() for p in config.programs])
