"""The start-up cold-vs-warm prefix-cache check's verdicts, against scripted engines (the
real engines, the demo models and the wide classifier that fails it: integration)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from deployments.engine.args import Platform, plan_engine
from deployments.engine.fingerprint import build_fingerprint
from deployments.engine.prefix_check import (
    SUFFIXES,
    prefix_requests,
    run_prefix_check,
    shared_prefix,
)
from gateway.core.config.settings import ModelSpec


class CachingEngine:
    """Caches each unsalted input's first 64 characters; a request that reuses a cached
    prefix counts 64 hit tokens and, when ``variant``, answers 1e-7 off (what kernels that
    read cached attention state differently do); ``hits_metric=False`` serves no metric."""

    def __init__(self, variant: bool = False, hits_metric: bool = True) -> None:
        self.variant, self.hits_metric = variant, hits_metric
        self.cached: set[tuple[str | None, str]] = set()
        self.hits = 0
        self.lock = threading.Lock()

    def score(self, text: str, salt: str | None) -> float:
        with self.lock:
            warm = (salt, text[:64]) in self.cached
            self.cached.add((salt, text[:64]))
            self.hits += 64 * warm
        return len(text) / 7 + (1e-7 if self.variant and warm else 0.0)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            if not self.hits_metric:
                return httpx.Response(200, text="# nothing\n")
            return httpx.Response(
                200, text=f'vllm:prefix_cache_hits_total{{engine="0"}} {float(self.hits)}\n'
            )
        body = json.loads(request.content)
        salt = body.get("cache_salt")
        if request.url.path == "/classify":
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"index": j, "probs": [self.score(t, salt)]} for j, t in enumerate(texts)]
            return httpx.Response(200, json={"data": data})
        score = self.score(body["messages"][0]["content"], salt)
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "Score: 1"}, "logprobs": {"content": [score]}}]
            },
        )


def check(engine: CachingEngine, kind: str):
    return run_prefix_check("http://engine", kind, "m", transport=httpx.MockTransport(engine))


@pytest.mark.parametrize("kind", ["discriminative", "generative"])
def test_a_bit_neutral_cache_passes_and_a_variant_one_fails(kind):
    ok = check(CachingEngine(), kind)
    assert ok.passed and ok.single == ok.batched == ok.total == len(SUFFIXES)
    assert ok.hit_tokens and ok.hit_tokens > 0
    bad = check(CachingEngine(variant=True), kind)
    assert not bad.passed and bad.single == 0 and bad.batched == 0
    assert "differ warm alone" in bad.reason and bad.summary().startswith("failed")


def test_a_cache_that_served_nothing_proves_nothing():
    """Equal bits with no hit counted (the engine ignored the flag, or no metric) are no
    proof: the cache stays off."""
    blind = check(CachingEngine(hits_metric=False), "discriminative")
    assert not blind.passed and blind.single == blind.total
    assert "served no prefix" in blind.reason


def test_an_engine_error_is_a_failed_check_not_a_crash():
    result = run_prefix_check(
        "http://engine",
        "discriminative",
        "m",
        transport=httpx.MockTransport(lambda r: httpx.Response(400, json={"error": "too long"})),
    )
    assert not result.passed and result.reason.startswith("probe failed")


def test_the_probes_share_a_prefix_that_fits_the_context():
    for max_len in (None, 1024, 512, 128):
        prefix = shared_prefix(max_len, "generative")
        primer, probes = prefix_requests("generative", "m", max_len)
        texts = [b["messages"][0]["content"] for _, b in (primer, *probes)]
        assert all(t.startswith(prefix) for t in texts)
        if max_len is not None:
            assert max(len(t) for t in texts) + 80 <= max_len or not prefix
    assert len(shared_prefix(1024, "discriminative")) == 700


def spec(**kw) -> ModelSpec:
    return ModelSpec(name="rm", kind="discriminative", model_path="/m", **kw)


@pytest.mark.parametrize("mode", ["serialize", "batch_invariant"])
def test_the_cache_is_on_only_where_asked_and_never_by_engine_args(mode):
    gpu = Platform("cuda", "H100", (9, 0))

    def flag(**kw) -> str:
        plan = plan_engine(spec(determinism=mode, **kw), gpu, port=1)
        return next(a for a in plan.args if a.endswith("enable-prefix-caching"))

    assert flag() == "--no-enable-prefix-caching"
    assert flag(prefix_cache="auto") == "--enable-prefix-caching"
    # the policy wins over a user override either way
    assert flag(engine_args={"enable_prefix_caching": True}) == "--no-enable-prefix-caching"
    assert plan_engine(spec(determinism=mode, prefix_cache="auto"), gpu, port=1).prefix_cache
    off = plan_engine(spec(determinism="off", prefix_cache="auto"), gpu, port=1)
    assert off.prefix_cache is None and not any("prefix-caching" in a for a in off.args)


def test_the_fingerprint_says_when_the_cache_is_on():
    base = {"model_digest": "ab" * 32, "device": "cpu", "mode": "serialize", "dtype": None}
    assert "prefix_cache=on" in build_fingerprint(**base, prefix_cache=True)
    assert "prefix_cache" not in build_fingerprint(**base, prefix_cache=False)
