"""Reward scoring on top of the routing core: ``/v1/rewards`` and OpenRLHF's ``/get_reward``.

Every item becomes one ordinary engine request built exactly as a client would send it
(a ``/classify`` chat request for a DisRM, a ``/v1/chat/completions`` judge request for a
GRM) and goes through ``RewardGateway``, so an item's reward has the same key, slot, seed
and bits as that request sent on its own.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from gateway.core.config import ModelSpec
from gateway.http.errors import GatewayError
from gateway.core.keys import canonical_json
from gateway.core.scoring import judge_prompt
from gateway.core.service import GatewayResponse, RewardGateway, parse_json_object, validate

Label = Union[StrictStr, StrictInt, StrictFloat, None]


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
    return None if label is None else str(label)


def _headers_detail(resp: GatewayResponse) -> dict[str, Any]:
    h = resp.headers
    detail: dict[str, Any] = {"key": h.get("x-rmgate-key"), "slot": h.get("x-rmgate-slot")}
    if "x-rmgate-seed" in h:
        detail["seed"] = int(h["x-rmgate-seed"])
    return detail


class RewardScorer:
    """Turns (prompt, response, label) items into rewards with the configured models."""

    def __init__(self, gateway: RewardGateway) -> None:
        self.gateway = gateway

    def reward_model(self, name: str | None) -> ModelSpec:
        cfg = self.gateway.config
        name = name or cfg.gateway.default_reward_model
        if name is None:
            if len(cfg.models) != 1:
                raise GatewayError(400, "`model` is required: several models are served "
                                   f"({[m.name for m in cfg.models]}) and no "
                                   "default_reward_model is configured", "model_required",
                                   param="model")
            return cfg.models[0]
        spec = cfg.model(name)
        if spec is None:
            raise GatewayError(404, f"The model `{name}` does not exist", "model_not_found",
                               param="model")
        return spec

    async def _call(self, path: str, body: dict[str, Any], index: int) -> GatewayResponse:
        call = self.gateway.generate if path == "/v1/chat/completions" else self.gateway.pool
        try:
            return await call(path, canonical_json(body))
        except GatewayError as err:
            err.message = f"item {index}: {err.message}"
            raise

    async def _score_disrm(self, spec: ModelSpec, index: int, *, messages: list[dict[str, Any]] | None,
                           text: str | None) -> tuple[float, dict[str, Any]]:
        body: dict[str, Any] = {"model": spec.name, "use_activation": False}
        if messages is not None:
            body["messages"] = messages
        else:
            body["input"] = text
        resp = await self._call("/classify", body, index)
        score = float(json.loads(resp.body)["data"][-1]["probs"][-1])
        return score, {"index": index, **_headers_detail(resp), "raw_score": score}

    async def _score_grm(self, spec: ModelSpec, index: int, prompt: str, response: str,
                         label: str | None) -> tuple[float, dict[str, Any]]:
        content = judge_prompt(spec.scorer, prompt, response, label)
        body = {"model": spec.name, "messages": [{"role": "user", "content": content}]}
        resp = await self._call("/v1/chat/completions", body, index)
        text = json.loads(resp.body)["choices"][0]["message"]["content"] or ""
        parsed = self.gateway.parsers[spec.name](text)
        detail = {"index": index, **_headers_detail(resp), "judge_text": text,
                  "parsed": parsed is not None}
        if parsed is None:
            detail["error"] = f"no score found by parser '{spec.scorer.parser}'; default used"
        return (parsed if parsed is not None else spec.scorer.default), detail

    async def _score_item(self, spec: ModelSpec, index: int, item: RewardItem) -> tuple[float, dict]:
        if item.prompt is None and item.messages is None:
            raise GatewayError(422, f"items[{index}]: one of `prompt` or `messages` is required",
                               "invalid_schema", param="items")
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

    async def rewards(self, path: str, raw: bytes) -> GatewayResponse:  # noqa: ARG002
        req = validate(RewardsRequest, parse_json_object(raw))
        spec = self.reward_model(req.model)
        scored = await asyncio.gather(*(self._score_item(spec, i, it)
                                        for i, it in enumerate(req.items)))
        body = {"model": spec.name, "rewards": [s for s, _ in scored],
                "details": [d for _, d in scored]}
        return GatewayResponse(200, json.dumps(body, ensure_ascii=False).encode(),
                               {"x-rmgate-model": spec.name})

    async def get_reward(self, path: str, raw: bytes) -> GatewayResponse:  # noqa: ARG002
        req = validate(GetRewardRequest, parse_json_object(raw))
        n = len(req.query)
        prompts = req.prompts if req.prompts is not None else [""] * n
        labels = req.labels if req.labels is not None else [None] * n
        if len(prompts) != n or len(labels) != n:
            raise GatewayError(422, f"query, prompts and labels must have one entry each "
                               f"(got {n}, {len(prompts)}, {len(labels)})", "invalid_schema")
        scored: list[tuple[float, dict]] = []
        if n:
            spec = self.reward_model(None)
            if spec.kind == "discriminative":
                jobs = [self._score_disrm(spec, i, messages=None, text=q)
                        for i, q in enumerate(req.query)]
            else:
                jobs = [self._score_grm(spec, i, p, q[len(p):] if q.startswith(p) else q,
                                        _label_text(lab))
                        for i, (q, p, lab) in enumerate(zip(req.query, prompts, labels))]
            scored = list(await asyncio.gather(*jobs))
        rewards = [s for s, _ in scored]
        extra = {"slot": [int(str(d["slot"]).split(",")[0]) for _, d in scored]}
        if scored and "parsed" in scored[0][1]:
            extra["parsed"] = [float(d["parsed"]) for _, d in scored]
        body = {"rewards": rewards, "scores": rewards, "extra_logs": extra}
        return GatewayResponse(200, json.dumps(body).encode())
