"""The physical anchor: the same model in offline ``vllm.LLM`` (no HTTP, no server), as one
``LLM.classify`` / ``LLM.chat`` call over the benchmark's requests.

Started by ``bench_paths.py`` next to the gateway, so its start-up overlaps the gateway's:
it builds ``LLM(...)`` with the same engine settings as the slot, warms up (the
batch-invariant Triton kernels compile on the first batch), writes ``READY`` and waits
until the benchmark writes ``GO`` (the GPU is otherwise idle then), runs once, writes the
result JSON and exits (its GPU memory goes back).

    python -m benchmarks.gpu.offline_anchor SPEC.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out, ready, go = Path(spec["out"]), Path(spec["ready"]), Path(spec["go"])
    t0 = time.time()
    from vllm import LLM, PoolingParams, SamplingParams

    kw = dict(
        model=spec["model"],
        dtype="bfloat16",
        seed=0,
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        enable_prefix_caching=False,
        # the API server's default on an H200 (the offline class would take 16384)
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 8192),
        kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
        gpu_memory_utilization=spec.get("gpu_memory_utilization", 0.05),
        generation_config="vllm",
    )
    if spec.get("batch_invariant"):
        kw["attention_backend"] = spec.get("attention_backend", "TRITON_ATTN")
    if spec.get("load_format"):
        kw["load_format"] = spec["load_format"]
    if spec["kind"] == "discriminative":
        kw["runner"] = "pooling"
    result: dict = {"mode": "batch_invariant" if spec.get("batch_invariant") else "off"}
    try:
        llm = LLM(**kw)
        result["start_s"] = round(time.time() - t0, 1)
        texts = spec["inputs"]
        if spec["kind"] == "discriminative":

            def run(items):
                return llm.classify(
                    items, pooling_params=PoolingParams(use_activation=False), use_tqdm=False
                )
        else:

            def run(items):
                sps = [
                    SamplingParams(
                        temperature=1.0,
                        top_p=1.0,
                        max_tokens=spec["max_tokens"],
                        seed=s,
                        logprobs=1,
                        ignore_eos=True,
                    )
                    for s in spec["seeds"][: len(items)]
                ]
                msgs = [[{"role": "user", "content": t}] for t in items]
                return llm.chat(msgs, sps, use_tqdm=False)

        run(texts[:64])  # warm-up: kernels compile here
        ready.write_text("ready")
        deadline = time.time() + spec.get("wait_s", 900)
        while not go.exists():
            if time.time() > deadline:
                raise TimeoutError("no GO")
            time.sleep(0.2)
        t = time.perf_counter()
        outs = run(texts)
        wall = time.perf_counter() - t
        result.update(
            requests=len(texts), seconds=round(wall, 3), req_per_s=round(len(texts) / wall, 2)
        )
        if spec["kind"] == "generative":
            toks = sum(len(o.outputs[0].token_ids) for o in outs)
            result["gen_tok_per_s"] = round(toks / wall, 1)
    except Exception as exc:  # noqa: BLE001 - the benchmark reports it and goes on
        result["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        ready.write_text("failed")
    out.write_text(json.dumps(result))
    os._exit(0)  # do not wait for the engine's orderly shutdown


if __name__ == "__main__":
    main()
