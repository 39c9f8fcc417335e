"""/v1/rewards and /get_reward against a fake engine: item order, details, defaults."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit.test_ingress import FakeTransport

CONFIG = {
    "models": [
        {
            "name": "judge",
            "kind": "generative",
            "model_path": "/m/grm",
            "replicas": 2,
            "scorer": {
                "template": "Is {prompt}{response} right? ref={label}",
                "parser": "last_int",
                "default": -1.0,
            },
        },
        {"name": "rm", "kind": "discriminative", "model_path": "/m/disrm", "replicas": 2},
    ],
    "gateway": {"default_reward_model": "rm"},
}


class JudgeTransport(FakeTransport):
    """A judge that answers 'Score: <len(content) % 3>', or rambles for 'ramble'."""

    async def post(self, model, placement, path, body, deadline):
        slot = placement.home
        data = json.loads(body)
        self.sent.append((model, slot, path, data))
        if path == "/classify":
            text = json.dumps(data.get("messages") or data.get("input"))
            out = {"object": "list", "data": [{"index": 0, "probs": [len(text) / 10]}]}
            return EngineReply(200, json.dumps(out).encode(), "fp", slot)
        content = data["messages"][0]["content"]
        answer = "I cannot say" if "ramble" in content else f"Score: {len(content) % 3}"
        out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}
        return EngineReply(200, json.dumps(out).encode(), "fp", slot)


@pytest.fixture
async def setup():
    transport = JudgeTransport()
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), transport))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        yield c, transport


async def test_grm_rewards_in_item_order_with_details(setup):
    client, transport = setup
    items = [{"prompt": f"{i}+1=", "response": str(i + 1), "label": i + 1} for i in range(6)]
    items.append({"prompt": "ramble", "response": "x"})
    r = await client.post("/v1/rewards", json={"model": "judge", "items": items})
    assert r.status_code == 200, r.text
    out = r.json()
    contents = [f"Is {i}+1={i + 1} right? ref={i + 1}" for i in range(6)]
    assert out["rewards"][:6] == [float(len(c) % 3) for c in contents]
    assert out["rewards"][6] == -1.0
    assert out["details"][6]["parsed"] is False and "default" in out["details"][6]["error"]
    assert all(d["seed"] is not None and d["slot"] in (0, 1) for d in out["details"])
    assert [d["index"] for d in out["details"]] == list(range(7))


async def test_disrm_scores_the_conversation(setup):
    client, transport = setup
    r = await client.post(
        "/v1/rewards",
        json={
            "items": [
                {"messages": [{"role": "user", "content": "2+3="}], "response": "5"},
                {"prompt": "2+3=", "response": "5"},
            ]
        },
    )
    assert r.status_code == 200
    out = r.json()
    assert out["model"] == "rm" and out["rewards"][0] == out["rewards"][1]
    sent = transport.sent[0][3]
    assert sent["messages"][-1] == {"role": "assistant", "content": "5"}
    assert sent["use_activation"] is False


async def test_rewards_errors(setup):
    client, _ = setup
    assert (
        await client.post("/v1/rewards", json={"items": [{"response": "x"}]})
    ).status_code == 422
    assert (await client.post("/v1/rewards", json={"items": "x"})).status_code == 422
    assert (await client.post("/v1/rewards", json={"model": "no", "items": []})).status_code == 404
    r = await client.post("/v1/rewards", json={"items": []})
    assert r.status_code == 200 and r.json()["rewards"] == []


async def test_get_reward_openrlhf_shape_and_empty_batch(setup):
    client, _ = setup
    r = await client.post(
        "/get_reward", json={"query": ["a b", "c"], "prompts": ["a", "c"], "labels": [None, "x"]}
    )
    out = r.json()
    assert r.status_code == 200 and len(out["rewards"]) == 2 and out["scores"] == out["rewards"]
    assert set(out["extra_logs"]) == {"parsed"}  # request-determined only: no slot
    empty = await client.post("/get_reward", json={"query": [], "prompts": [], "labels": []})
    assert empty.status_code == 200
    # every key a client reads, an empty shard included (OpenRLHF: KeyError 'parsed')
    assert empty.json() == {"rewards": [], "scores": [], "extra_logs": {"parsed": []}}
    bad = await client.post("/get_reward", json={"query": ["a"], "prompts": []})
    assert bad.status_code == 422


async def test_get_reward_names_each_items_slot_in_the_header_not_the_body(setup):
    """OpenRLHF logs extra_logs as training metrics: the answering slot (free under class
    placement) is routing, so it goes in the x-rmgate-slot header, one per item."""
    client, _ = setup
    queries = [f"{i}+{i}={2 * i}" for i in range(8)]
    r = await client.post("/get_reward", json={"query": queries})
    assert r.status_code == 200, r.text
    slots = r.headers["x-rmgate-slot"].split(",")
    assert len(slots) == 8 and set(slots) == {
        "0",
        "1",
    }  # the batch spread over both slots  # the batch is spread over both slots
    assert "slot" not in r.text
    items = [{"prompt": q, "response": "x"} for q in queries]
    rewards = await client.post("/v1/rewards", json={"items": items})
    assert len(rewards.headers["x-rmgate-slot"].split(",")) == 8


async def test_model_path_is_accepted_as_model_name(setup):
    """verl's built-in loop sends the reward model's path as `model`."""
    client, _ = setup
    a = await client.post(
        "/classify", json={"model": "/m/disrm", "input": "x", "activation": False}
    )
    b = await client.post("/classify", json={"model": "rm", "input": "x", "use_activation": False})
    assert a.status_code == 200 and a.headers["x-rmgate-key"] == b.headers["x-rmgate-key"]


CHATML_PROMPT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.mark.parametrize(
    "label,text",
    [
        (7, "7"),
        (7.5, "7.5"),
        (True, "true"),
        ([1, "a"], '[1, "a"]'),
        ({"b": 1, "a": [2]}, '{"a": [2], "b": 1}'),
        ("seven", "seven"),
        (None, ""),
    ],
)
async def test_any_json_label_reaches_the_judge_as_json_text(setup, label, text):
    """OpenRLHF sends the dataset's label field unchanged; a 422 would make it drop the
    reward after five tries."""
    client, transport = setup
    for path, body in (
        (
            "/v1/rewards",
            {"model": "judge", "items": [{"prompt": "3+4=", "response": "7", "label": label}]},
        ),
    ):
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert transport.sent[-1][3]["messages"][0]["content"] == f"Is 3+4=7 right? ref={text}"


async def test_get_reward_judge_sees_plain_prompt_and_response_with_any_label():
    transport = JudgeTransport()
    cfg = {**CONFIG, "gateway": {"default_reward_model": "judge"}}
    app = create_app(RewardService(AppConfig.model_validate(cfg), transport))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        query = CHATML_PROMPT + "7<|im_end|>\n<|endoftext|><|endoftext|>"
        r = await c.post(
            "/get_reward",
            json={"query": [query], "prompts": [CHATML_PROMPT], "labels": [{"answer": 7}]},
        )
        assert r.status_code == 200, r.text
        assert (
            transport.sent[-1][3]["messages"][0]["content"] == 'Is 3+4=7 right? ref={"answer": 7}'
        )
        assert set(r.json()["extra_logs"]) == {"parsed"}
        empty = await c.post("/get_reward", json={"query": []})
        assert empty.json()["extra_logs"] == {"parsed": []}


async def test_get_reward_disrm_adds_no_special_tokens_and_truncates(setup):
    """OpenRLHF's query already holds BOS and may exceed the RM's context."""
    client, transport = setup
    r = await client.post("/get_reward", json={"query": ["<s>2+3=5</s>"], "labels": [True]})
    assert r.status_code == 200, r.text
    sent = transport.sent[-1][3]
    assert sent["input"] == "<s>2+3=5</s>" and sent["add_special_tokens"] is False
    assert sent["truncate_prompt_tokens"] == -1 and sent["truncation_side"] == "right"
    assert r.json()["extra_logs"]["parsed"] == [1.0]
