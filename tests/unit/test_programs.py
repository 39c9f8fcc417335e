"""Scorers and reward programs against a fake engine and the real rule pool: the seam keeps
today's bits, logprob judges read exact label probabilities, programs combine in a fixed
order, and every failure is explicit (never a silent 0)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gateway.core.api.errors import RewardComponentFailed
from gateway.core.api.results import EngineReply
from gateway.core.config.scoring import ProgramSpec
from gateway.core.config.settings import AppConfig
from gateway.core.scoring.base import RewardInput
from gateway.core.scoring.model_scorers import expected_value, label_logprobs, yes_probability
from gateway.core.scoring.programs import ComponentScore, apply_transform, combine
from gateway.core.service import RewardService
from gateway.http.app import create_app
from gateway.observability import metrics
from gateway.rules import checks
from gateway.rules.pool import RulePool
from tests.unit.test_rewards import CONFIG, JudgeTransport

BEFORE = Path(__file__).parent / "data" / "rewards_before_scorer_seam.json"
HANG = "a" * 40 + "b"  # (a+)+$ backtracks for ages on it


def _label_lp(content: str, token: int) -> float:
    """The fake judge's log-probability of ``token``: a function of the prompt."""
    return -((len(content) * 7 + token * 3) % 11) - 0.25


class LabelJudge(JudgeTransport):
    """The fake judge, also answering one-token label reads (``logprob_token_ids``)."""

    async def post(self, model, placement, path, body, deadline):
        data = json.loads(body)
        if "logprob_token_ids" not in data and "prompt_logprobs" not in data:
            return await super().post(model, placement, path, body, deadline)
        self.sent.append((model, placement.home, path, data))
        content = data["messages"][0]["content"]
        if "prompt_logprobs" in data:  # the label appended: the last prompt token's
            token = ord(data["messages"][-1]["content"][-1])
            out = {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "."}}],
                "prompt_logprobs": [
                    None,
                    {str(token): {"logprob": _label_lp(content, token), "rank": 1}},
                ],
            }
            return EngineReply(200, json.dumps(out).encode(), "fp", placement.home)
        if "nolabels" in content:
            top = []
        else:
            top = [
                {"token": f"token_id:{t}", "logprob": _label_lp(content, t)}
                for t in data["logprob_token_ids"]
            ]
        out = {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Y"},
                    "logprobs": {
                        "content": [{"token": "token_id:89", "logprob": -0.1, "top_logprobs": top}]
                    },
                }
            ]
        }
        return EngineReply(200, json.dumps(out).encode(), "fp", placement.home)


YES, NO = [89, 121], [78, 110]  # "Y", "y", "N", "n"
RATINGS = [48, 49, 50, 51, 52]
JUDGE_PROB = {
    "type": "judge_prob",
    "template": "Q {prompt} A {response}",
    "yes": ["Y", "y"],
    "no": ["N", "n"],
    "yes_token_ids": YES,
    "no_token_ids": NO,
}
RATING = {
    "type": "expected_rating",
    "template": "Rate {prompt} {response}",
    "ratings": ["0", "1", "2", "3", "4"],
    "rating_token_ids": RATINGS,
}


def program(name: str, on_failure, extra=()) -> dict:
    return {
        "name": name,
        "on_failure": on_failure,
        "components": [
            {
                "name": "rm",
                "model": "rm",
                "weight": 0.5,
                "transform": [{"affine": {"scale": 2.0, "shift": 1.0}}, {"clip": [-1.0, 3.0]}],
            },
            {"name": "judge", "model": "judge", "scorer": JUDGE_PROB, "weight": 0.25},
            {"name": "correct", "rule": {"type": "math_verify", "timeout_s": 10}},
            *extra,
        ],
    }


HANGING = {
    "name": "shape",
    "rule": {"type": "regex", "pattern": "^(a+)+$", "timeout_s": 0.5},
    "weight": 0.1,
}
PROGRAMS = [
    program("math", "error"),
    program("math_strict", "error", [HANGING]),
    program("math_skip", "skip_component", [HANGING]),
    program("math_default", {"default": -7.5}, [HANGING]),
    {"name": "rating", "components": [{"name": "r", "model": "judge", "scorer": RATING}]},
    {"name": "yes", "components": [{"name": "p", "model": "judge", "scorer": JUDGE_PROB}]},
    {
        "name": "yes_prompt",
        "components": [
            {
                "name": "p",
                "model": "judge",
                "scorer": {**JUDGE_PROB, "answer_prefix": "Score: ", "read": "prompt_logprobs"},
            }
        ],
    },
    {
        "name": "rating_prompt",
        "components": [
            {"name": "r", "model": "judge", "scorer": {**RATING, "read": "prompt_logprobs"}}
        ],
    },
]


@pytest.fixture(scope="module")
def rule_pool():
    pool = RulePool(2)
    yield pool
    pool.close()


@pytest.fixture
async def client(rule_pool):
    cfg = AppConfig.model_validate(
        {**CONFIG, "programs": PROGRAMS, "gateway": {"default_reward_model": "math_default"}}
    )
    transport = LabelJudge()
    app = create_app(RewardService(cfg, transport, rules=rule_pool))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        yield c, transport


# ---- the seam keeps today's bits --------------------------------------------------------
async def test_model_rewards_are_bitwise_those_before_the_scorer_seam():
    """Answers recorded with the code before scorers existed (same fake engine): every
    /v1/rewards and /get_reward body is byte for byte the same now."""
    recorded = json.loads(BEFORE.read_text(encoding="utf-8"))
    changed = []
    for rec in recorded:
        cfg = {**CONFIG, "gateway": {"default_reward_model": rec["default"]}}
        app = create_app(RewardService(AppConfig.model_validate(cfg), JudgeTransport()))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            r = await c.post(rec["path"], json=rec["request"])
        if (r.status_code, r.text) != (rec["status"], rec["body"]):
            changed.append(rec["path"])
    assert len(recorded) == 10 and changed == []


# ---- exact label probabilities ----------------------------------------------------------
def test_yes_probability_and_expected_rating_by_hand():
    assert yes_probability([math.log(0.3)], [math.log(0.1)]) == pytest.approx(0.75)
    # two yes tokens, one no: (0.2 + 0.1) / (0.2 + 0.1 + 0.3)
    assert yes_probability([math.log(0.2), math.log(0.1)], [math.log(0.3)]) == pytest.approx(0.5)
    # log-probabilities far below exp's range still give the ratio (no 0/0)
    assert yes_probability([-2000.0], [-2000.0 - math.log(3)]) == pytest.approx(0.75)
    assert expected_value(
        [math.log(0.5), math.log(0.25), math.log(0.25)], [0, 1, 2]
    ) == pytest.approx(0.75)


def test_label_logprobs_are_read_by_token_id_and_a_missing_one_is_named():
    answer = {
        "choices": [
            {
                "logprobs": {
                    "content": [
                        {
                            "token": "token_id:5",
                            "logprob": -0.5,
                            "top_logprobs": [{"token": "token_id:7", "logprob": -3.0}],
                        }
                    ]
                }
            }
        ]
    }
    assert label_logprobs(answer, [5, 7]) == {5: -0.5, 7: -3.0}  # the sampled one counts
    with pytest.raises(KeyError, match=r"\[9\]"):
        label_logprobs(answer, [5, 9])


async def test_judge_prob_and_expected_rating_equal_the_hand_computation(client):
    c, transport = client
    items = [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(5)]
    yes = (await c.post("/v1/rewards", json={"model": "yes", "items": items})).json()
    rating = (await c.post("/v1/rewards", json={"model": "rating", "items": items})).json()
    for i, it in enumerate(items):
        content = f"Q {it['prompt']} A {it['response']}"
        lp = {t: _label_lp(content, t) for t in YES + NO}
        p_yes = sum(math.exp(lp[t]) for t in YES)
        p_no = sum(math.exp(lp[t]) for t in NO)
        assert yes["rewards"][i] == pytest.approx(p_yes / (p_yes + p_no), rel=1e-12)
        assert 0.0 <= yes["rewards"][i] <= 1.0
        content = f"Rate {it['prompt']} {it['response']}"
        ps = [math.exp(_label_lp(content, t)) for t in RATINGS]
        assert rating["rewards"][i] == pytest.approx(
            sum(p * v for p, v in zip(ps, range(5))) / sum(ps), rel=1e-12
        )
        assert 0.0 <= rating["rewards"][i] <= 4.0
        comp = rating["details"][i]["components"][0]
        assert comp["status"] == "ok" and set(comp["label_logprobs"]) == {str(t) for t in RATINGS}
    sent = [d for _, _, _, d in transport.sent if "logprob_token_ids" in d][0]
    assert sent["max_tokens"] == 1 and sent["temperature"] == 0 and sent["logprobs"] is True
    assert sent["return_tokens_as_token_ids"] is True


async def test_prompt_logprobs_reads_the_same_values_one_request_per_label(client):
    c, transport = client
    items = [{"prompt": f"{i}*2=", "response": str(2 * i)} for i in range(4)]
    for direct, per_label, n in (("yes", "yes_prompt", 4), ("rating", "rating_prompt", 5)):
        transport.sent.clear()
        a = (await c.post("/v1/rewards", json={"model": direct, "items": items})).json()
        b = (await c.post("/v1/rewards", json={"model": per_label, "items": items})).json()
        assert a["rewards"] == b["rewards"]  # the fake's log-probabilities: the same bits
        reads = [d for _, _, _, d in transport.sent if "prompt_logprobs" in d]
        assert len(reads) == n * len(items)
        assert all(d["continue_final_message"] and d["prompt_logprobs"] == 0 for d in reads)
    prefixed = [d["messages"][-1]["content"] for d in reads][:5]
    assert prefixed == ["0", "1", "2", "3", "4"]


async def test_a_model_scorer_that_cannot_read_its_answer_is_502(rule_pool):
    cfg = {**CONFIG, "models": [{**CONFIG["models"][0], "scorer": JUDGE_PROB}, CONFIG["models"][1]]}
    app = create_app(RewardService(AppConfig.model_validate(cfg), LabelJudge()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        r = await c.post(
            "/v1/rewards",
            json={"model": "judge", "items": [{"prompt": "nolabels", "response": "x"}]},
        )
        models = (await c.get("/v1/models")).json()
    assert r.status_code == 502 and r.json()["error"]["code"] == "score_unreadable"
    assert "item 0" in r.json()["error"]["message"]
    judge = next(m for m in models["data"] if m["id"] == "judge")
    assert judge["scorer"]["yes_token_ids"] == YES


# ---- programs ---------------------------------------------------------------------------
async def test_a_program_reports_each_component_and_combines_in_order(client):
    c, _ = client
    items = [
        {"prompt": "1/2 as a decimal?", "response": "\\boxed{0.5}", "label": "\\frac{1}{2}"},
        {"prompt": "2+2=", "response": "5", "label": 4},
    ]
    r = await c.post("/v1/rewards", json={"model": "math", "items": items})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == "math"
    for reward, detail in zip(out["rewards"], out["details"]):
        comps = {x["name"]: x for x in detail["components"]}
        assert [x["name"] for x in detail["components"]] == ["rm", "judge", "correct"]
        assert all(x["status"] == "ok" for x in comps.values()) and detail["failed"] == []
        rm = comps["rm"]
        assert rm["transformed"] == min(max(rm["score"] * 2.0 + 1.0, -1.0), 3.0)
        expected = 0.0
        for x in detail["components"]:
            expected += x["weight"] * x["transformed"]
        assert reward == expected  # bitwise: the same order of additions
        assert "receipt" not in rm or rm["receipt"]  # no ledger here: none
    assert [x["score"] for x in out["details"][0]["components"]][2] == 1.0
    assert [x["score"] for x in out["details"][1]["components"]][2] == 0.0
    again = (await c.post("/v1/rewards", json={"model": "math", "items": items[::-1]})).json()
    assert again["rewards"] == out["rewards"][::-1]


async def test_a_hanging_rule_is_cut_off_and_each_on_failure_policy_acts(client):
    c, _ = client
    items = [
        {"prompt": "say a", "response": HANG, "label": "a"},
        {"prompt": "say a", "response": "aaa", "label": "a"},
    ]
    before = metrics.REWARD_DEFAULTS.labels("math_default")._value.get()
    timeouts = metrics.COMPONENT_FAILURES.labels("math_skip", "shape", "timeout")._value.get()

    strict = await c.post("/v1/rewards", json={"model": "math_strict", "items": items})
    assert strict.status_code == 422
    err = strict.json()["error"]
    assert err["code"] == "reward_component_failed" and "'shape'" in err["message"]
    assert "timeout" in err["message"] and "item 0" in err["message"]

    skip = (await c.post("/v1/rewards", json={"model": "math_skip", "items": items})).json()
    d0, d1 = skip["details"]
    assert d0["failed"] == ["shape"] and d0["default_used"] is False
    shape = d0["components"][3]
    assert shape["status"] == "failed" and shape["reason"] == "timeout"
    assert shape["transformed"] is None
    others = 0.0
    for x in d0["components"][:3]:
        others += x["weight"] * x["transformed"]
    assert skip["rewards"][0] == others
    assert d1["failed"] == [] and d1["components"][3]["score"] == 1.0

    default = (await c.post("/v1/rewards", json={"model": "math_default", "items": items})).json()
    assert default["rewards"][0] == -7.5 and default["details"][0]["default_used"] is True
    assert default["details"][1]["default_used"] is False and default["rewards"][1] != -7.5
    assert metrics.REWARD_DEFAULTS.labels("math_default")._value.get() == before + 1
    assert (
        metrics.COMPONENT_FAILURES.labels("math_skip", "shape", "timeout")._value.get()
        == timeouts + 1
    )


async def test_get_reward_logs_one_series_per_component(client):
    c, _ = client
    r = await c.post(
        "/get_reward",
        json={
            "query": [
                "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
                "<|im_start|>user\nsay a<|im_end|>\n<|im_start|>assistant\n" + HANG,
            ],
            "prompts": [
                "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n",
                "<|im_start|>user\nsay a<|im_end|>\n<|im_start|>assistant\n",
            ],
            "labels": ["4", "a"],
        },
    )
    assert r.status_code == 200, r.text
    out = r.json()  # default_reward_model: math_default
    logs = out["extra_logs"]
    assert set(logs) == {"rm", "judge", "correct", "shape", "failed_components", "default_used"}
    assert logs["correct"][0] == 1.0 and logs["default_used"] == [0.0, 1.0]
    assert logs["failed_components"] == [0.0, 1.0] and out["rewards"][1] == -7.5
    # an empty shard answers the same keys (OpenRLHF gathers them across shards)
    empty = (await c.post("/get_reward", json={"query": []})).json()
    assert empty["extra_logs"] == {k: [] for k in logs}


def test_combine_policies_and_transform_order():
    spec = ProgramSpec.model_validate(
        {
            "name": "p",
            "components": [
                {"name": "a", "rule": {"type": "exact_match"}},
                {"name": "b", "rule": {"type": "exact_match"}},
            ],
        }
    )
    ok = ComponentScore("a", 0.5, 1.0, 1.0)
    bad = ComponentScore("b", 1.0, None, None, "crashed", "worker died")
    with pytest.raises(RewardComponentFailed, match="crashed"):
        combine(spec, [ok, bad], 3)
    skip = spec.model_copy(update={"on_failure": "skip_component"})
    assert combine(skip, [ok, bad], 0).reward == 0.5
    with pytest.raises(RewardComponentFailed, match="every component"):
        combine(skip, [bad, bad], 0)
    from gateway.core.config.scoring import AffineStep, AffineWrap, ClipStep

    steps = [ClipStep(clip=(0, 1)), AffineWrap(affine=AffineStep(scale=10, shift=-1))]
    assert apply_transform(5.0, steps) == 9.0 and apply_transform(5.0, steps[::-1]) == 1.0


def test_rule_checks():
    assert checks.exact_match(" 5 ", "5", strip=True, case_sensitive=True) == 1.0
    assert checks.exact_match("Yes", "yes", strip=True, case_sensitive=False) == 1.0
    assert checks.regex("answer: 42", "42", pattern=r"answer: (\d+)", compare="label") == 1.0
    assert checks.regex("nothing", None, pattern=r"\d", compare="none") == 0.0
    assert checks.numeric("it is 3.0000001", "3", tolerance=1e-6, relative=False) == 1.0
    assert checks.numeric("it is 3.1", "3", tolerance=0.01, relative=True) == 0.0
    assert checks.math_equivalent("so \\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert checks.length_penalty("a b c d", None, max_length=2, unit="words", penalty=0.5) == -1.0
    with pytest.raises(ValueError, match="label"):
        checks.numeric("3", None, tolerance=0, relative=False)


def test_config_checks_programs_and_scorers_at_load():
    base = {**CONFIG, "programs": PROGRAMS}
    AppConfig.model_validate(base)
    bad = [
        {**CONFIG, "models": [{**CONFIG["models"][1], "scorer": {"type": "judge_prob"}}]},
        {
            **base,
            "programs": [
                {"name": "judge", "components": [{"name": "x", "rule": {"type": "exact_match"}}]}
            ],
        },  # a model's name
        {**base, "programs": [{"name": "p", "components": [{"name": "x", "model": "nope"}]}]},
        {
            **base,
            "programs": [
                {
                    "name": "p",
                    "components": [{"name": "x", "model": "rm", "scorer": {"type": "judge_text"}}],
                }
            ],
        },
        {
            **base,
            "programs": [
                {
                    "name": "p",
                    "components": [{"name": "x", "model": "rm", "rule": {"type": "exact_match"}}],
                }
            ],
        },
        {
            **base,
            "programs": [
                {
                    "name": "p",
                    "components": [{"name": "x", "rule": {"type": "regex", "pattern": "("}}],
                }
            ],
        },
        {
            **base,
            "programs": [
                {
                    "name": "p",
                    "components": [
                        {
                            "name": "x",
                            "rule": {"type": "exact_match"},
                            "transform": [{"clip": [2, 1]}],
                        }
                    ],
                }
            ],
        },
    ]
    for cfg in bad:
        with pytest.raises(ValidationError):
            AppConfig.model_validate(cfg)
    legacy = AppConfig.model_validate(CONFIG)
    assert legacy.models[0].scorer.type == "judge_text" and legacy.models[1].scorer.type == "logit"
    as_default = AppConfig.model_validate({**base, "gateway": {"default_reward_model": "math"}})
    assert as_default.program("math") is not None


def test_reward_input_is_what_every_scorer_reads():
    item = RewardInput(0, "q", "r", "l")
    assert item.messages is None and item.text is None


def test_label_strings_resolve_to_one_token_each_from_the_models_tokenizer(tmp_path):
    """The byte-level tokenizer of the demo models: "1" is one token (49), "Yes" is three
    (refused at start, naming the label)."""
    from deployments.demo.models import tokenizer_json
    from gateway.serve.labels import resolve_label_tokens

    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    judge = {**CONFIG["models"][0], "model_path": str(tmp_path)}
    cfg = {
        **CONFIG,
        "models": [judge, CONFIG["models"][1]],
        "programs": [
            {
                "name": "p",
                "components": [
                    {
                        "name": "j",
                        "model": "judge",
                        "scorer": {"type": "judge_prob", "yes": ["1"], "no": ["0"]},
                    }
                ],
            }
        ],
    }
    resolved = resolve_label_tokens(AppConfig.model_validate(cfg))
    scorer = resolved.programs[0].components[0].scorer
    assert (scorer.yes_token_ids, scorer.no_token_ids) == ([49], [48])
    cfg["programs"][0]["components"][0]["scorer"]["yes"] = ["Yes"]
    with pytest.raises(ValueError, match="'Yes' is 3 tokens"):
        resolve_label_tokens(AppConfig.model_validate(cfg))
