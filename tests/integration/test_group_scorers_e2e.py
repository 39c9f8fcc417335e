"""Group scorers on the real demo judge (the session gateway, configs/test-cpu.yaml):
pairwise (every pair in both orders), listwise, and three sampled judges per item give the
same rewards at any concurrency and in any item order; the position-swapped comparisons
are in the details; every receipt resolves; ``rmgate ledger replay --groups`` replays the
recorded groups with every answer identical."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from tests.integration.test_postgres_ledger import rmgate_ledger

pytestmark = pytest.mark.integration

RESPONSES = ["42", "41", "The sum is 42.", "17 + 25 = 43", "It is forty-two."]
SIZES = {"pairwise": (3, 4), "listwise": (3, 5), "judges3": (2, 3)}  # groups, items each


def groups(program: str) -> list[list[dict]]:
    n_groups, size = SIZES[program]
    return [
        [
            {"prompt": f"What is {17 + g} + 25?", "response": r, "group": f"{program}-{g}"}
            for r in RESPONSES[:size]
        ]
        for g in range(n_groups)
    ]


async def score(url: str, program: str, bodies: list[list[dict]], concurrency: int) -> dict:
    """(group, response) -> (reward, detail) over every body, ``concurrency`` at once."""
    sem = asyncio.Semaphore(concurrency)
    out: dict[tuple[str, str], tuple[float, dict]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:

        async def one(items: list[dict]) -> None:
            async with sem:
                r = await c.post("/v1/rewards", json={"model": program, "items": items})
            assert r.status_code == 200, r.text
            for item, reward, detail in zip(
                items, r.json()["rewards"], r.json()["details"], strict=True
            ):
                out[(item["group"], item["response"])] = (reward, detail)

        await asyncio.gather(*(one(b) for b in bodies))
    return out


def shuffled(items: list[dict], seed: int) -> list[dict]:
    out = items[:]
    random.Random(seed).shuffle(out)
    return out


@pytest.mark.parametrize("program", ["pairwise", "listwise", "judges3"])
async def test_group_scorers_answer_alike_at_any_concurrency_and_order(gateway, program):
    url, _ = gateway
    base = groups(program)
    runs = [
        await score(url, program, base, 1),
        await score(url, program, [shuffled(g, 7 + i) for i, g in enumerate(base)], 8),
        await score(url, program, [shuffled([it for g in base for it in g], 3)], 1),
    ]
    rewards = [{k: v[0] for k, v in run.items()} for run in runs]
    assert rewards[0] == rewards[1] == rewards[2]
    assert all(r is not None for r in rewards[0].values()), rewards[0]
    details = [d["components"][0] for _, d in runs[0].values()]
    if program == "pairwise":
        for detail in details:
            shown = {(c["opponent"], c["shown"]) for c in detail["comparisons"]}
            others = detail["size"] - 1
            assert len(shown) == 2 * others and {s for _, s in shown} == {"A", "B"}
    if program == "judges3":
        assert all(len(set(d["seeds"])) == 3 for d in details)
    # every receipt resolves to its recorded answer
    receipts = {r for _, d in runs[0].values() for r in d.get("receipts", [])}
    assert receipts
    time.sleep(1.0)  # the ledger writer's flush interval is 0.2 s
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        found = await asyncio.gather(*(c.get(f"/v1/ledger/{r}") for r in sorted(receipts)))
    assert all(f.status_code == 200 for f in found), [f.text for f in found if f.status_code != 200]


def test_ledger_replay_replays_the_recorded_groups(gateway, ledger_postgres):
    url, _ = gateway
    run = asyncio.run(score(url, "pairwise", groups("pairwise"), 4))
    assert all(reward is not None for reward, _ in run.values())
    time.sleep(1.0)
    out = rmgate_ledger(
        "replay", url, "--groups", "--program", "pairwise", "--db", ledger_postgres.dsn
    )
    assert out.returncode == 0, out.stdout + out.stderr
    n = len(groups("pairwise"))
    assert f"groups: {n} replayed, {n} identical, 0 changed" in out.stdout, out.stdout
