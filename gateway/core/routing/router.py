"""The router: one typed engine request in, the answer of the slot policy allows out.

Every engine request rmgate makes (a vLLM-shaped endpoint's, a scorer's, a probe's) is an
``EngineRequest``: its model, endpoint, canonical body and key, made once
(``gateway.core.vllm_api.requests``) and never serialized or parsed again on its way to an
engine. The router decides where it goes (``placement``), asks the ledger policy whether
an answer exists or is in flight (``gateway.core.ledger_policy.reuse``), and has the
transport answer it on the placement's slots. Nothing here does I/O itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.core.api import stages
from gateway.core.api.errors import (
    EngineFailed,
    EngineRejected,
    ModelNotFound,
    ModelRequired,
    Rescaling,
    RmgateError,
    SlotRemoved,
    WrongModelKind,
    engine_error_message,
)
from gateway.core.api.results import EngineReply, GatewayResult, Route, key_hex
from gateway.core.config.settings import AppConfig, Kind, ModelSpec
from gateway.core.ledger_policy.reuse import Ask, RewardLedger, RewardReuse, cache_decision
from gateway.core.routing.deadline import GUARD_MARGIN_S, Deadline
from gateway.core.routing.engine_access import Transport
from gateway.core.routing.placement import Placement, place, place_in_class
from gateway.core.routing.slots import SlotTable

logger = logging.getLogger("rmgate")

#: How often one request may be re-routed because scaling removed its slot under it.
MAX_REROUTES = 4


@dataclass(frozen=True)
class EngineRequest:
    """One request to a model's engines, canonical and keyed once.

    ``key`` is computed over what the caller asked (``gateway.core.routing.keys``);
    ``body`` is what the engine gets (the model's sampling defaults and the seed added),
    canonical JSON: the ledger names the answer by it."""

    model: ModelSpec
    path: str
    body: bytes
    key: int
    #: The sampling seed sent to the engine (a generative request), else None.
    seed: int | None = None
    #: Whether the gateway derived ``seed`` (seed policy ``derive``, none sent).
    seed_derived: bool = False
    #: ``(field, asked, sent)`` when the ask for output tokens was capped at the context.
    max_tokens_clamped: tuple[str, int, int] | None = None


def route_attributes(route: Route, status: int) -> dict[str, stages.Attribute]:
    """What decided an engine request's answer, as a traced stage's attributes: the slot
    that answered and the key's own, the answering class, the cache outcome, the receipt
    and the answer's status."""
    out: dict[str, stages.Attribute] = {
        "rmgate.slot": route.answered_by,
        "rmgate.slot.home": route.slot,
        "http.response.status_code": status,
    }
    for name, value in (
        ("rmgate.numerics_class", route.numerics_class),
        ("rmgate.cache", route.cache),
        ("rmgate.receipt", route.receipt),
        ("rmgate.placement.reason", route.placement_reason),
        ("rmgate.fingerprint", route.fingerprint),
    ):
        if value is not None:
            out[name] = value
    return out


def engine_error(reply: EngineReply, routed: GatewayResult) -> RmgateError:
    """An engine's non-200 answer as rmgate's error: its own 4xx passes through (the
    request was bad), anything else is the engine failing (502)."""
    message = engine_error_message(reply.body)
    if 400 <= reply.status < 500:
        return EngineRejected(message, engine_status=reply.status, routed=routed)
    return EngineFailed(message, routed=routed)


class Router:
    """Answers ``EngineRequest``s for the configured models over ``transport``."""

    def __init__(
        self,
        config: AppConfig,
        transport: Transport,
        slots: SlotTable | None = None,
        ledger: RewardLedger | None = None,
    ) -> None:
        self.config = config
        self.settings = config.gateway
        self.transport = transport
        #: OpenAI's ``created`` of every /v1/models entry.
        self.started_at = int(time.time())
        #: Current slot counts (shared with the transport; ``set_slot_counts`` changes them).
        self.slots = slots or SlotTable.from_config(config)
        #: Per autoscaled model: what it is doing now and its last decisions
        #: (``gateway.serve.autoscaler``).
        self.autoscaling: dict[str, dict[str, Any]] = {}
        #: Generative models' sampling defaults, read once (``sampling_defaults_from``).
        self.sampling_defaults: dict[str, dict[str, Any]] = {
            m.name: m.effective_sampling_defaults() for m in config.models
        }
        #: The ledger's cache and recording (None: no ledger, nothing recorded).
        self.reuse = (
            RewardReuse(ledger, config.gateway.ledger.keep_bodies) if ledger is not None else None
        )

    def set_slot_counts(self, counts: dict[str, object]) -> dict[str, int]:
        """Route each named model over its new count from now on (a scale event). Checked
        as a whole first (``InvalidSlotCounts``, 400); jump hashing moves only the keys
        it must."""
        return self.slots.update(counts)

    def deadline(self, timeout_s: float | None = None, on_sleep: str | None = None) -> Deadline:
        """A request's one deadline, set at its arrival: ``timeout_s`` (the client's
        ``x-rmgate-timeout``) capped at ``gateway.request_timeout_s``, or that setting;
        ``on_sleep`` its ``x-rmgate-on-sleep``."""
        limit = self.settings.request_timeout_s
        return Deadline.after(
            limit if timeout_s is None else min(timeout_s, limit), on_sleep=on_sleep
        )

    # ---- model resolution -------------------------------------------------------------
    def scaling_state(self, model: str) -> str | None:
        """``scaling`` while the autoscaler changes ``model``'s slots (else None)."""
        return "scaling" if (self.autoscaling.get(model) or {}).get("scaling") else None

    def resolve_model(
        self, name: str | None, kind: Kind | None, default: str | None = None
    ) -> ModelSpec:
        """The model a request names (its name or its path), else ``default``, else the
        only model of ``kind`` (of any kind when ``kind`` is None)."""
        name = name if name is not None else default
        if name is not None:
            spec = self.config.model(name)
            if spec is None:
                raise ModelNotFound(
                    f"The model `{name}` does not exist. Served models (and "
                    f"the other names they answer to): "
                    f"{self.config.model_names()}",
                    param="model",
                )
            if kind is not None and spec.kind != kind:
                other = "/v1/chat/completions" if spec.kind == "generative" else "/classify"
                raise WrongModelKind(f"model `{name}` is {spec.kind}; use {other}", param="model")
            return spec
        candidates = [m for m in self.config.models if kind is None or m.kind == kind]
        if len(candidates) == 1:
            return candidates[0]
        what = f"{kind} models" if kind else "models"
        if not candidates:
            raise ModelNotFound(f"no {kind} model is served", param="model")
        hint = "" if kind else " and no default_reward_model is configured"
        raise ModelRequired(
            f"`model` is required: {len(candidates)} {what} are served "
            f"({[m.name for m in candidates]}){hint}",
            param="model",
        )

    # ---- answering --------------------------------------------------------------------
    def answer(
        self,
        request: EngineRequest,
        deadline: Deadline,
        use_cache: bool | None = None,
        placement: Placement | None = None,
    ) -> Coroutine[Any, Any, tuple[Route, EngineReply]]:
        """The answer to one engine request: from the ledger or an identical call in
        flight when the cache may answer (``gateway.core.ledger_policy.reuse``), else the
        engine's, and recorded. Nothing waits past ``deadline``: a last-resort guard
        answers 504 ``GUARD_MARGIN_S`` after it whatever happened (the transport ends its
        own waits at the deadline). ``placement``: decided by the caller (a group's, made
        once for all its items), else the request's own.

        Traced as the stage ``rmgate.answer`` when tracing is on
        (``gateway.core.api.stages``); off, this returns the untraced coroutine itself."""
        if stages.TRACER is None:
            return self._answer(request, deadline, use_cache, placement)
        return self._traced_answer(stages.TRACER, request, deadline, use_cache, placement)

    async def _traced_answer(
        self,
        tracer: stages.StageTracer,
        request: EngineRequest,
        deadline: Deadline,
        use_cache: bool | None,
        placement: Placement | None,
    ) -> tuple[Route, EngineReply]:
        with tracer.stage(
            "rmgate.answer",
            {
                "rmgate.model": request.model.name,
                "rmgate.endpoint": request.path,
                "rmgate.key": key_hex(request.key),
            },
        ) as stage:
            route, reply = await self._answer(request, deadline, use_cache, placement)
            for name, value in route_attributes(route, reply.status).items():
                stage.set_attribute(name, value)
            return route, reply

    async def _answer(
        self,
        request: EngineRequest,
        deadline: Deadline,
        use_cache: bool | None,
        placement: Placement | None,
    ) -> tuple[Route, EngineReply]:
        spec = request.model
        placement = placement or self.placement(spec, request.key)

        async def call() -> tuple[Route, EngineReply]:
            return await self._post(request, deadline, placement)

        try:
            async with asyncio.timeout(deadline.remaining() + GUARD_MARGIN_S):
                if self.reuse is None:
                    return await call()
                return await self.reuse.answer(
                    Ask(
                        spec.name,
                        request.path,
                        request.body,
                        request.key,
                        placement.numerics_class,
                        request.seed,
                        cacheable=cache_decision(self.settings.cache, use_cache)
                        and spec.determinism != "off",
                    ),
                    call,
                )
        except TimeoutError:
            raise deadline.exceeded(f"routing it to {spec.name}'s slots") from None

    async def _post(
        self, request: EngineRequest, deadline: Deadline, placement: Placement | None
    ) -> tuple[Route, EngineReply]:
        """Send to the key's placement; when a scale-down removes the slot under the
        request, place it again under the new count (same bits: homogeneous replicas), and
        when a chosen class mate turned out to be of another class now, place it again
        under the slots' current classes."""
        spec, key = request.model, request.key
        for _ in range(MAX_REROUTES):
            placement = placement or self.placement(spec, key)
            try:
                reply = await self.transport.post(
                    spec.name, placement, request.path, request.body, deadline
                )
            except SlotRemoved as exc:
                logger.info("%s; routing %s again", exc, key_hex(key))
                placement = None
                continue
            reason = None
            if placement.within_class and reply.slot != placement.home:
                reason = reply.reason or (
                    placement.reason
                    if reply.slot == placement.first and placement.reason != "preferred"
                    else "unavailable"
                )
            return Route(
                key,
                placement.home,
                reply.slot,
                reply.fingerprint,
                reply.numerics_class,
                placement.within_class,
                reason,
            ), reply
        raise Rescaling(f"model {spec.name} is being rescaled; retry")

    def placement(self, spec: ModelSpec, key: int) -> Placement:
        """The placement policy's decision for ``key`` (pure:
        ``gateway.core.routing.placement``), on the slots' classes and load of now."""
        settings = self.settings
        n = self.slots.count(spec.name)
        if settings.placement == "class" and n > 1:
            view = self.transport.slot_view(spec.name, n)
            return place_in_class(
                key,
                view.classes,
                view.load,
                failover=settings.failover,
                slot_wait_s=settings.slot_wait_s,
                failover_after_s=settings.failover_after_s,
                load_bound=settings.load_bound,
                service_s=view.service_s,
            )
        pinned = place(key, n, settings.failover, settings.slot_wait_s, settings.failover_after_s)
        if self.reuse is None:
            return pinned
        # the class its own slot reports: what names the reward in the ledger
        home_class = self.transport.slot_view(spec.name, n).classes.classes[pinned.home]
        return dataclasses.replace(pinned, numerics_class=home_class)
