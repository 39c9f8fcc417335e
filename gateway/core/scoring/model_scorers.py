"""Scorers that read a served model: a DisRM's logit, a judge's text, a judge's label
probabilities.

The engine bodies are the ones a client would send for the same question, so a reward has
the key, seed and bits of that request sent on its own (and the same ledger identity).
"""

from __future__ import annotations

import math
from typing import Any

from gateway.core.config.scoring import ExpectedRatingSpec, JudgeProbSpec, JudgeTextSpec, LogitSpec
from gateway.core.scoring.base import Call, EngineCall, RewardInput, Score
from gateway.core.scoring.judge_parsers import make_parser

CHAT = "/v1/chat/completions"


class LogitScorer:
    """The last class's raw score of a DisRM's ``/classify`` answer."""

    type = "logit"

    def __init__(self, spec: LogitSpec, model: str, truncation_side: str = "right") -> None:
        self.model = model
        self.truncation_side = truncation_side

    def calls(self, item: RewardInput) -> list[Call]:
        body: dict[str, Any] = {"model": self.model, "use_activation": False}
        if item.messages is not None:
            body["messages"] = item.messages
        else:
            # OpenRLHF's query is the policy's whole token sequence as text, BOS included,
            # and may be longer than the RM's context: add no special tokens a second time
            # and truncate to the context (the side OpenRLHF's own RM server's tokenizer
            # uses, configurable), as its RM server does, instead of answering 400.
            body.update(
                input=item.text,
                add_special_tokens=False,
                truncate_prompt_tokens=-1,
                truncation_side=self.truncation_side,
            )
        return [EngineCall("/classify", body)]

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        try:
            score = float(answers[0]["data"][-1]["probs"][-1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return Score(
                None,
                failure="unreadable",
                message=f"the classifier's answer holds no score ({exc!r})",
            )
        return Score(score, {"raw_score": score})


def judge_messages(template: str, item: RewardInput) -> list[dict[str, Any]]:
    content = template.format(
        prompt=item.prompt, response=item.response, label="" if item.label is None else item.label
    )
    return [{"role": "user", "content": content}]


class JudgeTextScorer:
    """The judge's sampled text, read by a parser; the default when it holds no score."""

    type = "judge_text"

    def __init__(self, spec: JudgeTextSpec, model: str, truncation_side: str = "right") -> None:
        self.spec = spec
        self.model = model
        self.parse = make_parser(spec)

    def calls(self, item: RewardInput) -> list[Call]:
        return [
            EngineCall(
                CHAT, {"model": self.model, "messages": judge_messages(self.spec.template, item)}
            )
        ]

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        try:
            text = answers[0]["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            return Score(
                None, failure="unreadable", message=f"the judge's answer holds no text ({exc!r})"
            )
        parsed = self.parse(text)
        detail: dict[str, Any] = {"judge_text": text, "parsed": parsed is not None}
        if parsed is None:
            detail["error"] = f"no score found by parser '{self.spec.parser}'; default used"
            return Score(
                self.spec.default,
                detail,
                failure="unparsed",
                message=f"no score found by parser '{self.spec.parser}'",
            )
        return Score(parsed, detail)


def label_logprobs(answer: Any, token_ids: list[int]) -> dict[int, float]:
    """The full-vocabulary log-probability of each of ``token_ids`` at the first answer
    position, from a chat answer asked with ``logprob_token_ids`` and
    ``return_tokens_as_token_ids``; a ``KeyError`` naming a token the answer lacks."""
    position = answer["choices"][0]["logprobs"]["content"][0]
    found: dict[int, float] = {}
    for entry in [position, *(position.get("top_logprobs") or [])]:
        token = str(entry.get("token", ""))
        if token.startswith("token_id:") and entry.get("logprob") is not None:
            found[int(token[len("token_id:") :])] = float(entry["logprob"])
    missing = [t for t in token_ids if t not in found]
    if missing:
        raise KeyError(
            f"no log-probability for label token(s) {missing} (does the engine "
            f"take `logprob_token_ids`?)"
        )
    return {t: found[t] for t in token_ids}


def prompt_label_logprob(answer: Any, token_id: int) -> float:
    """The log-probability of the prompt's last token, ``token_id`` (the label appended to
    the answer), from an answer asked with ``prompt_logprobs``; a ``KeyError`` when the last
    prompt token is another one (the label merged with the text before it)."""
    last = answer["prompt_logprobs"][-1]
    if str(token_id) not in last:
        raise KeyError(
            f"the prompt's last token is {sorted(last)}, not label token "
            f"{token_id} (it merged with the text before it: end answer_prefix "
            f"where a token ends)"
        )
    return float(last[str(token_id)]["logprob"])


def normalized_weights(logprobs: list[float]) -> list[float]:
    """``exp(lp - max)``: each label's probability up to one common factor, so a ratio of
    sums is exact where the probabilities themselves would underflow to 0."""
    top = max(logprobs)
    return [math.exp(lp - top) for lp in logprobs]


def yes_probability(yes: list[float], no: list[float]) -> float:
    """P(yes) / (P(yes) + P(no)) from label log-probabilities; sums in a fixed order
    (``math.fsum``: correctly rounded, the same float every time)."""
    weights = normalized_weights([*yes, *no])
    p_yes = math.fsum(weights[: len(yes)])
    return p_yes / (p_yes + math.fsum(weights[len(yes) :]))


def expected_value(logprobs: list[float], values: list[float]) -> float:
    """sum(P(r) * value(r)) / sum(P(r)) over the rating tokens."""
    weights = normalized_weights(logprobs)
    return math.fsum(w * v for w, v in zip(weights, values)) / math.fsum(weights)


class _LabelScorer:
    """A judge read at its first answer token: one greedy token, the labels' exact
    log-probabilities (``logprob_token_ids``; token ids, not strings, so two labels that
    decode alike stay apart)."""

    type = ""

    def __init__(self, spec: JudgeProbSpec | ExpectedRatingSpec, model: str) -> None:
        token_ids = spec.label_token_ids
        if not token_ids:
            raise ValueError(
                f"{self.type} scorer of {model!r}: label token ids are not "
                f"resolved (the gateway resolves them from the model's "
                f"tokenizer at start)"
            )
        self.template = spec.template
        self.model = model
        self.token_ids = token_ids
        self.answer_prefix = spec.answer_prefix or ""
        self.read_mode = spec.read
        self.labels = spec.label_strings

    def _body(self, content: str, answer: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": 1,
            "temperature": 0,
            "messages": [{"role": "user", "content": content}],
        }
        if answer:
            body["messages"].append({"role": "assistant", "content": answer})
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def label_calls(self, content: str, answer_prefix: str) -> list[EngineCall]:
        """The calls that read the labels after ``answer_prefix``, the judge asked
        ``content`` (what the group scorers ask per comparison or per listed response)."""
        if self.read_mode == "prompt_logprobs":
            # one request per label, the label appended: its log-probability is the last
            # prompt position's (always returned for the prompt's own token)
            return [
                EngineCall(
                    CHAT, {**self._body(content, answer_prefix + label), "prompt_logprobs": 0}
                )
                for label in self.labels
            ]
        return [
            EngineCall(
                CHAT,
                {
                    **self._body(content, answer_prefix),
                    "logprobs": True,
                    "logprob_token_ids": self.token_ids,
                    "return_tokens_as_token_ids": True,
                },
            )
        ]

    def calls(self, item: RewardInput) -> list[Call]:
        return list(
            self.label_calls(judge_messages(self.template, item)[0]["content"], self.answer_prefix)
        )

    def _found(self, answers: list[Any]) -> dict[int, float]:
        if self.read_mode == "prompt_logprobs":
            return {
                t: prompt_label_logprob(answer, t)
                for t, answer in zip(self.token_ids, answers, strict=True)
            }
        return label_logprobs(answers[0], self.token_ids)

    def value(self, logprobs: list[float]) -> float:
        """The reward from the labels' log-probabilities, in ``token_ids`` order."""
        raise NotImplementedError

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        try:
            found = self._found(answers)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            return Score(
                None,
                failure="unreadable",
                message=f"the judge's answer lacks label log-probabilities: {exc}",
            )
        return Score(
            self.value([found[t] for t in self.token_ids]),
            {"label_logprobs": {str(t): found[t] for t in self.token_ids}},
        )


class JudgeProbScorer(_LabelScorer):
    type = "judge_prob"

    def __init__(self, spec: JudgeProbSpec, model: str, truncation_side: str = "right") -> None:
        super().__init__(spec, model)
        self.n_yes = len(spec.yes_token_ids or [])

    def value(self, logprobs: list[float]) -> float:
        return yes_probability(logprobs[: self.n_yes], logprobs[self.n_yes :])


class ExpectedRatingScorer(_LabelScorer):
    type = "expected_rating"

    def __init__(
        self, spec: ExpectedRatingSpec, model: str, truncation_side: str = "right"
    ) -> None:
        super().__init__(spec, model)
        self.values = list(spec.values or [])

    def value(self, logprobs: list[float]) -> float:
        return expected_value(logprobs, self.values)
