"""Score parsers and judge templates: every parser, and failure -> None (never raise)."""

import pytest

from gateway.core.config.scoring import JudgeTextSpec as ScorerSpec
from gateway.core.scoring.base import RewardInput
from gateway.core.scoring.judge_parsers import make_parser
from gateway.core.scoring.model_scorers import judge_messages


@pytest.mark.parametrize(
    "spec,text,expected",
    [
        ({"parser": "last_int"}, "Score: 1", 1.0),
        ({"parser": "last_int"}, "7 then 3 then -2", -2.0),
        ({"parser": "last_int"}, "no digits", None),
        ({"parser": "last_float"}, "I'd say 0.75, final 8.5", 8.5),
        ({"parser": "last_float"}, "1e-3", 0.001),
        ({"parser": "last_float"}, "", None),
        ({"parser": "boxed"}, "so \\boxed{3} or \\boxed{ 4.5 }", 4.5),
        ({"parser": "boxed"}, "\\boxed{\\frac{1}{2}} 9", 2.0),
        ({"parser": "boxed"}, "unclosed \\boxed{3", None),
        ({"parser": "boxed"}, "none", None),
        ({"parser": "regex", "pattern": r"Rating: (\d+)/10"}, "Rating: 3/10 ... Rating: 9/10", 9.0),
        ({"parser": "regex", "pattern": r"Rating: (\w+)"}, "Rating: high", None),
        ({"parser": "regex", "pattern": r"\d+"}, "a 12 b 34", 34.0),
        ({"parser": "yes_no"}, "Yes. Well, no.", 0.0),
        ({"parser": "yes_no", "yes": 2.0}, "the answer is YES", 2.0),
        ({"parser": "yes_no"}, "maybe", None),
    ],
)
def test_parsers(spec, text, expected):
    assert make_parser(ScorerSpec(**spec))(text) == expected


def test_regex_needs_a_pattern_and_templates_are_checked():
    with pytest.raises(ValueError):
        ScorerSpec(parser="regex")
    with pytest.raises(ValueError):
        ScorerSpec(template="{unknown}")


def test_judge_prompt_fills_fields():
    spec = ScorerSpec(template="Q: {prompt} A: {response} Ref: {label}")

    def prompt(label):
        item = RewardInput(0, "2+3=", "5", label)
        return judge_messages(spec.template, item)[0]["content"]

    assert prompt(None) == "Q: 2+3= A: 5 Ref: "
    assert prompt("5") == "Q: 2+3= A: 5 Ref: 5"
