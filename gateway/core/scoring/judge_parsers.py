"""Score parsers for a generative judge's text (the ``judge_text`` scorer).

A parser turns the judge's text into a float, or ``None`` when the text holds no score; the
caller then uses the model's configured default reward and says so in the details. A parse
never raises: a judge that rambles must not crash a training step.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gateway.core.config.scoring import JudgeTextSpec

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


def parse_last_int(text: str) -> float | None:
    m = _last(_INT, text)
    return float(int(m)) if m is not None else None


def parse_last_float(text: str) -> float | None:
    m = _last(_FLOAT, text)
    return float(m) if m is not None else None


def parse_boxed(text: str) -> float | None:
    """The number inside the last ``\\boxed{...}`` (balanced braces)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return parse_last_float(text[i:j])
    return None


def make_parser(spec: JudgeTextSpec) -> Callable[[str], float | None]:
    if spec.parser == "last_int":
        return parse_last_int
    if spec.parser == "last_float":
        return parse_last_float
    if spec.parser == "boxed":
        return parse_boxed
    if spec.parser == "yes_no":

        def parse_yes_no(text: str) -> float | None:
            m = _last(_YES_NO, text)
            return None if m is None else (spec.yes if m.lower() == "yes" else spec.no)

        return parse_yes_no
    pattern = re.compile(spec.pattern or "")

    def parse_regex(text: str) -> float | None:
        matches = list(pattern.finditer(text))
        if not matches:
            return None
        m = matches[-1]
        try:
            return float(m.group(1) if m.groups() else m.group(0))
        except (TypeError, ValueError):
            return None

    return parse_regex
