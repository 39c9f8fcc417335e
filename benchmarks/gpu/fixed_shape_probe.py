"""Is a DisRM step of one fixed token count batch-invariant? One setting at a time.
(``--kind grm``: the same question for a judge's generation.)

Offline ``vllm.LLM`` (runner ``pooling``) over a random DisRM of a real shape
(``models_gpu``), one child process per setting (vLLM reads its environment at start-up).
Per setting: 24 prompts answered alone against the same prompts inside one batch of 192,
and the 192 in batches of 7 against the batch of 192; every logit compared in bits; the
compilation settings vLLM actually ran with; the time of 960 prompts in one call.

    python -m benchmarks.gpu.fixed_shape_probe --out $OUT [--model rm-0.5b]
        [--settings off,pad,pad-head,pad-triton-head,batch-invariant]
    python -m benchmarks.gpu.fixed_shape_probe --out $OUT --kind grm --model grm-0.5b \
        --settings gen-pad-head,off

Generation (``--kind grm``): 24 chats sampled alone (T=1, a seed each, 32 tokens, the
sampled token's logprob) against the same chats inside one batch of 192; the time of 192
in one call. ``gen-pad-*`` pads every step to ``GEN_TOKENS`` tokens (one captured size
equal to the token budget, ``max_num_seqs`` the same: a decode step of the full batch is
one captured step) and the LM head to that many rows (``pad_lm_head``: it runs on the
rows that sample, a count that follows the batch: ``deployments.engine.fixed_shape``'s
``pad_lm_head``).

Every setting runs its engine in the child's own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the head patch of
``deployments.engine.fixed_shape`` is in effect and counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOKENS = 8192  # the token budget (max_num_batched_tokens) and the one captured size
PAD = {"cudagraph_capture_sizes": [TOKENS], "max_cudagraph_capture_size": TOKENS}
#: The score head at one row count (deployments/engine/fixed_shape.py): max_num_seqs.
HEAD = {"RMGATE_FIXED_HEAD_ROWS": "256"}
SETTINGS: dict[str, dict[str, Any]] = {
    "off": {},
    "pad": {"compilation_config": PAD},
    "pad-triton": {"compilation_config": PAD, "attention_backend": "TRITON_ATTN"},
    "pad-piecewise-triton": {
        "compilation_config": {**PAD, "cudagraph_mode": "PIECEWISE"},
        "attention_backend": "TRITON_ATTN",
    },
    "pad-head": {"compilation_config": PAD, "env": HEAD},
    "pad-triton-head": {
        "compilation_config": PAD,
        "attention_backend": "TRITON_ATTN",
        "env": HEAD,
    },
    "off-head": {"env": HEAD},
    "eager-triton": {"enforce_eager": True, "attention_backend": "TRITON_ATTN"},
    "batch-invariant": {"attention_backend": "TRITON_ATTN", "env": {"VLLM_BATCH_INVARIANT": "1"}},
}
GEN_TOKENS = 256  # generation: the token budget, the one captured size, max_num_seqs
GEN_PAD = {"cudagraph_capture_sizes": [GEN_TOKENS], "max_cudagraph_capture_size": GEN_TOKENS}
LM_HEAD = {"RMGATE_PROBE_LM_HEAD_ROWS": str(GEN_TOKENS)}
SETTINGS.update(
    {
        "gen-pad": {"compilation_config": GEN_PAD},
        "gen-pad-head": {"compilation_config": GEN_PAD, "env": LM_HEAD},
    }
)


def chats(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": p[: 40 + (i * 37) % 400]}] for i, p in enumerate(prompts(n))
    ]


def gen_child(spec: dict[str, Any]) -> dict[str, Any]:
    if os.environ.get("RMGATE_PROBE_LM_HEAD_ROWS"):
        from deployments.engine.fixed_shape import pad_lm_head

        pad_lm_head(int(os.environ["RMGATE_PROBE_LM_HEAD_ROWS"]))
    from vllm import LLM, SamplingParams

    t0 = time.time()
    kw = {k: v for k, v in spec["setting"].items() if k != "env"}
    if spec.get("dummy"):
        kw["load_format"] = "dummy"
    padded = "compilation_config" in kw
    llm = LLM(
        model=spec["model"],
        dtype="bfloat16",
        seed=0,
        max_model_len=2048,
        max_num_seqs=GEN_TOKENS,
        max_num_batched_tokens=GEN_TOKENS if padded else 8192,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.4,
        generation_config="vllm",
        **kw,
    )
    start_s = time.time() - t0
    cc = llm.llm_engine.vllm_config.compilation_config

    def run(idx: list[int], items: list[Any]) -> list[str]:
        params = [
            SamplingParams(
                temperature=1.0,
                top_p=1.0,
                max_tokens=32,
                seed=1000 + i,
                logprobs=1,
                ignore_eos=True,
            )
            for i in idx
        ]
        outs = llm.chat(items, params, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(d[t].logprob).hex() for t, d in zip(c.token_ids, c.logprobs or [])]
            res.append(json.dumps([list(c.token_ids), lps]))
        return res

    texts = chats(192)
    idx = list(range(192))
    run(idx[:64], texts[:64])  # warm-up
    big = run(idx, texts)
    alone = [run([i], [texts[i]])[0] for i in range(24)]
    t1 = time.time()
    run(idx, texts)
    seconds = time.time() - t1
    return {
        "start_s": round(start_s, 1),
        "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
        "capture_sizes": list(getattr(cc, "cudagraph_capture_sizes", None) or []),
        "alone_vs_192_differ": sum(a != b for a, b in zip(alone, big[:24], strict=True)),
        "of_alone": 24,
        "tok_s_192": round(192 * 32 / seconds, 1),
    }


def prompts(n: int) -> list[str]:
    """Lengths from 20 to ~1,500 bytes (one token per byte), deterministic."""
    out = []
    for i in range(n):
        k = 20 + (i * 7919) % 1500
        out.append("".join(chr(97 + (i * 31 + j * 17) % 26) for j in range(k)))
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from deployments.engine import fixed_shape

    rows = fixed_shape.pad_head_rows()  # the engine runs in this process (see main)
    from vllm import LLM, PoolingParams

    t0 = time.time()
    kw = {k: v for k, v in spec["setting"].items() if k != "env"}
    if spec.get("dummy"):
        kw["load_format"] = "dummy"
    llm = LLM(
        model=spec["model"],
        runner="pooling",
        dtype="bfloat16",
        seed=0,
        max_model_len=2048,
        max_num_seqs=256,
        max_num_batched_tokens=TOKENS,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.4,
        **kw,
    )
    start_s = time.time() - t0
    cc = llm.llm_engine.vllm_config.compilation_config
    params = PoolingParams(use_activation=False)

    def run(items: list[str]) -> list[list[str]]:
        outs = llm.classify(items, pooling_params=params, use_tqdm=False)
        return [[float(x).hex() for x in o.outputs.probs] for o in outs]

    texts = prompts(192)
    run(texts[:64])  # warm-up
    big = run(texts)
    alone = [run([t])[0] for t in texts[:24]]
    sevens: list[list[str]] = []
    for i in range(0, len(texts), 7):
        sevens += run(texts[i : i + 7])
    again = run(texts)
    t1 = time.time()
    run(texts * 5)
    seconds = time.time() - t1
    return {
        "start_s": round(start_s, 1),
        "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
        "capture_sizes": list(getattr(cc, "cudagraph_capture_sizes", None) or []),
        "level": str(getattr(cc, "mode", getattr(cc, "level", None))),
        "alone_vs_192_differ": sum(a != b for a, b in zip(alone, big[:24], strict=True)),
        "of_alone": 24,
        "batches_of_7_vs_192_differ": sum(a != b for a, b in zip(sevens, big, strict=True)),
        "of_192": 192,
        "192_twice_differ": sum(a != b for a, b in zip(again, big, strict=True)),
        "req_s_960": round(960 / seconds, 1),
        "head_rows": rows,
        "padded_head_calls": fixed_shape.CALLS[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--model", default="rm-0.5b")
    ap.add_argument("--settings", default="off,pad,pad-head,pad-triton-head,batch-invariant")
    ap.add_argument("--kind", choices=["rm", "grm"], default="rm")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child.read_text())
        run = gen_child if spec.get("kind") == "grm" else child
        print("RESULT " + json.dumps(run(spec)))
        return
    from benchmarks.gpu.models_gpu import build_in_child

    models = Path("/tmp/rmgate-probe-models")
    built = build_in_child(models, [args.model])
    result: dict[str, Any] = {
        "command": f"python -m benchmarks.gpu.fixed_shape_probe --kind {args.kind} "
        f"--model {args.model} --settings {args.settings}",
        "model": args.model,
        "built": built,
        "settings": {},
    }
    for name in args.settings.split(","):
        setting = SETTINGS[name]
        spec = Path(f"/tmp/probe-{name}.json")
        dummy = built[args.model]["weights"] == "dummy"
        spec.write_text(
            json.dumps(
                {
                    "model": str(models / args.model),
                    "setting": setting,
                    "dummy": dummy,
                    "kind": args.kind,
                }
            )
        )
        # the engine in the child's own process: the head patch is certainly in effect
        # there (and counted), and every setting runs the same way
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **setting.get("env", {})}
        t0 = time.time()
        res = subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu.fixed_shape_probe", "--child", str(spec)],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
        got = json.loads(line[7:]) if line else {"error": res.stderr[-2500:]}
        got["setting"] = setting
        got["wall_s"] = round(time.time() - t0, 1)
        result["settings"][name] = got
        print(name, json.dumps(got)[:600], flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            name = "fixed-shape-probe" + ("-gen" if args.kind == "grm" else "")
            (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
