"""Logprob judges on a GPU: exact label probabilities, bitwise stable, against a control.

One ``rmgate serve`` of the 0.5B judge (``grm-0.5b``, built here by ``models_gpu``) with two
models over the same weights: ``judge`` (``determinism: auto``, batch invariant on a GPU,
2 slots) and ``judge_plain`` (``determinism: off``: vLLM's own batching, the control), and
four programs reading P("1") / (P("1") + P("0")) right after "Score: ":

* ``yes_direct``: ``read: logprob_token_ids`` (what vLLM's chat API takes from 0.25 on);
* ``yes``: ``read: prompt_logprobs`` (one request per label; any vLLM);
* ``rating``: ``expected_rating`` over 0-9 with ``read: prompt_logprobs``;
* ``yes_plain``: ``yes`` on ``judge_plain``.

It records, into ``OUT/judge_labels.json``: the vLLM version, what ``yes_direct`` answers on
it, whether ``yes`` and ``rating`` equal the hand computation from the chat requests'
prompt log-probabilities, whether they are bitwise equal across a replay in order at
concurrency 1 and shuffled at 32 and 128, and how many of the control's rewards differ
between concurrency 1 and 128.

    python -m benchmarks.gpu.judge_labels OUT [--items 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.gpu.bench_paths import gateway, log
from benchmarks.gpu.models_gpu import build_in_child
from gateway.harness.running import serve_config

TEMPLATE = "Is {prompt}{response} right?"
YES = {
    "type": "judge_prob",
    "template": TEMPLATE,
    "answer_prefix": "Score: ",
    "yes": ["1"],
    "no": ["0"],
}


def config(model_path: str) -> dict[str, Any]:
    engine = {
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 256,
        "attention_backend": "TRITON_ATTN",
        "kv_cache_memory_bytes": 2 << 30,
        "gpu_memory_utilization": 0.02,
    }
    model = {
        "kind": "generative",
        "model_path": model_path,
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.2},
        "engine_args": engine,
        "sampling_defaults": {"temperature": 1.0, "max_tokens": 16},
    }

    def program(name: str, model_name: str, scorer: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "components": [{"name": "p", "model": model_name, "scorer": scorer}]}

    return serve_config(
        {
            "gateway": {
                "cache": "off",
                "ledger": {"backend": "off"},
                "placement": "pinned",
                "slot_wait_s": 300,
                "default_reward_model": "yes",
            },
            "models": [
                {**model, "name": "judge", "replicas": 2, "determinism": "auto"},
                {**model, "name": "judge_plain", "replicas": 1, "determinism": "off"},
            ],
            "programs": [
                program("yes_direct", "judge", YES),
                program("yes", "judge", {**YES, "read": "prompt_logprobs"}),
                program(
                    "rating",
                    "judge",
                    {
                        "type": "expected_rating",
                        "template": TEMPLATE,
                        "answer_prefix": "Score: ",
                        "read": "prompt_logprobs",
                    },
                ),
                program("yes_plain", "judge_plain", {**YES, "read": "prompt_logprobs"}),
            ],
        }
    )


def items(n: int) -> list[dict[str, str]]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        c = a + b if rng.random() < 0.5 else rng.randrange(200)
        pad = " ".join(
            rng.choice(["please", "check", "this", "sum"]) for _ in range(rng.randrange(40))
        )
        out.append({"prompt": f"{pad} {a}+{b}=", "response": str(c)})
    return out


async def rewards(
    url: str, program: str, its: list[dict], order: list[int], concurrency: int
) -> list[Any]:
    sem = asyncio.Semaphore(concurrency)
    out: list[Any] = [None] * len(its)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(i: int) -> None:
            async with sem:
                r = await client.post("/v1/rewards", json={"model": program, "items": [its[i]]})
            out[i] = (
                r.json()["rewards"][0] if r.status_code == 200 else (r.status_code, r.text[:300])
            )

        await asyncio.gather(*(one(i) for i in order))
    return out


def hand(url: str, model: str, item: dict, labels: list[str]) -> list[float]:
    """Each label's log-probability from the chat request a client would send itself."""
    lps = []
    for label in labels:
        body = {
            "model": model,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "messages": [
                {"role": "user", "content": TEMPLATE.format(**item)},
                {"role": "assistant", "content": "Score: " + label},
            ],
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        lps.append(float(r.json()["prompt_logprobs"][-1][str(ord(label))]["logprob"]))
    return lps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--items", type=int, default=128)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/judge-labels")
    work.mkdir(exist_ok=True)
    built = build_in_child(work / "models", ["grm-0.5b"])
    log(f"built {list(built)}")
    import vllm  # noqa: F401 - its version only (this process runs no engine)
    import yaml

    cfg_path = work / "judge.yaml"
    cfg_path.write_text(yaml.safe_dump(config(str(work / "models" / "grm-0.5b"))))
    result: dict[str, Any] = {"vllm": vllm.__version__, "items": args.items}
    its = items(args.items)
    with gateway(cfg_path, work, 900, 8100) as (url, _, _):
        models = httpx.get(url + "/v1/models", timeout=60).json()
        result["modes"] = {c["id"]: c["determinism"] for c in models["data"]}
        result["label_ids"] = {
            p["name"]: p["components"][0]["scorer"].get("yes_token_ids")
            or p["components"][0]["scorer"].get("rating_token_ids")
            for p in models["programs"]
        }
        direct = httpx.post(
            url + "/v1/rewards", json={"model": "yes_direct", "items": its[:1]}, timeout=600
        )
        result["yes_direct"] = {"status": direct.status_code, "body": direct.text[:400]}
        n = len(its)
        for program in ("yes", "rating"):
            t = time.monotonic()
            first = asyncio.run(rewards(url, program, its, list(range(n)), 1))
            runs = {
                f"c{c}": asyncio.run(
                    rewards(url, program, its, random.Random(c).sample(range(n), n), c)
                )
                for c in (32, 128)
            }
            labels = ["1", "0"] if program == "yes" else [str(d) for d in range(10)]
            by_hand = []
            for it in its[:16]:
                lps = hand(url, "judge", it, labels)
                ws = [math.exp(lp) for lp in lps]
                by_hand.append(
                    ws[0] / (ws[0] + ws[1])
                    if program == "yes"
                    else sum(w * d for w, d in zip(ws, range(10))) / sum(ws)
                )
            result[program] = {
                "all_numbers": all(isinstance(x, float) for x in first),
                "range": [min(first), max(first)]
                if all(isinstance(x, float) for x in first)
                else None,
                "bitwise_equal_c32_c128": {
                    k: sum(a == b for a, b in zip(first, v)) for k, v in runs.items()
                },
                "hand_max_rel_diff": max(
                    abs(a - b) / max(abs(b), 1e-300) for a, b in zip(first, by_hand)
                ),
                "seconds": round(time.monotonic() - t, 1),
            }
            log(f"{program}: {result[program]}")
        first = asyncio.run(rewards(url, "yes_plain", its, list(range(n)), 1))
        busy = asyncio.run(
            rewards(url, "yes_plain", its, random.Random(7).sample(range(n), n), 128)
        )
        result["control_plain_differs_c1_vs_c128"] = sum(a != b for a, b in zip(first, busy))
        log(f"control: {result['control_plain_differs_c1_vs_c128']} of {n} differ")
    (args.out / "judge_labels.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
