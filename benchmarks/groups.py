"""GRPO-shaped groups: item placement without a prefix cache against group placement with
the proven one, side by side in one run, one variable at a time.

A real ``rmgate serve`` of the demo models, each model twice: ``<kind>-items`` (no prefix
cache) and ``<kind>-cache`` (``prefix_cache: auto``, proven at start-up), two slots each,
``serialize``. A step is G groups of N samples (N = 16): one long problem per group
(``--prompt-chars``, about 800 tokens with the demo's byte-level tokenizer, whose context
is 1,024) and short responses (about 60 tokens), each group one ``/v1/rewards`` request
(what a trainer sends per prompt), ``--concurrency`` requests in flight. Three arms score
the very same items, interleaved round by round:

* ``items``: the ``-items`` model, items without ``group`` (each item placed by its key);
* ``groups``: the ``-items`` model, the items with their ``group`` (placement only);
* ``groups_cache``: the ``-cache`` model, with ``group`` (placement and the cache).

Per arm: samples/s, request p50/p99, the prompt tokens the engines were asked to prefill
and those their prefix cache served (``vllm:prompt_tokens_total``,
``vllm:prefix_cache_hits_total``, read from the engines around each arm's requests), and
the rewards whose bits differ from the ``items`` arm's (must be 0). DisRM (``logit``) and
judge (``judge_prob``: one-token reads), and the cost of pairwise against pointwise
judging per group (engine calls and prompt tokens, ``pairwise`` over the cached judge).

    .venv/bin/python -m benchmarks.groups [--quick] [--out benchmarks/results/groups]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.harness.processes import NO_CACHE, engine_metric_totals
from gateway.harness.running import running_gateway, serve_config

REPO = Path(__file__).resolve().parents[1]
ENGINE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}
COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
)
JUDGE_PROB = {
    "type": "judge_prob",
    "template": "{prompt}{response} Is that right?",
    "answer_prefix": "Score: ",
    "yes": ["1"],
    "no": ["0"],
}
PAIRWISE = {"type": "pairwise", "yes": ["A"], "no": ["B"], "pairs": "circular"}
ARMS = ("items", "groups", "groups_cache")


def config(models_dir: Path, state_dir: Path, slots: int) -> dict[str, Any]:
    def model(name: str, path: str, kind: str, cache: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "model_path": str(models_dir / path),
            "replicas": slots,
            "determinism": "serialize",
            "prefix_cache": cache,
            "engine_args": ENGINE,
            "cpu_cores_per_slot": 1,
            "max_queue_per_slot": 100000,
        }
        if kind == "generative":
            out["scorer"] = JUDGE_PROB
        return out

    return serve_config(
        {
            "gateway": {
                "max_queue_per_slot": 100000,
                "request_timeout_s": 900,
                "placement": "pinned",
                "cache": "off",
                "ledger": {"state_dir": str(state_dir)},
            },
            "models": [
                model("rm-items", "disrm", "discriminative", "off"),
                model("rm-cache", "disrm", "discriminative", "auto"),
                model("judge-items", "grm", "generative", "off"),
                model("judge-cache", "grm", "generative", "auto"),
            ],
            "programs": [
                {
                    "name": "pairwise",
                    "components": [{"name": "pref", "model": "judge-cache", "scorer": PAIRWISE}],
                }
            ],
        }
    )


def grpo_groups(
    seed: int, groups: int, size: int, prompt_chars: int, response_chars: int
) -> list[list[dict[str, str]]]:
    """``groups`` problems of ``prompt_chars`` characters, ``size`` responses each (every
    text its own: no prefix is shared across groups, nor with another round's)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        words = []
        while sum(len(w) + 1 for w in words) < prompt_chars:
            a, b = rng.randrange(10, 999), rng.randrange(10, 999)
            words.append(f"{a}+{b}={a + b}.")
        prompt = f"[{seed}:{g}] Check each sum, then give the total. " + " ".join(words)
        prompt = prompt[:prompt_chars]
        items = []
        for r in range(size):
            text = f" Sample {r}: the total is {rng.randrange(1000, 99999)}"
            text += " because " * 20
            items.append(
                {"prompt": prompt, "response": text[:response_chars], "group": f"{seed}-{g}"}
            )
        out.append(items)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def send(
    url: str, model: str, bodies: list[list[dict[str, Any]]], concurrency: int
) -> tuple[list[list[float | None]], list[float], float]:
    """Each body's rewards, each request's seconds, and the wall time."""
    sem = asyncio.Semaphore(concurrency)
    rewards: dict[int, list[float | None]] = {}
    latencies: list[float] = []
    async with httpx.AsyncClient(
        base_url=url, timeout=900, headers=NO_CACHE, limits=httpx.Limits(max_connections=64)
    ) as client:

        async def one(i: int) -> None:
            async with sem:
                start = time.perf_counter()
                r = await client.post("/v1/rewards", json={"model": model, "items": bodies[i]})
                latencies.append(time.perf_counter() - start)
            r.raise_for_status()
            rewards[i] = r.json()["rewards"]

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(bodies))))
        wall = time.perf_counter() - start
    return [rewards[i] for i in range(len(bodies))], latencies, wall


def arm_model(kind: str, arm: str) -> str:
    return f"{kind}-{'cache' if arm == 'groups_cache' else 'items'}"


async def run_kind(url: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The three arms over the same groups, round by round."""
    stats: dict[str, dict[str, Any]] = {
        arm: {
            "latencies": [],
            "wall_s": 0.0,
            "samples": 0,
            "counters": dict.fromkeys(COUNTERS, 0.0),
        }
        for arm in ARMS
    }
    differing = 0
    compared = 0
    for rnd in range(args.rounds):
        groups = grpo_groups(
            1000 * rnd + (7 if kind == "rm" else 11),
            args.groups,
            args.size,
            args.prompt_chars,
            args.response_chars,
        )
        answers: dict[str, list[list[float | None]]] = {}
        for arm in ARMS[rnd % 3 :] + ARMS[: rnd % 3]:  # each arm first in turn
            model = arm_model(kind, arm)
            bodies = (
                [[{k: v for k, v in it.items() if k != "group"} for it in g] for g in groups]
                if arm == "items"
                else groups
            )
            before = engine_metric_totals(url, COUNTERS, [model])
            rewards, latencies, wall = await send(url, model, bodies, args.concurrency)
            after = engine_metric_totals(url, COUNTERS, [model])
            s = stats[arm]
            s["latencies"] += latencies
            s["wall_s"] += wall
            s["samples"] += sum(len(b) for b in bodies)
            for name in COUNTERS:
                s["counters"][name] += after[name] - before[name]
            answers[arm] = rewards
        for arm in ARMS[1:]:
            for got, want in zip(answers[arm], answers["items"], strict=True):
                compared += len(want)
                differing += sum(a != b for a, b in zip(got, want, strict=True))
    out: dict[str, Any] = {"bits_differing": differing, "rewards_compared": compared}
    for arm in ARMS:
        s = stats[arm]
        prompt = s["counters"]["vllm:prompt_tokens_total"]
        hits = s["counters"]["vllm:prefix_cache_hits_total"]
        out[arm] = {
            "model": arm_model(kind, arm),
            "samples": s["samples"],
            "samples_per_s": round(s["samples"] / s["wall_s"], 1),
            "request_p50_s": round(percentile(s["latencies"], 0.5), 3),
            "request_p99_s": round(percentile(s["latencies"], 0.99), 3),
            "engine_requests": int(s["counters"]["vllm:request_success_total"]),
            "prompt_tokens": int(prompt),
            "prefix_cache_hit_tokens": int(hits),
            "prefill_tokens_computed": int(prompt - hits),
        }
    base = out["items"]["samples_per_s"]
    for arm in ARMS[1:]:
        out[f"{arm}_over_items"] = round(out[arm]["samples_per_s"] / base, 2)
    out["prefill_computed_cache_over_items"] = round(
        out["groups_cache"]["prefill_tokens_computed"]
        / max(1, out["items"]["prefill_tokens_computed"]),
        3,
    )
    return out


async def judging_cost(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per group of ``args.size``: engine calls and prompt tokens of pointwise
    (``judge_prob``) against pairwise (``circular``, both orders) judging, on the cached
    judge (its hits counted too)."""
    groups = grpo_groups(99, 2, args.size, args.prompt_chars // 3, args.response_chars)
    out: dict[str, Any] = {"group_size": args.size, "groups": len(groups)}
    for name, model in (("pointwise", "judge-cache"), ("pairwise_circular", "pairwise")):
        before = engine_metric_totals(url, COUNTERS, ["judge-cache"])
        await send(url, model, groups, 1)
        after = engine_metric_totals(url, COUNTERS, ["judge-cache"])
        delta = {k: (after[k] - before[k]) / len(groups) for k in COUNTERS}
        out[name] = {
            "engine_calls_per_group": delta["vllm:request_success_total"],
            "prompt_tokens_per_group": delta["vllm:prompt_tokens_total"],
            "cached_tokens_per_group": delta["vllm:prefix_cache_hits_total"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="One round of two groups of 4.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8, help="Groups per round.")
    ap.add_argument("--size", type=int, default=16, help="Samples per group.")
    ap.add_argument("--prompt-chars", type=int, default=800)
    ap.add_argument("--response-chars", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=4, help="Requests (groups) in flight.")
    ap.add_argument("--slots", type=int, default=2, help="Slots per model.")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "groups")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.groups, args.size = 1, 2, 4
    from deployments.demo.models import build_demo_models, demo_models_present

    models = REPO / "models" / "demo"
    if not demo_models_present(models):
        build_demo_models(models)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rmgate-groups-") as tmp:
        work = Path(tmp)
        path = work / "groups.yaml"
        path.write_text(yaml.safe_dump(config(models, work / "state", args.slots)))
        started = time.time()
        with running_gateway(path, work / "run") as (url, _):
            cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
            result: dict[str, Any] = {
                "command": "python -m benchmarks.groups" + (" --quick" if args.quick else ""),
                "args": {k: str(v) for k, v in vars(args).items()},
                "prefix_cache": {c["id"]: c["prefix_cache"] for c in cards},
                "serving_after_s": round(time.time() - started, 1),
            }
            for kind in ("rm", "judge"):
                result[kind] = asyncio.run(run_kind(url, kind, args))
                print(kind, json.dumps(result[kind], indent=1), flush=True)
            result["judging_cost"] = asyncio.run(judging_cost(url, args))
            print(json.dumps(result["judging_cost"], indent=1), flush=True)
    name = "groups-quick.json" if args.quick else "groups.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    print(f"-> {args.out / name}")


if __name__ == "__main__":
    main()
