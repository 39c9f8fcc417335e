"""Determinism policy -> engine arguments, and seed policies."""

from __future__ import annotations

import json

import httpx
import pytest

from deployments.engine.args import Platform, PolicyError, plan_engine, resolve_mode
from gateway.core.config.settings import AppConfig, ModelSpec
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit.test_ingress import CHAT, FakeTransport

CPU = Platform("cpu", "cpu")
H200 = Platform("cuda", "NVIDIA H200", (9, 0))
T4 = Platform("cuda", "Tesla T4", (7, 5))


def spec(**kw) -> ModelSpec:
    return ModelSpec(**{"name": "m", "kind": "discriminative", "model_path": "/x", **kw})


@pytest.mark.parametrize(
    "platform,kind,expected",
    [
        (CPU, "generative", "serialize"),
        (CPU, "discriminative", "serialize"),
        (H200, "generative", "batch_invariant"),
        (H200, "discriminative", "batch_invariant"),
        (T4, "generative", "serialize"),
    ],
)
def test_auto_resolves_per_platform(platform, kind, expected):
    assert resolve_mode(spec(kind=kind), platform) == expected


def test_batch_invariant_refused_where_impossible():
    with pytest.raises(PolicyError, match="compute capability"):
        resolve_mode(spec(determinism="batch_invariant"), CPU)


def _args(plan) -> dict:
    out, key = {}, None
    for a in plan.args:
        if a.startswith("--"):
            key = a[2:]
            out[key] = True
        else:
            out[key] = a
    return out


def test_serialize_runs_one_sequence_without_prefix_cache_even_if_asked_otherwise():
    plan = plan_engine(
        spec(
            engine_args={
                "max_num_seqs": 64,
                "enable_prefix_caching": True,
                "max_num_batched_tokens": 16,
                "dtype": "float32",
            }
        ),
        CPU,
        port=9,
    )
    args = _args(plan)
    assert args["max-num-seqs"] == "1" and "no-enable-prefix-caching" in args
    assert "enable-prefix-caching" not in args
    assert int(args["max-num-batched-tokens"]) >= int(args["max-model-len"])
    assert args["runner"] == "pooling" and args["dtype"] == "float32"
    # the engine serializes; the ingress keeps a short queue in it (serialize_inflight)
    assert plan.max_inflight == 4 and plan.env["HF_HUB_OFFLINE"] == "1"
    one = plan_engine(spec(serialize_inflight=1), CPU, port=9)
    assert one.max_inflight == 1 and _args(one)["max-num-seqs"] == "1"


def test_batch_invariant_sets_env_and_one_backend():
    plan = plan_engine(spec(kind="generative"), H200, port=9)
    assert plan.mode == "batch_invariant" and plan.env["VLLM_BATCH_INVARIANT"] == "1"
    assert _args(plan)["attention-backend"] == "TRITON_ATTN"
    assert "runner" not in _args(plan)


def test_off_keeps_vllm_defaults():
    args = _args(plan_engine(spec(determinism="off"), CPU, port=9))
    assert "max-num-seqs" not in args and "no-enable-prefix-caching" not in args


async def _chat(policy: str, body: dict) -> httpx.Response:
    cfg = AppConfig(
        models=[
            {"name": "judge", "kind": "generative", "model_path": "/x", "seed": {"policy": policy}}
        ]
    )
    transport = FakeTransport()
    app = create_app(RewardService(cfg, transport))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        r = await c.post("/v1/chat/completions", json=body)
    r.sent = transport.sent  # type: ignore[attr-defined]
    return r


async def test_seed_policy_require():
    assert (await _chat("require", CHAT)).status_code == 400
    assert (await _chat("require", {**CHAT, "seed": 1})).status_code == 200


async def test_seed_policy_passthrough_sends_no_seed():
    r = await _chat("passthrough", CHAT)
    assert r.status_code == 200 and "seed" not in r.sent[0][3]
    assert "x-rmgate-seed" not in r.headers


async def test_seed_base_changes_derived_seed():
    a = await _chat("derive", CHAT)
    cfg_b = AppConfig(
        models=[
            {
                "name": "judge",
                "kind": "generative",
                "model_path": "/x",
                "seed": {"policy": "derive", "base": 7},
            }
        ]
    )
    t = FakeTransport()
    gw = RewardService(cfg_b, t)
    await gw.chat_completions(json.dumps(CHAT).encode())
    assert t.sent[0][3]["seed"] != int(a.headers["x-rmgate-seed"])


def test_model_required_when_several_of_a_kind():
    cfg = AppConfig(
        models=[
            {"name": "a", "kind": "discriminative", "model_path": "/x"},
            {"name": "b", "kind": "discriminative", "model_path": "/x"},
        ]
    )
    from gateway.core.api.errors import RmgateError

    with pytest.raises(RmgateError) as err:
        RewardService(cfg, FakeTransport()).resolve_model(None, "discriminative")
    assert err.value.status == 400


def test_config_rejects_duplicates_and_unknown_fields():
    with pytest.raises(ValueError):
        AppConfig(models=[{"name": "a", "kind": "generative", "model_path": "/x"}] * 2)
    with pytest.raises(ValueError):
        AppConfig(models=[{"name": "a", "kind": "generative", "model_path": "/x", "replcas": 2}])


def test_cpu_slots_get_their_own_cores_by_slot_index_only():
    from deployments.engine.args import slot_cpu_binding

    cores = [0, 1, 2, 3]
    assert [slot_cpu_binding(s, 1, cores) for s in range(5)] == ["0", "1", "2", "3", "0"]
    assert [slot_cpu_binding(s, 2, cores) for s in range(3)] == ["0,1", "2,3", "0,1"]
    assert slot_cpu_binding(0, 8, [4, 5]) == "4,5"  # never more cores than the host has
    # the plan sets it on CPU only, and a user's explicit binding wins
    host = ",".join(map(str, sorted(__import__("os").sched_getaffinity(0))))
    first = sorted(__import__("os").sched_getaffinity(0))[0]
    plan = plan_engine(spec(cpu_cores_per_slot=1), CPU, port=9, slot=0)
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == str(first)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan_engine(spec(), CPU, port=9).env
    assert (
        "VLLM_CPU_OMP_THREADS_BIND" not in plan_engine(spec(cpu_cores_per_slot=1), H200, port=9).env
    )
    mine = plan_engine(
        spec(cpu_cores_per_slot=1, engine_env={"VLLM_CPU_OMP_THREADS_BIND": host}),
        CPU,
        port=9,
        slot=1,
    )
    assert mine.env["VLLM_CPU_OMP_THREADS_BIND"] == host
