"""The application's configuration: what the ``args`` of a Ray Serve config file hold.

Shared by the ingress (routing, seeds, defaults) and the replica deployments (engine
arguments), so it depends only on pydantic.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.core.config.audit import AuditSettings
from gateway.core.config.elastic import AutoscalingSpec, OnSleep
from gateway.core.config.scoring import (
    SCORER_KINDS,
    ModelScorerSpec,
    ProgramSpec,
    scorer_with_default_type,
)

Kind = Literal["generative", "discriminative"]
DeterminismMode = Literal["auto", "batch_invariant", "fixed_shape", "serialize", "off"]


def normalize_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` by vLLM dest name (``max-model-len``, ``--dtype`` -> ``max_model_len``,
    ``dtype``); a ``ValueError`` for an empty name, a name given twice, or one rmgate owns."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in args.items():
        name = key.lstrip("-").replace("-", "_")
        if not name:
            raise ValueError(f"engine_args has an empty name ({key!r})")
        if name in given:
            raise ValueError(
                f"engine_args names `{name}` twice (as `{given[name]}` and `{key}`); keep one"
            )
        if name in OWNED_ENGINE_ARGS:
            raise ValueError(f"engine_args.{key}: {OWNED_ENGINE_ARGS[name]}; remove it")
        given[name] = key
        out[name] = value
    return out


class SeedPolicy(BaseModel):
    """How a GRM request's sampling seed is chosen.

    ``derive``: the caller's seed, else one derived from the request key (deterministic).
    ``require``: the caller must send one (400 otherwise).
    ``passthrough``: whatever the caller sent, possibly none (not deterministic).
    """

    model_config = ConfigDict(extra="forbid")
    policy: Literal["derive", "require", "passthrough"] = Field(
        default="derive",
        description="`derive`: the caller's seed, else one derived from "
        "the request key; `require`: 400 without one; `passthrough`: whatever was sent, "
        "possibly none (not deterministic).",
    )
    base: int = Field(
        default=0,
        description="Mixed into derived seeds: another base gives every request another seed.",
    )


#: vLLM server options rmgate sets itself (``deployments.engine.args.plan_engine``), with
#: the reason shown when a config's ``engine_args`` names one. Letting ``engine_args``
#: override them would break routing (``served_model_name``), the slot layout (``host``,
#: ``port``), the model kind (``runner``) or determinism (``seed``, ``generation_config``),
#: or make the engine unreachable over HTTP (``uds``, ``headless``, ``grpc``); a vLLM
#: ``--config`` file could set any of these out of sight of this check.
OWNED_ENGINE_ARGS: dict[str, str] = {
    "model": "rmgate sets `model` itself (from the model's `model_path`)",
    "served_model_name": "rmgate sets `served_model_name` itself (the model's `name`, which "
    "requests and /v1/models use)",
    "host": "rmgate sets `host` itself (engines listen on loopback, next to their slot replica)",
    "port": "rmgate sets `port` itself (one engine per slot on a free loopback port)",
    "runner": "rmgate sets `runner` itself from the model's `kind` (discriminative -> "
    "pooling; generative -> vLLM's default)",
    "seed": "rmgate pins the engine `seed` to 0 itself; request seeds come from the model's "
    "`seed` policy (`seed.base`)",
    "generation_config": "rmgate sets `generation_config` to `vllm` itself, so sampling "
    "defaults come only from the model's `sampling_defaults`",
    "config": "rmgate passes every engine option on the command line; a vLLM `--config` "
    "file would set options this check cannot see (write them in engine_args)",
    "uds": "rmgate reaches each engine over HTTP on its loopback port, not a Unix socket",
    "headless": "rmgate needs each engine's HTTP API server (`headless` runs none)",
    "grpc": "rmgate needs each engine's HTTP API server (`grpc` serves gRPC instead)",
}


#: The generation_config.json keys vLLM takes as sampling defaults
#: (``ModelConfig.get_diff_sampling_param``), ``max_new_tokens`` as ``max_tokens``.
GENERATION_CONFIG_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)


def model_generation_defaults(model_path: Path) -> dict[str, Any]:
    """The sampling defaults vLLM would read from a model folder's generation_config.json."""
    try:
        cfg = json.loads((model_path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {k: cfg[k] for k in GENERATION_CONFIG_KEYS if cfg.get(k) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


#: The context length rmgate gives an engine whose ``engine_args`` name none (vLLM's own
#: default, the model's full context, can exceed a CPU host's KV cache).
DEFAULT_MAX_MODEL_LEN = 1024


class ModelSpec(BaseModel):
    """One served reward model and how its slots are run."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description=(
            "The model's name: what requests send as `model`, the slots' names (`judge-0`, …)."
        ),
    )
    kind: Kind = Field(
        description="`generative` (a judge: chat and completions) or "
        "`discriminative` (a classifier: `/classify`, `/pooling`)."
    )
    model_path: str = Field(
        description="A local model folder (with its `config.json`); "
        "relative paths are relative to the directory the application "
        "is built from. Nothing is downloaded."
    )
    aliases: list[str] = Field(
        description=(
            "Other names requests may use for this model: what trainers were configured with (an "
            "HF id such as `Skywork/Skywork-Reward-V2-Llama-3.1-8B`, a path on the trainer's "
            "machine). The `model_path` and its basename are accepted without listing them."
        ),
        default_factory=list,
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Slots: engines of this "
        "model, one per slot replica (`rmgate scale` changes it live).",
    )
    determinism: DeterminismMode = Field(
        default="auto",
        description=(
            "`batch_invariant` (vLLM's batch-invariant kernels: batched, the same bits), "
            "`fixed_shape` (CUDA: every step padded to one token count, 8192 for a DisRM and "
            "512 for a judge unless `max_num_batched_tokens` is set, so vLLM's standard "
            "kernels see one shape; the score head or lm_head at one row count, "
            "FlashAttention in one split; proven by the start-up self-test, else "
            "`batch_invariant`; at 7B a DisRM 1.31× `batch_invariant` and a judge 1.23× "
            "vLLM's own engine under `off`, both slower for a lone request; "
            "`configs/gpu.yaml`: docs/determinism.md), "
            "`serialize` (one sequence at a time, prefix caching off), `off` (vLLM's defaults, "
            "no guarantee), `auto` (batch_invariant where the platform has it, e.g. CUDA; "
            "serialize otherwise, e.g. CPU)."
        ),
    )
    seed: SeedPolicy = Field(
        default_factory=SeedPolicy, description="How a GRM request's sampling seed is chosen."
    )
    sampling_defaults: dict[str, Any] = Field(
        description=(
            "Sampling parameters a GRM request gets where it sends none (verl's judge requests "
            "send none). Empty: vLLM's neutral defaults (temperature 1.0, top_p 1.0, max_tokens ="
            " what the context leaves): rmgate runs engines with `generation_config: vllm`."
        ),
        default_factory=dict,
    )
    sampling_defaults_from: Literal["vllm", "model"] = Field(
        default="vllm",
        description=(
            "`model`: also take the defaults the model folder's `generation_config.json` sets, "
            "exactly the keys vLLM's own default (`generation_config: auto`) would take "
            "(`sampling_defaults` wins where both set one); `vllm`: none of them."
        ),
    )
    scorer: ModelScorerSpec = Field(
        default=None,
        validate_default=True,
        description="How /v1/rewards and /get_reward turn an item into this model's reward "
        "(a scorer, by `type`): `logit` (a DisRM's class score, its default), `judge_text` "
        "(a GRM's sampled text read by a parser, its default), `judge_prob` (P(yes) at "
        "the judge's first token), `expected_rating` (the expected rating token). A "
        "`scorer` without `type` is the kind's default.",
    )
    on_failure: Literal["error", "mask"] = Field(
        default="error",
        description="An item this model fails to score in /v1/rewards (the engine's error, "
        "an answer without a score): `error` fails the request (a `judge_text` answer "
        "without a score takes the scorer's `default`); `mask`: the item's reward is null "
        "with `mask: true` and the reason in its details, the others are answered.",
    )
    engine_args: dict[str, Any] = Field(
        description=(
            "Extra vLLM server arguments (`--flag value` with `_` -> `-`), e.g. dtype. Names may "
            "use `-` or `_`; the ones rmgate sets (OWNED_ENGINE_ARGS) are refused."
        ),
        default_factory=dict,
    )
    engine_env: dict[str, str] = Field(
        description="Extra environment for the engine process, e.g. VLLM_CPU_KVCACHE_SPACE.",
        default_factory=dict,
    )
    ray_actor_options: dict[str, Any] = Field(
        description="Ray actor options of each slot's replica (num_cpus, num_gpus, resources...).",
        default_factory=lambda: {"num_cpus": 0},
    )
    slot_ray_actor_options: list[dict[str, Any]] = Field(
        description=(
            "Per slot index (wrapping), options merged over `ray_actor_options`: where each slot "
            'may run, by Ray custom resources or node labels, e.g. `[{"resources": {"nodeA": '
            '0.01}}, {"resources": {"nodeB": 0.01}}]` puts slot 0 on the node that offers `nodeA`'
            " and slot 1 on `nodeB`'s. A slot's options depend only on its index, so scaling "
            "never moves a running slot."
        ),
        default_factory=list,
    )

    def actor_options(self, slot: int) -> dict[str, Any]:
        """The Ray actor options of slot ``slot``'s replica."""
        if not self.slot_ray_actor_options:
            return dict(self.ray_actor_options)
        extra = self.slot_ray_actor_options[slot % len(self.slot_ray_actor_options)]
        out = {**self.ray_actor_options, **extra}
        for key in ("resources", "label_selector"):  # merged, not replaced
            if key in self.ray_actor_options and key in extra:
                out[key] = {**self.ray_actor_options[key], **extra[key]}
        return out

    max_queue_per_slot: int | None = Field(
        description="Requests waiting per slot of this model (overrides "
        "gateway.max_queue_per_slot).",
        default=None,
        ge=1,
    )
    selftest: Literal["auto", "always", "never"] = Field(
        default="auto",
        description=(
            "The start-up self-test (deployments/engine/selftest.py): `auto` runs it when the slot "
            "batches under `batch_invariant`; `always` also under `off` (batch only where the "
            "probes prove it safe); `never` skips it. A failure restarts the slot's engine under "
            "`serialize` and says why in /v1/models."
        ),
    )
    prefix_cache: Literal["off", "auto"] = Field(
        default="off",
        description=(
            "The engine's prefix cache under `serialize` and `batch_invariant` (under `off` "
            "engine_args decide): `auto` starts the engine with it and keeps it only when the "
            "start-up cold-vs-warm check (deployments/engine/prefix_check.py) proves its "
            "answers bit-identical with and without their prefix cached; else the engine "
            "restarts without it and /v1/models says why. It is what lets a group's shared "
            "prompt be computed once (a group's items go to one slot). `off` never caches."
        ),
    )
    cpu_cores_per_slot: int | None = Field(
        description=(
            "CPU engines only: bind slot `s`'s engine to `k` cores of its own (cores `s*k .. "
            "s*k+k-1` of the host's, wrapping) instead of vLLM's auto binding, which puts every "
            "engine of a host on the same cores (it reserves one core and binds each engine "
            "process to the rest). A slot's cores depend only on its index, so scaling never "
            "moves a running engine. `None` keeps vLLM's default."
        ),
        default=None,
        ge=1,
        le=4096,
    )
    serialize_inflight: int = Field(
        description=(
            "`serialize` only: requests the ingress lets into a slot's engine at once. The engine"
            " itself computes one sequence at a time (`max_num_seqs=1`, no chunked "
            "prefill) in arrival order, so more than one only queues inside the engine: "
            "it hides the ingress <-> engine round trip without changing a bit "
            "(tests/integration/test_negative_control.py). 1 serializes at the ingress as well, "
            "which can be faster where the engine's own queue costs more than the round trip "
            "(docs/benchmarks.md)."
        ),
        default=4,
        ge=1,
        le=256,
    )
    engine_host: Literal["loopback", "node"] = Field(
        default="loopback",
        description=(
            "Where the slot's engine listens: `loopback` (127.0.0.1: only its own node reaches "
            "it; the `handle` transport crosses nodes) or `node` (its node's address, for an "
            "ingress on another node with the `direct` transport). Either way the engine gets a "
            "secret its slot generates at start and refuses every request without it but "
            "`/health` (`deployments.engine.guard`), so only the gateway can call it."
        ),
    )
    startup_timeout_s: float = Field(
        description="Seconds to wait for the engine to answer /health at start-up.",
        default=600.0,
        gt=0,
    )
    sleep_mode: bool = Field(
        default=False,
        description=(
            "CUDA engines start with vLLM's sleep mode, so `POST /sleep` frees the engine's GPU "
            "memory in place (level 1 keeps the weights in host memory, level 2 drops them) "
            "and `/wake_up` brings it back. Without it, and on CPU (vLLM has no sleep mode "
            "there), sleep stops the engine process and wake starts it again."
        ),
    )
    on_sleep: OnSleep = Field(
        default="wake",
        description=(
            "A request for a sleeping model: `wake` its slot and answer (the wake counts "
            "against the request's deadline), `wait` until it is woken, or `refuse` "
            "(503 + Retry-After). A slot the autoscaler put to sleep always wakes."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "Slots follow load between min_slots and max_slots (`replicas` is the count it "
            "starts with); a new slot serves only once its numerics class matches."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _scorer_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") in SCORER_KINDS.values():
            data = {**data, "scorer": scorer_with_default_type(data["kind"], data.get("scorer"))}
        return data

    @model_validator(mode="after")
    def _scorer_fits(self) -> ModelSpec:
        needs = SCORER_KINDS[self.scorer.type]
        if needs != self.kind:
            raise ValueError(
                f"model {self.name!r}: scorer `{self.scorer.type}` reads a "
                f"{needs} model, not a {self.kind} one"
            )
        return self

    @model_validator(mode="after")
    def _replicas_within_autoscaling(self) -> ModelSpec:
        scaling = self.autoscaling
        if (
            scaling is not None
            and not max(1, scaling.min_slots) <= self.replicas <= scaling.max_slots
        ):
            raise ValueError(
                f"model {self.name!r}: replicas ({self.replicas}) is outside autoscaling's "
                f"[{max(1, scaling.min_slots)}, {scaling.max_slots}]"
            )
        return self

    def effective_sampling_defaults(self) -> dict[str, Any]:
        """``sampling_defaults``, over the model folder's under ``sampling_defaults_from:
        model`` (read once per gateway; a folder without the file sets none, as in vLLM)."""
        out = dict(self.sampling_defaults)
        if self.sampling_defaults_from == "model":
            out = {**model_generation_defaults(Path(self.model_path)), **out}
        if isinstance(out.get("max_tokens"), int) and out["max_tokens"] > self.max_model_len:
            out["max_tokens"] = self.max_model_len  # as a request's own ask is capped
        return out

    @property
    def max_model_len(self) -> int:
        """The context length its engines run with (``engine_args.max_model_len``)."""
        return int(self.engine_args.get("max_model_len", DEFAULT_MAX_MODEL_LEN))

    @field_validator("model_path")
    @classmethod
    def _resolve_path(cls, v: str) -> str:
        """Relative paths are relative to the directory the application is built from."""
        return str(Path(os.path.expanduser(v)).resolve())

    @field_validator("engine_args")
    @classmethod
    def _check_engine_arg_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Normalize names to vLLM's dest spelling (``max-model-len`` -> ``max_model_len``)
        and refuse the ones rmgate owns (``OWNED_ENGINE_ARGS``), at load time: overriding
        them would otherwise only show later, as a misrouted or dead engine. A name given
        in both spellings is refused rather than one silently winning. Whether a name
        exists in vLLM at all is checked where vLLM is at hand
        (``deployments.engine.arg_names.check_engine_args``)."""
        return normalize_engine_args(v)


def default_state_dir() -> str:
    """Where the ledger lives unless the config says: ``$RMGATE_STATE_DIR``, else
    ``$XDG_STATE_HOME/rmgate``, else ``~/.local/state/rmgate`` (the XDG state directory)."""
    explicit = os.environ.get("RMGATE_STATE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_STATE_HOME") or os.path.join("~", ".local", "state")
    return os.path.join(base, "rmgate")


class LedgerSettings(BaseModel):
    """The reward ledger (``gateway.ledger``): every answered engine request recorded with
    its provenance, and the store the cache answers from."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["sqlite", "postgres", "off"] = Field(
        default="sqlite",
        description="`sqlite`: one file under `state_dir` (several ingress "
        "replicas of one host share it); `postgres`: a PostgreSQL server (`dsn`/`dsn_env`), "
        "for several hosts or a team; `off`: nothing recorded, no receipts, no cache.",
    )
    state_dir: str | None = Field(
        default=None,
        description="SQLite: the directory of `ledger.sqlite3`. Unset: "
        "`$RMGATE_STATE_DIR`, else `$XDG_STATE_HOME/rmgate`, else `~/.local/state/rmgate`, "
        "as the ingress process sees them (a pod's own home on KubeRay).",
    )
    dsn: str | None = Field(
        default=None,
        description="PostgreSQL: a libpq connection string "
        "(`postgresql://user@host:5432/db`). Prefer `dsn_env` for one "
        "with a password: the rendered config is written to disk.",
    )
    dsn_env: str = Field(
        default="RMGATE_LEDGER_DSN",
        description="PostgreSQL: the environment variable read for the DSN when `dsn` is not set.",
    )
    keep_bodies: bool = Field(
        default=True,
        description="Record each canonical engine body "
        "(needed by `rmgate ledger replay`); false keeps only its "
        "sha256.",
    )
    memory_rows: int = Field(
        default=100_000,
        ge=0,
        description="Rows kept in memory in front "
        "of the store (LRU): a hit there costs no database read.",
    )
    max_buffered: int = Field(
        default=100_000,
        ge=1,
        description="Rows waiting for the writer "
        "at most (a slow or unreachable store); past it rows are dropped "
        "and counted (`rmgate_ledger_rows_dropped_total`), never a "
        "request.",
    )
    flush_interval_s: float = Field(
        default=0.2,
        gt=0,
        description="The writer writes what "
        "is buffered at least this often: what a crash "
        "(`kill -9`) can lose.",
    )
    batch_rows: int = Field(default=512, ge=1, description="Rows per write transaction.")
    retention_days: float | None = Field(
        default=None,
        gt=0,
        description="Rows older than this are deleted (at start and hourly); none: kept.",
    )
    retention_rows: int | None = Field(
        default=None,
        gt=0,
        description="At most this many rows are kept, the oldest deleted first; none: all.",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        """YAML 1.1 reads a bare `off` as false: `backend: off` means off."""
        return "off" if v is False else v

    def sqlite_path(self) -> Path:
        """The SQLite file, resolved where it is opened (``~`` expanded)."""
        return Path(os.path.expanduser(self.state_dir or default_state_dir())) / "ledger.sqlite3"

    def resolved_dsn(self) -> str | None:
        return self.dsn or os.environ.get(self.dsn_env) or None


class ExperimentalSettings(BaseModel):
    """Placement parts a benchmark can switch off to measure them one at a time; the defaults
    are what rmgate runs."""

    model_config = ConfigDict(extra="forbid")
    load_weight: Literal["count", "answer_time"] = Field(
        default="answer_time",
        description=(
            "What bounded load weighs a class mate's requests by: `answer_time` (each request as "
            "many as the slot's round trip is longer than its fastest mate's: a throttled engine "
            "shows before its queue builds; the class queue weighs by it too, "
            "`placement.takes_waiter`) or `count` (in flight + queued, each 1)."
        ),
    )
    class_queue: bool = Field(
        default=True,
        description=(
            "`placement: class`: a request whose chosen slot has no room (its engine holds as "
            "many as its mode lets in) waits at every class mate's gate at once and goes to the "
            "first that frees a place, instead of queueing behind one slot (a stalled engine's "
            "queue) while a mate is free. Same bits whichever answers. False: it waits at the "
            "slot bounded load chose."
        ),
    )


#: Keys that live under ``gateway.experimental``: named in the error a config that sets them
#: at ``gateway`` gets.
EXPERIMENTAL_KEYS = frozenset(ExperimentalSettings.model_fields)


class GatewaySettings(BaseModel):
    """Ingress-wide settings."""

    model_config = ConfigDict(extra="forbid")
    max_body_bytes: int = Field(
        description="Largest request body accepted, in bytes (413 above it).",
        default=8 * 1024 * 1024,
        gt=0,
    )
    transport: Literal["direct", "handle"] = Field(
        default="direct",
        description=(
            "How the ingress reaches a slot's engine: straight to the vLLM server over HTTP (one "
            "hop fewer) or through the slot replica's Serve handle (works across nodes when "
            "engines bind loopback)."
        ),
    )
    request_timeout_s: float = Field(
        description=(
            "Each request's deadline in seconds, from its arrival (`x-rmgate-timeout` may shorten"
            " it): every wait ends by it, retries and failover included (504 after it)."
        ),
        default=300.0,
        gt=0,
    )
    slot_wait_s: float = Field(
        description="How long a request waits for a dead slot to come back before answering 503.",
        default=120.0,
        ge=0,
    )
    failover: Literal["wait", "next_slot"] = Field(
        default="wait",
        description=(
            "`wait`: a request only ever runs on its own slot (results never change). "
            "`next_slot`: after `failover_after_s` it moves to the next slot of its key's "
            "ranking, and the response says so (`x-rmgate-failover`); with heterogeneous replicas"
            " its bits may then differ."
        ),
    )
    failover_after_s: float = Field(
        default=5.0,
        ge=0,
        description="`failover: next_slot`: seconds before a request moves to the next slot.",
    )
    placement: Literal["pinned", "class"] = Field(
        default="class",
        description=(
            "`class` (default): a key is answered by any slot of its own slot's numerics class "
            "(bitwise the same answers): its own slot first, another class mate under load "
            "(bounded load, `load_bound`) or at once when its own slot is unreachable or drained."
            " `pinned`: only by its own slot (`failover` then decides what a dead slot's requests"
            " do): for a deployment that wants each key on one engine only."
        ),
    )
    load_bound: float = Field(
        description=(
            "Bounded load: a class mate takes a key when the key's own slot holds at least "
            "`ceil(load_bound * (class load + 1) / class size)` requests."
        ),
        default=1.25,
        ge=1.0,
    )
    class_policy: Literal["strict", "mixed"] = Field(
        default="strict",
        description=(
            "Slots of one model in several classes: `strict` drains those outside the majority "
            "class (reason in /v1/models); `mixed` serves each class for its own keys."
        ),
    )
    canary_interval_s: float = Field(
        description=(
            "Every this many seconds each slot re-answers the golden probes through its gate; a "
            "slot whose probe digest changed leaves its class (drained under `strict`) until it "
            "matches again. 0 turns the canary off."
        ),
        default=600.0,
        ge=0,
    )
    direct_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "A port on which every ingress replica also serves the API itself (uvicorn on the "
            "replica's event loop; the node's replicas share it with SO_REUSEPORT, the kernel "
            "spreading connections over them), without Serve's proxy: less CPU per request "
            "(benchmarks/ingress_stack.py), same answers, same auth, metrics and deadlines. "
            "Serve's own port keeps serving. Off (null) by default."
        ),
    )
    direct_host: str = Field(
        default="127.0.0.1",
        description=(
            "The address `direct_port` binds: loopback by default; the node's address or "
            "0.0.0.0 for trainers on other hosts."
        ),
    )
    ingress_replicas: int = Field(
        description=(
            "Ingress replicas (Serve replicas of the `gateway` deployment, each its own process)."
            " One replica's CPU per request caps a gateway in front of small fast engines; more "
            "replicas lift that cap without changing a bit: every replica keys, seeds and places "
            "alike, and a slot's numerics do not depend on which ingress sent the request (the "
            "engine itself serializes or is batch invariant). Each replica keeps its own load "
            "view, queue limit and metrics registry (scrape each, or keep 1)."
        ),
        default=1,
        ge=1,
    )
    max_queue_per_slot: int = Field(
        description="Requests waiting per slot beyond the ones in flight before answering 503.",
        default=4096,
        ge=1,
    )
    default_reward_model: str | None = Field(
        default=None,
        description=(
            "The model /v1/rewards uses when a request names none, and /get_reward (OpenRLHF) "
            "always uses. Optional when exactly one model is served."
        ),
    )
    get_reward_truncation_side: Literal["left", "right"] = Field(
        default="right",
        description=(
            "`/get_reward` with a DisRM: a query longer than the model's context is truncated to "
            "it from this side (OpenRLHF's RM server truncates with its tokenizer, right by "
            "default) instead of answering 400."
        ),
    )
    cache: Literal["on", "off", "opt_in"] = Field(
        default="on",
        description="`on`: a request whose identity (model, numerics class, "
        "endpoint, canonical engine body) the ledger holds is answered from it without an "
        "engine call, and identical requests in flight at once make one call; a request "
        "may send `x-rmgate-cache: off` to reach an engine anyway. `opt_in`: only requests "
        "that send `x-rmgate-cache: on`. `off`: never. Every answer is recorded whatever "
        "this says; models with `determinism: off` are never answered from the cache.",
    )
    ledger: LedgerSettings = Field(
        default_factory=LedgerSettings,
        description="The reward ledger: where answers are recorded and the cache answers from.",
    )
    audit: AuditSettings = Field(
        default_factory=AuditSettings,
        description="The continuous audit: recorded rewards re-answered on a class mate, "
        "their bits compared (docs/operations.md, Audit).",
    )
    rule_workers: int = Field(
        default=2,
        ge=1,
        le=256,
        description="Worker processes of "
        "each ingress replica's rule pool (started only when a "
        "program has a rule component): at most this many rule checks "
        "run at once; a check past its `timeout_s` has its worker "
        "ended and replaced.",
    )
    experimental: ExperimentalSettings = Field(
        default_factory=lambda: ExperimentalSettings(),
        description=(
            "Switches that turn off parts of placement, kept so that the benchmarks can measure "
            "what each part is worth (`benchmarks/slow_slot.py`). Leave them at their defaults."
        ),
    )
    api_keys_env: str = Field(
        default="RMGATE_API_KEYS",
        description=(
            "Optional API keys (`Authorization: Bearer <key>` or `X-Api-Key`), read at start from"
            " this environment variable (comma separated) and/or file (one per line). With no key"
            " configured, auth is off. `/health` and `/metrics` stay open."
        ),
    )
    api_keys_file: str | None = Field(
        default=None, description="A file of API keys, one per line (with `api_keys_env`)."
    )
    admin_api_keys_env: str = Field(
        default="RMGATE_ADMIN_API_KEYS",
        description=(
            "Keys that may also sleep, wake and scale (`/sleep`, `/wake_up`), comma-separated. "
            "With API keys configured those routes take only these; with none, auth is off."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _experimental_keys_in_their_section(cls, data: Any) -> Any:
        if isinstance(data, dict):
            misplaced = sorted(EXPERIMENTAL_KEYS & data.keys())
            if misplaced:
                raise ValueError(
                    f"{', '.join(misplaced)}: set under gateway.experimental "
                    "(switches a benchmark uses to turn a part of placement off)"
                )
        return data

    @field_validator("cache", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: Any) -> Any:
        """YAML 1.1 reads bare `on`/`off` as true/false: `cache: off` means off."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _audit_needs_bodies(self) -> GatewaySettings:
        """The auditor re-sends recorded bodies: without them it has nothing to send."""
        if self.audit.sample > 0 and (self.ledger.backend == "off" or not self.ledger.keep_bodies):
            raise ValueError(
                "audit.sample > 0 re-answers recorded requests: it needs the ledger "
                "(ledger.backend sqlite or postgres) with ledger.keep_bodies: true"
            )
        return self

    def load_api_keys(self) -> frozenset[str]:
        keys = [k.strip() for k in os.environ.get(self.api_keys_env, "").split(",")]
        if self.api_keys_file:
            keys += Path(self.api_keys_file).read_text(encoding="utf-8").splitlines()
        return frozenset(k.strip() for k in keys if k.strip())

    def load_admin_api_keys(self) -> frozenset[str]:
        keys = os.environ.get(self.admin_api_keys_env, "").split(",")
        return frozenset(k.strip() for k in keys if k.strip())


#: What to do about a missing model folder (rmgate downloads nothing).
MISSING_MODEL_HINT = (
    "build the demo models with `rmgate make-demo-models models/demo` "
    "(or run `rmgate demo`), or point model_path at a local model folder"
)


class AppConfig(BaseModel):
    """Everything ``build_app`` takes: the ``args`` of the Serve config's application."""

    model_config = ConfigDict(extra="forbid")
    models: list[ModelSpec] = Field(description="The served reward models.")
    gateway: GatewaySettings = Field(
        default_factory=GatewaySettings, description="Ingress-wide settings."
    )
    programs: list[ProgramSpec] = Field(
        default_factory=list,
        description="Reward programs: "
        "named rewards served by /v1/rewards and /get_reward "
        "like a model, combining model scorers and rules.",
    )

    def missing_paths(self) -> list[str]:
        """One line per file the config names that is not there: a model folder without its
        ``config.json`` (rmgate downloads nothing: ``model_path`` is a local folder), an
        API-key file. Checked before anything starts, so a missing model costs seconds,
        not an engine that dies minutes later inside Ray."""
        missing = []
        for model in self.models:
            folder = Path(model.model_path)
            if not (folder / "config.json").is_file():
                what = "does not exist" if not folder.exists() else "has no config.json"
                missing.append(f"model {model.name!r}: model_path {folder} {what}")
        keys = self.gateway.api_keys_file
        if keys and not Path(os.path.expanduser(keys)).is_file():
            missing.append(f"gateway.api_keys_file {keys} does not exist")
        return missing

    @model_validator(mode="after")
    def _unique_names(self) -> AppConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if not names:
            raise ValueError("at least one model must be configured")
        taken: dict[str, str] = {n: n for n in names}
        for m in self.models:
            for alias in m.aliases:
                if taken.setdefault(alias, m.name) != m.name:
                    raise ValueError(
                        f"alias {alias!r} of model {m.name!r} is already the name "
                        f"or an alias of model {taken[alias]!r}"
                    )
        for program in self.programs:
            if program.name in taken:
                raise ValueError(
                    f"program {program.name!r} has the name of model "
                    f"{taken[program.name]!r} (or one of its aliases)"
                )
            taken[program.name] = program.name
            for comp in program.components:
                if comp.model is None:
                    continue
                spec = self.model(comp.model)
                if spec is None:
                    raise ValueError(
                        f"program {program.name!r}, component {comp.name!r}: "
                        f"model {comp.model!r} is not served ({names})"
                    )
                scorer = comp.scorer or spec.scorer
                if SCORER_KINDS[scorer.type] != spec.kind:
                    raise ValueError(
                        f"program {program.name!r}, component {comp.name!r}: "
                        f"scorer `{scorer.type}` does not read {spec.kind} "
                        f"model {spec.name!r}"
                    )
                if comp.judges is not None and spec.kind != "generative":
                    raise ValueError(
                        f"program {program.name!r}, component {comp.name!r}: `judges` "
                        f"samples a generative judge; {spec.name!r} is {spec.kind}"
                    )
        default = self.gateway.default_reward_model
        programs = [p.name for p in self.programs]
        if default is not None and default not in names + programs:
            raise ValueError(
                f"default_reward_model {default!r} is not among the models "
                f"{names} or programs {programs}"
            )
        return self

    def program(self, name: str | None) -> ProgramSpec | None:
        """The reward program called ``name`` (None: not a program)."""
        return next((p for p in self.programs if p.name == name), None)

    def model(self, name: str) -> ModelSpec | None:
        """The model called ``name``: its name, one of its ``aliases``, its ``model_path``
        or that path's basename (verl's and OpenRLHF's clients send the path or HF id they
        were configured with as ``model``)."""
        found = next((m for m in self.models if m.name == name), None)
        if found is None and name:
            found = next((m for m in self.models if name in m.aliases), None)
        if found is None and name:
            path = str(Path(os.path.expanduser(name)).resolve())
            found = next((m for m in self.models if m.model_path in (name, path)), None)
        if found is None and name:
            found = next((m for m in self.models if Path(m.model_path).name == name), None)
        return found

    def model_names(self) -> dict[str, list[str]]:
        """Every model's name and the other names it answers to (for a 404's message)."""
        return {m.name: [*m.aliases, Path(m.model_path).name] for m in self.models}
