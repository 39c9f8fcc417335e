"""The framework anchor: the same DisRM in a plain ``transformers`` forward, what a trainer
scoring in-process would get, with no server, no engine and no determinism policy.

bf16, the requests pre-tokenized (the tokenization is timed apart). Two attention
implementations (``attn`` in the spec), each at several token budgets after a warm-up pass
over the same batches; the best of all is the anchor (the strongest plain forward this
recipe finds, so a ratio against it is not flattered):

``sdpa``  transformers' SDPA: bucketed by length (sorted by token count, cut into batches of
          at most ``max_batch`` sequences whose padded size, longest x count, stays within
          the budget);
``fa3``   FlashAttention-3 with no padding at all: the sequences packed into one row of at
          most ``budget`` tokens (positions restart per sequence, ``cu_seqlens`` bound each
          one), attention by ``flash_attn_varlen_func`` (vLLM's FA3 build, the kernel its
          FLASH_ATTN backend runs; transformers' ``flash_attention_2``/``_3`` need the
          ``flash-attn`` packages, which have no build for the device's torch), registered
          as a transformers attention function; the score head on each sequence's last token.

Models built without weights (``load_format: dummy`` shapes) are initialised randomly on the
GPU from their config: the same shapes, so the same speed.

Run as a child process of the benchmark (its CUDA context must not live in the benchmark's
process, which starts vLLM engines), while the engines are idle:

    python -m benchmarks.gpu.framework_anchor SPEC.json   # writes spec["out"]

SPEC: {"model": PATH, "texts": [...], "out": PATH, "budgets": [16384, ...], "max_batch": 512,
       "attn": ["sdpa", "fa3"], "dummy": false}
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any


def buckets(lengths: list[int], budget: int, max_batch: int) -> list[list[int]]:
    """Indices sorted by length, cut greedily so that len(batch) * longest <= budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = max(lengths[i], max((lengths[j] for j in cur), default=0))
        if cur and (len(cur) + 1 > max_batch or (len(cur) + 1) * longest > budget):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def packs(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices in order, cut greedily so that each pack's total tokens <= budget."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(lengths):
        if cur and total + n > budget:
            out.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        out.append(cur)
    return out


def varlen_attention(varlen: Any) -> Any:
    """A transformers attention function over packed sequences: ``varlen`` is a
    ``flash_attn_varlen_func``; the forward passes ``cu_seqlens`` and ``max_seqlen``."""

    def attention(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        scaling: float | None = None,
        cu_seqlens: Any = None,
        max_seqlen: int = 0,
        **_: Any,
    ) -> tuple[Any, None]:
        # (1, heads, tokens, dim) -> (tokens, heads, dim); FA takes the KV heads as they are
        q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
        out = varlen(
            q,
            k,
            v,
            max_seqlen_q=max_seqlen,
            cu_seqlens_q=cu_seqlens,
            max_seqlen_k=max_seqlen,
            cu_seqlens_k=cu_seqlens,
            softmax_scale=scaling,
            causal=True,
        )
        return out.unsqueeze(0), None

    return attention


def fa3_varlen() -> Any:
    """vLLM's FlashAttention-3 ``flash_attn_varlen_func``, pinned to version 3."""
    import functools

    from vllm.vllm_flash_attn import flash_attn_varlen_func

    return functools.partial(flash_attn_varlen_func, fa_version=3)


def load(spec: dict[str, Any], attn: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if spec.get("dummy"):
        cfg = AutoConfig.from_pretrained(spec["model"])
        with torch.device("cuda"):
            model = AutoModelForSequenceClassification.from_config(
                cfg, dtype=torch.bfloat16, attn_implementation=attn
            )
        return model.eval()
    model = AutoModelForSequenceClassification.from_pretrained(
        spec["model"], dtype=torch.bfloat16, attn_implementation=attn
    )
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def run(spec: dict[str, Any], varlen: Any = None) -> dict[str, Any]:
    """``varlen``: the varlen attention function for ``fa3`` (default: vLLM's FA3; a test
    passes a reference one to check the packing on a CPU)."""
    import torch
    from transformers import AttentionInterface, AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(spec["model"])
    texts = spec["texts"]
    t = time.perf_counter()
    ids = [tok(x, add_special_tokens=True)["input_ids"] for x in texts]
    tokenize_s = time.perf_counter() - t
    lengths = [len(x) for x in ids]

    def sdpa_batches(budget: int) -> tuple[list[list[int]], list[dict[str, Any]]]:
        batches = buckets(lengths, budget, spec.get("max_batch", 512))
        prepared = []
        for batch in batches:
            longest = max(lengths[i] for i in batch)
            inp = torch.full((len(batch), longest), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, i in enumerate(batch):
                inp[row, : lengths[i]] = torch.tensor(ids[i])
                mask[row, : lengths[i]] = 1
            prepared.append({"input_ids": inp.to(dev), "attention_mask": mask.to(dev)})
        return batches, prepared

    def fa3_batches(budget: int) -> tuple[list[list[int]], list[dict[str, Any]]]:
        batches = packs(lengths, budget)
        prepared = []
        for batch in batches:
            flat = [t for i in batch for t in ids[i]]
            pos = [p for i in batch for p in range(lengths[i])]
            cu = [0, *itertools.accumulate(lengths[i] for i in batch)]
            prepared.append(
                {
                    "input_ids": torch.tensor([flat], device=dev),
                    "position_ids": torch.tensor([pos], device=dev),
                    "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=dev),
                    "max_seqlen": max(lengths[i] for i in batch),
                    "last": torch.tensor(cu[1:], device=dev) - 1,
                }
            )
        return batches, prepared

    def forward(model: Any, attn: str, inputs: dict[str, Any]) -> Any:
        if attn == "sdpa":
            return model(**inputs).logits[:, 0]
        args = {k: v for k, v in inputs.items() if k != "last"}
        hidden = model.model(**args).last_hidden_state[0]
        return model.score(hidden[inputs["last"]])[:, 0]

    def forward_all(model: Any, attn: str, batches: list[list[int]], prepared: list) -> list[float]:
        scores = [0.0] * len(texts)
        outs = []
        with torch.inference_mode():
            for inputs in prepared:
                outs.append(forward(model, attn, inputs))
        if dev == "cuda":
            torch.cuda.synchronize()
        for batch, o in zip(batches, outs):
            for i, v in zip(batch, o.float().cpu().tolist()):
                scores[i] = v
        return scores

    by_attn: dict[str, Any] = {}
    best: dict[str, Any] | None = None
    load_s: dict[str, float] = {}
    pad = 0
    for attn in spec.get("attn", ["sdpa"]):
        name = attn
        try:
            if attn == "fa3":
                name = "rmgate_fa3_varlen"
                AttentionInterface.register(name, varlen_attention(varlen or fa3_varlen()))
            t0 = time.perf_counter()
            model = load(spec, name)
            load_s[attn] = round(time.perf_counter() - t0, 1)
            pad = model.config.pad_token_id or 0
            tried: dict[str, Any] = {}
            scores: list[float] = []
            for budget in spec.get("budgets", [16384, 32768]):
                make = sdpa_batches if attn == "sdpa" else fa3_batches
                batches, prepared = make(budget)  # on the GPU before the clock starts
                forward_all(model, attn, batches, prepared)  # warm-up: kernels per shape
                t = time.perf_counter()
                scores = forward_all(model, attn, batches, prepared)
                wall = time.perf_counter() - t
                row = {
                    "batches": len(batches),
                    "seconds": round(wall, 4),
                    "req_per_s": round(len(texts) / wall, 1),
                }
                tried[str(budget)] = row
                if best is None or row["req_per_s"] > best["req_per_s"]:
                    best = {"attn": attn, "budget": budget, **row}
            by_attn[attn] = {
                "req_per_s": max(r["req_per_s"] for r in tried.values()),
                "budgets": tried,
                "scores_head": scores[:8],
            }
            del model
            if dev == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - one implementation failing leaves the other
            by_attn[attn] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
    if best is None:
        return {"error": "; ".join(f"{a}: {r.get('error')}" for a, r in by_attn.items())}
    return {
        "framework": f"transformers {__import__('transformers').__version__}, "
        f"torch {torch.__version__}, bf16, " + "/".join(by_attn),
        "requests": len(texts),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "load_s": load_s,
        "tokenize_s": round(tokenize_s, 3),
        "req_per_s": best["req_per_s"],
        "best": best,
        "by_attention": by_attn,
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    try:
        result = run(spec)
    except Exception as exc:  # noqa: BLE001 - the benchmark reports it and goes on
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
