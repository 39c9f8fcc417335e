"""``determinism: fixed_shape``: its engine plan, its identity, its place in the self-test's
fallbacks, and the score head at one row count (``deployments.engine.fixed_shape``)."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from deployments.engine.args import Platform, PolicyError, plan_engine, resolve_mode
from deployments.engine.fixed_shape import (
    HEAD_ROWS_ENV,
    INDUCTOR_DETERMINISTIC,
    ONE_SPLIT_ENV,
    SplitsAsBatchInvariant,
    one_split_attention,
    pad_lm_head,
    padded_rows,
)
from deployments.engine.numerics import slot_identity
from deployments.engine.selftest import SelfTestResult, prove_batching
from gateway.core.config.settings import ModelSpec
from tests.integration.conftest import REPO

CPU = Platform("cpu", "cpu")
H100 = Platform("cuda", "NVIDIA H100 80GB HBM3", (9, 0))


def spec(**kw) -> ModelSpec:
    return ModelSpec(
        **{
            "name": "rm",
            "kind": "discriminative",
            "model_path": "/m",
            "determinism": "fixed_shape",
            **kw,
        }
    )


def options(plan) -> dict[str, str]:
    args, out = plan.args, {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[a[2:]] = "" if nxt.startswith("--") else nxt
    return out


def test_every_step_is_padded_to_the_token_budget_and_the_head_to_the_sequences():
    plan = plan_engine(spec(), H100, port=9)
    opts = options(plan)
    assert plan.mode == "fixed_shape" and plan.max_inflight == 256
    assert json.loads(opts["compilation-config"]) == {
        "cudagraph_capture_sizes": [8192],
        "max_cudagraph_capture_size": 8192,
        "inductor_compile_config": INDUCTOR_DETERMINISTIC,
    }
    assert opts["max-num-batched-tokens"] == "8192" and opts["max-num-seqs"] == "256"
    assert opts["attention-backend"] == "FLASH_ATTN" and plan.attention_backend == "FLASH_ATTN"
    assert plan.env[HEAD_ROWS_ENV] == "256" and "VLLM_BATCH_INVARIANT" not in plan.env
    assert plan.env[ONE_SPLIT_ENV] == "1"
    assert (plan.step_tokens, plan.head_rows) == (8192, 256)
    # the user's budget and sequences are the padded shape; other compilation keys stay
    mine = plan_engine(
        spec(
            engine_args={
                "max_num_batched_tokens": 4096,
                "max_num_seqs": 64,
                "compilation_config": {
                    "cudagraph_capture_sizes": [1, 2],
                    "mode": 3,
                    "inductor_compile_config": {"deterministic": False, "max_autotune": False},
                },
                "attention_backend": "TRITON_ATTN",
            }
        ),
        H100,
        port=9,
    )
    opts = options(mine)
    # the user's Inductor keys stay, but no kernel is chosen by timing it
    assert json.loads(opts["compilation-config"]) == {
        "cudagraph_capture_sizes": [4096],
        "max_cudagraph_capture_size": 4096,
        "mode": 3,
        "inductor_compile_config": {"max_autotune": False, **INDUCTOR_DETERMINISTIC},
    }
    assert opts["attention-backend"] == "TRITON_ATTN" and mine.env[HEAD_ROWS_ENV] == "64"
    assert mine.args.count("--compilation-config") == 1 and mine.max_inflight == 64


def test_a_judge_steps_at_a_small_budget_and_its_lm_head_at_the_sequences():
    """A judge's decode steps are padded too: its default budget is small (256 decodes and
    prompt chunks fill it under load), not the DisRM's 8,192."""
    plan = plan_engine(spec(kind="generative", name="judge"), H100, port=9)
    opts = options(plan)
    assert plan.mode == "fixed_shape" and (plan.step_tokens, plan.head_rows) == (512, 256)
    assert json.loads(opts["compilation-config"])["cudagraph_capture_sizes"] == [512]
    assert opts["max-num-batched-tokens"] == "512" and opts["attention-backend"] == "FLASH_ATTN"
    assert plan.env[HEAD_ROWS_ENV] == "256" and plan.env[ONE_SPLIT_ENV] == "1"
    assert "VLLM_BATCH_INVARIANT" not in plan.env
    own = plan_engine(
        spec(kind="generative", engine_args={"max_num_batched_tokens": 1024}), H100, port=9
    )
    assert own.step_tokens == 1024


@pytest.mark.parametrize(
    "kw,platform,match",
    [
        ({"engine_args": {"max_num_batched_tokens": 128}}, H100, "at least max_num_seqs"),
        ({"kind": "generative", "engine_args": {"max_num_seqs": 2048}}, H100, "at least"),
        ({}, CPU, "CUDA"),
        ({"engine_args": {"enforce_eager": True}}, H100, "enforce_eager"),
        ({"engine_args": {"compilation_config.mode": 0}}, H100, "dotted key"),
        ({"engine_args": {"compilation_config": {"cudagraph_mode": "NONE"}}}, H100, "cudagraph"),
    ],
)
def test_refused_where_steps_cannot_have_one_shape(kw, platform, match):
    with pytest.raises(PolicyError, match=match):
        plan_engine(spec(**kw), platform, port=9)


def test_its_own_class_and_the_shape_is_part_of_it():
    def identity(s: ModelSpec) -> dict:
        return slot_identity(s, plan_engine(s, H100, port=9), H100, "digest")

    fixed = identity(spec())
    assert fixed["mode"] == "fixed_shape" and fixed["step_tokens"] == 8192
    assert fixed["attention_splits"] == 1
    # kernels chosen by a fixed rule, not by timing: a slot that tunes by timing is another
    # class, and so is one with Inductor's environment changed
    assert fixed["inductor"] == INDUCTOR_DETERMINISTIC
    assert identity(spec(engine_env={"TORCHINDUCTOR_DETERMINISTIC": "0"})) != fixed
    assert identity(spec(determinism="batch_invariant")) != fixed
    assert "step_tokens" not in identity(spec(determinism="batch_invariant"))
    # a budget is a capacity knob elsewhere; here it is the shape the kernels see
    assert identity(spec(engine_args={"max_num_batched_tokens": 4096})) != fixed
    assert identity(spec(engine_args={"gpu_memory_utilization": 0.5})) == fixed
    assert resolve_mode(spec(determinism="auto"), H100) == "batch_invariant"


def test_a_failed_selftest_falls_back_to_batch_invariant_then_serialize():
    restarted: list[str] = []
    running = {"mode": "fixed_shape"}

    def restart(s: ModelSpec) -> None:
        restarted.append(s.determinism)
        running["mode"] = s.determinism

    def outcomes(passes: set[str]):
        return lambda s: SelfTestResult(running["mode"] in passes, 3, 4, "")

    final, shown = prove_batching(
        spec(), lambda: running["mode"], outcomes({"fixed_shape"}), restart
    )
    assert final.determinism == "fixed_shape" and not restarted
    assert shown is not None and shown["mode"] == "fixed_shape" and "fallback" not in shown

    running["mode"] = "fixed_shape"
    final, shown = prove_batching(
        spec(), lambda: running["mode"], outcomes({"batch_invariant"}), restart
    )
    assert final.determinism == "batch_invariant" and restarted == ["batch_invariant"]
    assert shown is not None and shown["fallback"] == "batch_invariant"
    assert shown["then"]["mode"] == "batch_invariant" and shown["then"]["passed"]

    restarted.clear()
    running["mode"] = "fixed_shape"
    final, shown = prove_batching(spec(), lambda: running["mode"], outcomes(set()), restart)
    assert final.determinism == "serialize" and restarted == ["batch_invariant", "serialize"]
    assert shown is not None and shown["fallback"] == "serialize"
    assert not shown["passed"] and not shown["then"]["passed"]


def test_the_padded_head_answers_what_the_head_answers_at_any_row_count():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 2, bias=False).double()
    padded = padded_rows(head, 8)
    for n in (1, 3, 8, 9, 20):
        x = torch.randn(n, 32, dtype=torch.float64)
        got = padded(x)
        assert got.shape == (n, 2) and torch.allclose(got, head(x))
    # the head stays one parameter set (the pooler holds it as a child module)
    assert [p.data_ptr() for p in padded.parameters()] == [head.weight.data_ptr()]


def test_the_lm_head_sees_one_row_count_and_answers_as_unpadded():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    weight = torch.randn(50, 16, dtype=torch.float64)
    seen: list[int] = []

    class Processor:  # vLLM's LogitsProcessor as far as the patch cares
        def forward(self, lm_head, hidden_states, embedding_bias=None):
            seen.append(int(hidden_states.shape[0]))
            return hidden_states @ lm_head.T * 2.0  # the scale after the projection

        def get_top_tokens(self, lm_head, hidden_states, embedding_bias=None):
            seen.append(int(hidden_states.shape[0]))
            return (hidden_states @ lm_head.T).argmax(-1)

    plain = Processor()
    want = {n: torch.randn(n, 16, dtype=torch.float64) for n in (1, 7, 8, 9, 30)}
    expected = {
        n: (plain.forward(weight, x), plain.get_top_tokens(weight, x)) for n, x in want.items()
    }
    seen.clear()
    assert pad_lm_head(8, Processor) is True
    assert pad_lm_head(8, Processor) is True  # applied once, not wrapped twice
    for n, x in want.items():
        logits = Processor().forward(weight, hidden_states=x)
        assert logits.shape == (n, 50) and torch.allclose(logits, expected[n][0])
        assert torch.equal(Processor().get_top_tokens(weight, x), expected[n][1])
    # what it is for: a row answers the same bits alone as among others
    batch = want[30]
    together = Processor().forward(weight, batch)
    for i in (0, 7, 8, 29):
        assert torch.equal(Processor().forward(weight, batch[i : i + 1])[0], together[i])
    assert seen and set(seen) == {8}
    assert pad_lm_head(8, type("NoTop", (), {"forward": Processor.forward})) is True


def test_one_split_attention_reads_batch_invariant_splits_and_nothing_else(monkeypatch):
    real = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_OTHER="x")
    backend = types.SimpleNamespace(envs=real)
    monkeypatch.delenv(ONE_SPLIT_ENV, raising=False)
    assert one_split_attention(backend) is False and backend.envs is real
    monkeypatch.setenv(ONE_SPLIT_ENV, "1")
    assert one_split_attention(backend) is True
    assert backend.envs.VLLM_BATCH_INVARIANT is True and backend.envs.VLLM_OTHER == "x"
    real.VLLM_OTHER = "y"  # read through at each access, never copied
    assert backend.envs.VLLM_OTHER == "y"
    assert one_split_attention(backend) is True  # applied once, not wrapped twice
    assert isinstance(backend.envs, SplitsAsBatchInvariant) and backend.envs._real is real
    assert one_split_attention(types.SimpleNamespace()) is False  # no such backend


def test_the_server_module_pads_vllms_head_in_the_engine_processes():
    """In a fresh interpreter, as the engine starts: ``RMGATE_FIXED_HEAD_ROWS`` replaces the
    sequence classifier head's and the logits processor's forward, and
    ``RMGATE_ATTENTION_ONE_SPLIT`` gives the FlashAttention backend one split; unset,
    vLLM's stay."""
    code = (
        "from deployments.engine import vllm_server;"
        "from vllm.model_executor.layers.pooler.seqwise import heads as h;"
        "from vllm.v1.attention.backends import flash_attn as fa;"
        "from vllm.model_executor.layers.logits_processor import LogitsProcessor as lp;"
        "print(getattr(h.ClassifierPoolerHead, '_rmgate_rows', None),"
        " getattr(lp, '_rmgate_rows', None), fa.envs.VLLM_BATCH_INVARIANT)"
    )
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in (HEAD_ROWS_ENV, ONE_SPLIT_ENV, "VLLM_BATCH_INVARIANT")
    }
    unset = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    padded = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**env, HEAD_ROWS_ENV: "256", ONE_SPLIT_ENV: "1"},
        capture_output=True,
        text=True,
    )
    assert unset.stdout.strip() == "None None False", unset.stderr[-2000:]
    assert padded.stdout.strip() == "256 256 True", padded.stderr[-2000:]


def test_the_inductor_settings_are_real_inductor_options():
    """vLLM hands ``inductor_compile_config`` to Inductor as config patches, and Inductor
    raises on a name it does not have: a misspelt key would stop every fixed_shape engine
    at its first compile (or, patched loosely, leave the timed tilings on)."""
    import torch._inductor.config as inductor

    with inductor.patch(INDUCTOR_DETERMINISTIC):
        assert inductor.deterministic is True and inductor.benchmark_combo_kernel is False
