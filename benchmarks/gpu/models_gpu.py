"""Build the GPU benchmark models (``deployments/demo/models.py: GPU_MODEL_SHAPES``) on the
device: config, a byte-level BPE tokenizer padded to the model's vocabulary, a ChatML
template, and either seeded random bf16 weights or none (``load_format: dummy``).

Run it as a child process (``python -m benchmarks.gpu.models_gpu OUT NAME...``): torch must
not have run in a process that later creates ``vllm.LLM`` (its forked EngineCore hangs).
Weights are drawn on the GPU when there is one (seconds for 1.5B), per tensor from a
generator seeded by the model seed and the tensor name, so a rebuild gives the same bytes.

The tokenizer: 256 byte symbols + the chat specials, then filler tokens ``<x259>`` ... up to
the vocabulary size. Encoding never produces a filler (there are no merges), so prompts are
one token per byte; a sampled filler decodes to its own text. This keeps the LM head, the
sampler and the logprobs at their real size (151,936 / 152,064 columns) instead of 259.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from deployments.demo import models as demo

MAX_POSITIONS = 4096


def shape(name: str) -> demo.GpuModelShape:
    for s in demo.GPU_MODEL_SHAPES:
        if s.name == name:
            return s
    raise KeyError(f"no GPU model shape {name!r}; known: {[s.name for s in demo.GPU_MODEL_SHAPES]}")


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    tok = demo.tokenizer_json()
    vocab = tok["model"]["vocab"]
    for i in range(demo.VOCAB_SIZE, vocab_size):
        vocab[f"<x{i}>"] = i
    return tok


#: Per architecture: the transformers class prefix and model type, and what differs in the
#: config (Qwen2.5: q/k/v biases, rope theta 1e6; Llama-3.1: no biases, rope theta 5e5).
ARCH = {
    "qwen2": (
        "Qwen2",
        {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False},
    ),
    "llama": (
        "Llama",
        {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False},
    ),
}


def config(s: demo.GpuModelShape) -> dict[str, Any]:
    generative = s.kind == "generative"
    prefix, extra = ARCH[s.arch]
    cfg: dict[str, Any] = {
        "architectures": [
            f"{prefix}ForCausalLM" if generative else f"{prefix}ForSequenceClassification"
        ],
        "model_type": s.arch,
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.hidden_size // s.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        **extra,
        # the classifier's score head is its own (vLLM's seq-cls adapter replaces the LM head)
        "tie_word_embeddings": s.tie_word_embeddings and generative,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": demo.EOS_ID,
        "pad_token_id": demo.PAD_ID,
    }
    if not generative:
        cfg.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    return cfg


def tensor_shapes(s: demo.GpuModelShape) -> dict[str, tuple[int, ...]]:
    h, i, hd = s.hidden_size, s.intermediate_size, s.hidden_size // s.num_heads
    q, kv = s.num_heads * hd, s.num_kv_heads * hd
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (s.vocab_size, h),
        "model.norm.weight": (h,),
    }
    for layer in range(s.num_layers):
        p = f"model.layers.{layer}."
        out.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
        if s.arch == "qwen2":  # Qwen2's attention projections carry biases, Llama's do not
            out.update(
                {p + f"self_attn.{x}_proj.bias": (d,) for x, d in (("q", q), ("k", kv), ("v", kv))}
            )
    if s.kind == "discriminative":
        out["score.weight"] = (1, h)
    elif not s.tie_word_embeddings:
        out["lm_head.weight"] = (s.vocab_size, h)
    return out


def std_of(name: str, dims: tuple[int, ...], s: demo.GpuModelShape) -> float:
    """Std-scaled init. Embeddings at 0.1 (tied: logits of std ~3 at the last layer, so
    sampling at T=1 is neither uniform nor one-hot and batch variance shows in the bits)."""
    if name.endswith(".bias"):
        return 0.02
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return 0.1
    return 1.0 / dims[-1] ** 0.5


def write_weights(s: demo.GpuModelShape, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = {}
    for name, dims in sorted(tensor_shapes(s).items()):
        if name.endswith("norm.weight"):
            t = torch.ones(dims, dtype=torch.bfloat16)
        else:
            gen = torch.Generator(device=dev).manual_seed(
                s.seed * 1_000_003 + zlib.crc32(name.encode())
            )
            t = (
                (torch.randn(dims, generator=gen, device=dev) * std_of(name, dims, s))
                .to(torch.bfloat16)
                .cpu()
            )
        tensors[name] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def build(out_dir: Path, name: str) -> dict[str, Any]:
    """Write one model folder; returns {path, weights, params}. Reuses a complete folder."""
    return build_shape(out_dir, shape(name))


def build_shape(out_dir: Path, s: demo.GpuModelShape) -> dict[str, Any]:
    """``build`` for a shape given whole (one not in ``GPU_MODEL_SHAPES``)."""
    name = s.name
    out = out_dir / name
    done = out_dir / f"{name}.built"  # beside the folder: the folder's digest is the model's
    if done.is_file():
        return json.loads(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dump = lambda f, obj: (out / f).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")  # noqa: E731
    dump("config.json", config(s))
    dump(
        "generation_config.json",
        {"eos_token_id": demo.EOS_ID, "pad_token_id": demo.PAD_ID, "do_sample": True},
    )
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(s.vocab_size)))
    tc = demo.tokenizer_config()
    tc["model_max_length"] = MAX_POSITIONS
    dump("tokenizer_config.json", tc)
    dump("special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    if s.weights == "random":
        write_weights(s, out)
    params = sum(_numel(d) for d in tensor_shapes(s).values())
    info = {
        "path": str(out),
        "weights": s.weights,
        "params": params,
        "kind": s.kind,
        "build_s": round(time.time() - t0, 1),
    }
    done.write_text(json.dumps(info))
    return info


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def build_in_child(out_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`build` of ``names`` in a child process: the CUDA context the weights are drawn
    in must not outlive the build on a GPU the engines are about to fill."""
    import subprocess

    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.models_gpu", str(out_dir), *names],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
    )
    if res.returncode:
        raise RuntimeError(f"model build failed: {res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    out = Path(sys.argv[1])
    print(json.dumps({n: build(out, n) for n in sys.argv[2:]}))


if __name__ == "__main__":
    main()
