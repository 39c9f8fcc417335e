"""Judge prompts and score parsers for generative reward models (``/v1/rewards``).

A parser turns the judge's text into a float, or ``None`` when the text holds no score; the
caller then uses the model's configured default reward and says so in the details. A parse
never raises: a judge that rambles must not crash a training step.
"""

from __future__ import annotations

import re
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, model_validator

ParserName = Literal["last_int", "last_float", "boxed", "regex", "yes_no"]

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


class ScorerSpec(BaseModel):
    """How a GRM's judge is asked (``template``) and read (``parser``)."""

    model_config = ConfigDict(extra="forbid")
    #: ``str.format`` template; fields: ``{prompt}``, ``{response}``, ``{label}``.
    template: str = "{prompt}{response}"
    parser: ParserName = "last_int"
    #: For ``regex``: the score is group 1 (or the whole match) of the last match.
    pattern: str | None = None
    #: For ``yes_no``: the reward of each answer (the last yes/no in the text counts).
    yes: float = 1.0
    no: float = 0.0
    #: Reward used when the text holds no parsable score.
    default: float = 0.0

    @model_validator(mode="after")
    def _check(self) -> "ScorerSpec":
        if self.parser == "regex":
            if not self.pattern:
                raise ValueError("parser 'regex' needs a `pattern`")
            re.compile(self.pattern)
        try:
            self.template.format(prompt="", response="", label="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad scorer template: {exc}") from exc
        return self


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


def make_parser(spec: ScorerSpec) -> Callable[[str], float | None]:
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


def judge_prompt(spec: ScorerSpec, prompt: str, response: str, label: str | None) -> str:
    return spec.template.format(prompt=prompt, response=response, label="" if label is None else label)
