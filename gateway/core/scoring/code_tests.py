"""The ``code_tests`` rule's policy: which code a response submits, which tests its label
holds, what a submission's identity is, and the score its verdicts give.

Pure: the sandbox (``gateway.sandbox``) runs the submission this module builds and hands
back one verdict per test. A submission's identity covers everything that decides its
verdicts (the code, the tests, the comparison, the limits), so identical submissions of
a GRPO group run once and a recorded result answers the next identical one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.core.config.code_rules import CodeTestsRule
from gateway.core.scoring.base import Call, CodeCall, RewardInput, Score

#: The ledger's name for code_tests results (its ``model`` and ``endpoint`` columns).
CODE_MODEL = "code_tests"
CODE_ENDPOINT = "/rules/code_tests"

#: Fenced blocks: an opening fence with an optional language, the code, a closing fence.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_FENCES = frozenset({"", "python", "py", "python3"})


class BadTests(ValueError):
    """The label does not hold tests this rule can run."""


def extract_code(response: str, how: str) -> str | None:
    """The code the response submits: the last fenced Python (or bare) block under
    ``fenced`` (None: there is none), the whole response under ``whole``."""
    if how == "whole":
        return response
    blocks = [m.group(2) for m in _FENCE.finditer(response) if m.group(1).lower() in _PYTHON_FENCES]
    return blocks[-1] if blocks else None


def _text(value: Any, where: str) -> str:
    """A test's input or output as text: a string as is, a list of lines joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise BadTests(f"{where} must be text (or a list of lines), not {type(value).__name__}")


def parse_tests(label: Any) -> list[dict[str, str]]:
    """The label's tests, each ``{"input", "output"}`` (stdin -> expected stdout) or
    ``{"code"}`` (assert-style, run after the response's code). A label sent as JSON text
    is read as JSON first."""
    if isinstance(label, str):
        stripped = label.strip()
        if stripped[:1] in ("{", "["):
            try:
                label = json.loads(stripped)
            except ValueError:
                pass
    if isinstance(label, str):
        return [{"code": label}]
    if isinstance(label, dict):
        if "inputs" in label or "outputs" in label:
            inputs, outputs = label.get("inputs"), label.get("outputs")
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise BadTests("`inputs` and `outputs` must both be lists")
            if len(inputs) != len(outputs):
                raise BadTests(f"{len(inputs)} inputs but {len(outputs)} outputs")
            return [
                {"input": _text(i, f"inputs[{n}]"), "output": _text(o, f"outputs[{n}]")}
                for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
            ]
        if "asserts" in label:
            asserts = label["asserts"]
            if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
                raise BadTests("`asserts` must be a list of strings (test code)")
            return [{"code": a} for a in asserts]
        if "test" in label:
            return [{"code": _text(label["test"], "test")}]
        raise BadTests(
            "a code_tests label is {inputs, outputs}, [{input, output}, ...], "
            "{asserts: [...]}, {test: code} or test code"
        )
    if isinstance(label, list):
        tests = []
        for n, case in enumerate(label):
            if not isinstance(case, dict) or "input" not in case or "output" not in case:
                raise BadTests(f"tests[{n}] must be {{input, output}}")
            tests.append(
                {
                    "input": _text(case["input"], f"tests[{n}].input"),
                    "output": _text(case["output"], f"tests[{n}].output"),
                }
            )
        return tests
    raise BadTests("the item has no tests: send them as its `label`")


def submission(spec: CodeTestsRule, code: str, tests: list[dict[str, str]]) -> dict[str, Any]:
    """What the sandbox runs; its canonical JSON is the submission's identity."""
    return {
        "language": spec.language,
        "code": code,
        "tests": tests,
        "compare": spec.compare,
        "stop_on_failure": spec.stop_on_failure,
        "limits": spec.limits.model_dump(),
    }


def canonical(sub: dict[str, Any]) -> bytes:
    return json.dumps(sub, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def timing_dependent(verdicts: list[dict[str, Any]]) -> bool:
    """Whether a test came near its CPU or wall limit (or hit it): then its outcome may
    depend on the host's speed and load, and the result is not recorded."""
    return any(v.get("near_limit") for v in verdicts)


def score(spec: CodeTestsRule, verdicts: list[dict[str, Any]]) -> Score:
    """The fraction of tests passed (or 1.0/0.0 under ``all_or_nothing``), with each
    test's outcome in the details."""
    outcomes = [v["outcome"] for v in verdicts]
    passed = outcomes.count("passed")
    total = len(outcomes)
    if spec.score == "all_or_nothing":
        value = 1.0 if passed == total else 0.0
    else:
        value = passed / total
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    detail: dict[str, Any] = {
        "tests": {"passed": passed, "total": total, "outcomes": outcomes, "counts": counts},
        "timing_dependent": timing_dependent(verdicts),
    }
    errors = {str(n): v["error"] for n, v in enumerate(verdicts) if v.get("error")}
    if errors:
        detail["tests"]["errors"] = errors
    return Score(value, detail)


class CodeTestsScorer:
    """A ``code_tests`` rule of a program: one sandbox run per item (none when the
    response holds no code: score 0)."""

    type = "code_tests"

    def __init__(self, spec: CodeTestsRule, rule: str) -> None:
        self.spec = spec
        #: ``program/component``: the runner's concurrency bound is per rule.
        self.rule = rule

    def calls(self, item: RewardInput) -> list[Call]:
        code = extract_code(item.response, self.spec.extract)
        if code is None:
            return []
        try:
            tests = parse_tests(item.raw_label if item.raw_label is not None else item.label)
        except BadTests:
            return []  # read() says why
        if not tests or len(tests) > self.spec.max_tests:
            return []
        return [
            CodeCall(
                self.rule,
                submission(self.spec, code, tests),
                self.spec.timeout_s,
                self.spec.deterministic,
            )
        ]

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        if answers:
            return score(self.spec, answers[0])
        if extract_code(item.response, self.spec.extract) is None:
            return Score(0.0, {"tests": {"passed": 0, "total": 0}, "code": "no_code"})
        try:
            tests = parse_tests(item.raw_label if item.raw_label is not None else item.label)
        except BadTests as exc:
            return Score(None, failure="error", message=f"code_tests: {exc}")
        if not tests:
            return Score(None, failure="error", message="code_tests: the label holds no tests")
        return Score(
            None,
            failure="error",
            message=f"code_tests: {len(tests)} tests, above max_tests {self.spec.max_tests}",
        )
