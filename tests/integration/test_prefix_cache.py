"""The prefix cache on real engines (``prefix_cache: auto`` in configs/test-cpu.yaml).

* The session gateway's demo judge and classifiers checked their cache at start-up and serve
  as the check found: with it where every warm answer equals its cold one (measured on
  AVX-512 hosts), without it where the warm answers differ (AVX2-only AMD hosts); the wide
  classifier fails the check on both and serves without it, while on AVX-512 hosts with
  AMX tiles its warm answers equal its cold ones and it keeps the cache: ``/v1/models``
  says which, and the verdict, the fingerprint and the serving agree.
* A failed check is remembered on the host: the wide classifier's engine, killed, comes back
  once, without the cache, and says where the verdict is kept (checked with the other
  engine deaths in ``test_http_contract``, so the restarts overlap), where it failed.
* Negative control: the same check run against the plain wide classifier's engine (vLLM's
  defaults, its prefix cache on) fails, warm alone: the check can tell. Skipped, saying
  so, on a host whose kernels answer a cached prefix with the same bits.
* GRPO-shaped groups (a long shared prompt, short responses) give the same rewards sent as
  groups at concurrency 1 and 32, shuffled, and as items; the rewards are stashed for the
  cacheless gateway's comparison (``prefix_groups``).
"""

from __future__ import annotations

import httpx
import pytest

from deployments.engine.prefix_check import run_prefix_check
from tests.integration.prefix_groups import GROUP_REWARDS, MODELS, grpo_items, post_rewards

pytestmark = pytest.mark.integration


def assert_serves_as_checked(name: str, card: dict, reason: str = "differ warm") -> bool:
    """A model's slots serve as their prefix-cache check found, all with one verdict
    (one identity): the cache on where every warm answer equalled its cold one, off (and
    said why) otherwise. Returns the verdict."""
    verdicts = set()
    for report, fingerprint in zip(card["prefix_cache"], card["fingerprints"], strict=True):
        check = report["check"]
        verdicts.add(report["enabled"])
        assert report["enabled"] is check["passed"], (name, report)
        assert check["hit_tokens"] > 0  # the cache served: the verdict is about bits
        if report["enabled"]:
            assert check["single"] == check["batched"] == check["total"]
            assert "prefix_cache=on" in fingerprint
        else:  # this host's kernels read cached attention state otherwise
            assert reason in check["reason"], (name, report)
            assert "prefix_cache=on" not in fingerprint
    assert len(verdicts) == 1, (name, card["prefix_cache"])
    return verdicts.pop()


def test_models_report_their_cache_check_and_serve_as_it_found(gateway):
    url, _ = gateway
    cards = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=60).json()["data"]}
    for name in ("rm", "judge"):
        assert_serves_as_checked(name, cards[name])
    # the wide classifier: warm answers differ alone on AVX-512 and AVX2 hosts; on AVX-512
    # hosts with AMX tiles they were equal (2026-12-07), and it keeps the cache there
    assert_serves_as_checked("rm-large", cards["rm-large"], "differ warm alone")


def test_the_check_fails_on_an_engine_whose_cache_changes_bits(plain_engine):
    """The negative control: vLLM's defaults (prefix cache on) on the wide classifier."""
    engine, _ = plain_engine
    engine.wait_ready(600)
    result = run_prefix_check(engine.url, "discriminative", "rm-large", max_model_len=512)
    assert result.hit_tokens and result.hit_tokens > 0  # the cache served
    if result.passed:
        pytest.skip(
            "this host's kernels answer the wide classifier's cached prefix with the same "
            f"bits ({result.summary()}): no negative control here (AVX-512 hosts with AMX)"
        )
    assert result.single < result.total, result.summary()


@pytest.mark.parametrize("model", MODELS)
async def test_groups_answer_alike_at_any_concurrency_and_order(gateway, request, model):
    url, _ = gateway
    items = grpo_items()
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item["prompt"], []).append(i)
    bodies = [
        [{**items[i], "group": f"{model}-grpo-{g}"} for i in members]
        for g, members in enumerate(groups.values())
    ]
    runs = []
    for concurrency, seed in ((1, 1), (32, 2)):
        answers = await post_rewards(url, model, bodies, concurrency, seed)
        rewards = [0.0] * len(items)
        for members, answer in zip(groups.values(), answers, strict=True):
            slots = {
                d["slot"] if "slot" in d else d["components"][0]["slot"] for d in answer["details"]
            }
            assert len(slots) == 1, "a group on one slot"
            for i, reward in zip(members, answer["rewards"], strict=True):
                rewards[i] = reward
        runs.append(rewards)
    alone = await post_rewards(url, model, [[item] for item in items], 32, 3)
    runs.append([a["rewards"][0] for a in alone])
    assert runs[0] == runs[1] == runs[2]
    request.config.stash.setdefault(GROUP_REWARDS, {})[model] = runs[0]
