"""Request schemas the ingress checks before routing.

Only the fields the gateway acts on are typed here (model, the routed input, seed,
stream, activation flags); everything else is passed to vLLM untouched and vLLM's own
validation answers for it (its 400 is passed through). Types are strict: a seed of
``"5"`` is a 422, not silently another request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    RootModel,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
)

TokenIds = list[StrictInt]
PromptInput = Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = Field(
        default=None,
        description="Served model name; optional when exactly one model of this kind is served.",
    )


class ChatCompletionRequest(_Open):
    """OpenAI chat completion, as vLLM serves it."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    seed: StrictInt | None = Field(
        default=None,
        description="Sampling seed; derived from the request when absent (seed policy 'derive').",
    )
    stream: StrictBool | None = False


class CompletionRequest(_Open):
    """OpenAI (legacy) completion, as vLLM serves it."""

    prompt: PromptInput
    seed: StrictInt | None = None
    stream: StrictBool | None = False


class ClassifyRequest(_Open):
    """vLLM's /classify and /pooling body. A list ``input`` is split into one engine
    request per item; ``activation`` and ``softmax`` are accepted as synonyms of
    ``use_activation``."""

    input: PromptInput | None = None
    messages: list[dict[str, Any]] | None = None
    use_activation: StrictBool | None = None
    activation: StrictBool | None = None
    softmax: StrictBool | None = None


class EmbeddingRequest(_Open):
    """OpenAI's embeddings body, for a DisRM (``gateway.core.vllm_api.embeddings``); ``input`` as
    ``/classify`` takes it."""

    model_config = ConfigDict(extra="forbid")
    input: PromptInput
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="`base64`: little-endian float32, as OpenAI's clients "
        "decode it (the openai client asks for it by default).",
    )
    user: StrictStr | None = None


class ModelCard(BaseModel):
    """One served model, a superset of OpenAI's ``Model`` (``openai.types.Model`` parses it)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(
        default=0, description="When the gateway started (Unix seconds), as OpenAI's `created`."
    )
    owned_by: str = "rmgate"
    aliases: list[str] = Field(
        default_factory=list,
        description="Other names requests may "
        "use: the configured aliases and the model path's basename.",
    )
    max_model_len: int | None = None
    kind: str
    determinism: str
    slots: int
    seed_policy: str | None = None
    fingerprints: list[str | None] = Field(default_factory=list)
    health: list[str] = Field(
        default_factory=list,
        description="Per slot: healthy or unavailable (dead, restarting or starting).",
    )
    selftest: list[dict[str, Any] | None] = Field(
        default_factory=list,
        description="Per slot: the start-up self-test (alone vs batched, "
        "bitwise) when the slot batches: passed, identical, total, reason, mode, fallback.",
    )
    prefix_cache: list[dict[str, Any] | None] = Field(
        default_factory=list,
        description="Per slot, where the model asks for `prefix_cache: auto`: whether the "
        "engine caches prefixes (`enabled`) and its start-up cold-vs-warm check (probes "
        "equal warm alone and batched, cached tokens, reason when off). None: no cache.",
    )
    placement: str = Field(
        default="pinned",
        description="pinned (a key's own slot) or class "
        "(any slot of its own slot's numerics class).",
    )
    numerics_classes: list[str | None] = Field(
        default_factory=list,
        description="Per slot: its numerics class (identity + probe "
        "digest, short hash), as last reported; None while unknown.",
    )
    classes: dict[str, list[int]] = Field(
        default_factory=dict, description="Each numerics class and its slots."
    )
    drained: dict[str, str] = Field(
        default_factory=dict,
        description="Slots (by index) that answer no key, and why (class_policy: strict).",
    )
    numerics: list[dict[str, Any] | None] = Field(
        default_factory=list,
        description="Per slot: identity (what decides its bits) and probe digest.",
    )
    nodes: list[dict[str, Any] | None] = Field(
        default_factory=list,
        description="Per slot: where it runs (the Ray node's id and "
        "address, the engine's host and pid); null while the slot is not reachable.",
    )
    scorer: dict[str, Any] | None = Field(
        default=None,
        description="How /v1/rewards scores an item with this model: the "
        "scorer's type and options, label token ids resolved from the model's tokenizer.",
    )
    state: str = Field(
        default="awake",
        description=(
            "The model as a whole: awake, asleep, sleeping, waking, kept_out (a slot woke in "
            "another numerics class), mixed, or scaling (the autoscaler is adding or "
            "removing a slot)."
        ),
    )
    slot_states: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per slot: its state, sleep level, who put it to sleep, its last transition.",
    )
    autoscaling: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    programs: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Reward programs (named like models in "
        "/v1/rewards and /get_reward): components, weights, transforms, on_failure, and "
        "each model component's resolved scorer.",
    )


#: A dataset's label as the trainer sends it: OpenRLHF passes the label field unchanged (a
#: string, a number, a bool, a list or a dict); the judge sees it as text (``_label_text``).
Label = JsonValue


class RewardItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: StrictStr | None = None
    messages: list[dict[str, Any]] | None = None
    response: StrictStr
    label: Label = None
    group: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Items with the same `group` are placed on one slot of their model "
        "(chosen by the group), so the items that share a prompt meet on one engine; "
        "each item's reward is that of the item sent alone.",
    )


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


class SlimeSample(BaseModel):
    """One sample as slime's ``remote_rm`` posts it (``--rm-type remote_rm``): the
    ``Sample``'s ``prompt`` (text, or the chat messages when slime leaves the chat template
    to the reward model), ``response`` and ``label``."""

    model_config = ConfigDict(extra="forbid")
    prompt: StrictStr | list[dict[str, Any]]
    response: StrictStr
    label: Label = None


def _slime_body_kind(body: Any) -> str:
    return "samples" if isinstance(body, list) else "sample"


class SlimeRewardRequest(
    RootModel[
        Annotated[
            Union[
                Annotated[SlimeSample, Tag("sample")],
                Annotated[list[SlimeSample], Field(max_length=100_000), Tag("samples")],
            ],
            Discriminator(_slime_body_kind),
        ]
    ]
):
    """``POST /slime/reward``: one sample (what slime's ``remote_rm`` sends) -> its reward,
    a JSON number (or ``null``: masked); a list of samples -> their rewards, in order."""
