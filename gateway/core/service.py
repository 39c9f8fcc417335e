"""The core's front: one object per ingress replica that answers every scoring endpoint.

``RewardService`` composes the router (``gateway.core.routing.router``), the vLLM-shaped
endpoints (``gateway.core.vllm_api``) and reward scoring (``gateway.core.scoring``). Each
endpoint is one method taking the raw body, the request's deadline and what it asked of
the cache; the HTTP layer's route table (``gateway.http.routes``) names these methods.

Free of Ray, FastAPI, HTTP clients and Prometheus (``tests/unit/test_layers.py`` holds
the core to that): it returns typed ``GatewayResult``s and raises ``RmgateError``s; the
HTTP layer renders both, the transport does the I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.core.api import slime
from gateway.core.api.results import GatewayResult
from gateway.core.api.schemas import ModelList
from gateway.core.config.settings import AppConfig, Kind, ModelSpec
from gateway.core.elastic.control import ElasticControl
from gateway.core.ledger_policy.reuse import RewardLedger
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.engine_access import Transport
from gateway.core.routing.router import Router
from gateway.core.routing.slots import SlotTable
from gateway.core.scoring.base import CodeRunner, RuleRunner
from gateway.core.scoring.rewards import RewardScoring
from gateway.core.vllm_api.endpoints import VllmEndpoints


class RewardService:
    """Every scoring endpoint of one ingress replica, over ``transport``."""

    def __init__(
        self,
        config: AppConfig,
        transport: Transport,
        slots: SlotTable | None = None,
        ledger: RewardLedger | None = None,
        rules: RuleRunner | None = None,
        code: CodeRunner | None = None,
    ) -> None:
        self.config = config
        self.transport = transport
        self.router = Router(config, transport, slots, ledger)
        self.slots = self.router.slots
        self.vllm = VllmEndpoints(self.router)
        self.scoring = RewardScoring(self.router, rules, code)
        #: The API keys requests must carry (empty: auth is off).
        self.api_keys = config.gateway.load_api_keys()
        #: The keys that may also sleep, wake and scale (admin routes).
        self.admin_keys = config.gateway.load_admin_api_keys()
        self.elastic = ElasticControl(self.router)

    # ---- what the edge needs ----------------------------------------------------------
    def deadline(self, timeout_s: float | None = None, on_sleep: str | None = None) -> Deadline:
        """A request's one deadline (``Router.deadline``)."""
        return self.router.deadline(timeout_s, on_sleep)

    def set_slot_counts(self, counts: dict[str, Any]) -> dict[str, int]:
        """A scale event: each named model's new slot count (``Router.set_slot_counts``)."""
        return self.router.set_slot_counts(counts)

    def resolve_model(
        self, name: str | None, kind: Kind | None, default: str | None = None
    ) -> ModelSpec:
        """The model a request names (``Router.resolve_model``)."""
        return self.router.resolve_model(name, kind, default)

    async def models(self, timeout_s: float = 2.0) -> ModelList:
        """``GET /v1/models``."""
        return await self.vllm.models(timeout_s)

    # ---- the scoring endpoints: (raw body, deadline, cache ask) -> result -------------
    async def chat_completions(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /v1/chat/completions`` (a generative model)."""
        return await self.vllm.generate(
            "/v1/chat/completions", raw, deadline or self.deadline(), use_cache
        )

    async def completions(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /v1/completions`` (a generative model)."""
        return await self.vllm.generate(
            "/v1/completions", raw, deadline or self.deadline(), use_cache
        )

    async def classify(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /classify`` (a discriminative model)."""
        return await self.vllm.pool("/classify", raw, deadline or self.deadline(), use_cache)

    async def pooling(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /pooling`` (a discriminative model)."""
        return await self.vllm.pool("/pooling", raw, deadline or self.deadline(), use_cache)

    async def embeddings(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /v1/embeddings`` (a discriminative model's raw logits)."""
        return await self.vllm.embed(raw, deadline or self.deadline(), use_cache)

    async def rewards(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /v1/rewards``."""
        return await self.scoring.rewards(raw, deadline or self.deadline(), use_cache)

    async def get_reward(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /get_reward`` (OpenRLHF's remote reward protocol)."""
        return await self.scoring.get_reward(raw, deadline or self.deadline(), use_cache)

    async def slime_reward(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /slime/reward`` (slime's ``--rm-type remote_rm``): its samples as
        ``/v1/rewards`` items, each in the group of its prompt, scored with
        ``gateway.default_reward_model``; answered as slime reads it
        (``gateway.core.api.slime``)."""
        samples, single = slime.parse(raw)
        if not samples:
            return GatewayResult(model="", body=b"[]", endpoint=slime.SLIME_PATH)
        result = await self.rewards(slime.rewards_body(samples), deadline, use_cache)
        body = slime.answer(result.body, single)
        return dataclasses.replace(result, body=body, endpoint=slime.SLIME_PATH)
