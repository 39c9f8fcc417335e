"""Scorers by name: the config's ``type`` -> the class that reads it.

Built once per gateway (``build_scorers``), not per request: a judge's parser and a
program's components are ready before the first reward is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.core.config.code_rules import CodeTestsRule
from gateway.core.config.settings import AppConfig
from gateway.core.scoring.base import Scorer
from gateway.core.scoring.code_tests import CodeTestsScorer
from gateway.core.scoring.group_scorers import GroupScorer, ListwiseScorer, PairwiseScorer
from gateway.core.scoring.model_scorers import (
    ExpectedRatingScorer,
    JudgeProbScorer,
    JudgeTextScorer,
    LogitScorer,
)
from gateway.core.scoring.rule_scorers import RuleScorer
from gateway.core.scoring.voting import VotingScorer

#: type -> factory(spec, model name, truncation side)
MODEL_SCORERS: dict[str, Callable[..., Scorer]] = {
    "logit": LogitScorer,
    "judge_text": JudgeTextScorer,
    "judge_prob": JudgeProbScorer,
    "expected_rating": ExpectedRatingScorer,
}


#: type -> factory(spec, model name, truncation side): scorers of a whole group
GROUP_SCORERS: dict[str, Callable[..., GroupScorer]] = {
    "pairwise": PairwiseScorer,
    "listwise": ListwiseScorer,
}


def model_scorer(spec: Any, model: str, truncation_side: str = "right") -> Scorer:
    return MODEL_SCORERS[spec.type](spec, model, truncation_side)


def rule_scorer(spec: Any, rule: str) -> Scorer:
    """A rule component's scorer; ``rule`` (``program/component``) names it to the code
    sandboxes."""
    if isinstance(spec, CodeTestsRule):
        return CodeTestsScorer(spec, rule)
    return RuleScorer(spec)


class Scorers:
    """Every scorer a config names: one per model (its ``scorer``) and one per program
    component, keyed ``(program, component)``."""

    def __init__(self, config: AppConfig) -> None:
        side = config.gateway.get_reward_truncation_side
        self.models: dict[str, Scorer] = {
            m.name: model_scorer(m.scorer, m.name, side) for m in config.models
        }
        self.components: dict[tuple[str, str], Scorer | GroupScorer] = {}
        for program in config.programs:
            for comp in program.components:
                scorer: Scorer | GroupScorer
                if comp.rule is not None:
                    scorer = rule_scorer(comp.rule, f"{program.name}/{comp.name}")
                else:
                    spec = config.model(comp.model or "")
                    assert spec is not None  # AppConfig checked it
                    if comp.scorer is not None and comp.scorer.type in GROUP_SCORERS:
                        scorer = GROUP_SCORERS[comp.scorer.type](comp.scorer, spec.name, side)
                    else:
                        item = (
                            model_scorer(comp.scorer, spec.name, side)
                            if comp.scorer is not None
                            else self.models[spec.name]
                        )
                        scorer = VotingScorer(item, comp.judges) if comp.judges else item
                self.components[(program.name, comp.name)] = scorer
