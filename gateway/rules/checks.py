"""The rule checks themselves, run inside a rule-pool worker process.

Each takes the response, the label text and the rule's options and returns a float. They
are plain functions of their arguments (no clock, no randomness), so a check's value is
the same in every worker and every run. ``math_verify`` is imported in the worker only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _need_label(label: str | None, check: str) -> str:
    if label is None:
        raise ValueError(f"{check} needs the item's label (none was sent)")
    return label


def exact_match(response: str, label: str | None, *, strip: bool, case_sensitive: bool) -> float:
    gold = _need_label(label, "exact_match")
    a, b = (response.strip(), gold.strip()) if strip else (response, gold)
    if not case_sensitive:
        a, b = a.casefold(), b.casefold()
    return 1.0 if a == b else 0.0


def regex(response: str, label: str | None, *, pattern: str, compare: str) -> float:
    matches = list(re.finditer(pattern, response))
    if compare == "none":
        return 1.0 if matches else 0.0
    gold = _need_label(label, "regex with compare: label")
    if not matches:
        return 0.0
    last = matches[-1]
    found = last.group(1) if last.groups() else last.group(0)
    return 1.0 if found is not None and found.strip() == gold.strip() else 0.0


def numeric(response: str, label: str | None, *, tolerance: float, relative: bool) -> float:
    gold_text = _need_label(label, "numeric")
    try:
        gold = float(gold_text)
    except ValueError:
        raise ValueError(f"numeric: the label {gold_text[:50]!r} is not a number") from None
    found = _NUMBER.findall(response)
    if not found:
        return 0.0
    value = float(found[-1])
    bound = tolerance * abs(gold) if relative else tolerance
    return 1.0 if math.isfinite(value) and abs(value - gold) <= bound else 0.0


def math_equivalent(response: str, label: str | None) -> float:
    """``math-verify``'s verdict: the label parsed as the gold answer, the response's
    answer (``\\boxed{}``, LaTeX or a plain expression) parsed and compared. Its own
    signal-based timeouts are off (the pool's timeout ends a hung check)."""
    import logging

    from math_verify import parse, verify

    # it warns on every call that its own timeouts are off: they are, on purpose
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(_need_label(label, "math_verify"), parsing_timeout=None)
    answer = parse(response, parsing_timeout=None)
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0


def length_penalty(
    response: str, label: str | None, *, max_length: int, unit: str, penalty: float
) -> float:
    length = len(response.split()) if unit == "words" else len(response)
    return -penalty * max(0, length - max_length)


CHECKS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "regex": regex,
    "numeric": numeric,
    "math_verify": math_equivalent,
    "length_penalty": length_penalty,
}


def run_check(check: str, options: dict[str, Any], response: str, label: str | None) -> float:
    """What a worker runs: the named check on one item."""
    return float(CHECKS[check](response, label, **options))
