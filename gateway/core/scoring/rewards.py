"""Reward scoring on top of the router: ``/v1/rewards`` and OpenRLHF's ``/get_reward``.

An item is scored by a scorer (``gateway.core.scoring.model_scorers``,
``rule_scorers``): a model's own, or each component of a reward program
(``gateway.core.scoring.programs`` combines them). A scorer's engine bodies are built as a
client would send them and become engine requests in the same place a client's do
(``gateway.core.vllm_api.requests``), so an item's reward has the key, slot, seed, ledger
row and bits of that request sent on its own; its rule checks go to the rule pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

from gateway.core.api import stages
from gateway.core.api.errors import (
    DeadlineExceeded,
    InvalidSchema,
    RmgateError,
    RuleCheckFailed,
    ScoreUnreadable,
)
from gateway.core.api.parsing import parse_json_object, validate
from gateway.core.api.results import ComponentFailure, EngineReply, GatewayResult, Route, key_hex
from gateway.core.api.schemas import GetRewardRequest, Label, RewardItem, RewardsRequest
from gateway.core.config.scoring import ComponentSpec, ProgramSpec
from gateway.core.config.settings import ModelSpec
from gateway.core.ledger_policy.identity import group_row_identity
from gateway.core.ledger_policy.reuse import Ask, cache_decision
from gateway.core.ledger_policy.row import GroupRow
from gateway.core.routing.concurrency import all_or_cancel
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.keys import group_key
from gateway.core.routing.placement import Placement
from gateway.core.routing.router import EngineRequest, Router
from gateway.core.scoring.base import (
    CodeCall,
    CodeRunner,
    EngineCall,
    RewardInput,
    RuleCall,
    RuleRunner,
    Score,
    Scorer,
)
from gateway.core.scoring.chat_text import prompt_text, response_text
from gateway.core.scoring.code_tests import CODE_ENDPOINT, CODE_MODEL, canonical, timing_dependent
from gateway.core.scoring.group_scorers import GroupScorer, MemberScore, is_group_scorer
from gateway.core.scoring.groups import CanonicalGroup, canonical_group, item_identity
from gateway.core.scoring.programs import ComponentScore, apply_transform, combine
from gateway.core.scoring.registry import Scorers
from gateway.core.vllm_api.endpoints import answer_pooled, generative_result
from gateway.core.vllm_api.requests import generative_request, pooling_requests


def _label_text(label: Label) -> str | None:
    """A label as the judge's ``{label}`` field: a string as is, anything else as JSON
    text with sorted keys (``true``, ``[1, 2]``, ``{"a": 1}``), so two spellings of one
    label ask the judge the same question."""
    if label is None or isinstance(label, str):
        return label
    return json.dumps(label, ensure_ascii=False, sort_keys=True, allow_nan=False)


def _route_detail(request: EngineRequest, route: Route) -> dict[str, Any]:
    """What decided an item's reward: its key, the slot that answered, its seed."""
    detail: dict[str, Any] = {"key": key_hex(request.key), "slot": route.answered_by}
    if route.numerics_class:
        detail["numerics_class"] = route.numerics_class
    if request.seed is not None:
        detail["seed"] = request.seed
    if route.receipt:
        detail["receipt"] = route.receipt
    if route.cache:
        detail["cache"] = route.cache
    return detail


class GroupRun(NamedTuple):
    """A group scorer's run over one group: the canonical group, each member's score, and
    the routes of its calls (in call order)."""

    group: CanonicalGroup
    scores: list[MemberScore]
    routes: list[Route]


class Scored(NamedTuple):
    """One item's reward, its details, and the engine routes that produced it (for the
    response's ``x-rmgate-slot`` / ``x-rmgate-class`` headers). ``reward`` None: masked
    (``on_failure: mask``; the details say why)."""

    reward: float | None
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

#: The engine paths a generative model answers (the rest are pooling paths).
GENERATIVE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class RewardScoring:
    """What scores rewards: the router, every scorer the config names (built once, not
    per request), the rule pool (None: no program has a rule component) and the code
    sandboxes (None: no program has a ``code_tests`` rule)."""

    def __init__(
        self, router: Router, rules: RuleRunner | None = None, code: CodeRunner | None = None
    ) -> None:
        self.router = router
        self.scorers = Scorers(router.config)
        self.rules = rules
        self.code = code

    async def rewards(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /v1/rewards``."""
        return await RewardScorer(self, deadline, use_cache).rewards(raw)

    async def get_reward(
        self, raw: bytes, deadline: Deadline | None = None, use_cache: bool | None = None
    ) -> GatewayResult:
        """``POST /get_reward`` (OpenRLHF)."""
        return await RewardScorer(self, deadline, use_cache).get_reward(raw)


class RewardScorer:
    """One rewards request: turns its (prompt, response, label) items into rewards with
    the configured scorers: a model's own (``/v1/rewards`` naming a model) or a
    program's components."""

    def __init__(
        self,
        scoring: RewardScoring,
        deadline: Deadline | None = None,
        use_cache: bool | None = None,
    ) -> None:
        self.scoring = scoring
        self.router = scoring.router
        #: What the request asked of the cache (``x-rmgate-cache``; None: nothing).
        self.use_cache = use_cache
        #: The request's one deadline: every item's engine request ends by it.
        self.deadline = deadline or self.router.deadline()
        #: (model, group) -> the group's placement, decided at its first engine request:
        #: every item of a group goes where its first went (the group spreads load, not
        #: its items), whatever the load did since.
        self.group_placements: dict[tuple[str, str], Placement] = {}
        #: group name -> the request's items that carry it (``rewards``).
        self.groups: dict[str, list[RewardInput]] = {}
        #: (program, component, group) -> the group scorer's run, shared by its items.
        self.group_runs: dict[tuple[str, str, str], asyncio.Task[GroupRun]] = {}

    def reward_model(self, name: str | None) -> ModelSpec:
        """The model a rewards request names, else ``default_reward_model``, else the only
        model served (of either kind)."""
        return self.router.resolve_model(
            name, None, default=self.router.config.gateway.default_reward_model
        )

    def target(self, name: str | None) -> Target:
        """The program a rewards request names (or ``default_reward_model`` names), else
        the model (``reward_model``)."""
        config = self.router.config
        program = config.program(name if name is not None else config.gateway.default_reward_model)
        return program if program is not None else self.reward_model(name)

    def _placement(self, spec: ModelSpec, group: str | None) -> Placement | None:
        """A group's one placement on ``spec``'s slots (None: an item alone, placed by its
        own key)."""
        if group is None:
            return None
        found = self.group_placements.get((spec.name, group))
        if found is None:
            found = self.router.placement(spec, group_key(spec.name, group))
            self.group_placements[(spec.name, group)] = found
        return found

    async def _engine(
        self, call: EngineCall, item: RewardInput
    ) -> tuple[Any, Route, dict[str, Any]]:
        """A scorer's engine call as its engine request, answered: the parsed answer, its
        route and what decided it. A failure is the item's (``items[i]``)."""
        try:
            generative = call.path in GENERATIVE_PATHS
            spec = self.router.resolve_model(
                call.body.get("model"), "generative" if generative else "discriminative"
            )
            body = dict(call.body)  # the builders set fields in place
            placement = self._placement(spec, item.group)
            if generative:
                request = generative_request(
                    spec, call.path, body, self.router.sampling_defaults[spec.name]
                )
                route, reply = await self.router.answer(
                    request, self.deadline, self.use_cache, placement
                )
                generative_result(request, route, reply)  # raises an engine's non-200
            else:
                requests = pooling_requests(spec, call.path, body)
                request = requests.items[0]  # a scorer's pooling body holds one input
                route, reply = await answer_pooled(
                    self.router, requests, 0, self.deadline, self.use_cache, placement
                )
        except RmgateError as err:
            raise err.for_item(item.index) from err
        return json.loads(reply.body), route, _route_detail(request, route)

    async def _rule(self, call: RuleCall) -> float:
        rules = self.scoring.rules
        if rules is None:
            raise RuleCheckFailed("no rule pool is running in this gateway", reason="error")
        try:
            async with asyncio.timeout(self.deadline.remaining()):
                if stages.TRACER is None:
                    return await rules.run(call)
                return await _traced_rule(stages.TRACER, rules, call)
        except TimeoutError:
            raise self.deadline.exceeded("running a rule check") from None

    async def _code(self, call: CodeCall) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A submission's verdicts, and where they came from (its receipt, the cache):
        from the ledger when an identical submission's result is recorded, shared with an
        identical one in flight, else run in the rule's sandbox (recorded unless a test
        came near its limits), all within the request's deadline."""
        code = self.scoring.code
        if code is None:
            raise RuleCheckFailed("no code sandbox is running in this gateway", reason="sandbox")
        reuse = self.router.reuse
        try:
            async with asyncio.timeout(self.deadline.remaining()):
                if reuse is None or not call.recorded:
                    return await code.run(call, call.timeout_s), {}
                sandbox = code.identity(call.rule)

                async def run() -> tuple[Route, EngineReply]:
                    verdicts = await code.run(call, call.timeout_s)
                    named = None if timing_dependent(verdicts) else sandbox
                    body = json.dumps({"tests": verdicts}, sort_keys=True).encode()
                    return Route(0, 0, 0, None, named), EngineReply(200, body, None, 0, named)

                ask = Ask(
                    CODE_MODEL,
                    CODE_ENDPOINT,
                    canonical(call.submission),
                    0,
                    sandbox,
                    cacheable=cache_decision(self.router.settings.cache, self.use_cache),
                )
                route, reply = await reuse.answer(ask, run)
        except TimeoutError:
            raise self.deadline.exceeded("running code tests") from None
        detail: dict[str, Any] = {}
        if route.receipt:
            detail["receipt"] = route.receipt
        if route.cache:
            detail["cache"] = route.cache
        verdicts: list[dict[str, Any]] = json.loads(reply.body)["tests"]
        return verdicts, detail

    async def _run(
        self, scorer: Scorer, item: RewardInput
    ) -> tuple[Score, tuple[Route, ...], dict[str, Any]]:
        """Send a scorer's calls (engine requests through the router, rule checks
        through the rule pool), in order, and read their answers."""
        answers: list[Any] = []
        routes: list[Route] = []
        route_detail: dict[str, Any] = {}
        for call in scorer.calls(item):
            if isinstance(call, EngineCall):
                answer, route, route_detail = await self._engine(call, item)
                answers.append(answer)
                routes.append(route)
            elif isinstance(call, CodeCall):
                verdicts, route_detail = await self._code(call)
                answers.append(verdicts)
            else:
                answers.append(await self._rule(call))
        return scorer.read(item, answers), tuple(routes), route_detail

    async def _score_model(self, spec: ModelSpec, item: RewardInput) -> Scored:
        """The model's own scorer on one item. Under ``on_failure: mask`` an item the model
        fails to score (the engine's error, an answer without a score) has no reward and
        says why; the request's deadline still fails the request (504: the trainer
        retries)."""
        masking = spec.on_failure == "mask"
        try:
            score, routes, route_detail = await self._run(
                self.scoring.scorers.models[spec.name], item
            )
        except DeadlineExceeded:
            raise
        except RmgateError as err:
            if not masking:
                raise
            return _masked(item, f"engine: {err.code}: {err.message}")
        detail = {"index": item.index, **_group_detail(item), **route_detail, **score.detail}
        if masking and (score.value is None or score.failure):
            reason = f"{score.failure or 'unreadable'}: {score.message}"
            return Scored(None, {**detail, "mask": True, "mask_reason": reason}, routes)
        if score.value is None:
            raise ScoreUnreadable(f"item {item.index}: {score.message}")
        return Scored(score.value, detail, routes)

    def _check_group(self, program: ProgramSpec, comp: ComponentSpec, item: RewardInput) -> str:
        """The item's group, which a group scorer needs (422 without one, or when the
        group's items ask different questions: a comparison needs one)."""
        kind = comp.scorer.type if comp.scorer else ""
        what = f"program {program.name!r}, component {comp.name!r} ({kind})"
        if item.group is None:
            raise InvalidSchema(
                f"items[{item.index}]: {what} compares the items of a group: give each item "
                f"a `group`",
                param=f"items[{item.index}].group",
            )
        prompts = {m.prompt for m in self.groups[item.group]}
        if len(prompts) > 1:
            raise InvalidSchema(
                f"group {item.group!r}: its items ask {len(prompts)} different prompts; "
                f"{what} compares answers to one question",
                param=f"items[{item.index}].group",
            )
        return item.group

    async def _run_group(
        self, program: ProgramSpec, comp: ComponentSpec, scorer: GroupScorer, name: str
    ) -> GroupRun:
        """A group scorer's calls, all on the group's slot, and its members' scores."""
        group = canonical_group(name, self.groups[name])
        head = group.members[0]
        answered = await all_or_cancel(
            self._engine(call, head) for call in scorer.group_calls(group)
        )
        routes = [route for _, route, _ in answered]
        scores = scorer.read_group(
            group, [answer for answer, _, _ in answered], [r.receipt for r in routes]
        )
        self._record_group(program, comp, scorer, group, scores, routes)
        return GroupRun(group, scores, routes)

    def _record_group(
        self,
        program: ProgramSpec,
        comp: ComponentSpec,
        scorer: GroupScorer,
        group: CanonicalGroup,
        scores: list[MemberScore],
        routes: list[Route],
    ) -> None:
        """The group's row in the ledger (where one records): each member's score and the
        receipts of the answers it was read from."""
        reuse = self.router.reuse
        if reuse is None:
            return
        members = [
            {
                "item": item_identity(member),
                "score": s.score.value,
                "receipts": [routes[c].receipt for c in s.calls if routes[c].receipt],
            }
            for member, s in zip(group.members, scores, strict=True)
        ]
        reuse.ledger.record_group(
            GroupRow(
                group_row_identity(program.name, comp.name, group.identity),
                group.identity,
                program.name,
                comp.name,
                scorer.type,
                json.dumps(members, sort_keys=True),
                time.time(),
            )
        )

    async def _group_member(
        self, program: ProgramSpec, comp: ComponentSpec, scorer: GroupScorer, item: RewardInput
    ) -> tuple[Score, tuple[Route, ...], dict[str, Any]]:
        """The item's share of its group's run (started by the group's first item)."""
        assert item.group is not None
        run_key = (program.name, comp.name, item.group)
        task = self.group_runs.get(run_key)
        if task is None:
            task = asyncio.ensure_future(self._run_group(program, comp, scorer, item.group))
            self.group_runs[run_key] = task
        run = await asyncio.shield(task)  # one item cancelled must not cancel its group's run
        member = run.scores[run.group.position(item)]
        return member.score, tuple(run.routes[c] for c in member.calls), {}

    async def _component(
        self, program: ProgramSpec, comp: ComponentSpec, item: RewardInput
    ) -> ComponentScore:
        scorer = self.scoring.scorers.components[(program.name, comp.name)]
        if is_group_scorer(scorer):
            self._check_group(program, comp, item)
        try:
            if is_group_scorer(scorer):
                score, routes, route_detail = await self._group_member(program, comp, scorer, item)
            else:
                score, routes, route_detail = await self._run(scorer, item)
        except RuleCheckFailed as err:
            return ComponentScore(comp.name, comp.weight, None, None, err.reason, err.message)
        except DeadlineExceeded:
            raise
        except RmgateError as err:
            if program.on_failure == "error":
                raise  # the engine's own status (503, 504...), for the trainer's retries
            return ComponentScore(
                comp.name, comp.weight, None, None, "engine", f"{err.code}: {err.message}"
            )
        detail = {**route_detail, **score.detail}
        if score.failure:
            return ComponentScore(
                comp.name,
                comp.weight,
                score.value,
                None,
                score.failure,
                score.message,
                detail,
                routes,
            )
        return ComponentScore(
            comp.name,
            comp.weight,
            score.value,
            apply_transform(score.value, comp.transform) if score.value is not None else None,
            None,
            None,
            detail,
            routes,
        )

    async def _score_program(self, program: ProgramSpec, item: RewardInput) -> Scored:
        parts = await all_or_cancel(
            self._component(program, comp, item) for comp in program.components
        )
        outcome = combine(program, parts, item.index)
        detail: dict[str, Any] = {
            "index": item.index,
            **_group_detail(item),
            "program": program.name,
            "components": [p.as_detail() for p in parts],
            "failed": list(outcome.failed),
            "default_used": outcome.default_used,
        }
        receipts = [r.receipt for p in parts for r in p.routes if r.receipt]
        if receipts:
            detail["receipts"] = receipts
        if outcome.mask_reason is not None:
            detail.update(mask=True, mask_reason=outcome.mask_reason)
        return Scored(
            outcome.reward,
            detail,
            tuple(r for p in parts for r in p.routes),
            outcome.failed,
            tuple(p.failure or "" for p in parts if p.failure),
            outcome.default_used,
            {
                p.name: p.transformed if p.transformed is not None and not p.failure else 0.0
                for p in parts
            },
        )

    def _score(self, target: Target, item: RewardInput) -> Awaitable[Scored]:
        scoring = (
            self._score_program(target, item)
            if isinstance(target, ProgramSpec)
            else self._score_model(target, item)
        )
        if stages.TRACER is None:
            return scoring
        return _traced_score(stages.TRACER, scoring, target, item)

    @staticmethod
    def _result(
        target: Target, scored: list[Scored], endpoint: str, body: dict[str, Any]
    ) -> GatewayResult:
        failures: list[ComponentFailure] = []
        defaults = 0
        masked = sum(s.reward is None for s in scored)
        if isinstance(target, ProgramSpec):
            for s in scored:
                failures += [
                    ComponentFailure(target.name, name, reason)
                    for name, reason in zip(s.failures, s.reasons)
                ]
                defaults += s.default_used
        return GatewayResult(
            model=target.name,
            body=json.dumps(body, ensure_ascii=False).encode(),
            endpoint=endpoint,
            routes=_routes(scored),
            component_failures=tuple(failures),
            defaults_used=((target.name, defaults),) if defaults else (),
            masked=((target.name, masked),) if masked else (),
        )

    async def rewards(self, raw: bytes) -> GatewayResult:
        req = validate(RewardsRequest, parse_json_object(raw))
        target = self.target(req.model)
        inputs = [_item_input(i, it) for i, it in enumerate(req.items)]
        for x in inputs:
            if x.group is not None:
                self.groups.setdefault(x.group, []).append(x)
        # one failed item fails the request: the others are cancelled (engines abort them)
        try:
            scored = await all_or_cancel(self._score(target, x) for x in inputs)
        finally:
            for task in self.group_runs.values():
                task.cancel()  # a no-op on a finished run
        body = {
            "model": target.name,
            "rewards": [s.reward for s in scored],
            "details": [s.detail for s in scored],
        }
        return self._result(target, scored, "/v1/rewards", body)

    async def get_reward(self, raw: bytes) -> GatewayResult:
        req = validate(GetRewardRequest, parse_json_object(raw))
        n = len(req.query)
        prompts = req.prompts if req.prompts is not None else [""] * n
        labels = req.labels if req.labels is not None else [None] * n
        if len(prompts) != n or len(labels) != n:
            raise InvalidSchema(
                f"query, prompts and labels must have one entry each "
                f"(got {n}, {len(prompts)}, {len(labels)})"
            )
        scored: list[Scored] = []
        target: Target | None = None
        try:  # an empty shard answers the same extra_logs keys
            target = self.target(None)
        except RmgateError:
            if n:
                raise
        if n and target is not None:
            # a DisRM reads the whole query; a judge and the rules the question and the
            # answer as plain text
            inputs = [
                RewardInput(
                    i, prompt_text(p), response_text(q, p), _label_text(lab), text=q, raw_label=lab
                )
                for i, (q, p, lab) in enumerate(zip(req.query, prompts, labels))
            ]
            scored = await all_or_cancel(self._score(target, x) for x in inputs)
        # OpenRLHF turns the list into a tensor: a masked item is 0.0 here, and
        # ``extra_logs.masked`` (1.0) tells it apart
        rewards = [s.reward if s.reward is not None else 0.0 for s in scored]
        body = {"rewards": rewards, "scores": rewards, "extra_logs": _extra_logs(target, scored)}
        if target is None or not n:
            return GatewayResult(model="", body=json.dumps(body).encode(), endpoint="/get_reward")
        result = self._result(target, scored, "/get_reward", body)
        return dataclasses.replace(result, body=json.dumps(body).encode())


async def _traced_score(
    tracer: stages.StageTracer, scoring: Awaitable[Scored], target: Target, item: RewardInput
) -> Scored:
    """One item's scoring (its engine requests and rule checks nest under it) as the stage
    ``rmgate.score``: the item, its scorer, its reward or why it has none."""
    attributes: dict[str, stages.Attribute] = {
        "rmgate.model": target.name,
        "rmgate.scorer": "program" if isinstance(target, ProgramSpec) else "model",
        "rmgate.item": item.index,
    }
    if item.group is not None:
        attributes["rmgate.group"] = item.group
    with tracer.stage("rmgate.score", attributes) as stage:
        scored = await scoring
        if scored.reward is not None:
            stage.set_attribute("rmgate.reward", scored.reward)
        else:
            stage.set_attribute("rmgate.masked", True)
        if scored.failures:
            stage.set_attribute("rmgate.failed_components", ",".join(scored.failures))
        return scored


async def _traced_rule(tracer: stages.StageTracer, rules: RuleRunner, call: RuleCall) -> float:
    """One rule check in the rule pool as the stage ``rmgate.rule``."""
    with tracer.stage(
        "rmgate.rule", {"rmgate.rule": call.check, "rmgate.rule.timeout_s": call.timeout_s}
    ) as stage:
        try:
            score = await rules.run(call)
        except RuleCheckFailed as err:
            stage.set_attribute("rmgate.rule.failure", err.reason)
            raise
        stage.set_attribute("rmgate.rule.score", score)
        return score


def _item_input(index: int, item: RewardItem) -> RewardInput:
    """A /v1/rewards item as every scorer sees it: the conversation with the response
    last (a DisRM), the last user turn as the question (a judge, the rules)."""
    if item.prompt is None and item.messages is None:
        raise InvalidSchema(
            f"items[{index}]: one of `prompt` or `messages` is required", param="items"
        )
    msgs = (
        list(item.messages)
        if item.messages is not None
        else [{"role": "user", "content": item.prompt}]
    )
    msgs.append({"role": "assistant", "content": item.response})
    prompt = item.prompt
    if prompt is None:
        users = [m.get("content") for m in item.messages or [] if m.get("role") == "user"]
        prompt = str(users[-1]) if users else ""
    return RewardInput(
        index,
        prompt,
        item.response,
        _label_text(item.label),
        messages=msgs,
        raw_label=item.label,
        group=item.group,
    )


def _masked(item: RewardInput, reason: str) -> Scored:
    detail = {"index": item.index, **_group_detail(item), "mask": True, "mask_reason": reason}
    return Scored(None, detail, ())


def _group_detail(item: RewardInput) -> dict[str, Any]:
    return {} if item.group is None else {"group": item.group}


def _extra_logs(target: Target | None, scored: list[Scored]) -> dict[str, list[float]]:
    """/get_reward's ``extra_logs``. The same keys in every answer, an empty shard included
    (OpenRLHF gathers them across shards: a missing key is its KeyError), and only
    request-determined values: OpenRLHF logs them as training metrics, so two identical
    runs must log the same numbers (the answering slot, free under class placement, stays
    in the x-rmgate-slot header and /v1/rewards details).

    A model: ``parsed``, 1.0 where a score was read (always, for a DisRM) and 0.0 where the
    judge's default was used. A program: one series per component (its transformed score,
    0.0 where it failed), ``failed_components`` (how many failed) and ``default_used``.
    Either under ``on_failure: mask``: ``masked``, 1.0 where the item has no reward (its
    0.0 in ``rewards`` is not one)."""
    extra: dict[str, list[float]]
    if isinstance(target, ProgramSpec):
        extra = {c.name: [] for c in target.components}
        for s in scored:
            for name, value in (s.series or {}).items():
                extra[name].append(value)
        extra["failed_components"] = [float(len(s.failures)) for s in scored]
        extra["default_used"] = [float(s.default_used) for s in scored]
    else:
        extra = {"parsed": [float(s.detail.get("parsed", True)) for s in scored]}
    if target is not None and target.on_failure == "mask":
        extra["masked"] = [float(s.reward is None) for s in scored]
    return extra
