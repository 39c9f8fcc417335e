"""A load that ramps up and down on CPU: slots 1 -> 2 -> 0 -> 1, every answer checked.

A real ``rmgate serve`` of the demo DisRM with ``autoscaling: {min_slots: 0, max_slots: 2,
target_ongoing_per_slot: 2}`` (short delays: ``--upscale-delay-s``, ``--downscale-delay-s``).
One run, four phases:

1. **fixed**: every text once at concurrency 1 on one slot (the reference answers);
2. **ramp up**: the texts again and again at ``--concurrency`` until slot 1 has served for
   ``--hold-s``: when the autoscaler decided, when the ingress routed to slot 1, when slot 1
   first answered (seconds from the load's start);
3. **ramp down**: idle until the model is scaled to zero (slot 1 drained and removed, slot 0
   asleep, no engine process left): seconds from the load's end;
4. **from zero**: one request, answered after the wake (its latency).

Every answer of phases 2 and 4 is compared with phase 1's (bits), failed requests counted.

    .venv/bin/python -m benchmarks.autoscale [--out benchmarks/reports/autoscale-DATE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.harness.processes import NO_CACHE, vllm_servers
from gateway.harness.running import REPO, running_gateway, serve_config

TEXTS = [f"{a}+{b}={(a * b) % 19}" for a in range(12) for b in range(10)]


def config(
    model: Path, upscale_delay_s: float, downscale_delay_s: float, on_sleep: str = "wake"
) -> dict[str, Any]:
    """One DisRM, one slot to start with, autoscaled between 0 and 2 slots."""
    return serve_config(
        {
            "gateway": {"slot_wait_s": 180, "placement": "pinned", "cache": "off"},
            "models": [
                {
                    "name": "rm",
                    "kind": "discriminative",
                    "model_path": str(model),
                    "replicas": 1,
                    "determinism": "auto",
                    "on_sleep": on_sleep,
                    "engine_args": {
                        "dtype": "float32",
                        "max_model_len": 1024,
                        "enforce_eager": True,
                    },
                    "cpu_cores_per_slot": 1,
                    "autoscaling": {
                        "min_slots": 0,
                        "max_slots": 2,
                        "target_ongoing_per_slot": 2,
                        "upscale_delay_s": upscale_delay_s,
                        "downscale_delay_s": downscale_delay_s,
                    },
                }
            ],
        }
    )


def card(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/models", timeout=60).json()["data"][0]


async def send(client: httpx.AsyncClient, url: str, text: str) -> tuple[int, float | None, str]:
    r = await client.post(url + "/classify", json={"model": "rm", "input": text}, headers=NO_CACHE)
    if r.status_code != 200:
        return r.status_code, None, ""
    return 200, r.json()["data"][0]["probs"][0], r.headers["x-rmgate-slot"]


async def ramp(url: str, concurrency: int, hold_s: float, limit_s: float) -> dict[str, Any]:
    """The texts in a loop at ``concurrency`` until slot 1 has answered for ``hold_s``."""
    start = time.monotonic()
    seen: dict[str, float] = {}
    routed: list[float] = []
    answers: list[tuple[str, int, float | None]] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def watch() -> None:
            while not routed and time.monotonic() - start < limit_s:
                if await asyncio.to_thread(lambda: card(url)["slots"]) == 2:
                    routed.append(time.monotonic() - start)
                await asyncio.sleep(0.5)

        def done() -> bool:
            now = time.monotonic() - start
            return now > limit_s or ("1" in seen and now > seen["1"] + hold_s)

        async def worker(w: int) -> None:
            i = w
            while not done():
                text = TEXTS[i % len(TEXTS)]
                i += concurrency
                status, score, slot = await send(client, url, text)
                answers.append((text, status, score))
                if slot:
                    seen.setdefault(slot, time.monotonic() - start)

        await asyncio.gather(watch(), *(worker(w) for w in range(concurrency)))
    return {
        "seconds": round(time.monotonic() - start, 1),
        "routed_to_slot_1_s": routed[0] if routed else None,
        "slot_first_answer_s": {k: round(v, 1) for k, v in seen.items()},
        "answers": answers,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/autoscale.json"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--upscale-delay-s", type=float, default=2.0)
    ap.add_argument("--downscale-delay-s", type=float, default=8.0)
    ap.add_argument("--hold-s", type=float, default=15.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rmgate-autoscale-"))
    path = work / "autoscale.yaml"
    model = REPO / "models" / "demo" / "disrm"
    path.write_text(yaml.safe_dump(config(model, args.upscale_delay_s, args.downscale_delay_s)))
    result: dict[str, Any] = {
        "command": "python -m benchmarks.autoscale "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
    }
    with running_gateway(path, work) as (url, engines):

        async def fixed() -> dict[str, float]:
            async with httpx.AsyncClient(timeout=600) as client:
                out = {}
                for text in TEXTS:
                    status, score, _ = await send(client, url, text)
                    assert status == 200 and score is not None
                    out[text] = score
                return out

        reference = asyncio.run(fixed())
        up = asyncio.run(ramp(url, args.concurrency, args.hold_s, 600))
        end = time.monotonic()
        while card(url)["state"] != "asleep" and time.monotonic() - end < 300:
            time.sleep(0.5)
        to_zero = time.monotonic() - end
        engines_left = len(vllm_servers(engines))
        t = time.monotonic()
        woke = asyncio.run(fixed())
        first_after_zero = time.monotonic() - t
        decisions = card(url)["autoscaling"]["decisions"]
    answers = up.pop("answers")
    result.update(
        {
            "texts": len(TEXTS),
            "ramp": {
                **up,
                "requests": len(answers),
                "failed": sum(1 for _, s, _ in answers if s != 200),
                "differing_from_fixed": sum(
                    1 for t, s, v in answers if s == 200 and v != reference[t]
                ),
            },
            "to_zero_after_idle_s": round(to_zero, 1),
            "engines_left_at_zero": engines_left,
            "from_zero": {
                "all_texts_s": round(first_after_zero, 1),
                "differing_from_fixed": sum(1 for t in TEXTS if woke[t] != reference[t]),
            },
            "decisions": decisions,
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
