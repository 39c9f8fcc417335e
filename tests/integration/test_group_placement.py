"""Groups on real engines (the session gateway: two slots per model, pinned placement):
a group's items are answered by one slot, with the bits of the same items sent one by one
(which spread over both slots: the control that placement did something)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

pytestmark = pytest.mark.integration

PROMPT = "Is the following sum right? " + " + ".join(str(d) for d in range(12)) + " = "


def group_items(n: int) -> list[dict]:
    return [{"prompt": PROMPT, "response": str(60 + i), "label": "66"} for i in range(n)]


async def one_by_one(url: str, model: str, items: list[dict]) -> list[tuple[float, int]]:
    order = list(range(len(items)))
    random.Random(3).shuffle(order)
    sem = asyncio.Semaphore(8)
    out: dict[int, tuple[float, int]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.post("/v1/rewards", json={"model": model, "items": [items[i]]})
            assert r.status_code == 200, r.text
            out[i] = (r.json()["rewards"][0], r.json()["details"][0]["slot"])

        await asyncio.gather(*(one(i) for i in order))
    return [out[i] for i in range(len(items))]


@pytest.mark.parametrize("model", ["rm", "judge"])
async def test_a_group_is_answered_by_one_slot_with_the_bits_of_its_items_alone(gateway, model):
    url, _ = gateway
    items = group_items(12)
    alone = await one_by_one(url, model, items)
    assert {slot for _, slot in alone} == {0, 1}, "the control: items alone use both slots"
    grouped = [{**it, "group": f"{model}-sum-12"} for it in items]
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        r = await c.post("/v1/rewards", json={"model": model, "items": grouped})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len({d["slot"] for d in out["details"]}) == 1
    assert out["rewards"] == [reward for reward, _ in alone]
    assert all(d["group"] == f"{model}-sum-12" for d in out["details"])
