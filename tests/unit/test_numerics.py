"""A slot's numerics identity and probe digest (deployments.engine.numerics)."""

from __future__ import annotations

import json

import httpx

from deployments.engine.args import Platform, plan_engine
from deployments.engine.numerics import omp_threads, probe_digest, slot_identity, slot_numerics
from gateway.core.config import ModelSpec

CPU = Platform("cpu", "cpu")


def spec(**kw) -> ModelSpec:
    return ModelSpec(**{"name": "rm", "kind": "discriminative", "model_path": "/m",
                        "engine_args": {"dtype": "float32", "max_model_len": 512}, **kw})


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
        return httpx.Response(200, json={"id": f"x-{id(body)}", "data": [
            {"index": 0, "probs": [len(body["input"]) * scale]}]})
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
