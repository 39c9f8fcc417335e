"""The start-up self-test's verdicts, against scripted engines (the real run: integration)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from deployments.engine.args import Platform, PolicyError, needs_selftest, plan_engine
from deployments.engine.selftest import PROBE_TEXTS, run_selftest
from gateway.core.config.settings import ModelSpec


class Engine:
    """Answers from the input alone, or, when ``batch_variant``, shifts the score of any
    request that overlapped another one (what a batch-dependent kernel does)."""

    def __init__(self, batch_variant: bool) -> None:
        self.batch_variant, self.inflight, self.lock = batch_variant, 0, threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            self.inflight += 1
        time.sleep(0.02)
        with self.lock:
            overlapped = self.inflight > 1
            self.inflight -= 1
        if request.url.path == "/classify":
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            batched = overlapped or len(texts) > 1
            return httpx.Response(
                200,
                json={
                    "data": [
                        {
                            "index": j,
                            "probs": [
                                len(t) / 7 + (1e-7 if self.batch_variant and batched else 0.0)
                            ],
                        }
                        for j, t in reversed(list(enumerate(texts)))
                    ]
                },
            )  # any order: `index` says
        text = body["messages"][0]["content"]
        score = len(text) / 7 + (1e-7 if self.batch_variant and overlapped else 0.0)
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "Score: 1"}, "logprobs": {"content": [score]}}]
            },
        )


@pytest.mark.parametrize("kind", ["discriminative", "generative"])
def test_invariant_engine_passes_and_variant_engine_fails(kind):
    ok = run_selftest("http://engine", kind, "m", transport=httpx.MockTransport(Engine(False)))
    assert ok.passed and ok.identical == ok.total == len(PROBE_TEXTS)
    bad = run_selftest("http://engine", kind, "m", transport=httpx.MockTransport(Engine(True)))
    assert not bad.passed and bad.identical < bad.total
    assert "differ alone vs batched" in bad.reason and bad.summary().startswith("failed")


def test_a_batch_that_changes_only_token_ids_or_finish_reason_fails():
    """The self-test compares the whole answer (gateway.core.api.answers), not only the text and
    logprobs: a batch that ends a generation differently, or samples other token ids
    behind the same text, is not batch invariant."""
    for field, alone, batched in (
        ("finish_reason", "length", "stop"),
        ("token_ids", [1, 2], [1, 3]),
    ):
        state = {"inflight": 0}
        lock = threading.Lock()

        def engine(request: httpx.Request) -> httpx.Response:
            with lock:
                state["inflight"] += 1
            time.sleep(0.02)
            with lock:
                overlapped = state["inflight"] > 1
                state["inflight"] -= 1
            choice = {
                "index": 0,
                "message": {"content": "Score: 1"},
                "logprobs": {"content": [{"token": "S", "logprob": -0.5}]},
                field: batched if overlapped else alone,
            }
            return httpx.Response(200, json={"id": str(time.monotonic()), "choices": [choice]})

        bad = run_selftest(
            "http://engine", "generative", "m", transport=httpx.MockTransport(engine)
        )
        assert not bad.passed and "differ alone vs batched" in bad.reason, field


def test_a_disrm_batch_is_one_list_request_answered_item_by_item():
    """The DisRM probes meet in one engine step for sure: one ``/classify`` request whose
    ``input`` is every probe; each item's answer is compared with that probe alone."""
    seen: list[object] = []

    def engine(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["input"]
        seen.append(texts)
        batch = texts if isinstance(texts, list) else [texts]
        return httpx.Response(
            200,
            json={"data": [{"index": j, "probs": [float(len(t))]} for j, t in enumerate(batch)]},
        )

    ok = run_selftest("http://engine", "discriminative", "m", transport=httpx.MockTransport(engine))
    assert ok.passed and ok.identical == ok.total == len(PROBE_TEXTS)
    lists = [s for s in seen if isinstance(s, list)]
    assert len(lists) == 2 and all(sorted(s) == sorted(PROBE_TEXTS) for s in lists)
    assert lists[0] != lists[1]  # warm-up and batch in two orders
    short = run_selftest(
        "http://engine",
        "discriminative",
        "m",
        transport=httpx.MockTransport(
            lambda r: httpx.Response(200, json={"data": [{"index": 0, "probs": [1.0]}]})
        ),
    )
    assert not short.passed and "probe failed" in short.reason


def test_engine_errors_fail_the_test_with_a_reason():
    dead = httpx.MockTransport(lambda r: httpx.Response(500, json={"error": "boom"}))
    result = run_selftest("http://engine", "discriminative", "m", transport=dead)
    assert not result.passed and "probe failed" in result.reason


def test_probes_include_one_token_inputs():
    assert sum(len(t) == 1 for t in PROBE_TEXTS) >= 8 and max(map(len, PROBE_TEXTS)) > 200


def spec(**kw) -> ModelSpec:
    return ModelSpec(name="m", kind="discriminative", model_path="/m", **kw)


def test_when_the_selftest_runs():
    assert needs_selftest(spec(), "batch_invariant")
    assert not needs_selftest(spec(), "off") and needs_selftest(spec(selftest="always"), "off")
    assert not needs_selftest(spec(selftest="always"), "serialize")
    assert not needs_selftest(spec(selftest="never"), "batch_invariant")


def test_one_attention_backend_per_model():
    h200 = Platform("cuda", "NVIDIA H200", (9, 0))
    plan = plan_engine(spec(), h200, port=1)
    assert plan.mode == "batch_invariant" and plan.attention_backend == "TRITON_ATTN"
    assert plan.args[plan.args.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert plan.env["VLLM_BATCH_INVARIANT"] == "1"
    fa3 = plan_engine(spec(engine_args={"attention_backend": "FLASH_ATTN"}), h200, port=1)
    assert fa3.attention_backend == "FLASH_ATTN" and fa3.args.count("--attention-backend") == 1
    with pytest.raises(PolicyError, match="attention_backend"):
        plan_engine(spec(engine_env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}), h200, port=1)
    assert plan_engine(spec(), Platform("cpu", "cpu"), port=1).attention_backend is None


@pytest.mark.parametrize("name", ["gpu.yaml", "gpu-small.yaml"])
def test_gpu_config_plans_packed_batch_invariant_slots(name: str):
    import yaml

    from gateway.core.config.settings import AppConfig
    from gateway.serve import topology
    from tests.integration.conftest import REPO

    raw = yaml.safe_load((REPO / "configs" / name).read_text())
    cfg = AppConfig.model_validate(raw["applications"][0]["args"])
    h200 = Platform("cuda", "NVIDIA H200", (9, 0))
    for model in cfg.models:
        assert model.ray_actor_options["num_gpus"] < 1  # packed
        plan = plan_engine(model, h200, port=1)
        # the 7-8B models in fixed shapes on FA3 in one split (h100-2026-12-07b-candidates-7b,
        # h100-2026-12-07c-judge-fixed-shape-7b), the small ones batch invariant on TRITON_ATTN
        if name == "gpu.yaml":
            assert plan.mode == "fixed_shape" and plan.attention_backend == "FLASH_ATTN"
            step = 8192 if model.kind == "discriminative" else 512
            assert (plan.step_tokens, plan.head_rows) == (step, 256)
        else:
            assert plan.mode == "batch_invariant" and plan.attention_backend == "TRITON_ATTN"
        assert "--kv-cache-memory-bytes" in plan.args and plan.max_inflight == 256
        assert needs_selftest(model, plan.mode)
    auto = cfg.models[0].model_copy(update={"determinism": "auto"})
    assert plan_engine(auto, Platform("cuda", "T4", (7, 5)), port=1).mode == "serialize"
    # fixed_shape needs CUDA graphs, and says so on a CPU host
    with pytest.raises(PolicyError, match="CUDA"):
        plan_engine(
            cfg.models[1].model_copy(update={"determinism": "fixed_shape"}),
            Platform("cpu", "cpu"),
            port=1,
        )
    assert len(topology.render(raw)["applications"]) == 1 + sum(m.replicas for m in cfg.models)
    # through its own port one ingress process keeps up with the engines of one GPU
    # (gpu-small: H200, 2026-12-04; gpu.yaml: the shipped-7b layout)
    assert (cfg.gateway.ingress_replicas, cfg.gateway.direct_port) == (1, 8001)
    assert sum(m.ray_actor_options["num_gpus"] * m.replicas for m in cfg.models) <= 1.0
