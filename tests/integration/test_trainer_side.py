"""Trainer-facing paths on the real gateway: RewardClient, verl, OpenRLHF, openai, JSON."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import openai
import pytest

from deployments.demo.training import sum_items, sums_split
from gateway.client import RewardClient
from gateway.client.verl import compute_score

pytestmark = pytest.mark.integration


def _key(item: dict) -> str:
    return json.dumps(item, sort_keys=True)


@pytest.mark.parametrize("model,n", [("rm", 128), ("judge", 48)])
def test_reward_client_runs_match_in_submission_order(gateway, model, n):
    url, _ = gateway
    items = sum_items(n)
    order_a, order_b = list(items), list(items)
    random.Random(1).shuffle(order_a)
    random.Random(2).shuffle(order_b)
    run_a = RewardClient(url, model=model, concurrency=1, batch_size=1).score(order_a)
    run_b = RewardClient(url, model=model, concurrency=64, batch_size=3).score(order_b)
    by_item = {_key(it): r for it, r in zip(order_a, run_a)}
    assert run_b == [by_item[_key(it)] for it in order_b]  # same bits, submission order
    assert len(set(run_a)) > 1


def test_disrm_ranks_right_above_wrong_through_the_gateway(gateway):
    url, _ = gateway
    _, held_out = sums_split()
    client = RewardClient(url, model="rm", concurrency=16)
    right = client.score(
        [{"prompt": f"{s.a}+{s.b}=", "response": str(s.a + s.b)} for s in held_out]
    )
    wrong = client.score([{"prompt": f"{s.a}+{s.b}=", "response": str(s.c)} for s in held_out])
    wins = sum(r > w for r, w in zip(right, wrong))
    assert wins >= 0.9 * len(held_out), f"{wins}/{len(held_out)}"


def test_grm_judge_answers_in_its_parser_format(gateway):
    url, _ = gateway
    detailed = RewardClient(url, model="judge").score_detailed(sum_items(24, seed=5))
    parsed = [r for r, d in detailed if d["parsed"]]
    # Sampled at temperature 1.0 (the test config), the tiny judge still keeps its format.
    assert len(parsed) >= 0.8 * len(detailed), [d["judge_text"] for _, d in detailed]
    assert set(parsed) <= {0.0, 1.0}


@pytest.mark.parametrize(
    "path,body",
    [
        ("/classify", {"model": "rm", "input": "3+4=7 ✓", "use_activation": False}),
        (
            "/v1/chat/completions",
            {"model": "judge", "messages": [{"role": "user", "content": "Is 3+4=7 right? ü"}]},
        ),
        ("/v1/rewards", {"model": "rm", "items": [{"prompt": "3+4=", "response": "7 ü"}]}),
    ],
)
def test_json_spellings_land_on_the_same_slot_with_the_same_result(gateway, path, body):
    url, _ = gateway
    compact = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    aiohttp_style = json.dumps(body).encode()  # ", " / ": " and \\u escapes
    answers = [
        httpx.post(
            url + path, content=raw, timeout=120, headers={"content-type": "application/json"}
        )
        for raw in (compact, aiohttp_style)
    ]
    assert all(a.status_code == 200 for a in answers)
    strip = lambda d: {k: v for k, v in d.items() if k not in ("id", "created")}  # noqa: E731
    assert strip(answers[0].json()) == strip(answers[1].json())
    if path != "/v1/rewards":
        assert answers[0].headers["x-rmgate-slot"] == answers[1].headers["x-rmgate-slot"]
        assert answers[0].headers["x-rmgate-key"] == answers[1].headers["x-rmgate-key"]


def test_verl_compute_score_matches_verls_own_classify_path(gateway, demo_models):
    """compute_score (DisRM) == verl's built-in /classify body on the chat-templated text."""
    from transformers import AutoTokenizer

    url, _ = gateway
    address = url.removeprefix("http://")
    got = compute_score(
        "sums", "7", "7", {"question": "3+4="}, reward_router_address=address, model="rm"
    )
    tok = AutoTokenizer.from_pretrained(str(demo_models / "disrm"))
    chat = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
    text = tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    if tok.bos_token and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token) :]
    for flag in ("use_activation", "activation"):  # vLLM >= 0.11.2 and older verl bodies
        verl_body = {"model": str(demo_models / "disrm"), "input": text, flag: False}
        r = httpx.post(url + "/classify", json=verl_body, timeout=60)
        assert r.status_code == 200, r.text
        assert got["score"] == r.json()["data"][-1]["probs"][-1]
    assert set(got) == {"score", "rmgate_masked", "rmgate_slot", "rmgate_parsed"}
    judged = compute_score(
        "sums", "7", "7", {"question": "3+4="}, reward_router_address=address, model="judge"
    )
    assert judged["score"] in (0.0, 1.0, -1.0)  # -1.0: the test config's parse default


def test_openrlhf_get_reward(gateway):
    url, _ = gateway
    body = {
        "query": [
            "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n7<|im_end|>\n",
            "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n9<|im_end|>\n",
        ],
        "prompts": ["<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"] * 2,
        "labels": ["7", None],
    }
    r = httpx.post(url + "/get_reward", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert len(out["rewards"]) == 2 and out["scores"] == out["rewards"]
    assert out["rewards"][0] > out["rewards"][1]  # right above wrong
    assert httpx.post(url + "/get_reward", json=body, timeout=60).json() == out
    empty = httpx.post(
        url + "/get_reward", json={"query": [], "prompts": [], "labels": []}, timeout=60
    )
    assert empty.status_code == 200 and empty.json()["rewards"] == []


def test_get_reward_takes_what_openrlhf_sends(gateway):
    """Any JSON label, and a query longer than the DisRM's context: truncated, not 400."""
    url, _ = gateway
    prompt = "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + "7<|im_end|>\n<|endoftext|>"
    labels = [["7"], {"answer": 7}, 7, True]
    body = {"query": [query] * 4, "prompts": [prompt] * 4, "labels": labels}
    r = httpx.post(url + "/get_reward", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert set(r.json()["extra_logs"]) == {"parsed"}
    long_query = prompt + "7 " * 3000 + "<|im_end|>"  # far beyond max_model_len 1024
    r = httpx.post(url + "/get_reward", json={"query": [long_query]}, timeout=120)
    assert r.status_code == 200, r.text
    # (the GRM behind /get_reward: tests/unit/test_rewards.py, its text is checked there)


def test_openai_stream_true_is_a_clear_400(gateway):
    url, _ = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.chat.completions.create(
            model="judge", stream=True, messages=[{"role": "user", "content": "hi"}]
        )


@pytest.mark.parametrize(
    "method,path,content",
    [
        ("POST", "/v1/rewards", b"{"),
        ("POST", "/v1/rewards", b'{"items": 3}'),
        ("POST", "/get_reward", b"[]"),
        ("POST", "/classify", b'{"model": "judge", "input": "x"}'),
        ("POST", "/v1/completions", b'{"model": "judge", "prompt": "x", "max_tokens": 0}'),
        ("GET", "/v1/rewards", b""),
        ("GET", "/nowhere", b""),
        ("GET", "/health", b""),
        ("GET", "/v1/models", b""),
    ],
)
def test_every_answer_is_application_json(gateway, method, path, content):
    url, _ = gateway
    r = httpx.request(
        method,
        url + path,
        content=content or None,
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert r.headers["content-type"] == "application/json", (r.status_code, r.text)
    r.json()


def test_example_ppo_loop_reports_bitwise_match(gateway):
    import subprocess
    import sys

    url, _ = gateway
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(repo / "examples" / "ppo_loop.py"), "--url", url, "--batch", "32"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "match bitwise: True" in out.stdout
