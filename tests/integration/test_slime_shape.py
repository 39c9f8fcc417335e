"""slime's remote reward model against the session gateway, in slime's own call shape
(``slime/rollout/rm_hub/__init__.py``, ``remote_rm``: aiohttp posts ``{prompt, response,
label}`` to ``--rm-url``, ``raise_for_status()``, the reward is ``await resp.json()``): one
sample gives a number, the samples of one prompt (group mode) each their own, the same bits
as ``/v1/rewards`` with the samples in one group, answered by one slot."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest

from gateway.core.api.slime import group_of

pytestmark = pytest.mark.integration

PROMPT = "Solve: 18 + 24 = ?"
SAMPLES = [{"prompt": PROMPT, "response": r, "label": "42"} for r in ("42", "41", "forty-two")]


async def remote_rm(url: str, payload: object) -> object:
    """slime's remote_rm, as it calls the reward service."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=payload) as resp:
            resp.raise_for_status()
            return await resp.json()


async def group_rm(url: str, samples: list[dict]) -> list[object]:
    """slime's --group-rm: the samples of one prompt scored at once, one request each."""
    return list(await asyncio.gather(*(remote_rm(url, s) for s in samples)))


def test_slime_single_and_group_calls_get_the_rewards_of_v1_rewards(gateway):
    url, _ = gateway
    single = asyncio.run(remote_rm(url + "/slime/reward", SAMPLES[0]))
    grouped = asyncio.run(group_rm(url + "/slime/reward", SAMPLES))
    listed = asyncio.run(remote_rm(url + "/slime/reward", SAMPLES))  # a custom rm's list
    assert isinstance(single, float) and all(isinstance(r, float) for r in grouped)
    items = [{**s, "group": group_of(PROMPT)} for s in SAMPLES]
    r = httpx.post(url + "/v1/rewards", json={"items": items}, timeout=300)
    assert r.status_code == 200, r.text
    assert grouped == listed == r.json()["rewards"] and single == grouped[0]
    assert len({d["slot"] for d in r.json()["details"]}) == 1


def test_a_bad_slime_body_is_a_4xx_slime_raises_on(gateway):
    url, _ = gateway
    with pytest.raises(aiohttp.ClientResponseError) as err:
        asyncio.run(remote_rm(url + "/slime/reward", {"prompt": PROMPT}))
    assert err.value.status == 422
