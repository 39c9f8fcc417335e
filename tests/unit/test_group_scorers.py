"""Group scorers (pairwise, listwise) and K sampled judges against a fake judge: a group
is a set (any item order, the same rewards), every comparison is judged in both orders,
seeds come from the items, and a group scorer without a group is a 422."""

from __future__ import annotations

import hashlib
import json
import math
import random

import httpx
import pytest

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.scoring.group_scorers import comparison_pairs
from gateway.core.scoring.model_scorers import yes_probability
from gateway.core.scoring.voting import aggregate
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit import test_rewards
from tests.unit.test_rewards import JudgeTransport

A, B = 65, 66  # "A", "B"
RATINGS = [48, 49, 50]  # "0", "1", "2"


def label_logprob(content: str, token: int) -> float:
    """The fake judge's log-probability of ``token`` after ``content``: a function of the
    whole conversation (so A-first and B-first comparisons read differently)."""
    h = int(hashlib.sha256(f"{content}|{token}".encode()).hexdigest()[:6], 16)
    return -(h % 997) / 199.0 - 0.05


def conversation(data: dict) -> str:
    return "\n".join(m["content"] for m in data["messages"])


class GroupJudge(JudgeTransport):
    """Label reads answered from ``label_logprob``; sampled answers carry the seed."""

    async def post(self, model, placement, path, body, deadline):
        data = json.loads(body)
        self.sent.append((model, placement.home, path, data))
        if "logprob_token_ids" in data:
            top = [
                {"token": f"token_id:{t}", "logprob": label_logprob(conversation(data), t)}
                for t in data["logprob_token_ids"]
            ]
            entry = {"token": f"token_id:{A}", "logprob": -0.1, "top_logprobs": top}
            choice = {"index": 0, "message": {"role": "assistant", "content": "A"}}
            out = {"choices": [{**choice, "logprobs": {"content": [entry]}}]}
        else:  # a sampled judge: its score depends on the seed
            answer = f"Score: {data.get('seed', 0) % 3}"
            out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}
        return EngineReply(200, json.dumps(out).encode(), "fp", placement.home)


PAIRWISE = {
    "type": "pairwise",
    "yes": ["A"],
    "no": ["B"],
    "yes_token_ids": [A],
    "no_token_ids": [B],
}
LISTWISE = {"type": "listwise", "ratings": ["0", "1", "2"], "rating_token_ids": RATINGS}
CONFIG = {
    "models": [test_rewards.CONFIG["models"][0]],  # the rewards tests' judge, two slots
    "programs": [
        {"name": "pairs", "components": [{"name": "p", "model": "judge", "scorer": PAIRWISE}]},
        {
            "name": "ring",
            "components": [
                {"name": "p", "model": "judge", "scorer": {**PAIRWISE, "pairs": "circular"}}
            ],
        },
        {
            "name": "wins",
            "components": [
                {"name": "p", "model": "judge", "scorer": {**PAIRWISE, "reward": "wins"}}
            ],
        },
        {"name": "list", "components": [{"name": "l", "model": "judge", "scorer": LISTWISE}]},
        {
            "name": "vote",
            "components": [
                {"name": "v", "model": "judge", "judges": {"count": 5, "aggregate": "majority"}}
            ],
        },
        {
            "name": "pairs_mask",
            "on_failure": "mask",
            "components": [{"name": "p", "model": "judge", "scorer": PAIRWISE}],
        },
    ],
}


@pytest.fixture
async def setup():
    transport = GroupJudge()
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), transport))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        yield c, transport


def group(n: int = 5, name: str = "q1") -> list[dict]:
    return [
        {"prompt": "What is 12+30?", "response": f"It is {40 + i}.", "group": name}
        for i in range(n)
    ]


async def rewards(client, model: str, items: list[dict]) -> dict:
    r = await client.post("/v1/rewards", json={"model": model, "items": items})
    assert r.status_code == 200, r.text
    return r.json()


def by_response(out: dict, items: list[dict]) -> dict[str, float]:
    return {it["response"]: rw for it, rw in zip(items, out["rewards"], strict=True)}


@pytest.mark.parametrize("program", ["pairs", "ring", "wins", "list"])
async def test_a_group_is_a_set_any_item_order_gives_the_same_rewards(setup, program):
    client, transport = setup
    items = group()
    first = by_response(await rewards(client, program, items), items)
    calls = [d for _, _, _, d in transport.sent]
    for seed in (1, 2, 3):
        shuffled = items[:]
        random.Random(seed).shuffle(shuffled)
        transport.sent.clear()
        assert by_response(await rewards(client, program, shuffled), shuffled) == first
        # the very same engine calls, in the same order: canonical, not the request's
        assert [d for _, _, _, d in transport.sent] == calls
    assert len(set(first.values())) > 1, "the control: the fake judge tells responses apart"
    assert len({slot for _, slot, _, _ in transport.sent}) == 1, "a group on one slot"


async def test_pairwise_judges_every_pair_in_both_orders_and_shows_the_matrix(setup):
    client, transport = setup
    items = group(4)
    out = await rewards(client, "pairs", items)
    shown = [
        (
            m["content"].split("Response A: ")[1].split("\n")[0],
            m["content"].split("Response B: ")[1].split("\n")[0],
        )
        for _, _, _, d in transport.sent
        for m in d["messages"][:1]
    ]
    assert len(shown) == 4 * 3 and len(set(shown)) == 12  # n(n-1) ordered comparisons
    assert all((b, a) in shown for a, b in shown), "each pair in both orders"
    detail = out["details"][0]["components"][0]
    assert detail["size"] == 4 and len(detail["comparisons"]) == 6  # 3 opponents x 2 orders
    assert {c["shown"] for c in detail["comparisons"]} == {"A", "B"}
    # the reward: the mean preference, recomputed from the fake judge's probabilities
    sides = []
    for c in detail["comparisons"]:
        p = c["p_first_better"]
        sides.append(p if c["shown"] == "A" else 1 - p)
        assert c["preference"] == sides[-1]
    assert out["rewards"][0] == math.fsum(sides) / len(sides)
    # and one comparison from the logprobs themselves
    sent = transport.sent[0][3]
    lp_a, lp_b = (label_logprob(conversation(sent), t) for t in (A, B))
    assert yes_probability([lp_a], [lp_b]) in {
        c["p_first_better"] for d in out["details"] for c in d["components"][0]["comparisons"]
    }


def test_comparison_pairs():
    assert comparison_pairs(1, "all_pairs") == []
    assert comparison_pairs(2, "circular") == [(0, 1)]
    assert comparison_pairs(4, "circular") == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert len(comparison_pairs(6, "all_pairs")) == 15


async def test_circular_and_wins(setup):
    client, transport = setup
    await rewards(client, "ring", group(6))
    assert len(transport.sent) == 12  # 6 pairs, both orders
    out = await rewards(client, "wins", group(5))
    assert all(r in {k / 8 for k in range(9)} for r in out["rewards"])  # 8 comparisons each


async def test_listwise_shows_the_whole_group_in_canonical_order_once_per_item(setup):
    client, transport = setup
    items = group(4)
    out = await rewards(client, "list", items)
    prompts = {d["messages"][0]["content"] for _, _, _, d in transport.sent}
    assert len(prompts) == 1 and all(it["response"] in next(iter(prompts)) for it in items)
    prefixes = sorted(d["messages"][1]["content"] for _, _, _, d in transport.sent)
    assert prefixes == [f"Response {k} rating: " for k in range(1, 5)]
    assert sorted(d["components"][0]["position"] for d in out["details"]) == [0, 1, 2, 3]


async def test_k_judges_sample_with_seeds_of_the_item_and_take_the_majority(setup):
    client, transport = setup
    items = group(3)
    out = await rewards(client, "vote", items)
    assert len(transport.sent) == 15  # 5 samples x 3 items, each its own request
    for detail in out["details"]:
        votes, seeds = detail["components"][0]["votes"], detail["components"][0]["seeds"]
        assert len(set(seeds)) == 5 and votes == [float(s % 3) for s in seeds]
        assert detail["components"][0]["score"] == aggregate(votes, "majority")
    # the seeds belong to the item, not to its place in the request or its group
    transport.sent.clear()
    again = await rewards(client, "vote", [{**items[2], "group": "other"}])
    assert (
        again["details"][0]["components"][0]["seeds"] == out["details"][2]["components"][0]["seeds"]
    )


def test_majority_ties_take_the_smallest_and_mean_adds_in_order():
    assert aggregate([1.0, 2.0, 2.0, 1.0], "majority") == 1.0
    assert aggregate([0.0, 2.0, 2.0], "majority") == 2.0
    assert aggregate([0.1, 0.2, 0.3], "mean") == math.fsum([0.1, 0.2, 0.3]) / 3


async def test_a_group_scorer_without_a_group_or_with_mixed_prompts_is_a_422(setup):
    client, _ = setup
    lone = [{"prompt": "p", "response": "r"}]
    r = await client.post("/v1/rewards", json={"model": "pairs", "items": lone})
    assert r.status_code == 422 and "group" in r.json()["error"]["message"], r.text
    mixed = [{**it, "prompt": f"q{i}"} for i, it in enumerate(group(3))]
    r = await client.post("/v1/rewards", json={"model": "pairs", "items": mixed})
    assert r.status_code == 422 and "different prompts" in r.json()["error"]["message"], r.text


async def test_duplicates_are_one_member_and_a_group_of_one_is_masked_not_invented(setup):
    client, _ = setup
    items = group(3)
    out = await rewards(client, "pairs", [*items, items[1]])
    assert out["rewards"][3] == out["rewards"][1]
    assert out["details"][0]["components"][0]["size"] == 3
    alone = await rewards(client, "pairs_mask", [group(1)[0], group(1)[0]])
    assert alone["rewards"] == [None, None] and all(d["mask"] for d in alone["details"])
    assert "nothing to compare" in alone["details"][0]["mask_reason"]
