"""Rule scorers: a check of the response (against the label) run in the rule pool.

The check itself runs in another process (``gateway.rules``): math checking and regular
expressions can hang on adversarial input, and a hung check must cost one worker for its
timeout, never the gateway's event loop.
"""

from __future__ import annotations

from typing import Any

from gateway.core.scoring.base import Call, RewardInput, RuleCall, Score


class RuleScorer:
    """One rule of the config (``exact_match``, ``regex``, ``numeric``, ``math_verify``,
    ``length_penalty``); its value is what the check returned."""

    def __init__(self, spec: Any) -> None:
        self.type = spec.type
        self.timeout_s = spec.timeout_s
        self.options = spec.model_dump(exclude={"type", "timeout_s"})

    def calls(self, item: RewardInput) -> list[Call]:
        return [RuleCall(self.type, self.options, item.response, item.label, self.timeout_s)]

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        return Score(float(answers[0]))
