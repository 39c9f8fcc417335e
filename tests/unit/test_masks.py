"""``on_failure: mask`` against a fake engine: a failed item has no reward (null, ``mask:
true``, the reason), the others are answered; each control is the same item under
``error`` (the default), which invents nothing either: it fails the request or, for a
judge's unparsed text, uses the configured default."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.http.app import create_app
from gateway.observability import metrics
from tests.unit.test_rewards import CONFIG, JudgeTransport


class FailingTransport(JudgeTransport):
    """The judge transport, answering 500 to any body that mentions ``boom``."""

    async def post(self, model, placement, path, body, deadline):
        if b"boom" in body:
            self.sent.append((model, placement.home, path, json.loads(body)))
            err = {"error": {"message": "engine fell over", "type": "InternalServerError"}}
            return EngineReply(500, json.dumps(err).encode(), "fp", placement.home)
        return await super().post(model, placement, path, body, deadline)


def config(mask: bool) -> dict:
    cfg = copy.deepcopy(CONFIG)
    if mask:
        for m in cfg["models"]:
            m["on_failure"] = "mask"
    cfg["programs"] = [
        {
            "name": "both",
            "on_failure": "mask" if mask else "error",
            "components": [{"name": "rm", "model": "rm"}, {"name": "judge", "model": "judge"}],
        }
    ]
    return cfg


async def post(mask: bool, path: str, body: dict) -> httpx.Response:
    app = create_app(RewardService(AppConfig.model_validate(config(mask)), FailingTransport()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        return await c.post(path, json=body)


ITEMS = [
    {"prompt": "1+1=", "response": "2"},
    {"prompt": "ramble", "response": "x"},  # the judge's text holds no score
    {"prompt": "boom", "response": "3"},  # the engine answers 500
]


async def test_a_judge_masks_unparsed_text_and_an_engine_failure():
    r = await post(True, "/v1/rewards", {"model": "judge", "items": ITEMS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"][0] is not None and out["rewards"][1:] == [None, None]
    assert [d.get("mask", False) for d in out["details"]] == [False, True, True]
    assert out["details"][1]["mask_reason"].startswith("unparsed")
    assert out["details"][2]["mask_reason"].startswith("engine")
    # the controls: the default stands in for unparsed text; an engine failure fails it
    control = await post(False, "/v1/rewards", {"model": "judge", "items": ITEMS[:2]})
    assert control.json()["rewards"][1] == -1.0
    failed = await post(False, "/v1/rewards", {"model": "judge", "items": ITEMS})
    assert failed.status_code == 502, failed.text


async def test_a_disrm_and_a_program_mask_an_engine_failure():
    before = metrics.REWARDS_MASKED.labels("both")._value.get()
    for model in ("rm", "both"):
        r = await post(True, "/v1/rewards", {"model": model, "items": [ITEMS[0], ITEMS[2]]})
        assert r.status_code == 200, r.text
        rewards, details = r.json()["rewards"], r.json()["details"]
        assert rewards[0] is not None and rewards[1] is None, (model, rewards)
        assert details[1]["mask"] is True and details[1]["mask_reason"], details[1]
        control = await post(False, "/v1/rewards", {"model": model, "items": [ITEMS[2]]})
        assert control.status_code in (422, 502), control.text
    assert metrics.REWARDS_MASKED.labels("both")._value.get() == before + 1


async def test_get_reward_carries_the_mask_in_extra_logs_for_every_shard():
    cfg_body = {"query": ["1+1=2", "boom"], "prompts": ["1+1=", "boom"]}
    r = await post(True, "/get_reward", cfg_body)  # default_reward_model: rm
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"][1] == 0.0 and out["extra_logs"]["masked"] == [0.0, 1.0]
    empty = (await post(True, "/get_reward", {"query": []})).json()
    assert set(empty["extra_logs"]) == set(out["extra_logs"])
    unmasked = (await post(False, "/get_reward", {"query": ["1+1=2"]})).json()
    assert "masked" not in unmasked["extra_logs"]


@pytest.mark.parametrize("policy", ["mask", "error"])
def test_the_config_takes_mask_for_models_and_programs(policy):
    cfg = config(policy == "mask")
    app = AppConfig.model_validate(cfg)
    assert app.model("judge").on_failure == policy
    bad = copy.deepcopy(cfg)
    bad["models"][0]["on_failure"] = "skip_component"  # a program's policy, not a model's
    with pytest.raises(ValueError, match="on_failure"):
        AppConfig.model_validate(bad)
