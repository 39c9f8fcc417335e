"""The GPU benchmark's plans (benchmarks/gpu/bench_paths.py), checked without a GPU: every
layout renders to a valid rmgate config, fits the H200, names phases that exist, and the
pure helpers (ratios, load-generator merge, the wheel scanner, the model builder's
tokenizer and shapes) do what the results rely on."""

from __future__ import annotations

import ast
import json

import pytest

from benchmarks.gpu import bench_paths as bp
from benchmarks.gpu import loadgen, models_gpu, wheel_list
from gateway.core.config.settings import AppConfig


def built(layout: bp.Layout) -> dict:
    names = {*bp.SIZES[layout.size], *(m.shape for m in layout.models if m.shape)}
    return {n: {"path": f"/models/{n}", "weights": models_gpu.shape(n).weights} for n in names}


@pytest.mark.parametrize("name", sorted(bp.LAYOUTS))
def test_layout_renders_fits_and_names_real_phases(name):
    layout = bp.LAYOUTS[name]()
    cfg = bp.serve_config(layout, built(layout))
    app = AppConfig.model_validate(cfg["applications"][0]["args"])
    assert app.gateway.canary_interval_s == 0  # no probes inside the measured windows
    engines = sum(m.replicas for m in app.models)
    fracs = [m.ray_actor_options["num_gpus"] for m in app.models for _ in range(m.replicas)]
    assert sum(fracs) <= 1.0 and engines == sum(m.slots for m in layout.models)
    assert bp.memory_gib(layout) < 130, "leave the H200's last GiBs to CUDA contexts"
    for phase, kw in layout.phases:
        assert hasattr(bp.Bench, f"phase_{phase}"), phase
        if phase == "throughput":
            assert kw["kind"] in layout.n_tp
    from deployments.engine.arg_names import check_engine_args

    for m in app.models:
        check_engine_args(m)  # every engine argument is one vLLM knows (a typo fails here)
    dummy = {m.name for m in app.models if m.engine_args.get("load_format") == "dummy"}
    shapes = {m.name: models_gpu.shape(m.model_shape(layout.size)) for m in layout.models}
    assert dummy == {n for n, sh in shapes.items() if sh.weights == "dummy"}
    # 7-8B shapes skip writing 15 GB, except the Llama one (its dummy scores carry nothing)
    for sh in shapes.values():
        assert (sh.weights == "dummy") == (sh.hidden_size >= 3584 and sh.arch != "llama")


def test_core_layout_has_every_path_for_both_kinds():
    layout = bp.LAYOUTS["core-0.5b"]()
    names = {m.name for m in layout.models}
    for kind in ("grm", "rm"):
        assert {f"{kind}-auto", f"{kind}-off", f"{kind}-serialize"} <= names
    assert set(layout.anchors) == {"grm", "rm"}
    assert [p for p, _ in layout.phases][:2] == ["anchors", "replay"]


def test_ratios_and_merge():
    row = {
        "rmgate_auto": {"req_per_s": 900.0},
        "engine_auto": {"req_per_s": 1000.0},
        "rmgate_serial": {"req_per_s": 60.0},
    }
    r = bp.ratios(row)
    assert r == {"rmgate_auto/engine_auto": 0.9, "rmgate_auto/rmgate_serial": 15.0}
    parts = [
        {
            "answers": {0: "a"},
            "lat": [0.1],
            "errors": [],
            "tokens": 64,
            "first": 10.0,
            "last": 11.0,
            "cpu_s": 0.001,
        },
        {
            "answers": {1: "b"},
            "lat": [0.3],
            "errors": ["x"],
            "tokens": 64,
            "first": 10.5,
            "last": 12.0,
            "cpu_s": 0.003,
        },
    ]
    m = loadgen.merge(parts, 3, 2, 2)
    assert m["ok"] == 2 and m["errors"] == 1 and m["seconds"] == 2.0 and m["req_per_s"] == 1.0
    assert m["gen_tok_per_s"] == 64.0 and m["loadgen_cpu_ms_per_req"] == 2.0


def test_workloads_are_fixed_functions_of_the_index():
    assert bp.rm_body("m", 7) == bp.rm_body("m", 7)
    assert bp.grm_body("m", 7, 64)["seed"] == 1007
    lengths = {len(bp.rm_text(i)) for i in range(200)}
    assert lengths == {1, 4, 16, 64, 256, 900}


def test_wheel_scanner_tiers():
    src = (
        "import a_hard\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import not_at_runtime\n"
        "if FLAG:\n    import b_cond\n"
        "try:\n    import c_opt\nexcept ImportError:\n    c_opt = None\n"
        "def f():\n    import d_lazy\n    if x:\n        import e_lazycond\n"
    )
    got = {name: how for name, how, _ in wheel_list.imports_of(ast.parse(src), "vllm.x", False)}
    assert got["a_hard"] == "hard" and got["b_cond"] == "cond" and got["c_opt"] == "optional"
    assert got["d_lazy"] == "lazy" and got["e_lazycond"] == "lazy-cond"
    assert "not_at_runtime" not in got


def test_gpu_model_shapes_match_the_real_sizes(tmp_path):
    params = {
        s.name: sum(__import__("math").prod(d) for d in models_gpu.tensor_shapes(s).values())
        for s in __import__("deployments.demo.models", fromlist=["x"]).GPU_MODEL_SHAPES
    }
    assert 0.45e9 < params["grm-0.5b"] < 0.52e9
    assert 1.45e9 < params["grm-1.5b"] < 1.6e9
    assert 7.4e9 < params["grm-7b"] < 7.8e9
    info = models_gpu.build(tmp_path, "rm-7b")  # dummy weights: config and tokenizer only
    assert info["weights"] == "dummy" and not (tmp_path / "rm-7b" / "model.safetensors").exists()
    cfg = json.loads((tmp_path / "rm-7b" / "config.json").read_text())
    assert (
        cfg["architectures"] == ["Qwen2ForSequenceClassification"]
        and not cfg["tie_word_embeddings"]
    )
    vocab = json.loads((tmp_path / "rm-7b" / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == cfg["vocab_size"] == 152064 and sorted(vocab.values()) == list(
        range(152064)
    )


def test_layouts_that_stand_for_a_config_take_its_settings():
    """A layout that stands for configs/gpu-small.yaml measures that config: its slots,
    engine arguments, environment and ingress replicas (a sweep changes one thing at a
    time from there, and the KV cache, which the load does not reach)."""
    import yaml

    shipped = yaml.safe_load((bp.REPO / "configs" / "gpu-small.yaml").read_text())
    args = shipped["applications"][0]["args"]
    want = {("grm" if m["kind"] == "generative" else "rm"): m for m in args["models"]}
    layout = bp.LAYOUTS["shipped-0.5b"]()
    assert layout.config == "configs/gpu-small.yaml"
    assert layout.ingress_replicas == args["gateway"]["ingress_replicas"]
    cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
    got = {
        ("grm" if m["kind"] == "generative" else "rm"): m
        for m in cfg["applications"][0]["args"]["models"]
    }
    assert (
        cfg["applications"][0]["args"]["gateway"]["ingress_replicas"]
        == args["gateway"]["ingress_replicas"]
    )
    for kind, m in want.items():
        assert got[kind]["replicas"] == m["replicas"]
        assert got[kind]["engine_args"] == m["engine_args"]
        assert got[kind]["engine_env"] == m["engine_env"]

    sweep = bp.LAYOUTS["sweep-0.5b"]()
    cfg = bp.serve_config(sweep, built(sweep), sweep.ingress_replicas)
    models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
    base = models["rm-auto"]
    assert {k: v for k, v in base["engine_args"].items() if k != "kv_cache_memory_bytes"} == {
        k: v for k, v in want["rm"]["engine_args"].items() if k != "kv_cache_memory_bytes"
    }
    for name, m in models.items():
        changed = {
            k
            for k in set(m["engine_args"]) | set(base["engine_args"])
            if m["engine_args"].get(k) != base["engine_args"].get(k)
        }
        changed |= {k for k in ("replicas", "determinism") if m[k] != base[k]}
        assert len(changed) == (0 if name == "rm-auto" else 1), (name, changed)
    assert next(p for p, _ in sweep.phases) == "framework"


def test_framework_anchor_buckets_by_padded_tokens():
    from benchmarks.gpu.framework_anchor import buckets

    lengths = [5, 1, 3, 900, 4, 256, 256]
    got = buckets(lengths, 1024, 3)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    for b in got:
        assert len(b) <= 3 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 1024)
    assert [[lengths[i] for i in b] for b in got] == [[1, 3, 4], [5, 256, 256], [900]]


def test_layouts_for_one_80gb_gpu_fit_and_measure_the_shipped_7b_config():
    """shipped-7b / shipped-8b stand for configs/gpu.yaml: its DisRM and judge settings,
    each beside the same engine under `off` (one variable: the mode), within one 80 GB GPU,
    the framework anchors before the gateway starts."""
    import yaml

    shipped = yaml.safe_load((bp.REPO / "configs" / "gpu.yaml").read_text())
    args = shipped["applications"][0]["args"]
    want = {("grm" if m["kind"] == "generative" else "rm"): m for m in args["models"]}
    for name, tag in (("shipped-7b", ""), ("shipped-8b", "fa3")):
        layout = bp.LAYOUTS[name]()
        assert bp.memory_gib(layout) < 74, name
        assert layout.ingress_replicas == args["gateway"]["ingress_replicas"]
        assert layout.before_gateway == [("framework", {"kind": "rm", "attn": ["sdpa", "fa3"]})]
        cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
        models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
        judge = f"grm-auto-{tag}" if tag else "grm-auto"
        assert models["rm-auto"]["determinism"] == want["rm"]["determinism"]
        assert models[judge]["determinism"] == want["grm"]["determinism"]
        for det, off, kind in (
            ("rm-auto", "rm-off", "rm"),
            (judge, judge.replace("auto", "off"), "grm"),
        ):
            assert models[off]["determinism"] == "off"
            assert models[off]["engine_args"] == models[det]["engine_args"]
            skip = {"kv_cache_memory_bytes", "load_format", "attention_backend"}
            assert {k: v for k, v in models[det]["engine_args"].items() if k not in skip} == {
                k: v for k, v in want[kind]["engine_args"].items() if k not in skip
            }
        assert models[judge]["engine_args"]["attention_backend"] == (
            "FLASH_ATTN" if tag else want["grm"]["engine_args"]["attention_backend"]
        )
    assert bp.SIZES["8b"][1] == "rm-8b-llama"


def test_llama_shape_is_a_llama_3_1_8b_classifier(tmp_path):
    s = models_gpu.shape("rm-8b-llama")
    params = sum(__import__("math").prod(d) for d in models_gpu.tensor_shapes(s).values())
    assert 7.4e9 < params < 7.6e9  # Llama-3.1-8B without its LM head
    assert not any(k.endswith("_proj.bias") for k in models_gpu.tensor_shapes(s))
    cfg = models_gpu.config(s)
    assert cfg["architectures"] == ["LlamaForSequenceClassification"]
    assert cfg["model_type"] == "llama" and cfg["rope_theta"] == 500000.0
    assert cfg["head_dim"] == 128 and cfg["num_key_value_heads"] == 8


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_framework_anchor_packed_varlen_scores_match_sdpa(tmp_path, monkeypatch, arch):
    """The packed FlashAttention anchor computes the same scores as the padded SDPA one
    (attention stays inside each sequence, the head reads
    each sequence's last token): checked on a CPU with a reference varlen attention. A
    packing that let sequences see each other, or read the wrong token, fails."""
    import dataclasses

    import torch

    from benchmarks.gpu import framework_anchor as fa

    tiny = dataclasses.replace(
        models_gpu.shape("rm-8b-llama" if arch == "llama" else "rm-0.5b"),
        name="rm-tiny",
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=512,
        weights="random",
    )
    monkeypatch.setattr(models_gpu, "shape", lambda name: tiny)
    info = models_gpu.build(tmp_path, "rm-tiny")

    def reference(q, k, v, max_seqlen_q, cu_seqlens_q, softmax_scale, causal, **_):
        out = torch.empty_like(q)
        groups = q.shape[1] // k.shape[1]
        cu = cu_seqlens_q.tolist()
        for a, b in zip(cu, cu[1:]):
            qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
            ks, vs = (x.repeat_interleave(groups, dim=0) for x in (ks, vs))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=causal, scale=softmax_scale
            )
            out[a:b] = o.transpose(0, 1)
        return out

    texts = ["a", "12+3=15", "hello world " * 5, "x" * 40, "9", "abc def"]
    spec = {
        "model": info["path"],
        "texts": texts,
        "budgets": [64, 4096],
        "attn": ["sdpa", "fa3"],
        "max_batch": 4,
    }
    res = fa.run(spec, varlen=reference)
    assert "error" not in res["by_attention"]["fa3"], res
    # each implementation's scores at its last budget (one pack / bucket set holds them all)
    got = {a: res["by_attention"][a]["scores_head"][: len(texts)] for a in ("sdpa", "fa3")}
    assert max(abs(x - y) for x, y in zip(got["sdpa"], got["fa3"])) < 0.05 * max(
        1.0, max(abs(x) for x in got["sdpa"])
    )
    assert len(set(got["fa3"])) == len(texts)  # every sequence its own score


def test_judge_fixed_shape_layout_measures_each_budget_beside_vllms_default_engine():
    """Each fixed_shape budget beside one engine under `off`: the shipped judge's settings
    with FA3 (vLLM's default on Hopper), the only change from the candidates being the mode
    and the budget; the off paths of every phase reach that engine."""
    layout = bp.LAYOUTS["judge-fixed-shape-7b"]()
    assert bp.memory_gib(layout) < 74
    cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
    models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
    off = models["grm-off-fa3"]
    assert off["determinism"] == "off" and off["engine_args"]["attention_backend"] == "FLASH_ATTN"
    assert "max_num_batched_tokens" not in off["engine_args"]  # vLLM's own budget
    for budget in (512, 1024):
        fs = models[f"grm-auto-fs{budget}"]
        assert fs["determinism"] == "fixed_shape"
        assert fs["engine_args"].pop("max_num_batched_tokens") == budget
        assert fs["engine_args"] == off["engine_args"]
    throughput = [kw for phase, kw in layout.phases if phase == "throughput"]
    assert {kw["off_tag"] for kw in throughput} == {"fa3"}
    assert sorted(kw["levels"][0] for kw in throughput) == [1, 1, 256, 256]


def test_candidate_layouts_keep_the_batch_invariant_engines_they_measured():
    """judge-7b measured the judge batch-invariant on TRITON_ATTN at vLLM's own budget (as
    shipped then): it stays that, whatever configs/gpu.yaml's judge now runs."""
    layout = bp.LAYOUTS["judge-7b"]()
    cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
    models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
    assert models["grm-auto"]["determinism"] == "batch_invariant"
    assert models["grm-auto"]["engine_args"]["attention_backend"] == "TRITON_ATTN"
    assert "max_num_batched_tokens" not in models["grm-auto"]["engine_args"]
    assert models["grm-off-fa3"]["determinism"] == "off"
    # and candidates-7b its DisRM batch-invariant on TRITON_ATTN at a 32k step beside the
    # fixed_shape candidate, which the fixed-shape-* layouts measure alone
    layout = bp.LAYOUTS["candidates-7b"]()
    cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
    models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
    bi, fs = models["rm-auto"], models["rm-auto-fs"]
    assert bi["determinism"] == "batch_invariant"
    assert bi["engine_args"]["attention_backend"] == "TRITON_ATTN"
    assert bi["engine_args"]["max_num_batched_tokens"] == 32768
    alone = bp.serve_config(*(lambda lay: (lay, built(lay)))(bp.LAYOUTS["fixed-shape-7b"]()))
    same = {m["name"]: m for m in alone["applications"][0]["args"]["models"]}["rm-auto-fs"]
    for key in ("determinism", "engine_args", "engine_env"):
        assert same[key] == fs[key], key


def test_two_slots_layout_answers_every_request_on_both_slots_of_the_shipped_config():
    layout = bp.LAYOUTS["two-slots-7b"]()
    cfg = bp.serve_config(layout, built(layout), layout.ingress_replicas)
    models = {m["name"]: m for m in cfg["applications"][0]["args"]["models"]}
    assert {m["replicas"] for m in models.values()} == {2}
    assert {m["determinism"] for m in models.values()} == {"fixed_shape"}
    assert bp.memory_gib(layout) <= bp.memory_gib(bp.LAYOUTS["shipped-7b"]())
    for _, kw in layout.phases:
        assert "engine_auto_other_slot" in kw["paths"] and kw["bits"]
