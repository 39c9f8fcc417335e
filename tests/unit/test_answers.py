"""One definition of "the same answer" (gateway.core.api.answers), and every place that uses it."""

from __future__ import annotations

import ast
import copy
import importlib
import json
import math
import sys
from pathlib import Path

import httpx
import pytest

from gateway.core.api import answers
from gateway.core.api.answers import Answer, answer_of, same_answer

REPO = Path(__file__).resolve().parents[2]


def up(x: float) -> float:
    """The next double above ``x``: one ulp."""
    return math.nextafter(x, math.inf)


def chat(**over) -> dict:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "judge",
        "system_fingerprint": "fp-a",
        "prompt_token_ids": [1, 2, 3],
        "prompt_logprobs": None,
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [7, 8],
                "message": {
                    "role": "assistant",
                    "content": "Score: 1",
                    "reasoning_content": None,
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-aaa",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "logprobs": {
                    "content": [
                        {
                            "token": "Score",
                            "logprob": -0.25,
                            "bytes": [83],
                            "top_logprobs": [{"token": "Score", "logprob": -0.25, "bytes": [83]}],
                        },
                        {
                            "token": ": 1",
                            "logprob": -1.5,
                            "bytes": [58],
                            "top_logprobs": [{"token": ": 1", "logprob": -1.5, "bytes": [58]}],
                        },
                    ]
                },
            }
        ],
    }
    body.update(over)
    return body


def completion() -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "judge",
        "usage": {"completion_tokens": 2},
        "choices": [
            {
                "index": 0,
                "text": "yes",
                "finish_reason": "stop",
                "stop_reason": 2,
                "token_ids": [5, 6],
                "prompt_token_ids": [1],
                "logprobs": {
                    "tokens": ["y", "es"],
                    "token_logprobs": [-0.5, -0.125],
                    "text_offset": [0, 1],
                    "top_logprobs": [{"y": -0.5}, {"es": -0.125}],
                },
            }
        ],
    }


def classify() -> dict:
    return {
        "id": "classify-1",
        "object": "list",
        "created": 1,
        "model": "rm",
        "usage": {"prompt_tokens": 4},
        "data": [
            {"index": 0, "label": "LABEL_0", "probs": [0.1, 0.7], "num_classes": 2},
            {"index": 1, "label": "LABEL_0", "probs": [0.3, 0.2], "num_classes": 2},
        ],
    }


def pooling() -> dict:
    return {
        "id": "pool-1",
        "created": 1,
        "model": "rm",
        "usage": {},
        "data": [{"index": 0, "object": "pooling", "data": [[0.5, -0.25], [1.0, 2.0]]}],
    }


def rewards() -> dict:
    return {
        "model": "judge",
        "rewards": [1.0, 0.0],
        "details": [
            {
                "index": 0,
                "key": "0000abcd",
                "slot": "0",
                "seed": 12,
                "judge_text": "Score: 1",
                "parsed": True,
            },
            {
                "index": 1,
                "key": "0000abce",
                "slot": "1",
                "seed": 13,
                "judge_text": "no idea",
                "parsed": False,
                "error": "no score found by parser 'score'; default used",
            },
        ],
    }


def get_reward() -> dict:
    return {"rewards": [0.75, 0.5], "scores": [0.75, 0.5], "extra_logs": {"parsed": [1.0, 1.0]}}


CASES = {
    "/v1/chat/completions": chat,
    "/v1/completions": completion,
    "/classify": classify,
    "/pooling": pooling,
    "/v1/rewards": rewards,
    "/get_reward": get_reward,
}


@pytest.mark.parametrize("path", list(CASES))
def test_equal_answers_with_other_ids_times_usage_and_model_are_the_same(path):
    a, b = CASES[path](), CASES[path]()
    other = {
        "id": "other-2",
        "created": 1700000099,
        "usage": {"prompt_tokens": 99},
        "model": "judge-v2",
        "system_fingerprint": "fp-b",
        "object": "x",
    }
    b.update({k: v for k, v in other.items() if k in b})
    if path == "/v1/rewards":
        for d in b["details"]:
            d.update(key="ffffffff", slot="3", seed=99)  # routing provenance, not the answer
    if path == "/v1/chat/completions":
        b["choices"][0]["message"]["tool_calls"][0]["id"] = "chatcmpl-tool-bbb"
    assert same_answer(path, a, b)
    assert answer_of(path, a) == answer_of(path, b)
    assert hash(answer_of(path, a)) == hash(answer_of(path, b))


def _mutations():
    """(path, what, change): each changes one thing a consumer reads, minimally."""

    def at(obj, *keys):
        for k in keys[:-1]:
            obj = obj[k]
        return obj, keys[-1]

    def bump(*keys):
        def f(p):
            o, k = at(p, *keys)
            o[k] = up(o[k])

        return f

    def setv(value, *keys):
        def f(p):
            o, k = at(p, *keys)
            o[k] = value

        return f

    c = ("choices", 0)
    yield "/v1/chat/completions", "logprob", bump(*c, "logprobs", "content", 1, "logprob")
    yield (
        "/v1/chat/completions",
        "top logprob",
        bump(*c, "logprobs", "content", 0, "top_logprobs", 0, "logprob"),
    )
    yield "/v1/chat/completions", "token id", setv(9, *c, "token_ids", 1)
    yield "/v1/chat/completions", "prompt token id", setv(4, "prompt_token_ids", 2)
    yield "/v1/chat/completions", "finish_reason", setv("stop", *c, "finish_reason")
    yield "/v1/chat/completions", "stop_reason", setv(2, *c, "stop_reason")
    yield "/v1/chat/completions", "content", setv("Score: 0", *c, "message", "content")
    yield "/v1/chat/completions", "reasoning", setv("hm", *c, "message", "reasoning_content")
    yield (
        "/v1/chat/completions",
        "tool call",
        setv("{ }", *c, "message", "tool_calls", 0, "function", "arguments"),
    )
    yield "/v1/completions", "token logprob", bump(*c, "logprobs", "token_logprobs", 1)
    yield "/v1/completions", "top logprob", bump(*c, "logprobs", "top_logprobs", 0, "y")
    yield "/v1/completions", "text", setv("yes!", *c, "text")
    yield "/v1/completions", "token id", setv(0, *c, "token_ids", 0)
    yield "/v1/completions", "finish_reason", setv("length", *c, "finish_reason")
    yield "/classify", "probs value", bump("data", 1, "probs", 0)
    yield "/classify", "item index", setv(2, "data", 1, "index")
    yield "/pooling", "pooled value", bump("data", 0, "data", 1, 0)
    yield "/v1/rewards", "reward", bump("rewards", 0)
    yield "/v1/rewards", "judge text", setv("Score: 1 ", "details", 0, "judge_text")
    yield "/v1/rewards", "parsed flag", setv(False, "details", 0, "parsed")
    yield "/get_reward", "reward", bump("rewards", 1)
    yield "/get_reward", "score", bump("scores", 0)
    yield "/get_reward", "parsed", setv(0.0, "extra_logs", "parsed", 1)


@pytest.mark.parametrize(
    "path,what,change", list(_mutations()), ids=[f"{p}:{w}" for p, w, _ in _mutations()]
)
def test_one_changed_thing_is_a_different_answer(path, what, change):
    a = CASES[path]()
    b = copy.deepcopy(a)
    change(b)
    assert b != a, what
    assert not same_answer(path, a, b)
    assert answer_of(path, a) != answer_of(path, b)


def test_disrm_reward_details_compare_the_raw_score():
    a = {"rewards": [0.5], "details": [{"index": 0, "slot": "0", "raw_score": 0.5}]}
    b = copy.deepcopy(a)
    b["details"][0]["raw_score"] = up(0.5)
    assert not same_answer("/v1/rewards", a, b)


def test_bitwise_not_numeric_equality():
    def probs(v):
        return {"data": [{"index": 0, "probs": [v]}]}

    assert not same_answer("/classify", probs(0.0), probs(-0.0))
    assert not same_answer("/classify", probs(1), probs(1.0))
    assert not same_answer("/get_reward", {"rewards": [1.0]}, {"rewards": [True]})
    # a JSON float round-trips: the canonical text of a parsed body is the body's number
    x = 0.1 + 0.2
    assert json.loads(answer_of("/classify", probs(x)).canonical) == [[0, [x]]]


def test_choices_and_items_in_index_order_and_absent_is_null():
    a = classify()
    b = classify()
    b["data"].reverse()
    assert same_answer("/classify", a, b)
    two = chat()
    two["choices"].append({**copy.deepcopy(two["choices"][0]), "index": 1, "finish_reason": "stop"})
    swapped = copy.deepcopy(two)
    swapped["choices"].reverse()
    assert same_answer("/v1/chat/completions", two, swapped)
    lean = chat()
    del lean["prompt_logprobs"], lean["choices"][0]["stop_reason"]
    del lean["choices"][0]["message"]["reasoning_content"]
    assert same_answer("/v1/chat/completions", chat(), lean)
    assert same_answer("/v1/chat/completions/?x=1", chat(), lean)  # path normalized


def test_only_the_first_choice_is_not_enough():
    two = chat()
    two["choices"].append({**copy.deepcopy(two["choices"][0]), "index": 1})
    other = copy.deepcopy(two)
    other["choices"][1]["message"]["content"] = "Score: 0"
    assert not same_answer("/v1/chat/completions", two, other)


@pytest.mark.parametrize(
    "path,payload",
    [
        ("/v1/chat/completions", {"choices": []}),
        ("/v1/chat/completions", {"object": "error"}),
        ("/v1/chat/completions", {"choices": [{"index": 0, "text": "no message"}]}),
        ("/classify", {"data": [{"index": 0}]}),
        ("/pooling", {"data": None}),
        ("/v1/rewards", {"details": []}),
        ("/get_reward", {"scores": [1.0]}),
        ("/classify", ["not", "an", "object"]),
        ("/classify", {"data": [{"index": 0, "probs": [float("nan")]}]}),
        (
            "/v1/completions",
            {
                "choices": [
                    {"index": 0, "text": "", "logprobs": {"token_logprobs": [float("-inf")]}}
                ]
            },
        ),
    ],
)
def test_what_is_not_an_answer_raises_value_error(path, payload):
    with pytest.raises(ValueError):
        answer_of(path, payload)


def test_unknown_paths_compare_everything_but_the_volatile_fields():
    a = {"id": "1", "created": 1, "usage": {"n": 1}, "results": [{"score": 0.5}]}
    b = {"id": "2", "created": 2, "usage": {"n": 2}, "results": [{"score": 0.5}]}
    assert same_answer("/score", a, b)
    b["results"][0]["score"] = up(0.5)
    assert not same_answer("/score", a, b)


def test_the_core_module_imports_only_the_standard_library():
    tree = ast.parse(Path(answers.__file__).read_text())
    roots = {
        (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    roots |= {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


# --- every call site uses the one definition -------------------------------------------------


def test_rmgate_check_uses_it():
    from gateway.client import check

    assert check.essence is answer_of
    ref = {0: check.Result(200, answer_of("/classify", classify()), "0", None, None)}
    moved = classify()
    moved["data"][0]["probs"][1] = up(0.7)
    run = {0: check.Result(200, answer_of("/classify", moved), "0", None, None)}
    v = check.compare("x", ref, run)
    assert v.differing == 1 and 0 < v.max_abs_diff < 1e-15
    same = answer_of("/classify", {**classify(), "id": "z", "created": 9})
    again = {0: check.Result(200, same, "0", None, None)}
    assert check.compare("y", ref, again).identical == 1


def test_the_selftest_uses_it(monkeypatch):
    from deployments.engine import selftest

    seen = []

    def spy(path, payload):
        seen.append(path)
        return answer_of(path, payload)

    monkeypatch.setattr(selftest, "answer_of", spy)

    def engine(request: httpx.Request) -> httpx.Response:
        """A /classify engine: one item per input, a one-input list or a bare string."""
        inputs = json.loads(request.content)["input"]
        n = len(inputs) if isinstance(inputs, list) else 1
        item = classify()["data"][0]
        return httpx.Response(
            200,
            json={
                **classify(),
                "id": str(id(request)),
                "data": [{**item, "index": i} for i in range(n)],
            },
        )

    result = selftest.run_selftest(
        "http://e", "discriminative", "m", transport=httpx.MockTransport(engine)
    )
    assert result.passed and set(seen) == {"/classify"}
    assert len(seen) == 3 * len(selftest.PROBE_TEXTS)  # warm-up, alone, batched
    assert not hasattr(selftest, "comparable")


@pytest.mark.parametrize(
    "module,name",
    [("benchmarks.side_by_side", "answer"), ("benchmarks.gpu.bench_gpu", "result_of")],
)
def test_the_benchmarks_use_it(monkeypatch, module, name):
    mod = importlib.import_module(module)
    fn = getattr(mod, name)
    assert mod.answer_of is answer_of
    for path, make in CASES.items():
        assert fn(path, make()) == answer_of(path, make()).canonical
    # stricter than before: a logprob, a finish_reason, a second choice now count
    a, b = chat(), chat()
    b["choices"][0]["logprobs"]["content"][0]["logprob"] = up(-0.25)
    assert fn("/v1/chat/completions", a) != fn("/v1/chat/completions", b)
    b = chat()
    b["choices"][0]["finish_reason"] = "stop"
    assert fn("/v1/chat/completions", a) != fn("/v1/chat/completions", b)
    calls = []
    monkeypatch.setattr(mod, "answer_of", lambda p, x: calls.append(p) or Answer("x", None))
    assert fn("/classify", classify()) == "x" and calls == ["/classify"]
