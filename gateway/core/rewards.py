"""Reward scoring on top of the routing core: ``/v1/rewards`` and OpenRLHF's ``/get_reward``.

Every item becomes one ordinary engine request built exactly as a client would send it
(a ``/classify`` chat request for a DisRM, a ``/v1/chat/completions`` judge request for a
GRM) and goes through ``RewardGateway``, so an item's reward has the same key, slot, seed
and bits as that request sent on its own.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictStr

from gateway.core.chat_text import prompt_text, response_text
from gateway.core.concurrency import all_or_cancel
from gateway.core.config import ModelSpec
from gateway.core.deadline import Deadline
from gateway.core.errors import InvalidSchema, RmgateError
from gateway.core.keys import canonical_json
from gateway.core.requests import parse_json_object, validate
from gateway.core.results import GatewayResult, Route
from gateway.core.scoring import judge_prompt
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


def _routes(scored: list[Scored]) -> tuple[Route, ...]:
    return tuple(route for item in scored for route in item.routes)


class RewardScorer:
    """Turns (prompt, response, label) items into rewards with the configured models."""

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

    async def _call(self, path: str, body: dict[str, Any], index: int) -> GatewayResult:
        call = self.gateway.generate if path == "/v1/chat/completions" else self.gateway.pool
        try:
            return await call(path, canonical_json(body), self.deadline, self.use_cache)
        except RmgateError as err:
            raise err.for_item(index)

    async def _score_disrm(self, spec: ModelSpec, index: int, *, messages: list[dict[str, Any]] | None,
                           text: str | None) -> Scored:
        body: dict[str, Any] = {"model": spec.name, "use_activation": False}
        if messages is not None:
            body["messages"] = messages
        else:
            # OpenRLHF's query is the policy's whole token sequence as text, BOS included,
            # and may be longer than the RM's context: add no special tokens a second time
            # and truncate to the context (the side OpenRLHF's own RM server's tokenizer
            # uses, configurable), as its RM server does, instead of answering 400.
            body.update(input=text, add_special_tokens=False, truncate_prompt_tokens=-1,
                        truncation_side=self.gateway.config.gateway.get_reward_truncation_side)
        result = await self._call("/classify", body, index)
        score = float(json.loads(result.body)["data"][-1]["probs"][-1])
        return Scored(score, {"index": index, **_route_detail(result), "raw_score": score},
                      result.routes)

    async def _score_grm(self, spec: ModelSpec, index: int, prompt: str, response: str,
                         label: str | None) -> Scored:
        content = judge_prompt(spec.scorer, prompt, response, label)
        body = {"model": spec.name, "messages": [{"role": "user", "content": content}]}
        result = await self._call("/v1/chat/completions", body, index)
        text = json.loads(result.body)["choices"][0]["message"]["content"] or ""
        parsed = self.gateway.parsers[spec.name](text)
        detail = {"index": index, **_route_detail(result), "judge_text": text,
                  "parsed": parsed is not None}
        if parsed is None:
            detail["error"] = f"no score found by parser '{spec.scorer.parser}'; default used"
        return Scored(parsed if parsed is not None else spec.scorer.default, detail,
                      result.routes)

    async def _score_item(self, spec: ModelSpec, index: int, item: RewardItem) -> Scored:
        if item.prompt is None and item.messages is None:
            raise InvalidSchema(f"items[{index}]: one of `prompt` or `messages` is required",
                                param="items")
        if spec.kind == "discriminative":
            msgs = list(item.messages) if item.messages is not None else \
                [{"role": "user", "content": item.prompt}]
            msgs.append({"role": "assistant", "content": item.response})
            return await self._score_disrm(spec, index, messages=msgs, text=None)
        prompt = item.prompt
        if prompt is None:
            users = [m.get("content") for m in item.messages or [] if m.get("role") == "user"]
            prompt = str(users[-1]) if users else ""
        return await self._score_grm(spec, index, prompt, item.response, _label_text(item.label))

    async def rewards(self, raw: bytes) -> GatewayResult:
        req = validate(RewardsRequest, parse_json_object(raw))
        spec = self.reward_model(req.model)
        # one failed item fails the request: the others are cancelled (engines abort them)
        scored = await all_or_cancel(self._score_item(spec, i, it)
                                     for i, it in enumerate(req.items))
        body = {"model": spec.name, "rewards": [s.reward for s in scored],
                "details": [s.detail for s in scored]}
        return GatewayResult(model=spec.name, body=json.dumps(body, ensure_ascii=False).encode(),
                             endpoint="/v1/rewards", routes=_routes(scored))

    async def get_reward(self, raw: bytes) -> GatewayResult:
        req = validate(GetRewardRequest, parse_json_object(raw))
        n = len(req.query)
        prompts = req.prompts if req.prompts is not None else [""] * n
        labels = req.labels if req.labels is not None else [None] * n
        if len(prompts) != n or len(labels) != n:
            raise InvalidSchema(f"query, prompts and labels must have one entry each "
                                f"(got {n}, {len(prompts)}, {len(labels)})")
        scored: list[Scored] = []
        model = ""
        if n:
            spec = self.reward_model(None)
            model = spec.name
            if spec.kind == "discriminative":
                jobs = [self._score_disrm(spec, i, messages=None, text=q)
                        for i, q in enumerate(req.query)]
            else:  # the judge is asked about the question and the answer as plain text
                jobs = [self._score_grm(spec, i, prompt_text(p), response_text(q, p),
                                        _label_text(lab))
                        for i, (q, p, lab) in enumerate(zip(req.query, prompts, labels))]
            scored = await all_or_cancel(jobs)
        rewards = [s.reward for s in scored]
        # The same keys in every answer, an empty shard included (OpenRLHF gathers them
        # across shards: a missing key is its KeyError): `parsed` is 1.0 where a score was
        # read (always, for a DisRM) and 0.0 where the judge's default was used. Only
        # request-determined values: OpenRLHF logs extra_logs as training metrics, so two
        # identical runs must log the same numbers; the answering slot (free under class
        # placement) stays in the x-rmgate-slot header and /v1/rewards details.
        extra: dict[str, Any] = {"parsed": [float(s.detail.get("parsed", True)) for s in scored]}
        body = {"rewards": rewards, "scores": rewards, "extra_logs": extra}
        return GatewayResult(model=model, body=json.dumps(body).encode(), endpoint="/get_reward",
                             routes=_routes(scored))
