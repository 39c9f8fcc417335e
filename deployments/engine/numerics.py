"""A slot's numerics identity and probe digest: what decides its bits, and a proof.

Two slots answer bitwise alike when everything that decides the arithmetic is equal
(the *identity*) and their answers to a fixed golden probe set hash alike (the *probe
digest*, answered one at a time at start-up, so batching cannot enter). Equal identity and
digest = one numerics class (``gateway.core.routing.numerics``). Measured on the demo: the two
slots of each demo model answered the same 100 engine bodies identically.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import httpx

from deployments.engine.args import EnginePlan, Platform, engine_headers
from deployments.engine.fingerprint import vllm_version
from deployments.engine.fixed_shape import ONE_SPLIT_ENV
from deployments.engine.selftest import probe_requests
from deployments.engine.sleep_gate import PROBE_HEADER
from gateway.core.api.answers import answer_of
from gateway.core.config.settings import ModelSpec
from gateway.core.routing.numerics import class_id, probe_digest_of

#: engine_args that size or schedule the engine but cannot change an answer's bits under a
#: deterministic mode (the mode fixes batching; these only bound memory and queues).
CAPACITY_ARGS = frozenset(
    {
        "max_model_len",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "max_num_seqs",
        "max_num_batched_tokens",
        "disable_log_stats",
        "disable_log_requests",
        "enable_log_requests",
        "disable_uvicorn_access_log",
        "swap_space",
        "block_size",
        # vLLM's own OpenTelemetry spans (docs/operations.md, "Tracing"): where it sends
        # them and how detailed they are; turning them on must not change the class
        "otlp_traces_endpoint",
        "collect_detailed_traces",
    }
)
#: Environment prefixes that can change kernels, and names among them that cannot.
KERNEL_ENV_PREFIXES = (
    "VLLM_",
    "NCCL_",
    "CUBLAS",
    "TORCH_",
    "TORCHINDUCTOR_",
    "OMP_",
    "MKL_",
    "CUDA_",
    "TRITON_",
)
NON_NUMERIC_ENV = frozenset(
    {
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CACHE_ROOT",
        "VLLM_NO_USAGE_STATS",
        "VLLM_LOGGING_LEVEL",
        "CUDA_VISIBLE_DEVICES",
        "TORCHINDUCTOR_CACHE_DIR",
        "VLLM_CPU_SGL_KERNEL",
        "VLLM_SERVER_DEV_MODE",
    }
)
CPU_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _cpu_description() -> dict[str, Any]:
    model, flags = "unknown", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "isa": [f for f in CPU_FLAGS if f in flags]}


def omp_threads(env: dict[str, str]) -> str:
    """How many OpenMP threads the CPU engine runs: the count of its bound cores (the cores
    themselves do not change bits, their number partitions the reductions), or ``auto``."""
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if bind in ("", "auto", "all"):
        return "auto"
    count = 0
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit():
            count += (int(hi) - int(lo) + 1) if hi.strip().isdigit() else 1
    return str(count)


def _gpu_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        return (
            subprocess.run(
                [smi, "-i", visible, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.strip()
            or None
        )
    except (subprocess.SubprocessError, OSError):
        return None


def slot_identity(
    spec: ModelSpec, plan: EnginePlan, platform: Platform, model_digest: str
) -> dict[str, Any]:
    """Everything known to decide a slot's bits, as plain JSON values."""
    args = {k: v for k, v in sorted(spec.engine_args.items()) if k not in CAPACITY_ARGS}
    env = {
        k: v
        for k, v in sorted(plan.env.items())
        if k.startswith(KERNEL_ENV_PREFIXES) and k not in NON_NUMERIC_ENV
    }
    identity: dict[str, Any] = {
        "engine": "vllm",
        "version": vllm_version(),
        "model": model_digest,
        "kind": spec.kind,
        "mode": plan.mode,
        "dtype": spec.engine_args.get("dtype", "auto"),
        "quantization": spec.engine_args.get("quantization"),
        "attention": plan.attention_backend,
        "prefix_cache": plan.prefix_cache,
        "tensor_parallel_size": int(spec.engine_args.get("tensor_parallel_size", 1)),
        "pipeline_parallel_size": int(spec.engine_args.get("pipeline_parallel_size", 1)),
        "device": platform.device,
        "device_name": platform.name,
        "engine_args": args,
        "env": env,
    }
    if plan.step_tokens is not None:  # fixed_shape: the padded shape chooses the kernels
        identity["step_tokens"] = plan.step_tokens
        identity["head_rows"] = plan.head_rows
        identity["attention_splits"] = 1 if plan.env.get(ONE_SPLIT_ENV) == "1" else None
        identity["inductor"] = plan.inductor
    if platform.device == "cuda":
        identity["compute_capability"] = list(platform.compute_capability or ())
        identity["driver"] = _gpu_driver()
    else:
        identity.update(_cpu_description())
        identity["omp_threads"] = omp_threads(plan.env)
    return identity


def probe_digest(
    url: str,
    kind: str,
    model: str,
    timeout_s: float = 600.0,
    transport: httpx.BaseTransport | None = None,
    headers: dict[str, str] | None = None,
    max_model_len: int | None = None,
) -> str:
    """sha256 over the canonical answers to the golden probes, sent one at a time."""
    answers = []
    with httpx.Client(timeout=timeout_s, transport=transport, headers=headers) as client:
        for path, body in probe_requests(kind, model, max_model_len):
            resp = client.post(url + path, json=body)
            resp.raise_for_status()
            answers.append(answer_of(path, resp.json()).canonical)
    return probe_digest_of(answers)


def slot_numerics(
    spec: ModelSpec, plan: EnginePlan, platform: Platform, model_digest: str, url: str
) -> dict[str, Any]:
    """``{"class_id", "probe_digest", "identity"}`` of a running slot (None digest and a
    reason when the probes could not be answered: the slot is then a class of its own)."""
    identity = slot_identity(spec, plan, platform, model_digest)
    try:
        digest = probe_digest(
            url,
            spec.kind,
            spec.name,
            # past the sleep gate: a slot re-proves its numerics before it resumes
            headers={**engine_headers(plan), PROBE_HEADER: "1"},
            max_model_len=spec.max_model_len,
        )
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return {
            "class_id": None,
            "probe_digest": None,
            "identity": identity,
            "error": f"probes failed: {type(exc).__name__}: {exc}",
        }
    return {"class_id": class_id(identity, digest), "probe_digest": digest, "identity": identity}
