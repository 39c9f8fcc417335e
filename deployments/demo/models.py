"""Build the demo reward models locally, from a fixed seed, byte-identical on every run
on one kind of CPU (``DEMO_BUILDS``).

Nothing is downloaded: the tokenizer is a byte-level BPE written out by hand (the 256 byte
symbols plus chat specials), and every weight tensor is drawn from its own
``torch.Generator`` seeded by the model seed and the tensor's name, so the bytes do not
depend on module construction order or on the transformers version's init scheme.
Files are written with sorted keys and fixed metadata so that two builds hash the same.

Three models share one tokenizer:

* ``grm``       a tiny Qwen2 causal LM with a chat template (the generative judge),
* ``disrm``     a tiny Qwen2 sequence classifier with one label (the discriminative RM),
* ``disrm-large`` the same classifier at hidden size 1024, wide enough that vLLM CPU's
  batched kernels reduce differently from one-at-a-time (the negative control).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.engine.fingerprint import digest_dir

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MAX_POSITIONS = 1024


@dataclass(frozen=True)
class DemoModelSpec:
    """Shape of one demo model."""

    name: str
    kind: str  # "generative" | "discriminative"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    seed: int
    #: Seconds-long training on the single-digit-sum judging task (deployments.demo.training).
    trained: bool = False


DEMO_MODELS: tuple[DemoModelSpec, ...] = (
    DemoModelSpec("grm", "generative", 128, 256, 2, 4, 2, seed=1, trained=True),
    DemoModelSpec("disrm", "discriminative", 128, 256, 2, 4, 2, seed=2, trained=True),
    # Random weights on purpose: only its width matters (the batch-variance control).
    DemoModelSpec("disrm-large", "discriminative", 1024, 2816, 2, 16, 16, seed=3),
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json() -> dict[str, Any]:
    """A byte-level BPE tokenizer: one token per byte, specials after them, no merges."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    added = []
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = 256 + i
        added.append(
            {
                "id": 256 + i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": True,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
PAD_ID = 256
EOS_ID = 258


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


#: Random models shaped like Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads) for
#: the GPU benchmark (benchmarks/gpu): large enough that batching changes kernels on CUDA.
GPU_BENCH_MODELS: tuple[DemoModelSpec, ...] = (
    DemoModelSpec("grm-0.5b", "generative", 896, 4864, 24, 14, 2, seed=4),
    DemoModelSpec("disrm-0.5b", "discriminative", 896, 4864, 24, 14, 2, seed=5),
)


@dataclass(frozen=True)
class GpuModelShape:
    """A random reward model shaped like a real one, for the GPU benchmarks
    (``benchmarks/gpu/models_gpu.py`` builds it on the device; nothing is downloaded).

    ``weights``: ``random`` writes seeded random bf16 safetensors (std-scaled, so sampling
    and scores are not degenerate: the bitwise checks mean something); ``dummy`` writes no
    weights and the engine runs with ``load_format: dummy`` (vLLM fills them from a fixed
    seed at start-up): the same shapes, so the same speed, without writing and hashing
    15 GB per model. vLLM's dummy weights (``[-1e-3, 1e-3]``, norms included) leave a
    Llama classifier's score a function of its last token alone (2 distinct scores over six
    inputs ending alike, against 6 for the Qwen2 shape: ``benchmarks/dummy_weights.py``,
    ``benchmarks/reports/dummy_weights-2026-12-07.json``), so no batching can change it
    and its bit checks prove nothing: the Llama shape has random weights."""

    name: str
    kind: str  # "generative" | "discriminative"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    weights: str  # "random" | "dummy"
    seed: int
    #: ``qwen2`` (q/k/v biases, rope theta 1e6) or ``llama`` (no biases, rope theta 5e5,
    #: head_dim 128: the Llama-3.1-8B reward models such as Skywork-Reward-V2-Llama-3.1-8B)
    arch: str = "qwen2"


#: Real reward-model sizes (Qwen2.5 0.5B / 1.5B / 7B shapes, their vocabularies and
#: embedding tying). GRM = Qwen2ForCausalLM (chat judge), DisRM = Qwen2ForSequenceClassification
#: with one label on the same backbone (the score head replaces the LM head).
GPU_MODEL_SHAPES: tuple[GpuModelShape, ...] = (
    GpuModelShape("grm-0.5b", "generative", 896, 4864, 24, 14, 2, 151936, True, "random", 4),
    GpuModelShape("rm-0.5b", "discriminative", 896, 4864, 24, 14, 2, 151936, True, "random", 5),
    GpuModelShape("grm-1.5b", "generative", 1536, 8960, 28, 12, 2, 151936, True, "random", 6),
    GpuModelShape("rm-1.5b", "discriminative", 1536, 8960, 28, 12, 2, 151936, True, "random", 7),
    GpuModelShape("grm-7b", "generative", 3584, 18944, 28, 28, 4, 152064, False, "dummy", 8),
    GpuModelShape("rm-7b", "discriminative", 3584, 18944, 28, 28, 4, 152064, False, "dummy", 9),
    GpuModelShape(
        "rm-8b-llama",
        "discriminative",
        4096,
        14336,
        32,
        32,
        8,
        128256,
        False,
        "random",
        10,
        "llama",
    ),
)


def model_config(spec: DemoModelSpec) -> dict[str, Any]:
    generative = spec.kind == "generative"
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if generative else "Qwen2ForSequenceClassification"],
        "model_type": "qwen2",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": generative,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    if not generative:
        cfg["num_labels"] = 1
        cfg["id2label"] = {"0": "LABEL_0"}
        cfg["label2id"] = {"LABEL_0": 0}
    return cfg


def _tensor_shapes(spec: DemoModelSpec) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a Qwen2 checkpoint, as transformers names them."""
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.hidden_size // spec.num_heads
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB_SIZE, h),
        "model.norm.weight": (h,),
    }
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    if spec.kind == "discriminative":
        shapes["score.weight"] = (1, h)
    return shapes


def _weights(spec: DemoModelSpec) -> dict[str, Any]:
    import torch

    out = {}
    for name, shape in sorted(_tensor_shapes(spec).items()):
        gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + zlib.crc32(name.encode()))
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=gen) * 0.02
        elif name == "score.weight":
            t = torch.randn(shape, generator=gen) * (1.0 / spec.hidden_size**0.5)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) * (1.0 / shape[-1] ** 0.5)
        out[name] = t.to(torch.float32).contiguous()
    return out


def _trained(spec: DemoModelSpec, weights: dict[str, Any]) -> dict[str, Any]:
    """Load ``weights`` into the transformers model, train it, return its tensors."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    from deployments.demo import training as demo_training

    cfg_dict = {
        k: v for k, v in model_config(spec).items() if k not in ("architectures", "torch_dtype")
    }
    cfg = Qwen2Config(**cfg_dict)
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    cls = Qwen2ForCausalLM if spec.kind == "generative" else Qwen2ForSequenceClassification
    model = cls(cfg).to(torch.float32)
    state = dict(weights)
    if spec.kind == "generative":
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    tok = Tokenizer.from_str(json.dumps(tokenizer_json()))
    train = demo_training.train_grm if spec.kind == "generative" else demo_training.train_disrm
    train(model, tok, PAD_ID)
    out = model.state_dict()
    return {
        name: out[name].detach().to(torch.float32).contiguous().clone() for name in sorted(weights)
    }


def _dump_json(path: Path, obj: Any) -> None:
    path.write_text(
        json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def write_model(spec: DemoModelSpec, out_dir: Path) -> None:
    """Write one model folder (config, weights, tokenizer) that vLLM loads offline."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    _dump_json(out_dir / "config.json", model_config(spec))
    _dump_json(
        out_dir / "generation_config.json",
        {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": True},
    )
    _dump_json(out_dir / "tokenizer.json", tokenizer_json())
    _dump_json(out_dir / "tokenizer_config.json", tokenizer_config())
    _dump_json(
        out_dir / "special_tokens_map.json",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    weights = _weights(spec)
    if spec.trained:
        weights = _trained(spec, weights)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _write_single_threaded(spec: DemoModelSpec, out_dir: Path) -> None:
    """``write_model`` in a process of its own, on one thread as every build is."""
    import torch

    torch.set_num_threads(1)
    write_model(spec, out_dir)


def build_demo_models(
    out_dir: Path | str,
    names: list[str] | None = None,
    specs: tuple[DemoModelSpec, ...] = DEMO_MODELS,
    workers: int | None = None,
) -> dict[str, str]:
    """Build the demo models under ``out_dir`` and return {name: sha256 digest}.

    Each model trains on one thread (the bytes then depend on the CPU's kernels only, not
    on a thread count); the trained ones train at the same time in processes of their own
    (``workers``, default: one per trained model up to the CPU count), which halves the
    first demo's wait on two cores without changing a byte."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    import torch

    torch.set_num_threads(1)
    out = Path(out_dir)
    chosen = [s for s in specs if not names or s.name in names]
    trained = [s for s in chosen if s.trained]
    if workers is None:
        workers = min(len(trained), os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            for done in [pool.submit(_write_single_threaded, s, out / s.name) for s in trained]:
                done.result()
    for spec in chosen:
        if workers <= 1 or not spec.trained:
            write_model(spec, out / spec.name)
    return {spec.name: digest_dir(out / spec.name) for spec in chosen}


#: sha256 (``digest_dir``) of each model, by the kind of CPU that built it. The untrained
#: ``disrm-large`` is the same everywhere; the two trained models are not: their float
#: training follows the CPU's kernels (MKL and ATen pick AVX-512 or AVX2 code that sums in
#: another order), so each kind of CPU builds its own bytes, always the same ones. Measured:
#: AVX-512 Intel hosts, AVX-512 Intel hosts with AMX tiles (bf16/fp16), and an AVX2-only
#: AMD EPYC host; each built its set twice, byte for byte.
#: A build must reproduce one whole set; a CPU kind not listed here fails the unit test,
#: which prints the digests to add.
DEMO_BUILDS: dict[str, dict[str, str]] = {
    "x86-64 AVX-512 (Intel Xeon)": {
        "grm": "6f383bcb1b1fd2d97edfdb517719e5986222df183210474db07e9835f9e1cefa",
        "disrm": "89c831554f8077226500f3a15207f7b130b047d70c6bf21fe8513c1ca3100b9d",
        "disrm-large": "eaa582da4ba23ec3b1da5f8849ca0dc7d54baf0fe9cade28d788622fe8439520",
    },
    "x86-64 AVX-512 with AMX (Intel Xeon, bf16/fp16 tiles)": {
        "grm": "064d6105cc23379dda26f83c0f868497574f953bbf64443a987937257f3aa335",
        "disrm": "02793ce084008b9e263bfedefac053916a06dc5e127a4a65f5b71201f227f5e3",
        "disrm-large": "eaa582da4ba23ec3b1da5f8849ca0dc7d54baf0fe9cade28d788622fe8439520",
    },
    "x86-64 AVX2 (AMD EPYC)": {
        "grm": "2750d0eb29d420804e443a2fb00c6b487dc0d2eea39399a31a2ac3d6c30f7c62",
        "disrm": "09c5251a81c6dd844ec9a24f64872c6c0a34a5d147e638eb6e0b2a95e12bfd47",
        "disrm-large": "eaa582da4ba23ec3b1da5f8849ca0dc7d54baf0fe9cade28d788622fe8439520",
    },
}


def demo_build_of(out_dir: Path | str) -> str | None:
    """Which known build (``DEMO_BUILDS`` key) the models under ``out_dir`` are, or None
    when one is missing or its bytes match no known build."""
    out = Path(out_dir)
    if not all((out / s.name / "model.safetensors").is_file() for s in DEMO_MODELS):
        return None
    built = {s.name: digest_dir(out / s.name) for s in DEMO_MODELS}
    return next((kind for kind, digests in DEMO_BUILDS.items() if digests == built), None)


def demo_models_present(out_dir: Path | str) -> bool:
    """True when every demo model is there with exactly the bytes of one known build."""
    return demo_build_of(out_dir) is not None
