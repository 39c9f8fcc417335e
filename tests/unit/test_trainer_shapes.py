"""The request shapes of two RL trainers, against a fake engine: slime's remote reward model
(``POST /slime/reward``: one sample -> a bare reward, a list -> the list, the samples of a
prompt in one group) and verl's batch reward manager (``compute_score_batch``: one call, the
items grouped by uid or dataset row)."""

from __future__ import annotations

import copy
import hashlib
import json

import httpx
import pytest

import gateway.client.verl as verl
from gateway.client import RewardClient
from gateway.core.api import slime
from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit import test_masks
from tests.unit.test_hot_path import clients
from tests.unit.test_rewards import CONFIG, JudgeTransport


def judge_app() -> tuple[object, JudgeTransport]:
    """The rewards tests' gateway with the judge (2 slots) as the default reward model:
    its reward depends on the prompt, the response and the label."""
    cfg = copy.deepcopy(CONFIG)
    cfg["gateway"]["default_reward_model"] = "judge"
    transport = JudgeTransport()
    return create_app(RewardService(AppConfig.model_validate(cfg), transport)), transport


@pytest.fixture
async def judge():
    app, transport = judge_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        yield c, transport


def samples(n: int, prompt: str = "What is 12+30?") -> list[dict]:
    return [{"prompt": prompt, "response": f"It is {40 + i}.", "label": "42"} for i in range(n)]


def slots(transport: JudgeTransport) -> set[int]:
    return {slot for _, slot, _, _ in transport.sent}


# ---- slime ----------------------------------------------------------------------------


async def test_slime_single_sample_answers_the_bare_reward_of_v1_rewards(judge):
    client, _ = judge
    sample = {"prompt": "2+3=", "response": "5", "label": "5"}
    r = await client.post("/slime/reward", json=sample)
    assert r.status_code == 200, r.text
    want = await client.post("/v1/rewards", json={"items": [sample]})
    assert isinstance(r.json(), float)  # slime sets Sample.reward = await resp.json()
    assert r.json() == want.json()["rewards"][0]
    assert r.headers["x-rmgate-model"] == "judge"


async def test_slime_chat_prompt_is_scored_as_messages(judge):
    client, transport = judge
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}]
    r = await client.post("/slime/reward", json={"prompt": messages, "response": "5"})
    assert r.status_code == 200, r.text
    want = await client.post(
        "/v1/rewards", json={"items": [{"messages": messages, "response": "5"}]}
    )
    assert r.json() == want.json()["rewards"][0]


async def test_slime_group_list_is_scored_as_one_group_on_one_slot(judge):
    client, transport = judge
    group = samples(16)
    alone = await client.post("/v1/rewards", json={"items": group})
    assert alone.status_code == 200, alone.text
    assert slots(transport) == {0, 1}  # the control: the same items alone spread
    transport.sent.clear()
    r = await client.post("/slime/reward", json=group)
    assert r.status_code == 200, r.text
    assert r.json() == alone.json()["rewards"]
    assert len(slots(transport)) == 1
    home = slots(transport)
    # slime's own --group-rm sends the same samples one request each: the same slot
    transport.sent.clear()
    singles = [(await client.post("/slime/reward", json=s)).json() for s in group]
    assert singles == r.json() and slots(transport) == home


def test_slime_items_of_one_prompt_carry_one_group_from_the_prompt_digest():
    body = [*samples(3), *samples(2, prompt="Other?")]
    parsed, single = slime.parse(json.dumps(body).encode())
    items = json.loads(slime.rewards_body(parsed))["items"]
    assert not single and len(items) == 5
    digest = hashlib.sha256(json.dumps("What is 12+30?").encode()).hexdigest()
    assert [it["group"] for it in items[:3]] == [f"sha256:{digest}"] * 3
    assert items[3]["group"] == items[4]["group"] != items[0]["group"]
    assert all(it["label"] == "42" and "prompt" in it for it in items)


async def test_slime_masked_items_answer_null():
    ok, boom = {"prompt": "1+1=", "response": "2"}, {"prompt": "boom", "response": "3"}
    r = await test_masks.post(True, "/slime/reward", boom)
    assert r.status_code == 200 and r.text == "null"
    r = await test_masks.post(True, "/slime/reward", [ok, boom])
    assert r.status_code == 200, r.text
    assert isinstance(r.json()[0], float) and r.json()[1] is None
    # the control: under on_failure: error the engine's failure fails the request
    assert (await test_masks.post(False, "/slime/reward", [ok, boom])).status_code == 502


@pytest.mark.parametrize(
    "body,where",
    [
        ({"prompt": "p"}, "response"),
        ({"prompt": "p", "response": "r", "model": "judge"}, "model"),
        ({"prompt": 3, "response": "r"}, "prompt"),
        ([{"prompt": "p", "response": "r"}, {"response": "r"}], "samples.1.prompt"),
        (["p"], "samples.0"),
        (7, "sample"),
    ],
)
async def test_slime_bad_body_is_a_422_naming_the_field(judge, body, where):
    client, _ = judge
    r = await client.post("/slime/reward", json=body)
    assert r.status_code == 422, r.text
    assert where in r.json()["error"]["message"]


async def test_slime_empty_list_and_bad_json(judge):
    client, transport = judge
    r = await client.post("/slime/reward", json=[])
    assert (r.status_code, r.json()) == (200, [])
    bad = await client.post("/slime/reward", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert transport.sent == []


async def test_slime_without_a_default_reward_model():
    """Two models and no ``default_reward_model``: a sample is a clear 4xx; an empty list
    still answers [] (nothing to score)."""
    cfg = {**CONFIG, "gateway": {}}
    app = create_app(RewardService(AppConfig.model_validate(cfg), JudgeTransport()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        assert (await c.post("/slime/reward", json=[])).json() == []
        r = await c.post("/slime/reward", json=samples(1)[0])
    assert 400 <= r.status_code < 500 and "model" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("body", [samples(1)[0], samples(3), {"prompt": "p"}])
async def test_slime_on_the_hot_path_answers_what_fastapi_answers(body):
    plain, hot = clients(default_reward_model="judge")
    async with plain, hot:
        a = await plain.post("/slime/reward", json=body)
        b = await hot.post("/slime/reward", json=body)
    assert (b.status_code, b.content) == (a.status_code, a.content)
    mine = {k: v for k, v in a.headers.items() if k.startswith("x-rmgate")}
    assert {k: v for k, v in b.headers.items() if k.startswith("x-rmgate")} == mine


# ---- verl batch -----------------------------------------------------------------------


def verl_batch() -> tuple[list, list, list, list]:
    """(data_sources, solution_strs, ground_truths, extra_infos) as verl's batch manager
    passes them: 3 dataset rows x 4 samples (the repeats share the row's extra_info), 2
    samples whose extra_info carries a uid, and 2 with neither uid nor index."""
    extras: list = []
    for row in range(3):
        extras += [{"index": row, "question": f"q{row}: {row}+1="}] * 4
    extras += [{"uid": "u-7", "question": "q7: 7+1="}] * 2
    extras += [{"question": "q8: 8+1="}, None]
    n = len(extras)
    return ["gsm8k"] * n, [f"r{i}" for i in range(n)], [str(i % 3) for i in range(n)], extras


class FakeClient:
    """What compute_score_batch asks of its RewardClient: one score_detailed call."""

    def __init__(self) -> None:
        self.calls: list[list[dict]] = []

    def score_detailed(self, items, model=None):
        self.calls.append(list(items))
        return [(None if i == 1 else float(i), {"slot": i % 2}) for i in range(len(items))]


def test_verl_batch_groups_items_by_uid_or_row_in_one_call(monkeypatch):
    fake = FakeClient()
    monkeypatch.setattr(verl, "_client", lambda address, model: fake)
    out = verl.compute_score_batch(*verl_batch(), reward_router_address="g:1", model="rm")
    assert len(fake.calls) == 1
    items = fake.calls[0]
    groups = [it.get("group") for it in items]
    assert groups == [
        *["index:gsm8k:0"] * 4,
        *["index:gsm8k:1"] * 4,
        *["index:gsm8k:2"] * 4,
        "uid:u-7",
        "uid:u-7",
        None,
        None,
    ]
    assert items[0] == {
        "response": "r0",
        "prompt": "q0: 0+1=",
        "label": "0",
        "group": "index:gsm8k:0",
    }
    assert items[-1]["prompt"] == ""  # no extra_info: no prompt, as compute_score
    assert [r["score"] for r in out] == [0.0, 0.0, *[float(i) for i in range(2, 16)]]
    assert out[1]["rmgate_masked"] == 1.0 and out[0]["rmgate_masked"] == 0.0
    assert out[3] == verl._result(3.0, {"slot": 1})


def test_verl_group_names_are_bounded():
    long = verl.group_of("src", {"uid": "u" * 300})
    assert long is not None and long.startswith("sha256:") and len(long) <= verl.GROUP_MAX
    assert verl.group_of("src", {"index": 0}) == "index:src:0"
    assert verl.group_of("src", {}) is None and verl.group_of("src", None) is None


def test_verl_batch_through_the_gateway_places_groups_and_scores_items_alone(monkeypatch):
    app, transport = judge_app()
    client = RewardClient(
        "g:1", model="judge", batch_size=64, transport=httpx.ASGITransport(app=app)
    )
    monkeypatch.setitem(verl._CLIENTS, ("g:1", "judge"), client)
    try:
        batch = verl_batch()
        out = verl.compute_score_batch(*batch, reward_router_address="g:1", model="judge")
        grouped = list(transport.sent)
        transport.sent.clear()
        alone = [
            verl.compute_score(*sample, reward_router_address="g:1", model="judge")
            for sample in zip(*batch)
        ]
    finally:
        client.close()
    assert [r["score"] for r in out] == [r["score"] for r in alone]
    for q in ("q0", "q1", "q2", "q7"):
        homes = {slot for _, slot, _, d in grouped if q in d["messages"][0]["content"]}
        assert len(homes) == 1, (q, homes)
    # the control: the same samples alone spread over both slots
    assert slots(transport) == {0, 1}
