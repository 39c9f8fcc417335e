"""The framework anchor: the same DisRM in a plain ``transformers`` forward, what a trainer
scoring in-process would get, with no server, no engine and no determinism policy.

bf16, SDPA attention, the requests pre-tokenized (the tokenization is timed apart) and
bucketed by length: sorted by token count, then cut into batches of at most ``max_batch``
sequences whose padded size (longest x count) stays within a token budget. Several budgets
are tried, each after a warm-up pass over the same batches; the best is the anchor (the
strongest plain forward this recipe finds, so a ratio against it is not flattered).

Run as a child process of the benchmark (its CUDA context must not live in the benchmark's
process, which starts vLLM engines), while the engines are idle:

    python -m benchmarks.gpu.framework_anchor SPEC.json   # writes spec["out"]

SPEC: {"model": PATH, "texts": [...], "out": PATH, "budgets": [16384, ...], "max_batch": 512}
"""

from __future__ import annotations

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


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec["model"])
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            spec["model"], dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = AutoModelForSequenceClassification.from_pretrained(
            spec["model"], torch_dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    model = model.cuda().eval()
    pad = model.config.pad_token_id
    load_s = time.perf_counter() - t0

    texts = spec["texts"]
    t = time.perf_counter()
    ids = [tok(x, add_special_tokens=True)["input_ids"] for x in texts]
    tokenize_s = time.perf_counter() - t
    lengths = [len(x) for x in ids]

    def tensors(batch: list[int]) -> tuple[Any, Any]:
        longest = max(lengths[i] for i in batch)
        inp = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, i in enumerate(batch):
            inp[row, : lengths[i]] = torch.tensor(ids[i])
            mask[row, : lengths[i]] = 1
        return inp.cuda(non_blocking=True), mask.cuda(non_blocking=True)

    def forward_all(batches: list[list[int]], prepared: list[tuple[Any, Any]]) -> list[float]:
        scores = [0.0] * len(texts)
        outs = []
        with torch.inference_mode():
            for inp, mask in prepared:
                outs.append(model(input_ids=inp, attention_mask=mask).logits[:, 0])
        torch.cuda.synchronize()
        for batch, o in zip(batches, outs):
            for i, v in zip(batch, o.float().cpu().tolist()):
                scores[i] = v
        return scores

    tried: dict[str, Any] = {}
    best: dict[str, Any] | None = None
    scores: list[float] = []
    for budget in spec.get("budgets", [8192, 16384, 32768, 65536]):
        batches = buckets(lengths, budget, spec.get("max_batch", 512))
        prepared = [tensors(b) for b in batches]  # on the GPU before the clock starts
        forward_all(batches, prepared)  # warm-up: cuBLAS/SDPA picks kernels per shape
        t = time.perf_counter()
        scores = forward_all(batches, prepared)
        wall = time.perf_counter() - t
        row = {
            "batches": len(batches),
            "seconds": round(wall, 4),
            "req_per_s": round(len(texts) / wall, 1),
        }
        tried[str(budget)] = row
        if best is None or row["req_per_s"] > best["req_per_s"]:
            best = {"budget": budget, **row}
    assert best is not None
    return {
        "framework": f"transformers {__import__('transformers').__version__}, "
        f"torch {torch.__version__}, bf16, sdpa",
        "requests": len(texts),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "load_s": round(load_s, 1),
        "tokenize_s": round(tokenize_s, 3),
        "req_per_s": best["req_per_s"],
        "best": best,
        "budgets": tried,
        "scores_head": scores[:8],
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
