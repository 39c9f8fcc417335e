"""The heads that run outside a fixed-shape step see one row count, whatever the batch.

Under fixed-shape steps (every engine step padded to one token count: one CUDA-graph size
equal to the token budget) the model's matmuls always run at one shape, so a token's
hidden state cannot depend on its neighbours. vLLM then applies the last projection
outside that graph, to the rows that need it: a DisRM's score head to the last-token
states of the requests that finish in the step (``ClassifierPoolerHead``), a judge's
``lm_head`` to the positions it samples from (``LogitsProcessor``). Each is a matmul of
as many rows as requests, where cuBLAS picks its kernel (and with it the reduction
order) by the row count. So a request scored alone and the same request scored beside 50
others can differ in the last bits even though their hidden states are identical.
``RMGATE_FIXED_HEAD_ROWS=N`` pads those inputs to N rows (chunks of N beyond), so the
heads run at one shape too; the padding rows are zeros and dropped. A score head is
``hidden × num_labels`` (microseconds); a judge's ``lm_head`` at 256 rows is about
0.3 TFLOP at 7B, under a millisecond a step on a Hopper GPU.

The attention kernel is the other place a row can see its neighbours. FlashAttention-3
may split a sequence's keys across several thread blocks and add the partial results
(``num_splits``); vLLM lets FA3 choose the split count per step from the step's sequence
count and longest sequence, and plans it ahead (its AOT scheduler), so the same request
is reduced in another order when it shares a small step with a long neighbour.
``RMGATE_ATTENTION_ONE_SPLIT=1`` makes vLLM's FlashAttention backend run as it does under
``VLLM_BATCH_INVARIANT``: one split and no AOT plan, with the standard matmul kernels left
as they are (``one_split_attention``).

The third is torch.compile. vLLM compiles the model with Inductor, which generates the
norms' and other reductions' Triton kernels with several tilings and keeps the one that
timed fastest on the device when the engine first ran them (its autotuner). A tiling is a
reduction order, and the timing is noise: two engines of one configuration on one GPU,
each with its own compile cache, answered 116 of 1,024 DisRM requests and 31 of 1,024
judge requests with other bits on one H100 (the timed pick is the likely cause:
benchmarks/gpu/results/h100-2026-12-07d-two-slots-7b). Within one engine nothing moves, so
the start-up self-test passes on each. Inductor's own deterministic mode
(``INDUCTOR_DETERMINISTIC``) picks every reduction's tiling by a fixed rule instead of a
timing, and vLLM's combo kernels (tuned by timing too) are left off.

Applied at import by ``deployments.engine.vllm_server`` (engine processes vLLM forks
inherit it; spawned ones import that module again as their main).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: The environment variable with the row count (unset: vLLM's heads untouched).
HEAD_ROWS_ENV = "RMGATE_FIXED_HEAD_ROWS"
#: ``1``: vLLM's FlashAttention backend runs every sequence in one split (unset: untouched).
ONE_SPLIT_ENV = "RMGATE_ATTENTION_ONE_SPLIT"
#: Inductor settings (vLLM's ``compilation_config.inductor_compile_config``, applied to
#: every graph it compiles) under which no kernel is chosen by timing it on the device.
INDUCTOR_DETERMINISTIC: dict[str, bool] = {"deterministic": True, "benchmark_combo_kernel": False}
#: Head calls made padded in this process (what a probe reads to know the patch ran).
CALLS = [0]


def in_padded_chunks(fn: Callable[[Any], Any], x: Any, rows: int) -> Any:
    """``fn`` applied to ``x`` (a tensor, rows first) ``rows`` rows at a time, the last
    chunk padded with zeros and the padding's answers dropped: ``fn`` only ever sees
    ``rows`` rows. None when ``fn`` answers None (a tensor-parallel rank that gathers
    nothing)."""
    import torch

    CALLS[0] += 1
    n = int(x.shape[0])
    outs = []
    for start in range(0, max(n, 1), rows):
        chunk = x[start : start + rows]
        short = rows - int(chunk.shape[0])
        if short:
            chunk = torch.cat([chunk, chunk.new_zeros((short, *chunk.shape[1:]))])
        out = fn(chunk)
        if out is None:
            return None
        outs.append(out[: rows - short])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def padded_rows(fn: Any, rows: int) -> Any:
    """``fn`` (the head, a ``torch.nn.Module``) applied ``rows`` rows at a time
    (``in_padded_chunks``): a module itself, since the pooler holds its head as a child."""
    import torch

    class PaddedRows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = fn
            self.rows = rows

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return in_padded_chunks(self.inner, x, self.rows)

    return PaddedRows()


def pad_score_head(rows: int, heads: Any = None) -> bool:
    """Make vLLM's sequence classifier head (``heads.ClassifierPoolerHead``, vLLM's module
    unless given) run at ``rows`` rows. Returns whether it is patched; False when this vLLM
    has no such head (left untouched)."""
    if heads is None:
        try:
            from vllm.model_executor.layers.pooler.seqwise import heads as vllm_heads
        except ImportError:
            return False
        heads = vllm_heads
    head = heads.ClassifierPoolerHead
    if getattr(head, "_rmgate_rows", None) == rows:
        return True
    forward = head.forward

    def padded_forward(self: Any, pooled_data: Any, pooling_metadata: Any) -> Any:
        if self.classifier is not None and not getattr(self, "_rmgate_padded", False):
            self.classifier = padded_rows(self.classifier, rows)
            self._rmgate_padded = True
        return forward(self, pooled_data, pooling_metadata)

    head.forward = padded_forward
    head._rmgate_rows = rows
    return True


def pad_lm_head(rows: int, processor: Any = None) -> bool:
    """Make vLLM's ``LogitsProcessor`` (vLLM's class unless given) project ``rows`` hidden
    states at a time: its ``forward`` (the logits a judge samples from, and its logprobs)
    and, where this vLLM has it, ``get_top_tokens`` (greedy argmax without the full
    logits). Soft-capping and scaling after the projection are per element, so padding
    the input is padding the projection. Returns whether it is patched."""
    if processor is None:
        try:
            from vllm.model_executor.layers.logits_processor import LogitsProcessor
        except ImportError:
            return False
        processor = LogitsProcessor
    if getattr(processor, "_rmgate_rows", None) == rows:
        return True
    for name in ("forward", "get_top_tokens"):
        original = getattr(processor, name, None)
        if original is not None:
            setattr(processor, name, _padded_projection(original, rows))
    processor._rmgate_rows = rows
    return True


def _padded_projection(original: Callable[..., Any], rows: int) -> Callable[..., Any]:
    def padded(self: Any, lm_head: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        return in_padded_chunks(
            lambda x: original(self, lm_head, x, *args, **kwargs), hidden_states, rows
        )

    return padded


def pad_head_rows() -> int | None:
    """Make vLLM's score head and ``lm_head`` run at ``$RMGATE_FIXED_HEAD_ROWS`` rows (in
    this process and the engine processes it starts). Returns the row count, None when
    unset."""
    value = os.environ.get(HEAD_ROWS_ENV)
    if not value:
        return None
    rows = int(value)
    if rows < 1:
        raise ValueError(f"{HEAD_ROWS_ENV} must be a positive row count, not {value!r}")
    pad_score_head(rows)
    pad_lm_head(rows)
    return rows


class SplitsAsBatchInvariant:
    """vLLM's ``envs`` module as its FlashAttention backend reads it, with
    ``VLLM_BATCH_INVARIANT`` true: the backend's only uses of that flag are its split
    choices (one split, no AOT schedule, whose split plan follows the step's longest
    sequence), so this changes attention's splits and nothing else. Every other name is
    the real module's, read at each access."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name == "VLLM_BATCH_INVARIANT":
            return True
        return getattr(self._real, name)


def one_split_attention(module: Any = None) -> bool:
    """Under ``$RMGATE_ATTENTION_ONE_SPLIT=1``, make vLLM's FlashAttention backend
    (``module``: ``vllm.v1.attention.backends.flash_attn`` unless given) read
    ``SplitsAsBatchInvariant``. Returns whether the backend is patched; False when unset
    or when this vLLM has no such backend (left untouched)."""
    if os.environ.get(ONE_SPLIT_ENV) != "1":
        return False
    if module is None:
        try:
            import vllm.v1.attention.backends.flash_attn as backend
        except Exception:  # noqa: BLE001 - no FlashAttention build (CPU vLLM): nothing to split
            return False
        module = backend
    envs = getattr(module, "envs", None)
    if envs is None:
        return False
    if not isinstance(envs, SplitsAsBatchInvariant):
        module.envs = SplitsAsBatchInvariant(envs)
    return True
