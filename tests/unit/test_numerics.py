"""A slot's numerics identity and probe digest (deployments.engine.numerics)."""

from __future__ import annotations

import json

import httpx

from deployments.engine.args import Platform, plan_engine
from deployments.engine.numerics import omp_threads, probe_digest, slot_identity, slot_numerics
from gateway.core.config.settings import ModelSpec

CPU = Platform("cpu", "cpu")


def spec(**kw) -> ModelSpec:
    return ModelSpec(
        **{
            "name": "rm",
            "kind": "discriminative",
            "model_path": "/m",
            "engine_args": {"dtype": "float32", "max_model_len": 512},
            **kw,
        }
    )


def identity(s: ModelSpec, slot: int = 0) -> dict:
    return slot_identity(s, plan_engine(s, CPU, port=9, slot=slot), CPU, "digest")


def test_slots_of_one_model_share_an_identity_whatever_their_cores():
    s = spec(cpu_cores_per_slot=1)
    assert identity(s, 0) == identity(s, 1)  # other cores, same thread count


def test_what_changes_bits_changes_the_identity():
    base = identity(spec())
    assert identity(spec(engine_args={"dtype": "bfloat16", "max_model_len": 512})) != base
    assert identity(spec(determinism="off")) != base
    assert identity(spec(engine_env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})) != base
    assert identity(spec(engine_env={"VLLM_SOME_KERNEL_SWITCH": "1"})) != base
    # capacity knobs do not
    assert identity(spec(engine_args={"dtype": "float32", "max_model_len": 1024})) == base
    assert identity(spec(engine_env={"VLLM_CPU_KVCACHE_SPACE": "4"})) == base


def test_omp_threads_counts_bound_cores():
    assert omp_threads({}) == "auto"
    assert omp_threads({"VLLM_CPU_OMP_THREADS_BIND": "0-3,6"}) == "5"
    assert omp_threads({"VLLM_CPU_OMP_THREADS_BIND": "1"}) == "1"


def _engine(scale: float):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(
            200,
            json={
                "id": f"x-{id(body)}",
                "data": [{"index": 0, "probs": [len(body["input"]) * scale]}],
            },
        )

    return httpx.MockTransport(handler)


def test_probe_digest_is_of_the_answers_not_the_ids():
    a = probe_digest("http://e", "discriminative", "rm", transport=_engine(1.0))
    assert a == probe_digest("http://e", "discriminative", "rm", transport=_engine(1.0))
    assert a != probe_digest("http://e", "discriminative", "rm", transport=_engine(1.0 + 1e-12))


def test_a_slot_whose_probes_fail_is_a_class_of_its_own(monkeypatch):
    import deployments.engine.numerics as numerics

    def refuse(*a, **k):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(numerics, "probe_digest", refuse)
    s = spec()
    out = slot_numerics(s, plan_engine(s, CPU, port=9), CPU, "digest", "http://e")
    assert out["class_id"] is None and "ConnectError" in out["error"]


def test_tensor_parallel_size_is_part_of_the_identity():
    """TP 2 and TP 1 slots never share a class (TP size changes bits), nor do TP 2 slots
    with and without the collective settings."""
    tp1 = identity(spec(engine_args={"dtype": "float32", "tensor_parallel_size": 1}))
    tp2 = identity(spec(engine_args={"dtype": "float32", "tensor_parallel_size": 2}))
    assert tp1["tensor_parallel_size"] == 1 and tp2["tensor_parallel_size"] == 2 and tp1 != tp2
    assert tp2["env"]["NCCL_ALGO"] == "Ring"  # the settings are in what decides the class


def _judge_with_context(max_model_len: int):
    """A judge engine that refuses prompts beyond its context, as vLLM does (400): the
    demo's byte-level tokenizer gives one token per character, plus ~30 template tokens."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = len(body["messages"][0]["content"]) + 30
        if prompt + body["max_tokens"] > max_model_len:
            return httpx.Response(400, json={"error": {"message": "maximum context length"}})
        return httpx.Response(
            200,
            json={
                "id": "x",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "7"},
                        "finish_reason": "length",
                        "logprobs": {
                            "content": [{"token": "7", "logprob": -0.5, "top_logprobs": []}]
                        },
                    }
                ],
            },
        )

    return httpx.MockTransport(handler)


def test_the_probes_fit_the_models_context():
    """Measured: a judge at max_model_len 512 refused the longest probe, so its slots had
    no class and their keys never moved. The probe set now keeps what fits."""
    from deployments.engine.selftest import PROBE_TEXTS, probe_requests, probe_texts

    assert probe_texts("generative") == PROBE_TEXTS  # no context given: all of them
    short = probe_texts("generative", 512)
    assert 8 <= len(short) < len(PROBE_TEXTS) and all(len(t) + 80 <= 512 for t in short)
    assert probe_texts("generative", 4096) == PROBE_TEXTS
    assert probe_texts("generative", 40) == PROBE_TEXTS[:8]  # one-character probes
    assert len(probe_requests("discriminative", "rm", 512)) == len(
        probe_texts("discriminative", 512)
    )
    engine = _judge_with_context(512)
    try:  # the negative control: the whole set against that engine fails
        probe_digest("http://e", "generative", "judge", transport=engine)
        raise AssertionError("the long probe should not fit a 512-token context")
    except httpx.HTTPStatusError as exc:
        assert exc.response.status_code == 400
    assert probe_digest("http://e", "generative", "judge", transport=engine, max_model_len=512)


def test_a_judge_at_512_tokens_gets_a_class(monkeypatch):
    import deployments.engine.numerics as numerics

    s = ModelSpec(
        name="judge",
        kind="generative",
        model_path="/m",
        engine_args={"dtype": "float32", "max_model_len": 512},
    )
    plan = plan_engine(s, CPU, port=9, slot=0)
    real = numerics.probe_digest
    monkeypatch.setattr(
        numerics,
        "probe_digest",
        lambda *a, **kw: real(*a, **kw, transport=_judge_with_context(512)),
    )
    out = slot_numerics(s, plan, CPU, "digest", "http://e")
    assert out["class_id"] is not None and "error" not in out, out
