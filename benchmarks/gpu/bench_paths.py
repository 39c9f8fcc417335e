"""What users get through rmgate on one GPU, one variable at a time, with the physical anchor
in the same run.

One device command = one layout (``--layout``, see ``LAYOUTS``): the models are built on the
device (``models_gpu.py``), one ``rmgate serve`` starts every engine of the layout, and the
same engines are then reached several ways, interleaved in rounds:

``engine_auto``        the batch-invariant engine(s) of ``<kind>-auto``, directly (round robin)
``rmgate_auto``        the same engines through rmgate (HAProxy + ingress), ``determinism: auto``
``rmgate_direct``      the same through the ingress replicas' own port (``--direct-port``)
``engine_off``         the ``off`` engine(s) (vLLM defaults), directly
``rmgate_off``         the same through rmgate
``least_loaded_off``   the ``off`` engines behind the least-loaded FastAPI + httpx proxy
                       (``gateway/harness/least_loaded.py``: what trainers run today)
``rmgate_serial``      ``determinism: serialize`` through rmgate (verl's policy for DisRMs)
``offline_auto``       offline ``vllm.LLM`` (``LLM.classify`` / ``LLM.chat``), batch-invariant,
                       same settings, one call over the same requests (``offline_anchor.py``)

plus the bitwise replay (1,000 mixed GRM + DisRM requests, 3 shuffled runs at concurrency
1, 64, 256, against ``auto`` and, at the same time, against ``off``), the old benchmark's
client and Serve's Python proxy on the same path (what the ~10x of the old run was), and,
per layout, slot counts, ingress replicas and a GRM + DisRM sharing the GPU under load.

The load generator runs in several processes (``loadgen.py``) and reports its own CPU per
request; gateway CPU per request comes from /proc (``gateway/harness/cpu_accounting.py``), GPU
utilisation from NVML sampled every 100 ms. Output is flat and small: ``OUT/<layout>.json``
(saved after every phase) and ``OUT/<layout>-log.txt`` (log tails); engine logs stay
under /tmp on the device.

    python -m benchmarks.gpu.bench_paths --layout core-0.5b --out $OUT --deadline-s 500
    python -m benchmarks.gpu.bench_paths --layout core-0.5b --out /tmp/x --fake   # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu.loadgen import LoadGen, legacy_httpx
from gateway.harness import cpu_accounting

REPO = Path(__file__).resolve().parents[2]

GIB = 1 << 30
WORK = Path(os.environ.get("RMGATE_BENCH_WORK", "/tmp/rmgate-bench"))
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- workloads
def grm_body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    """A judge request: chat, T=1, fixed seed, logprobs (the bits a trainer reads)."""
    rng = random.Random(i)
    filler = " ".join(str(rng.randrange(1000)) for _ in range(rng.randrange(8, 48)))
    return {
        "model": model,
        "seed": 1000 + i,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 1,
        "messages": [{"role": "user", "content": f"Is {i % 10}+{i % 7}={i % 13} right? {filler}"}],
    }


def grm_text(i: int) -> str:
    return grm_body("x", i, 1)["messages"][0]["content"]


def rm_text(i: int) -> str:
    rng = random.Random(10_000 + i)
    length = rng.choice([1, 4, 16, 64, 256, 900])
    return "".join(rng.choice("0123456789+= abcdefgh") for _ in range(length))


def rm_body(model: str, i: int) -> dict[str, Any]:
    """A DisRM request: 1-900 tokens (byte-level tokenizer: one token per character)."""
    return {"model": model, "input": rm_text(i), "use_activation": False}


def shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


# ----------------------------------------------------------------------------- layouts
@dataclass
class Model:
    """One served model of a layout: ``<kind>-<mode>[-<tag>]``."""

    name: str
    kind: str  # "grm" | "rm"
    mode: str  # "auto" | "off" | "serialize"
    slots: int = 1
    max_num_seqs: int = 256
    kv_gib: float = 4.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: model-level config keys beside the engine arguments (e.g. ``serialize_inflight``)
    spec: dict[str, Any] = field(default_factory=dict)
    #: the engine arguments and environment of a shipped config's model, whole (then
    #: ``max_num_seqs``, ``kv_gib`` and ``extra`` are read from / laid over them)
    engine_args: dict[str, Any] | None = None
    engine_env: dict[str, str] = field(default_factory=dict)
    #: the GPU model shape it serves (``models_gpu``), when not the layout size's
    shape: str | None = None

    def model_shape(self, size: str) -> str:
        grm, rm = SIZES[size]
        return self.shape or (grm if self.kind == "grm" else rm)


@dataclass
class Layout:
    size: str
    models: list[Model]
    anchors: list[str]  # kinds with an offline LLM anchor ("grm", "rm")
    phases: list[tuple[str, dict[str, Any]]]
    #: per kind: requests per throughput run for (batching paths, serialize)
    n_tp: dict[str, tuple[int, int]] = field(default_factory=dict)
    replay_n: int = 1000
    gen_tokens: int = 64
    #: engines started beside the gateway, reached directly only (``phase_standalone``)
    standalone: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    #: the shipped config the layout stands for (its engine settings, slots and ingress
    #: replicas are the layout's; ``--ingress-replicas`` overrides only when given)
    config: str = ""
    ingress_replicas: int = 1
    #: phases run before the gateway starts, alone on the GPU (the framework anchor of a
    #: model whose engines leave no room for a second copy of its weights)
    before_gateway: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _core(
    size: str,
    n_tp: dict[str, tuple[int, int]],
    replay_n: int,
    anchors: list[str],
    kv: dict[str, float],
    levels: list[int],
    rounds: int,
) -> Layout:
    models = [
        Model(f"{k}-{m}", k, m, kv_gib=kv[k] if m != "serialize" else min(1.0, kv[k]))
        for k in ("grm", "rm")
        for m in ("auto", "off", "serialize")
    ]
    phases: list[tuple[str, dict[str, Any]]] = [("anchors", {}), ("replay", {"n": replay_n})]
    for k in ("rm", "grm"):
        phases.append(_tp(k, levels, rounds=rounds))
    phases += [("old_paths", {}), ("shared_gpu", {"tag": "auto"})]
    return Layout(
        size,
        models,
        anchors,
        phases,
        n_tp,
        replay_n,
        note="one slot per model, six engines on one GPU; every path reaches the same engines",
    )


def _tp(
    kind: str, levels: list[int], *paths: str, rounds: int = 1, **kw: Any
) -> tuple[str, dict[str, Any]]:
    """A throughput phase: ``kind`` at ``levels``, over ``paths`` (all of the kind's if none)."""
    return (
        "throughput",
        {
            "kind": kind,
            "levels": levels,
            "rounds": rounds,
            **({"paths": list(paths)} if paths else {}),
            **kw,
        },
    )


def role(mode: str) -> str:
    """The benchmark's name for a determinism mode: ``off`` and ``serialize`` as they are,
    every batching deterministic mode (``auto``, ``batch_invariant``, ``fixed_shape``) is
    ``auto``, the paths ``engine_auto`` / ``rmgate_auto`` / ``rmgate_direct``."""
    return mode if mode in ("off", "serialize") else "auto"


def shipped_models(config: str) -> tuple[dict[str, Model], int]:
    """The models of a shipped config as the benchmark's ``<kind>-auto`` models (its judge
    is ``grm``, its DisRM ``rm``) with the config's slots, engine arguments and environment,
    and the config's ingress replicas: a layout that stands for a config measures it."""
    cfg = yaml.safe_load((REPO / config).read_text())
    args = cfg["applications"][0]["args"]
    out: dict[str, Model] = {}
    for spec in args["models"]:
        kind = "grm" if spec["kind"] == "generative" else "rm"
        ea = dict(spec.get("engine_args") or {})
        out[kind] = Model(
            f"{kind}-{role(spec.get('determinism', 'auto'))}",
            kind,
            spec.get("determinism", "auto"),
            slots=int(spec.get("replicas", 1)),
            max_num_seqs=int(ea.get("max_num_seqs", 256)),
            kv_gib=ea.get("kv_cache_memory_bytes", 2 * GIB) / GIB,
            engine_args=ea,
            engine_env=dict(spec.get("engine_env") or {}),
        )
    return out, int((args.get("gateway") or {}).get("ingress_replicas", 1))


def variant(
    base: Model, tag: str, *, slots: int | None = None, mode: str | None = None, **engine: Any
) -> Model:
    """``base`` with one thing changed: its slot count, its determinism, or engine arguments
    (``None`` removes one). Named ``<kind>-<mode>[-<tag>]``."""
    mode = mode or base.mode
    return Model(
        f"{base.kind}-{role(mode)}" + (f"-{tag}" if tag else ""),
        base.kind,
        mode,
        slots=base.slots if slots is None else slots,
        max_num_seqs=base.max_num_seqs,
        kv_gib=base.kv_gib,
        extra={**base.extra, **engine},
        spec=dict(base.spec),
        engine_args=base.engine_args,
        engine_env=dict(base.engine_env),
        shape=base.shape,
    )


#: The engine settings tried one at a time against the shipped DisRM (``configs/gpu-small.yaml``):
#: tag -> variant arguments. ``off`` is the same engines without batch invariance: what
#: invariance itself costs.
SWEEP = {
    "0.5b": {
        "s8": {"slots": 8},
        "mnbt16k": {"max_num_batched_tokens": 16384},
        "eager": {"enforce_eager": True},
        "fa3": {"attention_backend": "FLASH_ATTN"},
        "off": {"mode": "off"},
    },
    "1.5b": {
        "s2": {"slots": 2},
        "mnbt16k": {"max_num_batched_tokens": 16384},
        "fa3": {"attention_backend": "FLASH_ATTN"},
        "off": {"mode": "off"},
    },
}


def _sweep(size: str, levels: list[int], only: list[str] | None = None) -> Layout:
    """The shipped DisRM (its config's slots, engine arguments, ingress replicas) and one
    variant per engine setting, all on one GPU, each measured alone: reached directly and
    through rmgate, every answer compared with the shipped engines' bits; the framework
    anchor first, the shipped engines measured again last (the run's drift)."""
    shipped, ingress = shipped_models("configs/gpu-small.yaml")
    # 1 GiB of KV cache for every variant (~87k tokens at 0.5B, ~37k at 1.5B; a c=1024 load
    # of the 207-token mix holds at most ~27k per slot): 20+ engines fit one GPU
    rm = variant(shipped["rm"], "")
    rm.kv_gib = 1.0
    models = [rm]
    phases: list[tuple[str, dict[str, Any]]] = [
        ("framework", {"kind": "rm"}),
        _tp("rm", levels, "engine_auto", "rmgate_auto", label="shipped", bits=True),
    ]
    tags = [t for t in SWEEP[size] if only is None or t in only]
    for tag in tags:
        change = dict(SWEEP[size][tag])
        mode = change.pop("mode", None)
        slots = change.pop("slots", None)
        m = variant(rm, "" if mode else tag, slots=slots, mode=mode, **change)
        models.append(m)
        paths = ("engine_off", "rmgate_off") if mode == "off" else ("engine_auto", "rmgate_auto")
        phases.append(
            _tp(
                "rm",
                levels,
                *paths,
                model_tag="" if mode else tag,
                label=tag if mode else "",
                bits=True,
            )
        )
    phases.append(_tp("rm", levels, "engine_auto", "rmgate_auto", label="again", bits=True))
    return Layout(
        size,
        models,
        [],
        phases,
        {"rm": (3072, 384)},
        config="configs/gpu-small.yaml",
        ingress_replicas=ingress,
        note=f"the shipped DisRM ({rm.slots} slots) and one engine setting changed at a "
        f"time: {', '.join(tags)}; KV 1 GiB each; the framework anchor first",
    )


def _shipped(size: str, levels: list[int]) -> Layout:
    """configs/gpu-small.yaml as shipped (judge and DisRM, their slots, engine arguments
    and ingress replicas) at ``size``, the framework anchor in the same run."""
    shipped, ingress = shipped_models("configs/gpu-small.yaml")
    return Layout(
        size,
        [shipped["rm"], shipped["grm"]],
        [],
        [
            ("framework", {"kind": "rm"}),
            _tp("rm", levels, "engine_auto", "rmgate_auto", "rmgate_direct", rounds=2, bits=True),
            _tp("grm", levels, "engine_auto", "rmgate_auto", "rmgate_direct"),
        ],
        {"rm": (3072, 384), "grm": (1024, 32)},
        config="configs/gpu-small.yaml",
        ingress_replicas=ingress,
        note="configs/gpu-small.yaml as shipped, with the framework anchor",
    )


def _shipped_big(
    size: str, judge_tag: str, judge_change: dict[str, Any], llama_too: bool = False
) -> Layout:
    """configs/gpu.yaml (the 7-8B config) at ``size``: its DisRM as shipped
    (``fixed_shape``) and the same engine under ``off``; its judge as shipped, with
    ``judge_change`` applied to both judge engines (a candidate setting), and the same
    engine under ``off``; the framework anchors (SDPA and packed FlashAttention-3) alone on
    the GPU before the gateway starts. Four 7-8B engines fit one 80 GB GPU only with less
    KV cache than shipped (the DisRM 1.25 GiB: a step is 8,192 tokens; the judge 3 GiB:
    256 chats of ~220 tokens), the same for each pair; ingress replicas and ports as
    shipped. DisRM: every deterministic answer compared bitwise across paths, concurrency
    1 and 256 (the ``off`` pair is the negative control); c=1 is the low-load latency.
    ``llama_too`` (a GPU of 120+ GiB): the same DisRM pair on the Llama-3.1-8B shape too."""
    shipped, ingress = shipped_models("configs/gpu.yaml")
    rm = variant(shipped["rm"], "")
    rm.kv_gib = 1.25
    grm = variant(shipped["grm"], judge_tag, **judge_change)
    grm.kv_gib = 3.0
    models = [
        rm,
        variant(rm, "", mode="off"),
        grm,
        variant(grm, judge_tag, mode="off"),
    ]
    rm_paths = ("engine_auto", "rmgate_auto", "rmgate_direct", "engine_off")
    c1 = ("engine_auto", "engine_off", "rmgate_direct")
    # in order of what the run must not miss, should its deadline cut the end
    phases = [
        _tp("rm", [256], *rm_paths, rounds=2, bits=True),
        _tp("grm", [256], *rm_paths, model_tag=judge_tag, bits=True),
        _tp("rm", [1], *c1, label="c1", bits=True, n=48),
    ]
    before = [("framework", {"kind": "rm", "attn": ["sdpa", "fa3"]})]
    if llama_too:
        llama = variant(rm, "llama")
        llama.shape = SIZES["8b"][1]
        models += [llama, variant(llama, "llama", mode="off")]
        phases.insert(2, _tp("rm", [256], *rm_paths, model_tag="llama", bits=True))
        phases.append(_tp("rm", [1], *c1, model_tag="llama", label="c1", bits=True, n=48))
        before.append(("framework", {"kind": "rm", "attn": ["sdpa", "fa3"], "shape": llama.shape}))
    return Layout(
        size,
        models,
        [],
        phases,
        {"rm": (1024, 96), "grm": (1024, 12)},
        config="configs/gpu.yaml",
        ingress_replicas=ingress,
        before_gateway=before,
        note=f"configs/gpu.yaml at {size}: DisRM fixed_shape and off, judge "
        f"{'as shipped' if not judge_change else judge_change} and off; KV 1.25 / 3 GiB; "
        "framework anchors before the gateway",
    )


def _candidates_rm(size: str, llama_too: bool = False, bi_too: bool = True) -> Layout:
    """configs/gpu.yaml's DisRM at ``size`` batch-invariant (TRITON_ATTN, a 32k-token step:
    as shipped before ``fixed_shape``) and the ``fixed_shape`` candidate (8,192-token steps, FA3 in one split,
    the head at 256 rows), each beside the same engine under ``off`` (one variable: the
    mode), one slot each; the framework anchors (SDPA, packed FA3) alone on the GPU before
    the gateway. The candidate first, should the deadline cut the end. Every answer's bits
    compared within its class across paths, rounds and concurrency 1 and 256.
    ``llama_too`` (a GPU of 120+ GiB): the candidate and its ``off`` twin on the
    Llama-3.1-8B shape too (``rm-auto-llama``, ``rm-off-llama``). On an 80 GB GPU the
    batch-invariant engine's ``off`` twin ran out of memory at its first 32k-token step
    (h100-2026-12-07b-candidates-7b): ``memory_gib`` counts no step activations.
    ``bi_too=False``: the candidate and its twin only, 3,072 requests per round (a run
    that long is steady state: the ramp and the tail, where a padded step is part empty,
    weigh less)."""
    shipped, ingress = shipped_models("configs/gpu.yaml")
    rm = variant(
        shipped["rm"],
        "",
        mode="batch_invariant",
        attention_backend="TRITON_ATTN",
        max_num_batched_tokens=32768,
    )
    rm.kv_gib = 1.25
    fs = variant(
        rm, "fs", mode="fixed_shape", attention_backend="FLASH_ATTN", max_num_batched_tokens=8192
    )
    paths = ("engine_auto", "rmgate_auto", "rmgate_direct", "engine_off")
    c1 = ("engine_auto", "engine_off", "rmgate_direct")
    models = [fs, variant(fs, "fs", mode="off")]
    phases = [
        _tp("rm", [256], *paths, model_tag="fs", rounds=2, bits=True),
        _tp("rm", [1], *c1, model_tag="fs", label="c1", bits=True, n=48),
    ]
    if bi_too:
        models = [rm, variant(rm, "", mode="off"), *models]
        phases.insert(1, _tp("rm", [256], *paths, rounds=2, bits=True))
        phases.append(_tp("rm", [1], *c1, label="c1", bits=True, n=48))
    before = [("framework", {"kind": "rm", "attn": ["sdpa", "fa3"]})]
    if llama_too:
        llama = variant(fs, "llama")
        llama.shape = SIZES["8b"][1]
        models += [llama, variant(llama, "llama", mode="off")]
        phases.insert(1, _tp("rm", [256], *paths, model_tag="llama", rounds=2, bits=True))
        phases.insert(4, _tp("rm", [1], *c1, model_tag="llama", label="c1", bits=True, n=48))
        before.append(("framework", {"kind": "rm", "attn": ["sdpa", "fa3"], "shape": llama.shape}))
    return Layout(
        size,
        models,
        [],
        phases,
        {"rm": (1024 if bi_too else 3072, 96)},
        config="configs/gpu.yaml",
        ingress_replicas=ingress,
        before_gateway=before,
        note=f"configs/gpu.yaml's DisRM at {size}: "
        + ("batch_invariant and " if bi_too else "")
        + "fixed_shape (FA3, one split), each beside its off twin; KV 1.25 GiB; framework "
        "anchors first",
    )


def _candidates_grm(size: str) -> Layout:
    """configs/gpu.yaml's judge at ``size`` batch-invariant with TRITON_ATTN (as shipped
    before ``fixed_shape``, with vLLM's own token budget), the same with FA3 (a
    candidate), and the FA3 engine under ``off`` (vLLM's own default backend on Hopper:
    the engine a user runs without rmgate); KV 3 GiB each (256 chats of ~220 tokens).
    Every answer's bits compared within its class."""
    shipped, ingress = shipped_models("configs/gpu.yaml")
    grm = variant(
        shipped["grm"],
        "",
        mode="batch_invariant",
        attention_backend="TRITON_ATTN",
        max_num_batched_tokens=None,
    )
    grm.kv_gib = 3.0
    fa3 = variant(grm, "fa3", attention_backend="FLASH_ATTN")
    paths = ("engine_auto", "rmgate_auto", "rmgate_direct", "engine_off")
    return Layout(
        size,
        [grm, fa3, variant(fa3, "fa3", mode="off")],
        [],
        [
            _tp("grm", [256], *paths, model_tag="fa3", rounds=2, bits=True),
            _tp("grm", [256], "engine_auto", "rmgate_auto", "rmgate_direct", rounds=2, bits=True),
        ],
        {"grm": (1024, 12)},
        config="configs/gpu.yaml",
        ingress_replicas=ingress,
        note=f"configs/gpu.yaml's judge at {size}: batch_invariant with TRITON_ATTN (shipped) "
        "and with FA3, and the FA3 engine under off; KV 3 GiB",
    )


def _judge_fixed_shape(size: str, budgets: tuple[int, ...]) -> Layout:
    """configs/gpu.yaml's judge at ``size`` under ``fixed_shape`` (FA3 in one split, the
    ``lm_head`` at 256 rows) at each token budget in ``budgets`` (every step, decode steps
    included, padded to it), each measured beside one engine under ``off``: the shipped
    judge's settings with FA3, vLLM's own default on Hopper (the engine a user runs
    without rmgate). c=256 for two rounds, then c=1 (the price of padded decode steps);
    every answer's bits compared within its class across paths, rounds and concurrency.
    KV 3 GiB each (256 chats of ~220 tokens)."""
    shipped, ingress = shipped_models("configs/gpu.yaml")
    grm = variant(shipped["grm"], "")
    grm.kv_gib = 3.0
    # vLLM's own engine: FA3 and vLLM's own token budget (the shipped judge sets 512)
    vllm_default = {"attention_backend": "FLASH_ATTN", "max_num_batched_tokens": None}
    models = [variant(grm, "fa3", mode="off", **vllm_default)]
    phases = []
    for budget in budgets:
        tag = f"fs{budget}"
        models.append(
            variant(
                grm,
                tag,
                mode="fixed_shape",
                attention_backend="FLASH_ATTN",
                max_num_batched_tokens=budget,
            )
        )
        paths = ("engine_auto", "rmgate_auto", "rmgate_direct", "engine_off")
        phases.append(_tp("grm", [256], *paths, model_tag=tag, off_tag="fa3", rounds=2, bits=True))
    for budget in budgets:
        phases.append(
            _tp(
                "grm",
                [1],
                "engine_auto",
                "engine_off",
                model_tag=f"fs{budget}",
                off_tag="fa3",
                label="c1",
                bits=True,
                n=12,
            )
        )
    return Layout(
        size,
        models,
        [],
        phases,
        {"grm": (1024, 12)},
        config="configs/gpu.yaml",
        ingress_replicas=ingress,
        note=f"configs/gpu.yaml's judge at {size} under fixed_shape (FA3, one split) with "
        f"token budgets {', '.join(map(str, budgets))}, beside the FA3 engine under off; "
        "KV 3 GiB",
    )


def _two_slots(size: str, judge: bool = True, batch_invariant: bool = False) -> Layout:
    """configs/gpu.yaml's judge and DisRM as shipped (``fixed_shape``), two slots each on
    one GPU: every request answered by one slot (``engine_auto``: request i to slot
    i mod 2), by the other (``engine_auto_other_slot``) and through rmgate, every answer's
    bits compared: two slots of one numerics class answer alike. KV 1.25 / 3 GiB (the
    footprint of ``shipped-7b``). ``judge=False``: the DisRM's two slots only (half the
    engines to start). ``batch_invariant``: the DisRM as shipped before ``fixed_shape``
    (TRITON_ATTN, a 32k-token step), whose RMSNorm vLLM also hands to Inductor."""
    shipped, ingress = shipped_models("configs/gpu.yaml")
    rm = variant(shipped["rm"], "", slots=2)
    if batch_invariant:
        rm = variant(
            rm,
            "",
            mode="batch_invariant",
            attention_backend="TRITON_ATTN",
            max_num_batched_tokens=32768,
        )
    rm.kv_gib = 1.25
    paths = ("engine_auto", "engine_auto_other_slot", "rmgate_direct")
    models, phases, n_tp = [rm], [_tp("rm", [256], *paths, bits=True)], {"rm": (1024, 96)}
    if judge:
        grm = variant(shipped["grm"], "", slots=2)
        grm.kv_gib = 3.0
        models.append(grm)
        phases.append(_tp("grm", [256], *paths, bits=True))
        n_tp["grm"] = (1024, 12)
    phases.append(_tp("rm", [1], "engine_auto_other_slot", label="c1", bits=True, n=48))
    return Layout(
        size,
        models,
        [],
        phases,
        n_tp,
        config="configs/gpu.yaml",
        ingress_replicas=ingress,
        note=f"configs/gpu.yaml at {size} as shipped, two slots per "
        + ("model" if judge else "DisRM")
        + ": each request answered by both slots and through rmgate, bits compared",
    )


LAYOUTS: dict[str, Callable[[], Layout]] = {
    # configs/gpu.yaml's DisRM: batch_invariant and fixed_shape, each beside its off twin
    # (Qwen2-7B and Llama-3.1-8B shapes), the framework anchors first.
    "candidates-7b": lambda: _candidates_rm("7b"),
    "candidates-8b": lambda: _candidates_rm("8b"),
    # Both shapes in one run (six engines: a 141 GB GPU): the candidate on Llama-3.1-8B too.
    "candidates-7b-8b": lambda: _candidates_rm("7b", llama_too=True),
    # configs/gpu.yaml's judge: batch_invariant with TRITON_ATTN and with FA3, FA3 under off.
    "judge-7b": lambda: _candidates_grm("7b"),
    # The DisRM's fixed_shape and its off twin alone, 3,072 requests a round (steady state).
    "fixed-shape-7b": lambda: _candidates_rm("7b", bi_too=False),
    "fixed-shape-8b": lambda: _candidates_rm("8b", bi_too=False),
    "fixed-shape-7b-8b": lambda: _candidates_rm("7b", llama_too=True, bi_too=False),
    # The judge under fixed_shape at two token budgets beside vLLM's default engine (off).
    "judge-fixed-shape-7b": lambda: _judge_fixed_shape("7b", (512, 1024)),
    # configs/gpu.yaml with two slots per model: each request answered by both slots.
    "two-slots-7b": lambda: _two_slots("7b"),
    "two-slots-rm-7b": lambda: _two_slots("7b", judge=False),
    "two-slots-bi-rm-7b": lambda: _two_slots("7b", judge=False, batch_invariant=True),
    # configs/gpu.yaml: the 7B DisRM and judge as shipped, each beside the same engine
    # under `off`, the framework anchors, both ports, every answer's bits compared.
    "shipped-7b": lambda: _shipped_big("7b", "", {}),
    # The same DisRM settings on a Llama-3.1-8B shape; the judge with FA3 attention under
    # batch invariance (a candidate) against the same engine under `off`.
    "shipped-8b": lambda: _shipped_big("8b", "fa3", {"attention_backend": "FLASH_ATTN"}),
    # Both DisRM shapes and the shipped judge in one run (six engines: a 141 GB GPU).
    "shipped-7b-8b": lambda: _shipped_big("7b", "", {}, llama_too=True),
    # Engine settings one at a time against the shipped DisRM, with the framework anchor.
    "sweep-0.5b": lambda: _sweep("0.5b", [256, 1024]),
    "sweep-1.5b": lambda: _sweep("1.5b", [256, 1024]),
    # The shipped small-model config, exactly, with the framework anchor.
    "shipped-0.5b": lambda: _shipped("0.5b", [256]),
    "shipped-1.5b": lambda: _shipped("1.5b", [256]),
    # The core claim at 0.5B: every path side by side, the offline anchor, the replay.
    "core-0.5b": lambda: _core(
        "0.5b",
        {"rm": (2048, 384), "grm": (512, 32)},
        1000,
        ["rm", "grm"],
        {"grm": 4, "rm": 4},
        [64, 256],
        2,
    ),
    "core-1.5b": lambda: _core(
        "1.5b",
        {"rm": (1536, 256), "grm": (512, 24)},
        400,
        ["rm", "grm"],
        {"grm": 4, "rm": 4},
        [256],
        2,
    ),
    "core-7b": lambda: _core(
        "7b", {"rm": (1024, 96), "grm": (512, 12)}, 200, [], {"grm": 6, "rm": 3}, [256], 1
    ),
    # Slots per GPU, ingress replicas, max_num_seqs / token budget, one engine with four
    # API servers, a GRM + DisRM sharing the GPU under load.
    "layout-0.5b": lambda: Layout(
        "0.5b",
        [
            Model("rm-auto", "rm", "auto", slots=4, kv_gib=2),
            Model("grm-auto", "grm", "auto", slots=4, kv_gib=2),
            Model("rm-serialize", "rm", "serialize", slots=4, kv_gib=0.5),
            Model(
                "rm-auto-wide",
                "rm",
                "auto",
                max_num_seqs=1024,
                kv_gib=8,
                extra={"max_num_batched_tokens": 32768},
            ),
            Model("grm-auto-wide", "grm", "auto", max_num_seqs=1024, kv_gib=16),
        ],
        [],
        [
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", "rmgate_serial"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto"),
            ("standalone", {"kind": "rm", "levels": [256, 1024]}),
            ("ingress", {"replicas": 2}),
            _tp("rm", [256, 1024], "rmgate_auto", label="ingress2"),
            _tp("grm", [256, 1024], "rmgate_auto", label="ingress2"),
            ("ingress", {"replicas": 4}),
            _tp("rm", [256, 1024], "rmgate_auto", label="ingress4"),
            _tp("grm", [256], "rmgate_auto", label="ingress4"),
            ("shared_gpu", {"tag": "auto"}),
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", model_tag="wide"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", model_tag="wide"),
            ("scale", {"model": "rm-auto", "slots": 2}),
            _tp("rm", [256], "engine_auto", "rmgate_auto", label="2slots"),
        ],
        {"rm": (3072, 768), "grm": (1024, 32)},
        standalone=[{"name": "rm-auto-asc4", "kind": "rm", "api_server_count": 4, "kv_gib": 2}],
        note="4 slots per model, ingress 1, 2, then 4 replicas; wide = max_num_seqs 1024",
    ),
    # The same questions at 1.5B (run with --ingress-replicas 4): 4 -> 2 -> 1 slots, 8 ingress
    # replicas, max_num_seqs 1024.
    "layout-1.5b": lambda: Layout(
        "1.5b",
        [
            Model("rm-auto", "rm", "auto", slots=4, kv_gib=2),
            Model("grm-auto", "grm", "auto", slots=4, kv_gib=2),
            Model("rm-serialize", "rm", "serialize", slots=4, kv_gib=0.5),
            Model(
                "rm-auto-wide",
                "rm",
                "auto",
                max_num_seqs=1024,
                kv_gib=2,
                extra={"max_num_batched_tokens": 32768},
            ),
            Model("grm-auto-wide", "grm", "auto", max_num_seqs=1024, kv_gib=8),
        ],
        [],
        [
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", "rmgate_serial", label="4slots"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", label="4slots"),
            ("ingress", {"replicas": 8}),
            _tp("rm", [256, 1024], "rmgate_auto", label="ingress8"),
            _tp("grm", [1024], "rmgate_auto", label="ingress8"),
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", model_tag="wide"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", model_tag="wide"),
            ("scale", {"model": "rm-auto", "slots": 2}),
            ("scale", {"model": "grm-auto", "slots": 2}),
            _tp("rm", [256], "engine_auto", "rmgate_auto", label="2slots"),
            _tp("grm", [256], "engine_auto", "rmgate_auto", label="2slots"),
            ("scale", {"model": "rm-auto", "slots": 1}),
            ("scale", {"model": "grm-auto", "slots": 1}),
            _tp("rm", [256], "engine_auto", "rmgate_auto", label="1slot"),
            _tp("grm", [256], "engine_auto", "rmgate_auto", label="1slot"),
        ],
        {"rm": (3072, 512), "grm": (1024, 24)},
        note="4 slots per model, then 2 and 1 (rmgate scale); ingress 4, then 8; wide = max_num_seqs 1024",
    ),
    # 7B judge: 2 slots vs 1 for auto and off (the GRM >= 0.85x off target), KV 1 / 4 / 12 GiB.
    "layout-7b-grm": lambda: Layout(
        "7b",
        [
            Model("grm-auto", "grm", "auto", slots=2, kv_gib=4),
            Model("grm-off", "grm", "off", slots=2, kv_gib=4),
            Model("grm-auto-kv1", "grm", "auto", kv_gib=1),
            Model("grm-auto-kv12", "grm", "auto", kv_gib=12),
        ],
        [],
        [
            _tp(
                "grm",
                [256, 1024],
                "engine_auto",
                "rmgate_auto",
                "engine_off",
                "rmgate_off",
                rounds=2,
                label="2slots",
            ),
            _tp("grm", [256], "engine_auto", "rmgate_auto", model_tag="kv1"),
            _tp("grm", [256], "engine_auto", "rmgate_auto", model_tag="kv12"),
            ("scale", {"model": "grm-auto", "slots": 1}),
            ("scale", {"model": "grm-off", "slots": 1}),
            _tp(
                "grm",
                [256],
                "engine_auto",
                "rmgate_auto",
                "engine_off",
                "rmgate_off",
                rounds=2,
                label="1slot",
            ),
        ],
        {"grm": (1024, 12)},
        note="7B GRM: 2 slots then 1 (auto and off); KV cache 1 / 4 / 12 GiB on one slot",
    ),
    # 7B DisRM: 2 slots vs 1 for auto, off and serialize; a 32k-token step on one slot.
    "layout-7b-rm": lambda: Layout(
        "7b",
        [
            Model("rm-auto", "rm", "auto", slots=2, kv_gib=2),
            Model("rm-off", "rm", "off", slots=2, kv_gib=2),
            Model("rm-serialize", "rm", "serialize", slots=2, kv_gib=1),
            Model(
                "rm-auto-wide",
                "rm",
                "auto",
                max_num_seqs=1024,
                kv_gib=3,
                extra={"max_num_batched_tokens": 32768},
            ),
        ],
        [],
        [
            _tp(
                "rm",
                [256, 1024],
                "engine_auto",
                "rmgate_auto",
                "engine_off",
                "rmgate_off",
                "rmgate_serial",
                label="2slots",
            ),
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", model_tag="wide"),
            ("scale", {"model": "rm-auto", "slots": 1}),
            ("scale", {"model": "rm-off", "slots": 1}),
            ("scale", {"model": "rm-serialize", "slots": 1}),
            _tp(
                "rm",
                [256],
                "engine_auto",
                "rmgate_auto",
                "engine_off",
                "rmgate_off",
                "rmgate_serial",
                label="1slot",
            ),
        ],
        {"rm": (2048, 96)},
        note="7B DisRM: 2 slots then 1 (auto, off, serialize); wide = max_num_seqs 1024, 32k-token step",
    ),
    # The 1.5B slot count settled (the 12-02 run lost a slot to the shared-port bug): 4 ->
    # 2 -> 1 batch-invariant slots per model by `rmgate scale`, nothing else on the GPU.
    "slots-1.5b": lambda: Layout(
        "1.5b",
        [
            Model("rm-auto", "rm", "auto", slots=4, kv_gib=2),
            Model("grm-auto", "grm", "auto", slots=4, kv_gib=2),
        ],
        [],
        [
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", label="4slots"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", label="4slots"),
            ("scale", {"model": "rm-auto", "slots": 2}),
            ("scale", {"model": "grm-auto", "slots": 2}),
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", label="2slots"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", label="2slots"),
            ("scale", {"model": "rm-auto", "slots": 1}),
            ("scale", {"model": "grm-auto", "slots": 1}),
            _tp("rm", [256, 1024], "engine_auto", "rmgate_auto", label="1slot"),
            _tp("grm", [256, 1024], "engine_auto", "rmgate_auto", label="1slot"),
        ],
        {"rm": (3072, 512), "grm": (1024, 24)},
        note="1.5B: 4, 2, then 1 batch-invariant slot per model (rmgate scale), nothing else on the GPU",
    ),
    # The 7B judge with one slot per model, every path, two rounds (the 12-02 run lost the
    # rmgate `off` row to its deadline): the GRM >= 0.85x `off` target.
    "grm-7b-1slot": lambda: Layout(
        "7b",
        [
            Model("grm-auto", "grm", "auto", kv_gib=4),
            Model("grm-off", "grm", "off", kv_gib=4),
        ],
        [],
        [
            _tp(
                "grm",
                [256, 1024],
                "engine_auto",
                "rmgate_auto",
                "engine_off",
                "rmgate_off",
                rounds=2,
                label="1slot",
            ),
        ],
        {"grm": (1024, 12)},
        note="7B GRM: one auto and one off slot, every path, two rounds at c=1024",
    ),
    # The `serialize` targets at 0.5B, one variable at a time: the shipped small layout
    # (configs/gpu-small.yaml: 4 + 4 batch-invariant slots) against one serialized slot
    # with today's 4 requests let into the engine and with one (the seed's and verl's:
    # the next request is sent when the last is answered).
    "serialize-0.5b": lambda: Layout(
        "0.5b",
        [
            Model("rm-auto", "rm", "auto", slots=4, kv_gib=2),
            Model("grm-auto", "grm", "auto", slots=4, kv_gib=2),
            Model("rm-serialize", "rm", "serialize", kv_gib=0.5),
            Model(
                "rm-serialize-one", "rm", "serialize", kv_gib=0.5, spec={"serialize_inflight": 1}
            ),
            Model("grm-serialize", "grm", "serialize", kv_gib=1),
            Model(
                "grm-serialize-one", "grm", "serialize", kv_gib=1, spec={"serialize_inflight": 1}
            ),
        ],
        [],
        [
            _tp("rm", [256], "engine_auto", "rmgate_auto", "rmgate_serial", rounds=2),
            _tp("rm", [256], "rmgate_serial", model_tag="one"),
            _tp("grm", [256], "engine_auto", "rmgate_auto", "rmgate_serial", rounds=2),
            _tp("grm", [256], "rmgate_serial", model_tag="one"),
        ],
        {"rm": (3072, 384), "grm": (1024, 32)},
        note="0.5B: 4 + 4 auto slots (gpu-small) vs one serialized slot, serialize_inflight 4 and 1",
    ),
}
SIZES = {
    "0.5b": ("grm-0.5b", "rm-0.5b"),
    "1.5b": ("grm-1.5b", "rm-1.5b"),
    "7b": ("grm-7b", "rm-7b"),
    "8b": ("grm-7b", "rm-8b-llama"),  # the Llama-3.1-8B DisRM shape beside the 7B judge
}


# ----------------------------------------------------------------------------- the gateway
def serve_config(
    layout: Layout, built: dict[str, dict[str, Any]], ingress_replicas: int = 1
) -> dict[str, Any]:
    engines = sum(m.slots for m in layout.models)
    frac = math.floor(1000 / (engines + len(layout.anchors) + len(layout.standalone))) / 1000
    models = []
    for m in layout.models:
        info = built[m.model_shape(layout.size)]
        if m.engine_args is not None:  # a shipped config's engine: its arguments whole
            args: dict[str, Any] = {
                **m.engine_args,
                "max_num_seqs": m.max_num_seqs,
                "kv_cache_memory_bytes": int(m.kv_gib * GIB),
            }
        else:
            args = {
                "dtype": "bfloat16",
                "max_model_len": 2048,
                "max_num_seqs": m.max_num_seqs,
                "kv_cache_memory_bytes": int(m.kv_gib * GIB),
                "gpu_memory_utilization": 0.04,
            }
        if info["weights"] == "dummy":
            args["load_format"] = "dummy"
        args.update(m.extra)
        args = {k: v for k, v in args.items() if v is not None}
        models.append(
            {
                "name": m.name,
                "kind": "generative" if m.kind == "grm" else "discriminative",
                "model_path": info["path"],
                "replicas": m.slots,
                "determinism": m.mode,
                "engine_args": args,
                "engine_env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", **m.engine_env},
                "ray_actor_options": {"num_cpus": 0, "num_gpus": frac},
                "max_queue_per_slot": 100000,
                "startup_timeout_s": 900,
                **m.spec,
            }
        )
    from gateway.harness.running import serve_config as one_app

    return one_app(
        {
            "models": models,
            "gateway": {
                "request_timeout_s": 900,
                "slot_wait_s": 900,
                "max_queue_per_slot": 100000,
                "canary_interval_s": 0,
                "ingress_replicas": ingress_replicas,
            },
        }
    )


def memory_gib(layout: Layout) -> float:
    """A planning estimate of the GPU memory a layout takes: bf16 weights + explicit KV cache
    + ~2 GiB per engine (CUDA context, activations, CUDA graphs, sampler buffers)."""
    from benchmarks.gpu.models_gpu import shape, tensor_shapes

    def weights(name: str) -> float:
        return 2 * sum(math.prod(d) for d in tensor_shapes(shape(name)).values()) / GIB

    grm, rm = SIZES[layout.size]
    total = 0.0
    for m in layout.models:
        total += m.slots * (weights(m.model_shape(layout.size)) + m.kv_gib + 2)
    for kind in layout.anchors:
        m = next(x for x in layout.models if x.kind == kind and x.mode == "auto")
        total += weights(grm if kind == "grm" else rm) + m.kv_gib + 2
    for spec in layout.standalone:
        total += (
            weights(grm if spec["kind"] == "grm" else rm)
            + spec.get("kv_gib", 2)
            + 2 * spec.get("api_server_count", 1) ** 0
        )
    return round(total, 1)


def _kill_marked(marker: str) -> list[int]:
    from gateway.harness.processes import processes_with_env

    pids = processes_with_env(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@contextmanager
def gateway(
    config: Path, work: Path, timeout_s: float, fallback_port: int, direct_port: int
) -> Iterator[tuple[str, Path, Path]]:
    """``rmgate serve CONFIG --direct-port P`` in its own process group: yields (url, engine
    log dir, serve log); the ingress replicas' own port is ``direct_port``.
    Always stopped: SIGINT, 20 s, then SIGKILL to the group and to everything carrying the
    marker (Ray's workers and the engines, which live in process groups of their own)."""
    from deployments.engine.process import free_port
    from gateway.harness.processes import stop_process_group
    from gateway.harness.running import wait_until_serving

    port = free_port()
    engines, slog = work / "engines", work / "serve.log"
    shutil.rmtree(engines, ignore_errors=True)
    env = {
        **os.environ,
        "RMGATE_LOG_DIR": str(engines),
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback_port),
    }
    with open(slog, "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                str(config),
                "--port",
                str(port),
                "--direct-port",
                str(direct_port),
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, slog, timeout_s)
        yield url, engines, slog
    finally:
        t = time.monotonic()
        stop_process_group(proc, grace_s=20)
        left = _kill_marked(str(engines))
        log(
            f"gateway stopped in {time.monotonic() - t:.0f}s"
            + (f" (killed {len(left)} leftovers)" if left else "")
        )


def engine_urls(engines: Path, model: str, slots: int) -> list[str]:
    urls = []
    for s in range(slots):
        logs = sorted(engines.glob(f"{model}-{s}-*.log"), key=lambda p: p.stat().st_mtime)
        urls.append(f"http://127.0.0.1:{logs[-1].stem.rsplit('-', 1)[1]}")
    return urls


# ----------------------------------------------------------------------------- sampling
class GpuSampler:
    """NVML utilisation every 100 ms in a thread (no CUDA context in this process)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, float]] = []
        self.ok = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.nvml = pynvml
            self.ok = True
        except Exception:  # noqa: BLE001 - no GPU (dry run): no numbers
            return
        self.stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(0.1):
            try:
                u = self.nvml.nvmlDeviceGetUtilizationRates(self.h)
                m = self.nvml.nvmlDeviceGetMemoryInfo(self.h)
                self.samples.append((time.time(), int(u.gpu), m.used / GIB))
            except Exception:  # noqa: BLE001
                pass

    def window(self, t0: float, t1: float) -> dict[str, float] | None:
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return None
        return {
            "gpu_util_pct": round(statistics.mean(x[1] for x in s), 1),
            "gpu_mem_gib": round(max(x[2] for x in s), 1),
        }


# ----------------------------------------------------------------------------- measuring
class Bench:
    def __init__(
        self,
        layout_name: str,
        layout: Layout,
        out: Path,
        deadline_s: float,
        fake: bool,
        ingress_replicas: int = 1,
    ) -> None:
        self.name, self.layout, self.out, self.fake = layout_name, layout, out, fake
        self.ingress_replicas = ingress_replicas
        self.deadline = T0 + deadline_s
        self.report: dict[str, Any] = {
            "layout": layout_name,
            "size": layout.size,
            "stands_for": layout.config or None,
            "note": layout.note,
            "date": time.strftime("%Y-%m-%d"),
            "phases": {},
            "skipped": [],
            "errors": [],
        }
        self.gpu = GpuSampler()
        self.lg = LoadGen(procs=4)
        self.lg2: LoadGen | None = None
        self.url = ""
        self.direct_url = ""  # the ingress replicas' own port (rmgate serve --direct-port)
        self.engines = Path()
        self.proxies: dict[str, tuple[subprocess.Popen, str]] = {}
        self.fallback_port = 0
        self.anchor_specs: dict[str, Path] = {}
        self.anchor_procs: dict[str, subprocess.Popen] = {}
        self.slots = {m.name: m.slots for m in layout.models}
        self.standalone: list[tuple[dict[str, Any], subprocess.Popen, str]] = []
        self.framework: dict[str, float | None] = {}
        #: (kind, model tag, "det" | "off") -> request id -> the first answer's digest
        self.bits_ref: dict[tuple[str, str, str], dict[int, str]] = {}
        self.built: dict[str, dict[str, Any]] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / f"{self.name}.json").write_text(json.dumps(self.report, indent=1))

    # -- one measured run
    def measure(
        self,
        urls: list[str],
        calls: list[tuple[str, dict]],
        concurrency: int,
        order: list[int] | None = None,
        lg: LoadGen | None = None,
        keep_answers: bool = False,
    ) -> dict[str, Any]:
        before = cpu_accounting.snapshot()
        t0 = time.time()
        r = (lg or self.lg).run(urls, calls, concurrency, order)
        t1 = time.time()
        cpu = cpu_accounting.cpu_ms_per_request(before, cpu_accounting.snapshot(), max(r["ok"], 1))
        r["cpu_ms_per_req"] = cpu
        r["gateway_cpu_ms_per_req"] = round(cpu["ingress"] + cpu["http_proxy"], 3)
        r["proxy_cpu_ms_per_req"] = cpu["least_loaded_proxy"]
        w = self.gpu.window(t0, t1)
        if w:
            r.update(w)
        if not keep_answers:
            r.pop("answers")
        return r

    def model_of(self, kind: str, mode: str, tag: str = "") -> str:
        base = f"{kind}-{mode}" + (f"-{tag}" if tag else "")
        return base

    def paths(
        self, kind: str, tag: str = "", off_tag: str | None = None
    ) -> dict[str, tuple[list[str], str]]:
        """path name -> (urls, model name in the body); ``off_tag``: the ``off`` paths'
        model is the one of that tag (one engine under ``off`` against several)."""
        out: dict[str, tuple[list[str], str]] = {}
        auto, ser = (self.model_of(kind, m, tag) for m in ("auto", "serialize"))
        off = self.model_of(kind, "off", tag if off_tag is None else off_tag)
        if auto in self.slots:
            out["engine_auto"] = (engine_urls(self.engines, auto, self.slots[auto]), auto)
            if self.slots[auto] > 1:  # each request to another slot than engine_auto's
                urls = out["engine_auto"][0]
                out["engine_auto_other_slot"] = (urls[1:] + urls[:1], auto)
            out["rmgate_auto"] = ([self.url], auto)
            out["rmgate_direct"] = ([self.direct_url], auto)
        if off in self.slots:
            out["engine_off"] = (engine_urls(self.engines, off, self.slots[off]), off)
            out["rmgate_off"] = ([self.url], off)
            if off in self.proxies:
                out["least_loaded_off"] = ([self.proxies[off][1]], off)
        if ser in self.slots:
            out["rmgate_serial"] = ([self.url], ser)
        return out

    def calls(self, kind: str, model: str, n: int, base: int) -> list[tuple[str, dict]]:
        if kind == "rm":
            return [("/classify", rm_body(model, base + i)) for i in range(n)]
        return [
            ("/v1/chat/completions", grm_body(model, base + i, self.layout.gen_tokens))
            for i in range(n)
        ]

    # -- phases
    def phase_anchors(self) -> None:
        out = {}
        for kind, spec_path in self.anchor_specs.items():
            spec = json.loads(spec_path.read_text())
            ready, go, res = Path(spec["ready"]), Path(spec["go"]), Path(spec["out"])
            t = time.monotonic()
            proc = self.anchor_procs.get(kind)
            while not ready.exists() and time.monotonic() - t < min(240, self.left() - 60):
                if proc is not None and proc.poll() is not None:
                    break  # it died before getting ready
                time.sleep(0.5)
            if not ready.exists():
                out[kind] = {
                    "error": "not ready in time"
                    if proc is None or proc.poll() is None
                    else f"exited with {proc.returncode} before it was ready"
                }
                log(f"offline anchor {kind}: {out[kind]}")
                continue
            t0 = time.time()
            go.write_text("go")
            while not res.exists() and time.monotonic() - t < min(300, self.left() - 40):
                time.sleep(0.2)
            out[kind] = json.loads(res.read_text()) if res.exists() else {"error": "no result"}
            w = self.gpu.window(t0, time.time())
            if w:
                out[kind].update(w)
            log(f"offline anchor {kind}: {out[kind]}")
        self.report["phases"]["anchors"] = out

    def phase_replay(self, n: int) -> None:
        """The mixed workload 3x shuffled at c=1, 64, 256 against auto and, at the same
        time (another load-generator pool, other engines), against off."""
        if self.lg2 is None:
            self.lg2 = LoadGen(procs=3)

        def mixed(mode: str) -> list[tuple[str, dict]]:
            return [
                ("/v1/chat/completions", grm_body(f"grm-{mode}", i, 16))
                if i % 2 == 0
                else ("/classify", rm_body(f"rm-{mode}", i))
                for i in range(n)
            ]

        rows: dict[str, list[dict[str, Any]]] = {"auto": [], "off": []}
        first: dict[str, dict[int, str]] = {}
        for seed, conc in enumerate((1, 64, 256)):
            order = shuffled(n, 100 + seed)
            res: dict[str, dict[str, Any]] = {}

            def go(mode: str, lg: LoadGen) -> None:
                res[mode] = lg.run([self.url], mixed(mode), conc, order)

            threads = [
                threading.Thread(target=go, args=m) for m in (("auto", self.lg), ("off", self.lg2))
            ]
            [t.start() for t in threads]
            [t.join() for t in threads]
            for mode in ("auto", "off"):
                r = res[mode]
                answers = r.pop("answers")
                first.setdefault(mode, answers)
                r["differing_from_run1"] = sum(
                    answers.get(i) != first[mode].get(i) for i in range(n)
                )
                r["missing"] = n - len(answers)
                rows[mode].append(r)
            log(
                f"replay c={conc}: auto differing {rows['auto'][-1]['differing_from_run1']}, "
                f"off differing {rows['off'][-1]['differing_from_run1']} "
                f"({rows['auto'][-1]['seconds']}s / {rows['off'][-1]['seconds']}s, "
                f"errors {rows['auto'][-1]['errors']}/{rows['off'][-1]['errors']})"
            )
        self.report["phases"]["replay"] = {"requests": n, "gen_tokens": 16, "runs": rows}

    def phase_framework(
        self, kind: str, attn: list[str] | None = None, shape: str | None = None
    ) -> None:
        """The framework anchor (``framework_anchor.py``: a plain ``transformers`` forward of
        the same model, ``attn`` its attention implementations) over the throughput phases'
        requests, in a child process while the engines are idle (or before they start)."""
        if kind != "rm":
            raise ValueError("the framework anchor is a DisRM forward")
        rm = shape or SIZES[self.layout.size][1]
        n = self.layout.n_tp[kind][0]
        d = WORK / f"framework-{rm}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        spec = {
            "model": self.built[rm]["path"],
            "out": str(d / "result.json"),
            "texts": [rm_text(50_000 + i) for i in range(n)],
            "attn": attn or ["sdpa"],
            "dummy": self.built[rm].get("weights") == "dummy",
        }
        (d / "spec.json").write_text(json.dumps(spec))
        t0 = time.time()
        with open(d / "log.txt", "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.gpu.framework_anchor", str(d / "spec.json")],
                cwd=REPO,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            proc.wait(timeout=max(30.0, min(240.0, self.left() - 60)))
        except subprocess.TimeoutExpired:
            _stop(proc)
        res = Path(spec["out"])
        out = (
            json.loads(res.read_text())
            if res.exists()
            else {"error": "no result: " + (d / "log.txt").read_text(errors="replace")[-1500:]}
        )
        w = self.gpu.window(t0, time.time())
        if w:
            out.update(w)
        self.framework[shape or kind] = out.get("req_per_s")
        self.report["phases"][f"framework_{kind}" + (f"_{shape}" if shape else "")] = out
        log(
            f"framework anchor {kind}: {out.get('req_per_s')} req/s "
            f"(best budget {out.get('best', {}).get('budget')}, {out.get('error', 'ok')})"
        )

    def phase_throughput(
        self,
        kind: str,
        levels: list[int],
        rounds: int,
        paths: list[str] | None = None,
        model_tag: str = "",
        label: str = "",
        bits: bool = False,
        n: int | None = None,
        off_tag: str | None = None,
    ) -> None:
        """Requests per second over ``paths`` at each concurrency level. ``bits``: every
        answer compared with the first answer to the same request on a path of the same
        class (the deterministic paths with each other, the ``off`` paths with each other:
        across paths, rounds, phases and concurrency levels); ``n`` overrides the layout's
        request count (a low-concurrency phase); ``off_tag``: the ``off`` engine measured
        beside this tag's (``paths``)."""
        n_all, n_ser = self.layout.n_tp[kind]
        n = n or n_all
        all_paths = self.paths(kind, model_tag, off_tag)
        # engine_auto_other_slot repeats engine_auto's load: only where a phase names it
        default = [p for p in all_paths if p != "engine_auto_other_slot"]
        chosen = {p: all_paths[p] for p in (paths or default) if p in all_paths}
        key = (
            f"throughput_{kind}"
            + (f"_{model_tag}" if model_tag else "")
            + (f"_{label}" if label else "")
        )
        result: dict[str, Any] = {"requests": n, "serial_requests": n_ser, "paths": {}}
        self.report["phases"][key] = result
        for c in levels:
            samples: dict[str, list[dict[str, Any]]] = {p: [] for p in chosen}
            for rnd in range(rounds if c == max(levels) else 1):
                for p, (urls, model) in chosen.items():
                    serial = p == "rmgate_serial"
                    if serial and rnd > 0:
                        continue
                    if self.left() < 45:
                        self.report["skipped"].append(f"{key} c={c} {p} round {rnd}")
                        continue
                    calls = self.calls(kind, model, n_ser if serial else n, 50_000 + 10_000 * rnd)
                    if rnd == 0 and c == levels[0]:  # warm-up: connections, kernels of new shapes
                        self.lg.run(urls, calls[:64], 64)
                    r = self.measure(urls, calls, c, keep_answers=bits)
                    if bits:
                        base = 50_000 + 10_000 * rnd
                        answers = {base + i: a for i, a in r.pop("answers").items()}
                        off = p.endswith("_off")
                        tag = (off_tag if off and off_tag is not None else model_tag) or ""
                        cls = (kind, tag, "off" if off else "det")
                        ref = self.bits_ref.setdefault(cls, {})
                        both = [i for i in answers if i in ref]
                        r["compared"] = len(both)
                        r["differing_from_reference"] = sum(answers[i] != ref[i] for i in both)
                        for i, a in answers.items():
                            ref.setdefault(i, a)
                    samples[p].append(r)
                    log(
                        f"{key} c={c} {p}: {r['req_per_s']} req/s"
                        + (f", {r['gen_tok_per_s']} tok/s" if r.get("gen_tok_per_s") else "")
                        + f", gw cpu {r['gateway_cpu_ms_per_req']} ms, lg cpu {r['loadgen_cpu_ms_per_req']} ms"
                        + f", gpu {r.get('gpu_util_pct')}%, errors {r['errors']}"
                        + (
                            f", differing bits {r['differing_from_reference']}/{r['compared']}"
                            if bits
                            else ""
                        )
                    )
            row = {}
            for p, rs in samples.items():
                if not rs:
                    continue
                med = statistics.median(x["req_per_s"] for x in rs)
                best = min(rs, key=lambda x: abs(x["req_per_s"] - med))
                row[p] = {
                    **best,
                    "req_per_s": med,
                    "req_per_s_rounds": [x["req_per_s"] for x in rs],
                }
                if bits:  # every round's count: the median round's alone hides a difference
                    row[p]["differing_rounds"] = [x["differing_from_reference"] for x in rs]
                    row[p]["compared_rounds"] = [x["compared"] for x in rs]
            result["paths"][str(c)] = row
            shape = next(
                (m.shape for m in self.layout.models if m.name == f"{kind}-auto-{model_tag}"),
                None,
            )
            result.setdefault("ratios", {})[str(c)] = ratios(row, self.framework.get(shape or kind))
            self.save()

    def phase_old_paths(self) -> None:
        """What the old bench_gpu.py lost: its client (one httpx process) and Serve's Python
        proxy, each on the rmgate_auto path of the same gateway, against this client."""
        out: dict[str, Any] = {}
        for kind in ("rm", "grm"):
            n = min(self.layout.n_tp[kind][0], 768 if kind == "rm" else 256)
            model = f"{kind}-auto"
            if model not in self.slots:
                continue
            calls = self.calls(kind, model, n, 90_000)
            if self.left() < 60:
                self.report["skipped"].append(f"old_paths {kind}")
                continue
            row = {"loadgen_rmgate": self.measure([self.url], calls, 256)}
            before = cpu_accounting.snapshot()
            t0 = time.time()
            r = legacy_httpx(self.url, calls, 256)
            r["cpu_ms_per_req"] = cpu_accounting.cpu_ms_per_request(
                before, cpu_accounting.snapshot(), r["ok"]
            )
            w = self.gpu.window(t0, time.time())
            if w:
                r.update(w)
            row["old_httpx_client_rmgate"] = r
            row["loadgen_serve_proxy"] = self.measure(
                [f"http://127.0.0.1:{self.fallback_port}"], calls, 256
            )
            out[kind] = row
            log(
                f"old paths {kind}: "
                + ", ".join(f"{k} {v['req_per_s']} req/s" for k, v in row.items())
            )
        self.report["phases"]["old_paths"] = out

    def phase_shared_gpu(self, tag: str) -> None:
        """GRM and DisRM on one GPU under load at the same time vs each alone (rmgate)."""
        grm, rm = f"grm-{tag}", f"rm-{tag}"
        if grm not in self.slots or rm not in self.slots:
            return
        if self.lg2 is None:
            self.lg2 = LoadGen(procs=3)
        n_rm, n_grm = self.layout.n_tp["rm"][0], self.layout.n_tp["grm"][0]
        rm_calls, grm_calls = (
            self.calls("rm", rm, n_rm, 70_000),
            self.calls("grm", grm, n_grm, 80_000),
        )
        res: dict[str, Any] = {}
        res["rm_alone"] = self.measure([self.url], rm_calls, 256)
        res["grm_alone"] = self.measure([self.url], grm_calls, 256)
        both: dict[str, Any] = {}

        def go(k: str, lg: LoadGen, calls: list) -> None:
            both[k] = lg.run([self.url], calls, 256)

        # DisRM requests repeated so that they last as long as the GRM run
        reps = max(1, round(res["grm_alone"]["seconds"] * res["rm_alone"]["req_per_s"] / n_rm))
        rm_long = [rm_calls[i % n_rm] for i in range(n_rm * reps)]
        t0 = time.time()
        threads = [
            threading.Thread(target=go, args=("rm_with_grm", self.lg, rm_long)),
            threading.Thread(target=go, args=("grm_with_rm", self.lg2, grm_calls)),
        ]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for k in both:
            both[k].pop("answers")
        w = self.gpu.window(t0, time.time())
        res.update(both)
        res["together_gpu"] = w
        res["rm_ratio"] = round(both["rm_with_grm"]["req_per_s"] / res["rm_alone"]["req_per_s"], 3)
        res["grm_ratio"] = round(
            both["grm_with_rm"]["req_per_s"] / res["grm_alone"]["req_per_s"], 3
        )
        log(
            f"shared GPU: DisRM {res['rm_alone']['req_per_s']} alone -> {both['rm_with_grm']['req_per_s']} "
            f"with GRM load; GRM {res['grm_alone']['req_per_s']} -> {both['grm_with_rm']['req_per_s']}"
        )
        self.report["phases"][f"shared_gpu_{tag}"] = res

    def phase_standalone(self, kind: str, levels: list[int]) -> None:
        """Engines started beside the gateway (e.g. one engine with four API server
        processes), reached directly: a layout rmgate could run, measured without risking
        the gateway's start-up on it."""
        import httpx

        for spec, proc, url in self.standalone:
            if spec["kind"] != kind:
                continue
            res: dict[str, Any] = {"spec": spec}
            self.report["phases"][f"standalone_{spec['name']}"] = res
            t = time.monotonic()
            while proc.poll() is None and time.monotonic() - t < min(120, self.left() - 60):
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1)
            else:
                res["error"] = f"not serving (exit {proc.poll()})"
                log(f"standalone {spec['name']}: {res['error']}")
                continue
            n = self.layout.n_tp[kind][0]
            calls = self.calls(kind, spec["name"], n, 50_000)
            self.lg.run([url], calls[:64], 64)
            for c in levels:
                r = self.measure([url], calls, c)
                res[str(c)] = r
                log(
                    f"standalone {spec['name']} c={c}: {r['req_per_s']} req/s, gpu {r.get('gpu_util_pct')}%"
                )

    def start_standalone(self, built: dict[str, dict[str, Any]], work: Path) -> None:
        from deployments.engine.process import free_port

        grm, rm = SIZES[self.layout.size]
        for spec in self.layout.standalone:
            info = built[grm if spec["kind"] == "grm" else rm]
            port = free_port()
            args = [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                info["path"],
                "--served-model-name",
                spec["name"],
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dtype",
                "bfloat16",
                "--max-model-len",
                "2048",
                "--max-num-seqs",
                str(spec.get("max_num_seqs", 256)),
                "--kv-cache-memory-bytes",
                str(int(spec.get("kv_gib", 2) * GIB)),
                "--gpu-memory-utilization",
                "0.04",
                "--seed",
                "0",
                "--generation-config",
                "vllm",
                "--no-enable-prefix-caching",
                "--attention-backend",
                "TRITON_ATTN",
                "--disable-uvicorn-access-log",
                "--api-server-count",
                str(spec.get("api_server_count", 1)),
            ]
            if spec["kind"] == "rm":
                args += ["--runner", "pooling"]
            if info["weights"] == "dummy":
                args += ["--load-format", "dummy"]
            d = work / f"standalone-{spec['name']}"
            d.mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ,
                "VLLM_BATCH_INVARIANT": "1",
                "VLLM_USE_FLASHINFER_SAMPLER": "0",
                "VLLM_CACHE_ROOT": str(d / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
            }
            with open(work / f"standalone-{spec['name']}.log", "wb") as fh:
                proc = subprocess.Popen(
                    args,
                    cwd=REPO,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.standalone.append((spec, proc, f"http://127.0.0.1:{port}"))

    def phase_ingress(self, replicas: int) -> None:
        from gateway.harness.running import dashboard_address
        from gateway.serve import topology
        from gateway.serve.admin import ServeAdmin

        t = time.monotonic()
        admin = ServeAdmin(dashboard_address(self.serve_log))
        apps = admin.applications()
        new = json.loads(json.dumps(apps))
        for app in new:
            if app.get("import_path") in {topology.INGRESS_IMPORT}:
                for d in app.setdefault("deployments", []):
                    if d.get("name") == topology.INGRESS_DEPLOYMENT:
                        d["num_replicas"] = replicas
        admin.apply(new, 300, apps)
        time.sleep(3)  # HAProxy picks up the new replica
        self.report["phases"][f"ingress_{replicas}"] = {"seconds": round(time.monotonic() - t, 1)}
        log(f"ingress -> {replicas} replicas in {time.monotonic() - t:.0f}s")

    def phase_scale(self, model: str, slots: int) -> None:
        from gateway.harness.running import dashboard_address
        from gateway.serve.admin import ServeAdmin

        t = time.monotonic()
        ServeAdmin(dashboard_address(self.serve_log)).scale(model, slots, 300, log=log)
        self.slots[model] = slots
        self.report["phases"][f"scale_{model}_{slots}"] = {
            "seconds": round(time.monotonic() - t, 1)
        }

    # -- the run
    def start_anchors(self, built: dict[str, dict[str, Any]]) -> list[subprocess.Popen]:
        procs = []
        grm, rm = SIZES[self.layout.size]
        for kind in self.layout.anchors:
            info = built[grm if kind == "grm" else rm]
            d = WORK / f"anchor-{kind}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            n = self.layout.n_tp[kind][0]
            m = next(x for x in self.layout.models if x.kind == kind and x.mode == "auto")
            spec = {
                "model": info["path"],
                "kind": "generative" if kind == "grm" else "discriminative",
                "batch_invariant": True,
                "max_model_len": 2048,
                "max_num_seqs": m.max_num_seqs,
                "kv_cache_memory_bytes": int(m.kv_gib * GIB),
                "max_tokens": self.layout.gen_tokens,
                "max_num_batched_tokens": int(m.extra.get("max_num_batched_tokens") or 8192),
                "inputs": [
                    grm_text(50_000 + i) if kind == "grm" else rm_text(50_000 + i) for i in range(n)
                ],
                "seeds": [1000 + 50_000 + i for i in range(n)],
                "load_format": "dummy" if info["weights"] == "dummy" else None,
                "ready": str(d / "READY"),
                "go": str(d / "GO"),
                "out": str(d / "result.json"),
            }
            (d / "spec.json").write_text(json.dumps(spec))
            self.anchor_specs[kind] = d / "spec.json"
            env = {
                **os.environ,
                "VLLM_BATCH_INVARIANT": "1",
                "VLLM_USE_FLASHINFER_SAMPLER": "0",
                "VLLM_CACHE_ROOT": str(d / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
                "RMGATE_ANCHOR": str(d),
            }
            with open(d / "log.txt", "wb") as fh:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "benchmarks.gpu.offline_anchor",
                            str(d / "spec.json"),
                        ],
                        cwd=REPO,
                        env=env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            self.anchor_procs[kind] = procs[-1]
        return procs

    def run(self) -> None:
        from deployments.engine.process import free_port
        from gateway.harness.least_loaded import start_proxy

        lay = self.layout
        work = WORK / self.name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        t = time.monotonic()
        names = sorted({*SIZES[lay.size], *(m.shape for m in lay.models if m.shape)})
        if self.fake:
            built = {n: {"path": str(work / n), "weights": "random"} for n in names}
        else:
            from benchmarks.gpu.models_gpu import build_in_child

            built = build_in_child(WORK / "models", names)
        self.built = built
        self.report["build"] = {"seconds": round(time.monotonic() - t, 1), "models": built}
        log(f"models ready in {time.monotonic() - t:.0f}s: {built}")
        cfg = serve_config(lay, built, self.ingress_replicas)
        (work / "serve.yaml").write_text(yaml.safe_dump(cfg))
        self.report["config"] = cfg["applications"][0]["args"]
        for phase, kw in [] if self.fake else lay.before_gateway:
            log(f"--- {phase} {kw} (before the gateway)")
            try:
                getattr(self, f"phase_{phase}")(**kw)
            except Exception as exc:  # noqa: BLE001 - record and go on
                self.report["errors"].append(f"{phase} {kw}: {type(exc).__name__}: {exc}"[:2000])
            self.save()
        anchors = [] if self.fake else self.start_anchors(built)
        if not self.fake:
            self.start_standalone(built, work)
        self.fallback_port, direct_port = free_port(), free_port()
        t = time.monotonic()
        ctx = (
            fake_gateway(lay)
            if self.fake
            else gateway(
                work / "serve.yaml",
                work,
                max(60.0, self.left() - 120),
                self.fallback_port,
                direct_port,
            )
        )
        try:
            with ctx as (url, engines, slog):
                self.url, self.engines, self.serve_log = url, engines, slog
                self.direct_url = url if self.fake else f"http://127.0.0.1:{direct_port}"
                if self.fake:
                    self.fallback_port = int(url.rsplit(":", 1)[1])
                self.report["startup_s"] = round(time.monotonic() - t, 1)
                import httpx

                cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
                self.report["models"] = [
                    {
                        k: c.get(k)
                        for k in (
                            "id",
                            "determinism",
                            "selftest",
                            "fingerprints",
                            # did the probe digests tell the slots apart
                            "numerics_classes",
                            "drained",
                        )
                    }
                    for c in cards
                ]
                log(
                    f"gateway up in {self.report['startup_s']}s: "
                    + ", ".join(f"{c['id']}={c.get('determinism')}" for c in cards)
                )
                for m in lay.models:
                    if m.mode == "off":
                        self.proxies[m.name] = start_proxy(
                            engine_urls(engines, m.name, m.slots), work
                        )
                self.save()
                for phase, kw in lay.phases:
                    if self.left() < 50:
                        self.report["skipped"].append(phase)
                        continue
                    log(f"--- {phase} {kw}")
                    try:
                        getattr(self, f"phase_{phase}")(**kw)
                    except Exception as exc:  # noqa: BLE001 - record and go on with the next
                        self.report["errors"].append(
                            f"{phase} {kw}: {type(exc).__name__}: {exc}"[:2000]
                        )
                        log(f"phase {phase} failed: {type(exc).__name__}: {exc}")
                    self.save()
        finally:
            for proc, _ in self.proxies.values():
                _stop(proc)
            for p in anchors + [proc for _, proc, _ in self.standalone]:
                _stop(p)
            self.lg.close()
            if self.lg2:
                self.lg2.close()
            self.report["wall_s"] = round(time.monotonic() - T0, 1)
            self.save()
            write_log_tail(work, self.out / f"{self.name}-log.txt")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def ratios(row: dict[str, Any], framework: float | None = None) -> dict[str, float]:
    def r(a: str, b: str) -> float | None:
        if a in row and b in row and row[b]["req_per_s"]:
            return round(row[a]["req_per_s"] / row[b]["req_per_s"], 3)
        return None

    out = {
        "rmgate_auto/engine_auto": r("rmgate_auto", "engine_auto"),
        "rmgate_direct/engine_auto": r("rmgate_direct", "engine_auto"),
        "rmgate_direct/rmgate_auto": r("rmgate_direct", "rmgate_auto"),
        "rmgate_auto/rmgate_serial": r("rmgate_auto", "rmgate_serial"),
        "rmgate_auto/rmgate_off": r("rmgate_auto", "rmgate_off"),
        "rmgate_auto/engine_off": r("rmgate_auto", "engine_off"),
        "engine_auto/engine_off": r("engine_auto", "engine_off"),
        "rmgate_direct/engine_off": r("rmgate_direct", "engine_off"),
        "rmgate_off/engine_off": r("rmgate_off", "engine_off"),
        "rmgate_off/least_loaded_off": r("rmgate_off", "least_loaded_off"),
        "rmgate_auto/least_loaded_off": r("rmgate_auto", "least_loaded_off"),
    }
    for p in ("rmgate_auto", "rmgate_direct", "engine_auto", "rmgate_off", "engine_off"):
        if framework and p in row:  # against the framework anchor of the same run
            out[f"{p}/framework"] = round(row[p]["req_per_s"] / framework, 3)
    return {k: v for k, v in out.items() if v is not None}


def write_log_tail(work: Path, dest: Path, limit: int = 400_000) -> None:
    """serve.log's tail, error lines of every engine and anchor log, and the last lines of
    any engine log that holds a traceback. One small file (what comes back from the device)."""
    parts = []
    slog = work / "serve.log"
    if slog.exists():
        parts.append(
            "== serve.log (tail)\n"
            + "\n".join(slog.read_text(errors="replace").splitlines()[-150:])
        )
    logs = (
        sorted((work / "engines").glob("*.log"))
        + sorted(WORK.glob("anchor-*/log.txt"))
        + sorted(work.glob("proxy-*.log"))
        + sorted(work.glob("standalone-*.log"))
    )
    for p in logs:
        text = p.read_text(errors="replace").splitlines()
        bad = [
            ln
            for ln in text
            if any(w in ln for w in ("Error", "error", "Traceback", "WARNING", "Killed"))
        ]
        tail = text[-40:] if any("Traceback" in ln for ln in text) else text[-3:]
        parts.append(
            f"== {p.parent.name}/{p.name}: {len(text)} lines\n"
            + "\n".join(bad[-30:] + ["..."] + tail)
        )
    blob = "\n".join(parts)
    dest.write_text(blob[-limit:])


# ----------------------------------------------------------------------------- dry run
@contextmanager
def fake_gateway(layout: Layout) -> Iterator[tuple[str, Path, Path]]:
    """A stub 'gateway' and stub engines (one aiohttp server): checks this script's flow on
    a CPU machine without Ray or vLLM. ``auto``/``serialize`` answers are a function of the
    request; ``off`` answers get random noise (a stand-in for batch variance)."""
    import socket

    from aiohttp import web

    from deployments.engine.process import free_port

    work = WORK / "fake"
    engines = work / "engines"
    shutil.rmtree(work, ignore_errors=True)
    engines.mkdir(parents=True)
    port = free_port()
    for m in layout.models:
        for s in range(m.slots):
            (engines / f"{m.name}-{s}-{port}.log").write_text("fake\n")
    slog = work / "serve.log"
    slog.write_text("fake gateway\n")

    def noisy(model: str) -> float:
        return random.random() * 1e-6 if "-off" in model else 0.0

    async def classify(req: web.Request) -> web.Response:
        b = await req.json()
        return web.json_response(
            {"data": [{"index": 0, "probs": [len(b["input"]) / 7 + noisy(b["model"])]}]}
        )

    async def chat(req: web.Request) -> web.Response:
        b = await req.json()
        lp = -1.5 - b["seed"] % 7 / 10 + noisy(b["model"])
        return web.json_response(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"content": "7"},
                        "finish_reason": "length",
                        "logprobs": {"content": [{"token": "7", "logprob": lp}]},
                    }
                ],
                "usage": {"completion_tokens": b["max_tokens"]},
            }
        )

    async def models(req: web.Request) -> web.Response:
        return web.json_response(
            {
                "data": [
                    {
                        "id": m.name,
                        "determinism": m.mode,
                        "selftest": None,
                        "fingerprints": ["fake"] * m.slots,
                    }
                    for m in layout.models
                ]
            }
        )

    def serve() -> None:
        app = web.Application()
        app.router.add_post("/classify", classify)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)

    threading.Thread(target=serve, daemon=True).start()
    for _ in range(50):
        with socket.socket() as sk:
            if sk.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", engines, slog


def scaled_down(layout: Layout) -> Layout:
    layout.n_tp = {k: (max(16, a // 16), max(8, b // 8)) for k, (a, b) in layout.n_tp.items()}
    layout.phases = [
        (p, {**kw, "n": 40} if p == "replay" else kw)
        for p, kw in layout.phases
        if p not in ("ingress", "scale", "framework")
    ]
    layout.anchors = []
    layout.standalone = []
    return layout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", required=True, choices=sorted(LAYOUTS))
    ap.add_argument("--out", type=Path, required=True, help="a flat folder (the device's $OUT)")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=540,
        help="finish (gateway stopped, files written) within this many seconds",
    )
    ap.add_argument("--fake", action="store_true", help="stub gateway and engines: a CPU dry run")
    ap.add_argument(
        "--levels",
        type=lambda v: [int(x) for x in v.split(",")],
        help="concurrency levels of every throughput phase, e.g. 256 or 64,256",
    )
    ap.add_argument(
        "--ingress-replicas",
        type=int,
        default=None,
        help="gateway.ingress_replicas of the served config (the ingress's Serve "
        "replicas); default: the layout's config's, else 1",
    )
    ap.add_argument(
        "--variants",
        type=lambda v: v.split(","),
        help="sweep-* only: the engine settings to try (default: all of SWEEP)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    layout = LAYOUTS[args.layout]()
    if args.variants:
        if not args.layout.startswith("sweep-"):
            ap.error("--variants is for the sweep-* layouts")
        unknown = set(args.variants) - set(SWEEP[layout.size])
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; known: {sorted(SWEEP[layout.size])}")
        layout = _sweep(layout.size, [256, 1024], args.variants)
    if args.levels:
        layout.phases = [
            (p, {**kw, "levels": args.levels} if p == "throughput" else kw)
            for p, kw in layout.phases
        ]
    if args.fake:
        layout = scaled_down(layout)
    ingress = layout.ingress_replicas if args.ingress_replicas is None else args.ingress_replicas
    name = (
        args.layout
        + (f"-{'-'.join(args.variants)}" if args.variants else "")
        + (f"-ingress{ingress}" if ingress != layout.ingress_replicas else "")
    )
    bench = Bench(name, layout, args.out, args.deadline_s, args.fake, ingress)
    try:
        bench.run()
    except Exception as exc:
        bench.report["errors"].append(f"run: {type(exc).__name__}: {exc}"[:3000])
        bench.save()
        log(f"FAILED: {type(exc).__name__}: {str(exc)[:3000]}")
        raise SystemExit(1)
    finally:
        print_summary(bench.report)


def print_summary(rep: dict[str, Any]) -> None:
    print(
        f"\n=== {rep['layout']} ({rep.get('startup_s')} s to serve, {rep.get('wall_s')} s in all)"
    )
    for m in rep.get("models", []):
        st = (m.get("selftest") or [None])[0]
        print(
            f"  {m['id']:<16} {m['determinism']:<16} selftest {st and (str(st.get('passed')) + ' ' + str(st.get('identical')) + '/' + str(st.get('total')))}"
        )
    for name, ph in rep["phases"].items():
        if name.startswith("throughput"):
            for c, row in ph["paths"].items():
                print(
                    f"  {name} c={c}: "
                    + ", ".join(f"{p} {v['req_per_s']:.0f}" for p, v in row.items())
                )
                print(f"     ratios {ph['ratios'][c]}")
        elif name.startswith("framework"):
            print(
                f"  {name}: {ph.get('req_per_s')} req/s ({ph.get('framework') or ph.get('error')})"
            )
        elif name == "replay":
            print(
                "  replay: "
                + "; ".join(
                    f"{mode} " + "/".join(str(r["differing_from_run1"]) for r in runs)
                    for mode, runs in ph["runs"].items()
                )
            )
    if rep["errors"]:
        print("  ERRORS: " + " | ".join(rep["errors"])[:3000])
    if rep["skipped"]:
        print(f"  skipped: {rep['skipped']}")


if __name__ == "__main__":
    main()
