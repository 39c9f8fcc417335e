"""The reward ledger under a GRPO-shaped load: engine calls, throughput and latency with the
cache on and off side by side in one run, and what the ledger costs the gateway.

Part 1, a real ``rmgate serve`` of the demo models (DisRM ``rm`` and judge ``judge``, one
slot each, ``serialize``), scored through ``/v1/rewards`` as a GRPO trainer would:

* a step is P prompts x G samples (G = 8 and 16); each sample is a short answer (4 tokens
  at temperature 1.0, its own seed) that a real sampler, the demo GRM used as the policy,
  gives to an arithmetic question, so identical (prompt, response) pairs occur at the rate
  this short-answer task gives (measured and printed: the duplicate rate);
* 10 % of the batches are sent twice (a retried batch after a worker timeout);
* the same workload shape is sent with ``x-rmgate-cache: off`` (arm ``off``) and with the
  cache (arm ``on``), each with its own prompts (so the arms share no identity), arms
  interleaved batch by batch; engine calls are counted by the engines themselves
  (``vllm:request_success_total``).

Part 2, in-process (the FastAPI app over a fake transport that answers at once, so only
the gateway's own work is timed): CPU seconds per request (``time.process_time``: every
thread, the writer's included) with no ledger, with SQLite and with PostgreSQL (a throwaway
server from the machine's binaries), cache off so that every request is recorded; and the
gateway's time to answer a hit (the core's call: from the store, and from the memory
front), p50 and p99.

    .venv/bin/python -m benchmarks.ledger [--quick] [--out benchmarks/results/ledger]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.side_by_side import load
from gateway.harness.processes import NO_CACHE, engine_requests_done
from gateway.harness.running import running_gateway, serve_config

REPO = Path(__file__).resolve().parents[1]
ENGINE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}


def config(models_dir: Path, state_dir: Path) -> dict[str, Any]:
    def model(name: str, path: str, kind: str) -> dict[str, Any]:
        return {
            "name": name,
            "kind": kind,
            "model_path": str(models_dir / path),
            "replicas": 1,
            "determinism": "serialize",
            "engine_args": ENGINE,
            "max_queue_per_slot": 100000,
            **(
                {
                    "sampling_defaults": {"max_tokens": 8},
                    "scorer": {"template": "Is {prompt} {response} right?", "parser": "last_int"},
                }
                if kind == "generative"
                else {}
            ),
        }

    return serve_config(
        {
            "gateway": {
                "max_queue_per_slot": 100000,
                "request_timeout_s": 900,
                "ledger": {"state_dir": str(state_dir)},
            },
            "models": [
                model("rm", "disrm", "discriminative"),
                model("judge", "grm", "generative"),
            ],
        }
    )


async def policy_answers(
    url: str, seed: int, prompts: int, group: int, max_tokens: int = 4
) -> list[tuple[str, list[str]]]:
    """A real sampler on a short-answer task: the demo GRM as the policy, ``group`` samples
    (temperature 1.0, one seed each, ``max_tokens`` tokens) per arithmetic question."""
    rng = random.Random(seed)
    questions = []
    for p in range(prompts):
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        questions.append(f"[{seed}:{p}] Is {a}+{b}={a + b + rng.choice((0, 0, 1, -1))} right?")
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(timeout=600, headers=NO_CACHE) as client:

        async def sample(q: str, k: int) -> str:
            async with sem:
                r = await client.post(
                    url + "/v1/chat/completions",
                    json={
                        "model": "judge",
                        "max_tokens": max_tokens,
                        "temperature": 1.0,
                        "seed": k,
                        "messages": [{"role": "user", "content": q}],
                    },
                )
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"] or ""

        return [
            (q, list(await asyncio.gather(*(sample(q, k) for k in range(group)))))
            for q in questions
        ]


def grpo_batches(
    sampled: list[tuple[str, list[str]]], seed: int, retry_rate: float = 0.1
) -> list[list[dict[str, str]]]:
    """One /v1/rewards batch per prompt group (its sampled answers); a share of the batches
    is sent twice (a retried batch)."""
    rng = random.Random(seed)
    batches = []
    for question, answers in sampled:
        items = [{"prompt": question, "response": text} for text in answers]
        batches.append(items)
        if rng.random() < retry_rate:
            batches.append(list(items))
    return batches


async def run_arms(
    url: str, model: str, group: int, prompts: int, concurrency: int
) -> dict[str, Any]:
    """Arms off and on, each its own prompts, batch by batch interleaved; engine calls
    counted around each arm's batches."""
    out: dict[str, Any] = {}
    for arm, seed, headers in (
        ("off", 1000 + group, {url: dict(NO_CACHE)}),
        ("on", 2000 + group, {url: {}}),
    ):
        batches = grpo_batches(await policy_answers(url, seed, prompts, group), seed)
        pairs = [(it["prompt"], it["response"]) for b in batches for it in b]
        calls = [("/v1/rewards", {"model": model, "items": b}) for b in batches]
        before = engine_requests_done(url)
        res = await load([url], calls, concurrency, headers=headers)
        res.pop("answers")
        res.pop("slots")
        res["engine_calls"] = int(engine_requests_done(url) - before)
        res["samples"] = len(pairs)
        res["unique_identities"] = len(set(pairs))
        res["duplicate_rate"] = round(1 - len(set(pairs)) / len(pairs), 3)
        res["samples_per_s"] = round(res["req_per_s"] * len(pairs) / len(calls), 1)
        out[arm] = res
    out["engine_calls_on_over_off"] = round(
        out["on"]["engine_calls"] / max(1, out["off"]["engine_calls"]), 3
    )
    out["throughput_on_over_off"] = round(
        out["on"]["samples_per_s"] / out["off"]["samples_per_s"], 2
    )
    return out


# ---- part 2: the gateway's own cost, in process ---------------------------------------------
class InstantEngines:
    """Answers at once, like vLLM (the class the ledger names: one known class)."""

    async def post(self, model, placement, path, body, deadline):
        from gateway.core.api.results import EngineReply

        data = json.loads(body)
        out = {
            "id": "classify-x",
            "object": "list",
            "model": model,
            "data": [
                {"index": 0, "label": "LABEL_0", "probs": [len(str(data)) / 7.0], "num_classes": 1}
            ],
            "usage": {"prompt_tokens": 9, "total_tokens": 9},
        }
        return EngineReply(200, json.dumps(out).encode(), "fp", placement.first, "cls-bench")

    async def describe(self, model, slot, timeout_s):
        return None

    async def health(self, model, slot, timeout_s):
        return "healthy"

    def slot_view(self, model, slots):
        from gateway.core.routing.engine_access import SlotView
        from gateway.core.routing.numerics import ModelClasses

        return SlotView(ModelClasses(("cls-bench",) * slots))


async def gateway_cost(backend: str, dsn: str | None, n: int, state: Path) -> dict[str, Any]:
    from gateway.core.config.settings import AppConfig, LedgerSettings
    from gateway.core.service import RewardService
    from gateway.ledger.ledger import Ledger

    cfg = AppConfig.model_validate(
        {
            "models": [{"name": "rm", "kind": "discriminative", "model_path": "/m", "replicas": 2}],
            "gateway": {"placement": "pinned"},
        }
    )
    ledger = None
    if backend != "none":
        settings = LedgerSettings(backend=backend, dsn=dsn, state_dir=str(state / backend))
        ledger = Ledger.open(settings)
        ledger.writer.start()
    gw = RewardService(cfg, InstantEngines(), ledger=ledger)
    bodies = [
        json.dumps({"model": "rm", "input": f"sample {backend} {i} of a GRPO group"}).encode()
        for i in range(n)
    ]
    for b in bodies[:200]:  # warm-up (imports, first allocations)
        await gw.classify(b, use_cache=False)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for b in bodies:
        await gw.classify(b, use_cache=False)
    if ledger is not None:
        await ledger.writer.flush()  # the writer's work belongs to these requests
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - t0
    out = {
        "cpu_ms_per_request": round(1000 * cpu / n, 4),
        "wall_ms_per_request": round(1000 * wall / n, 4),
    }
    if ledger is not None:
        # hits: the same bodies again; rows recorded with the cache off are not in memory,
        # so the first pass reads the store (a thread hop), the second memory
        for where in ("store", "memory"):
            lat = []
            for b in bodies[: min(n, 5000)]:
                t = time.perf_counter()
                result = await gw.classify(b)
                lat.append(time.perf_counter() - t)
                assert result.routes[0].cache == "hit"
            lat.sort()
            out[f"hit_{where}_p50_ms"] = round(1000 * statistics.median(lat), 4)
            out[f"hit_{where}_p99_ms"] = round(1000 * lat[int(0.99 * len(lat))], 4)
        await ledger.writer.aclose()
    return out


async def part2(n: int) -> dict[str, Any]:
    from gateway.harness.postgres import ThrowawayPostgres

    with tempfile.TemporaryDirectory() as tmp, ThrowawayPostgres() as pg:
        res = {}
        for backend in ("none", "sqlite", "postgres", "none"):  # the anchor twice: noise
            key = backend if backend not in res else "none_again"
            res[key] = await gateway_cost(backend, pg.dsn, n, Path(tmp))
    anchor = min(res["none"]["cpu_ms_per_request"], res["none_again"]["cpu_ms_per_request"])
    for backend in ("sqlite", "postgres"):
        res[backend]["added_cpu_ms_per_request"] = round(
            res[backend]["cpu_ms_per_request"] - anchor, 4
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ledger")
    args = ap.parse_args()
    from deployments.demo.models import build_demo_models, demo_models_present

    models = REPO / "models" / "demo"
    if not demo_models_present(models):
        build_demo_models(models)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores",
        "quick": args.quick,
    }
    report["gateway_cost"] = asyncio.run(part2(2000 if args.quick else 20000))
    print(json.dumps(report["gateway_cost"], indent=1), flush=True)
    with tempfile.TemporaryDirectory() as state:
        cfg = args.out / "serve.yaml"
        cfg.write_text(yaml.safe_dump(config(models, Path(state))))
        with running_gateway(cfg, args.out / "run", timeout_s=1500) as (url, _engines):
            grpo: dict[str, Any] = {}
            shapes = (
                [("rm", 8, 8), ("rm", 16, 4), ("judge", 8, 2)]
                if args.quick
                else [("rm", 8, 32), ("rm", 16, 16), ("judge", 8, 8), ("judge", 16, 4)]
            )
            for model, group, prompts in shapes:
                grpo[f"{model} x{group}"] = asyncio.run(
                    run_arms(url, model, group, prompts, concurrency=8)
                )
                print(f"{model} x{group}: " + json.dumps(grpo[f"{model} x{group}"]), flush=True)
            report["grpo"] = grpo
    (args.out / "ledger.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'ledger.json'}")


if __name__ == "__main__":
    main()
