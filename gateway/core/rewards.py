"""Reward scoring on top of the routing core: ``/v1/rewards`` and OpenRLHF's ``/get_reward``.

An item is scored by a scorer (``gateway.core.scorers``): a model's own, or each component
of a reward program (``gateway.core.programs`` combines them). A scorer's engine requests
are built exactly as a client would send them and go through ``RewardGateway``, so an
item's reward has the same key, slot, seed, ledger row and bits as that request sent on
its own; its rule checks go to the rule pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Awaitable, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictStr

from gateway.core.chat_text import prompt_text, response_text
from gateway.core.concurrency import all_or_cancel
from gateway.core.config import ModelSpec
from gateway.core.deadline import Deadline
from gateway.core.errors import (DeadlineExceeded, InvalidSchema, RmgateError, RuleCheckFailed,
                                 ScoreUnreadable)
from gateway.core.keys import canonical_json
from gateway.core.requests import parse_json_object, validate
from gateway.core.programs import ComponentScore, apply_transform, combine
from gateway.core.results import ComponentFailure, GatewayResult, Route
from gateway.core.scorers.base import EngineCall, RewardInput, RuleCall, Score, Scorer
from gateway.core.scorers.specs import ComponentSpec, ProgramSpec
from gateway.core.service import RewardGateway

#: A dataset's label as the trainer sends it: OpenRLHF passes the label field unchanged (a
#: string, a number, a bool, a list or a dict); the judge sees it as text (``_label_text``).
Label = JsonValue


class RewardItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: StrictStr | None = None
    messages: list[dict[str, Any]] | None = None
    response: StrictStr
    label: Label = None


class RewardsRequest(BaseModel):
    """``POST /v1/rewards``: one float reward per item, in item order."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    items: list[RewardItem] = Field(max_length=100_000)


class GetRewardRequest(BaseModel):
    """OpenRLHF's remote reward request (``--reward.remote_url .../get_reward``)."""

    model_config = ConfigDict(extra="allow")
    query: list[StrictStr] = Field(default_factory=list)
    prompts: list[StrictStr] | None = None
    labels: list[Label] | None = None


def _label_text(label: Label) -> str | None:
    """A label as the judge's ``{label}`` field: a string as is, anything else as JSON
    text with sorted keys (``true``, ``[1, 2]``, ``{"a": 1}``), so two spellings of one
    label ask the judge the same question."""
    if label is None or isinstance(label, str):
        return label
    return json.dumps(label, ensure_ascii=False, sort_keys=True, allow_nan=False)


def _route_detail(result: GatewayResult) -> dict[str, Any]:
    """What decided an item's reward: its key, the slot that answered, its seed."""
    detail: dict[str, Any] = {"key": result.key_hex, "slot": result.slots[-1]}
    if result.numerics_classes:
        detail["numerics_class"] = result.numerics_classes[-1]
    if result.seed is not None:
        detail["seed"] = result.seed
    receipts = result.receipts
    if receipts and receipts[-1]:
        detail["receipt"] = receipts[-1]
    if result.cache is not None:
        detail["cache"] = result.cache
    return detail


class Scored(NamedTuple):
    """One item's reward, its details, and the engine routes that produced it (for the
    response's ``x-rmgate-slot`` / ``x-rmgate-class`` headers)."""

    reward: float
    detail: dict[str, Any]
    routes: tuple[Route, ...]
    #: Reward programs: the components that failed, and whether the default was used.
    failures: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    default_used: bool = False
    #: Reward programs: each component's transformed score (0.0 where it failed).
    series: dict[str, float] | None = None


def _routes(scored: list[Scored]) -> tuple[Route, ...]:
    return tuple(route for item in scored for route in item.routes)


Target = ModelSpec | ProgramSpec


class RewardScorer:
    """Turns (prompt, response, label) items into rewards with the configured scorers:
    a model's own (``/v1/rewards`` naming a model) or a program's components."""

    def __init__(self, gateway: RewardGateway, deadline: Deadline | None = None,
                 use_cache: bool | None = None) -> None:
        self.gateway = gateway
        #: What the request asked of the cache (``x-rmgate-cache``; None: nothing).
        self.use_cache = use_cache
        #: The request's one deadline: every item's engine request ends by it.
        self.deadline = deadline or gateway.deadline()

    def reward_model(self, name: str | None) -> ModelSpec:
        """The model a rewards request names, else ``default_reward_model``, else the only
        model served (of either kind)."""
        return self.gateway.resolve_model(name, None,
                                          default=self.gateway.config.gateway.default_reward_model)

    def target(self, name: str | None) -> Target:
        """The program a rewards request names (or ``default_reward_model`` names), else
        the model (``reward_model``)."""
        config = self.gateway.config
        program = config.program(name if name is not None else config.gateway.default_reward_model)
        return program if program is not None else self.reward_model(name)

    async def _call(self, path: str, body: dict[str, Any], index: int) -> GatewayResult:
        call = self.gateway.generate if path == "/v1/chat/completions" else self.gateway.pool
        try:
            return await call(path, canonical_json(body), self.deadline, self.use_cache)
        except RmgateError as err:
            raise err.for_item(index)

    async def _rule(self, call: RuleCall) -> float:
        rules = self.gateway.rules
        if rules is None:
            raise RuleCheckFailed("no rule pool is running in this gateway", reason="error")
        try:
            async with asyncio.timeout(self.deadline.remaining()):
                return await rules.run(call)
        except TimeoutError:
            raise self.deadline.exceeded("running a rule check") from None

    async def _run(self, scorer: Scorer, item: RewardInput
                   ) -> tuple[Score, tuple[Route, ...], dict[str, Any]]:
        """Send a scorer's calls (engine requests through the gateway, rule checks
        through the rule pool), in order, and read their answers."""
        answers: list[Any] = []
        routes: list[Route] = []
        route_detail: dict[str, Any] = {}
        for call in scorer.calls(item):
            if isinstance(call, EngineCall):
                result = await self._call(call.path, call.body, item.index)
                answers.append(json.loads(result.body))
                routes.extend(result.routes)
                route_detail = _route_detail(result)
            else:
                answers.append(await self._rule(call))
        return scorer.read(item, answers), tuple(routes), route_detail

    async def _score_model(self, spec: ModelSpec, item: RewardInput) -> Scored:
        score, routes, route_detail = await self._run(self.gateway.scorers.models[spec.name],
                                                      item)
        if score.value is None:
            raise ScoreUnreadable(f"item {item.index}: {score.message}")
        return Scored(score.value, {"index": item.index, **route_detail, **score.detail},
                      routes)

    async def _component(self, program: ProgramSpec, comp: ComponentSpec,
                         item: RewardInput) -> ComponentScore:
        scorer = self.gateway.scorers.components[(program.name, comp.name)]
        try:
            score, routes, route_detail = await self._run(scorer, item)
        except RuleCheckFailed as err:
            return ComponentScore(comp.name, comp.weight, None, None, err.reason, err.message)
        except DeadlineExceeded:
            raise
        except RmgateError as err:
            if program.on_failure == "error":
                raise  # the engine's own status (503, 504...), for the trainer's retries
            return ComponentScore(comp.name, comp.weight, None, None, "engine",
                                  f"{err.code}: {err.message}")
        detail = {**route_detail, **score.detail}
        if score.failure:
            return ComponentScore(comp.name, comp.weight, score.value, None, score.failure,
                                  score.message, detail, routes)
        return ComponentScore(comp.name, comp.weight, score.value,
                              apply_transform(score.value, comp.transform)
                              if score.value is not None else None,
                              None, None, detail, routes)

    async def _score_program(self, program: ProgramSpec, item: RewardInput) -> Scored:
        parts = await all_or_cancel(self._component(program, comp, item)
                                    for comp in program.components)
        outcome = combine(program, parts, item.index)
        detail: dict[str, Any] = {
            "index": item.index, "program": program.name,
            "components": [p.as_detail() for p in parts],
            "failed": list(outcome.failed), "default_used": outcome.default_used}
        receipts = [r.receipt for p in parts for r in p.routes if r.receipt]
        if receipts:
            detail["receipts"] = receipts
        return Scored(outcome.reward, detail, tuple(r for p in parts for r in p.routes),
                      outcome.failed, tuple(p.failure or "" for p in parts if p.failure),
                      outcome.default_used,
                      {p.name: p.transformed if p.transformed is not None and not p.failure
                       else 0.0 for p in parts})

    def _score(self, target: Target, item: RewardInput) -> Awaitable[Scored]:
        if isinstance(target, ProgramSpec):
            return self._score_program(target, item)
        return self._score_model(target, item)

    @staticmethod
    def _result(target: Target, scored: list[Scored], endpoint: str, body: dict[str, Any]
                ) -> GatewayResult:
        failures: list[ComponentFailure] = []
        defaults = 0
        if isinstance(target, ProgramSpec):
            for s in scored:
                failures += [ComponentFailure(target.name, name, reason)
                             for name, reason in zip(s.failures, s.reasons)]
                defaults += s.default_used
        return GatewayResult(model=target.name, body=json.dumps(body, ensure_ascii=False).encode(),
                             endpoint=endpoint, routes=_routes(scored),
                             component_failures=tuple(failures),
                             defaults_used=((target.name, defaults),) if defaults else ())

    async def rewards(self, raw: bytes) -> GatewayResult:
        req = validate(RewardsRequest, parse_json_object(raw))
        target = self.target(req.model)
        inputs = [_item_input(i, it) for i, it in enumerate(req.items)]
        # one failed item fails the request: the others are cancelled (engines abort them)
        scored = await all_or_cancel(self._score(target, x) for x in inputs)
        body = {"model": target.name, "rewards": [s.reward for s in scored],
                "details": [s.detail for s in scored]}
        return self._result(target, scored, "/v1/rewards", body)

    async def get_reward(self, raw: bytes) -> GatewayResult:
        req = validate(GetRewardRequest, parse_json_object(raw))
        n = len(req.query)
        prompts = req.prompts if req.prompts is not None else [""] * n
        labels = req.labels if req.labels is not None else [None] * n
        if len(prompts) != n or len(labels) != n:
            raise InvalidSchema(f"query, prompts and labels must have one entry each "
                                f"(got {n}, {len(prompts)}, {len(labels)})")
        scored: list[Scored] = []
        target: Target | None = None
        if n:
            target = self.target(None)
            # a DisRM reads the whole query; a judge and the rules the question and the
            # answer as plain text
            inputs = [RewardInput(i, prompt_text(p), response_text(q, p), _label_text(lab),
                                  text=q, raw_label=lab)
                      for i, (q, p, lab) in enumerate(zip(req.query, prompts, labels))]
            scored = await all_or_cancel(self._score(target, x) for x in inputs)
        rewards = [s.reward for s in scored]
        body = {"rewards": rewards, "scores": rewards,
                "extra_logs": _extra_logs(target, scored)}
        if target is None:
            return GatewayResult(model="", body=json.dumps(body).encode(), endpoint="/get_reward")
        result = self._result(target, scored, "/get_reward", body)
        return dataclasses.replace(result, body=json.dumps(body).encode())


def _item_input(index: int, item: RewardItem) -> RewardInput:
    """A /v1/rewards item as every scorer sees it: the conversation with the response
    last (a DisRM), the last user turn as the question (a judge, the rules)."""
    if item.prompt is None and item.messages is None:
        raise InvalidSchema(f"items[{index}]: one of `prompt` or `messages` is required",
                            param="items")
    msgs = list(item.messages) if item.messages is not None else \
        [{"role": "user", "content": item.prompt}]
    msgs.append({"role": "assistant", "content": item.response})
    prompt = item.prompt
    if prompt is None:
        users = [m.get("content") for m in item.messages or [] if m.get("role") == "user"]
        prompt = str(users[-1]) if users else ""
    return RewardInput(index, prompt, item.response, _label_text(item.label), messages=msgs,
                       raw_label=item.label)


def _extra_logs(target: Target | None, scored: list[Scored]) -> dict[str, list[float]]:
    """/get_reward's ``extra_logs``. The same keys in every answer, an empty shard included
    (OpenRLHF gathers them across shards: a missing key is its KeyError), and only
    request-determined values: OpenRLHF logs them as training metrics, so two identical
    runs must log the same numbers (the answering slot, free under class placement, stays
    in the x-rmgate-slot header and /v1/rewards details).

    A model: ``parsed``, 1.0 where a score was read (always, for a DisRM) and 0.0 where the
    judge's default was used. A program: one series per component (its transformed score,
    0.0 where it failed), ``failed_components`` (how many failed) and ``default_used``."""
    if isinstance(target, ProgramSpec):
        extra: dict[str, list[float]] = {c.name: [] for c in target.components}
        for s in scored:
            for name, value in (s.series or {}).items():
                extra[name].append(value)
        extra["failed_components"] = [float(len(s.failures)) for s in scored]
        extra["default_used"] = [float(s.default_used) for s in scored]
        return extra
    return {"parsed": [float(s.detail.get("parsed", True)) for s in scored]}
