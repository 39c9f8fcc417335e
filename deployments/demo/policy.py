"""A tiny policy for the demo task, built in memory from a fixed seed (nothing downloaded).

The RL examples (``examples/trl_grpo.py``) need a causal LM that *answers* ``a+b=`` prompts;
the demo judge (``grm``) answers ``Is a+b=c right?`` with ``Score: 1``, so as a policy it
would only ever emit ``Score: ...`` and every rule reward would be 0. This one is the same
Qwen2 shape family (same byte-level tokenizer and chat template as the demo models), half
as wide, trained for a few seconds to answer ``user: 3+4=`` with ``7<|im_end|>`` — on
purpose only *partly*: sampled at temperature 1 it is right on some answers and wrong on
others, so the rewards of a GRPO group differ and training has a signal.

Why short answers matter: most demo answers are one byte-level token, which is what the
batch-variance negative control needs (plain vLLM CPU gives one-token inputs other bits
when batched; see docs/determinism.md).

The build is deterministic (one thread, deterministic algorithms, seeded weights from
``deployments.demo.models``, fixed data order), so two builds give the same tensors:
``policy_digest`` of two builds is equal.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from deployments.demo import models as demo_models
from deployments.demo import training as demo_training

#: hidden 64, 2 layers: generation of a few tokens for 16 sequences takes milliseconds.
POLICY_SPEC = demo_models.DemoModelSpec("policy", "generative", 64, 128, 2, 4, 2, seed=21)
#: Few enough steps that the policy is still unsure (right about half the time, sampled).
POLICY_TRAIN_STEPS = 130


def policy_prompt(a: int, b: int) -> str:
    """The demo task's prompt (the user message): ``a+b=``."""
    return f"{a}+{b}="


def build_tokenizer() -> Any:
    """The demo models' tokenizer as a transformers tokenizer (what TRL wants)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    cfg = {k: v for k, v in demo_models.tokenizer_config().items() if k != "tokenizer_class"}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(demo_models.tokenizer_json())), **cfg
    )
    return tok


def _train_policy(model: Any, tokenizer: Any, steps: int, seed: int = 23) -> None:
    """Teacher-forced answers ``c<|im_end|>`` to ``user: a+b=`` (loss on the answer only)."""
    import torch

    demo_training._set_deterministic(seed)
    rows = []
    for a in range(10):
        for b in range(10):
            prompt = demo_training.chat_text(
                [{"role": "user", "content": policy_prompt(a, b)}], add_generation_prompt=True
            )
            answer = f"{a + b}{demo_training.CHAT_CLOSE}"
            p = demo_training._encode(tokenizer, prompt)
            rows.append((p + demo_training._encode(tokenizer, answer), len(p)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for batch in demo_training._batches(len(rows), demo_training.BATCH, steps, seed):
        ids, mask = demo_training._pad([rows[i][0] for i in batch], demo_models.PAD_ID)
        labels = ids.clone()
        for j, i in enumerate(batch):
            labels[j, : rows[i][1]] = -100
        labels[mask == 0] = -100
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def build_policy(steps: int = POLICY_TRAIN_STEPS) -> tuple[Any, Any]:
    """(model, tokenizer): the demo policy, fp32, eager attention, in memory.

    Sets one torch thread and deterministic algorithms for the whole process (the build
    needs them to be reproducible, and so does any training that follows).
    """
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec = POLICY_SPEC
    cfg_dict = {
        k: v
        for k, v in demo_models.model_config(spec).items()
        if k not in ("architectures", "torch_dtype")
    }
    cfg = Qwen2Config(**cfg_dict)
    cfg._attn_implementation = "eager"
    demo_training._set_deterministic(spec.seed)
    model = Qwen2ForCausalLM(cfg)
    state = demo_models._weights(spec)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    model.generation_config = GenerationConfig(
        eos_token_id=demo_models.EOS_ID, pad_token_id=demo_models.PAD_ID, do_sample=True
    )
    _train_policy(model, Tokenizer.from_str(json.dumps(demo_models.tokenizer_json())), steps)
    return model, build_tokenizer()


def policy_digest(model: Any) -> str:
    """sha256 over a model's state (names, dtypes, shapes, raw bytes; sorted by name).

    Tied weights appear once per name, as ``state_dict`` lists them; the digest of two
    models is equal exactly when every tensor is bitwise equal.
    """
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


__all__ = ["POLICY_SPEC", "build_policy", "build_tokenizer", "policy_digest", "policy_prompt"]
