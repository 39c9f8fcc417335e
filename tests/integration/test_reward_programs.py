"""Logprob judges and reward programs on real engines, through the session's real gateway
(``configs/test-cpu.yaml``: the demo judge read after "Score: ", the demo DisRM, math-verify
in the rule pool, a rule that hangs on a crafted answer).

* ``judge_prob`` and ``expected_rating``: in range, equal to the value computed by hand from
  the same engine's label log-probabilities (the same chat request sent on its own), and
  bitwise equal across shuffled replays at concurrency 1 and 32.
* A program of the DisRM, the judge and math-verify on small sums: per-component scores,
  the combined reward bitwise stable across replays, the receipts of its model components;
  the hanging rule cut off at its 1 s timeout under each ``on_failure``; /get_reward's
  ``extra_logs`` with one series per component.

The negative control of these values is the engines' own (tests/integration/
test_negative_control.py): a label read is one ordinary chat request through the same
policy, and the demo judge on this CPU showed no batch variance to control for.
"""

from __future__ import annotations

import math
import random
import time

import httpx
import pytest

from gateway.client.check import Call, replay, shuffled

pytestmark = pytest.mark.integration

TEMPLATE = "Is {prompt}{response} right?"
HANG = "a" * 40 + "b"


def sums(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        c = a + b if rng.random() < 0.5 else rng.randrange(19)
        out.append({"prompt": f"{a}+{b}=", "response": str(c), "label": str(a + b)})
    return out


def post(url: str, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(
        url + path, json=body, timeout=300, headers={"x-rmgate-cache": "off", **headers}
    )


def label_read(url: str, item: dict, token_ids: list[int]) -> dict[int, float]:
    """The judge's label log-probabilities for ``item``, from the chat request a client
    would send itself."""
    body = {
        "model": "judge",
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "logprob_token_ids": token_ids,
        "return_tokens_as_token_ids": True,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "messages": [
            {"role": "user", "content": TEMPLATE.format(**item)},
            {"role": "assistant", "content": "Score: "},
        ],
    }
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    pos = r.json()["choices"][0]["logprobs"]["content"][0]
    found = {int(e["token"].split(":")[1]): e["logprob"] for e in pos["top_logprobs"]}
    return {t: found[t] for t in token_ids}


def test_logprob_judges_equal_the_hand_computation(gateway):
    url, _ = gateway
    models = httpx.get(url + "/v1/models", timeout=30).json()
    programs = {p["name"]: p for p in models["programs"]}
    yes_scorer = programs["judge_yes"]["components"][0]["scorer"]
    rating_scorer = programs["judge_rating"]["components"][0]["scorer"]
    yes_ids, no_ids = yes_scorer["yes_token_ids"], yes_scorer["no_token_ids"]
    assert (yes_ids, no_ids) == ([ord("1")], [ord("0")])  # the demo's byte-level tokenizer
    rating_ids = rating_scorer["rating_token_ids"]
    assert rating_ids == [ord(str(d)) for d in range(10)]

    items = sums(6, seed=1)
    yes = post(url, "/v1/rewards", {"model": "judge_yes", "items": items}).json()
    per_label = post(url, "/v1/rewards", {"model": "judge_yes_prompt", "items": items}).json()
    # the label's log-probability read from the prompt (one request per label): the same
    # value, bitwise on this engine
    assert per_label["rewards"] == yes["rewards"]
    rating = post(url, "/v1/rewards", {"model": "judge_rating", "items": items}).json()
    for i, item in enumerate(items):
        lp = label_read(url, item, yes_ids + no_ids)
        p1, p0 = math.exp(lp[yes_ids[0]]), math.exp(lp[no_ids[0]])
        assert 0.0 <= yes["rewards"][i] <= 1.0
        assert yes["rewards"][i] == pytest.approx(p1 / (p1 + p0), rel=1e-12, abs=0)
        assert yes["details"][i]["components"][0]["label_logprobs"] == {
            str(t): lp[t] for t in yes_ids + no_ids
        }  # the engine's bits, as sent
        lr = label_read(url, item, rating_ids)
        ps = [math.exp(lr[t]) for t in rating_ids]
        assert 0.0 <= rating["rewards"][i] <= 9.0
        assert rating["rewards"][i] == pytest.approx(
            sum(p * d for p, d in zip(ps, range(10))) / sum(ps), rel=1e-12, abs=0
        )


@pytest.mark.parametrize("program", ["judge_yes", "judge_yes_prompt", "judge_rating", "math"])
async def test_rewards_are_bitwise_equal_across_shuffled_replays(gateway, program):
    url, _ = gateway
    calls = [Call("/v1/rewards", {"model": program, "items": [it]}) for it in sums(16, 2)]
    first = await replay(url, calls, list(range(len(calls))), 1)
    assert all(r.status == 200 for r in first.values()), first[0].essence
    for concurrency, seed in ((1, 3), (32, 4)):
        again = await replay(url, calls, shuffled(len(calls), seed), concurrency)
        assert [again[i].essence for i in range(len(calls))] == [
            first[i].essence for i in range(len(calls))
        ]


def test_a_program_scores_each_component_and_records_its_engine_calls(gateway):
    url, _ = gateway
    items = sums(8, seed=5)
    r = post(url, "/v1/rewards", {"model": "math", "items": items})
    assert r.status_code == 200, r.text
    out = r.json()
    for item, reward, detail in zip(items, out["rewards"], out["details"]):
        comps = {c["name"]: c for c in detail["components"]}
        assert list(comps) == ["rm", "judge", "correct"] and detail["failed"] == []
        assert comps["correct"]["score"] == float(item["response"] == item["label"])
        assert comps["rm"]["transformed"] == min(max(comps["rm"]["score"], -10.0), 10.0)
        total = 0.0
        for c in detail["components"]:
            total += c["weight"] * c["transformed"]
        assert reward == total
        # each model component's engine answer is recorded (ledger) and named
        assert len(detail["receipts"]) == 2
        assert comps["rm"]["receipt"] in detail["receipts"]
    time.sleep(1.0)  # the ledger writer flushes every 0.2 s
    receipt = out["details"][0]["components"][0]["receipt"]
    row = httpx.get(f"{url}/v1/ledger/{receipt}", timeout=30)
    assert row.status_code == 200 and row.json()["model"] == "rm"


def test_a_hanging_rule_is_cut_off_under_each_on_failure(gateway):
    url, _ = gateway
    items = [
        {"prompt": "2+2=", "response": "4", "label": "4"},
        {"prompt": "say a", "response": HANG, "label": "a"},
    ]
    start = time.monotonic()
    strict = post(url, "/v1/rewards", {"model": "math_strict", "items": items})
    assert strict.status_code == 422, strict.text
    err = strict.json()["error"]
    assert err["code"] == "reward_component_failed"
    assert (
        "item 1" in err["message"] and "'shape'" in err["message"] and "timeout" in err["message"]
    )
    assert time.monotonic() - start < 60

    skip = post(url, "/v1/rewards", {"model": "math_skip", "items": items}).json()
    assert skip["details"][0]["failed"] == [] and skip["details"][1]["failed"] == ["shape"]
    shape = skip["details"][1]["components"][3]
    assert shape["status"] == "failed" and shape["reason"] == "timeout"
    assert skip["details"][0]["components"][3]["score"] == 0.0  # "4" is no run of a's

    before = httpx.get(url + "/metrics", timeout=30).text
    default = post(url, "/v1/rewards", {"model": "math_default", "items": items}).json()
    assert default["rewards"][1] == -1.0 and default["details"][1]["default_used"] is True
    assert default["rewards"][0] == skip["rewards"][0]  # the same components, bitwise
    after = httpx.get(url + "/metrics", timeout=30).text
    assert (
        _metric(after, 'rmgate_reward_defaults_total{program="math_default"}')
        == _metric(before, 'rmgate_reward_defaults_total{program="math_default"}') + 1
    )

    masked = post(url, "/v1/rewards", {"model": "math_mask", "items": items}).json()
    assert masked["rewards"][1] is None and masked["details"][1]["mask"] is True
    assert "timeout" in masked["details"][1]["mask_reason"]
    assert masked["rewards"][0] == skip["rewards"][0]  # an unfailed item: the same bits
    metrics_text = httpx.get(url + "/metrics", timeout=30).text
    assert _metric(metrics_text, 'rmgate_rewards_masked_total{model="math_mask"}') >= 1
    from gateway.client.trl import reward_function

    trl_reward = reward_function(url, "math_mask", label_key="answer")
    try:
        got = trl_reward(
            prompts=[i["prompt"] for i in items],
            completions=[i["response"] for i in items],
            answer=[i["label"] for i in items],
        )
    finally:
        trl_reward.client.close()
    assert got == masked["rewards"]  # None for the masked item: TRL leaves it out

    logs = post(
        url,
        "/get_reward",
        {"query": ["2+2=4", "say a" + HANG], "prompts": ["2+2=", "say a"], "labels": ["4", "a"]},
    ).json()["extra_logs"]
    assert set(logs) == {"parsed"}  # /get_reward's default is the DisRM here


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_trainer_functions_score_a_program_as_v1_rewards(gateway):
    """TRL's reward function and verl's compute_score naming the program: the rewards
    /v1/rewards gives, and verl's logged keys carry each component."""
    from gateway.client.trl import reward_function
    from gateway.client.verl import compute_score

    url, _ = gateway
    items = sums(4, seed=6)
    want = post(url, "/v1/rewards", {"model": "math", "items": items}).json()
    trl_reward = reward_function(url, "math", label_key="answer")
    try:
        got = trl_reward(
            prompts=[i["prompt"] for i in items],
            completions=[[{"role": "assistant", "content": i["response"]}] for i in items],
            answer=[i["label"] for i in items],
            trainer_state=None,
        )
    finally:
        trl_reward.client.close()
    assert trl_reward.__name__ == "math" and got == want["rewards"]
    verl = compute_score(
        "sums",
        items[0]["response"],
        items[0]["label"],
        {"prompt": items[0]["prompt"]},
        reward_router_address=url.removeprefix("http://"),
        model="math",
    )
    comps = {c["name"]: c for c in want["details"][0]["components"]}
    assert verl["score"] == want["rewards"][0]
    assert verl["rmgate_correct"] == comps["correct"]["transformed"]
    assert verl["rmgate_judge"] == comps["judge"]["transformed"]
    assert verl["rmgate_failed_components"] == 0.0
