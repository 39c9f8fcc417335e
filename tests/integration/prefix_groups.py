"""GRPO-shaped groups shared by the prefix-cache tests of two gateways: the session
gateway (``prefix_cache: auto``, proven) answers them first and stashes its rewards; the
numerics gateway (no prefix cache) answers the same items one by one later, and must give
the same bits (tests/integration/test_cli_numerics_classes.py)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

#: (model, rewards in item order) of the session gateway's groups, for the cacheless one.
GROUP_REWARDS = pytest.StashKey[dict[str, list[float]]]()
#: The models compared: the DisRM, and a judge_prob program over the judge (its reward is
#: a probability read from logprobs: every bit of the logits shows).
MODELS = ("rm", "judge_yes")


def grpo_items(groups: int = 3, size: int = 6) -> list[dict]:
    """``groups`` problems with a long shared prompt (about 400 characters: several cache
    blocks) and ``size`` short responses each."""
    items = []
    for g in range(groups):
        steps = " ".join(f"{g + k} + {k * k} = {g + k + k * k}." for k in range(40))
        prompt = f"Problem {g}: check every step. {steps} So the total is "[:400]
        for r in range(size):
            items.append(
                {"prompt": prompt, "response": f" {100 * g + 7 * r}.", "label": str(100 * g)}
            )
    return items


async def post_rewards(
    url: str, model: str, bodies: list[list[dict]], concurrency: int, seed: int
) -> list[dict]:
    """Each body's ``/v1/rewards`` answer, sent in a shuffled order ``concurrency`` at once."""
    order = list(range(len(bodies)))
    random.Random(seed).shuffle(order)
    sem = asyncio.Semaphore(concurrency)
    out: dict[int, dict] = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.post("/v1/rewards", json={"model": model, "items": bodies[i]})
            assert r.status_code == 200, r.text
            out[i] = r.json()

        await asyncio.gather(*(one(i) for i in order))
    return [out[i] for i in range(len(bodies))]
