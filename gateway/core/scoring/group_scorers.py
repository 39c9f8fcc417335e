"""Scorers that read a group at once: ``pairwise`` and ``listwise`` judges.

A group scorer turns a canonical group (``gateway.core.scoring.groups``) into engine calls
and their answers into one score per member. Like an item scorer it does no I/O:
``gateway.core.scoring.rewards`` sends the calls (on the group's one slot) and hands the
answers back in call order. Each call is the request a client would send for that
comparison, so it has its own key, ledger row and receipt, and the same bits sent alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from typing_extensions import TypeIs

from gateway.core.config.scoring import ListwiseSpec, PairwiseSpec
from gateway.core.scoring.base import EngineCall, RewardInput, Score, Scorer
from gateway.core.scoring.groups import CanonicalGroup
from gateway.core.scoring.model_scorers import ExpectedRatingScorer, JudgeProbScorer


@dataclass(frozen=True)
class MemberScore:
    """A member's score and the calls (indices into the group's calls) it took part in."""

    score: Score
    calls: tuple[int, ...] = field(default_factory=tuple)


class GroupScorer(Protocol):
    type: str

    def group_calls(self, group: CanonicalGroup) -> list[EngineCall]:
        """The calls whose answers ``read_group`` needs, in order."""
        ...

    def read_group(
        self, group: CanonicalGroup, answers: list[Any], receipts: list[str | None]
    ) -> list[MemberScore]:
        """One score per member of ``group`` (canonical order)."""
        ...


def is_group_scorer(scorer: Scorer | GroupScorer) -> TypeIs[GroupScorer]:
    return hasattr(scorer, "group_calls")


def _label(item: RewardInput) -> str:
    return "" if item.label is None else item.label


def comparison_pairs(n: int, pairs: str) -> list[tuple[int, int]]:
    """The unordered pairs of members compared (each is judged in both orders):
    ``all_pairs``: every pair; ``circular``: each member with the next (canonical order,
    wrapping), one pair for two members."""
    if n < 2:
        return []
    if pairs == "circular" and n > 2:
        return sorted(tuple(sorted((i, (i + 1) % n))) for i in range(n))  # type: ignore[misc]
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def _unreadable_group(group: CanonicalGroup, message: str, failure: str) -> list[MemberScore]:
    return [MemberScore(Score(None, failure=failure, message=message)) for _ in group.members]


class PairwiseScorer:
    """``pairwise``: P(first better) per ordered comparison, read like ``judge_prob``."""

    type = "pairwise"

    def __init__(self, spec: PairwiseSpec, model: str, truncation_side: str = "right") -> None:
        self.spec = spec
        self.judge = JudgeProbScorer(spec, model)
        self.per_comparison = 1 if spec.read == "logprob_token_ids" else len(spec.label_strings)

    def ordered(self, n: int) -> list[tuple[int, int]]:
        """(first, second) of every comparison, in call order: each pair, then swapped."""
        return [o for i, j in comparison_pairs(n, self.spec.pairs) for o in ((i, j), (j, i))]

    def group_calls(self, group: CanonicalGroup) -> list[EngineCall]:
        head = group.members[0]
        calls: list[EngineCall] = []
        for first, second in self.ordered(len(group.members)):
            content = self.spec.template.format(
                prompt=head.prompt,
                response_a=group.members[first].response,
                response_b=group.members[second].response,
                label=_label(head),
            )
            calls += self.judge.label_calls(content, self.judge.answer_prefix)
        return calls

    def read_group(
        self, group: CanonicalGroup, answers: list[Any], receipts: list[str | None]
    ) -> list[MemberScore]:
        n, k = len(group.members), self.per_comparison
        if n < 2:
            return _unreadable_group(
                group,
                f"group {group.name!r} has one distinct response: nothing to compare",
                "alone",
            )
        first_better: dict[tuple[int, int], float] = {}
        for c, order in enumerate(self.ordered(n)):
            score = self.judge.read(group.members[0], answers[c * k : (c + 1) * k])
            if score.value is None:
                return _unreadable_group(
                    group, f"comparison {order[0]} vs {order[1]}: {score.message}", "unreadable"
                )
            first_better[order] = score.value
        out = []
        for me in range(n):
            rows: list[dict[str, Any]] = []
            sides: list[float] = []
            calls: list[int] = []
            for c, (first, second) in enumerate(self.ordered(n)):
                if me not in (first, second):
                    continue
                calls += range(c * k, (c + 1) * k)
                side = (
                    first_better[(first, second)]
                    if me == first
                    else 1.0 - first_better[(first, second)]
                )
                sides.append(side)
                rows.append(
                    {
                        "opponent": second if me == first else first,
                        "shown": "A" if me == first else "B",
                        "p_first_better": first_better[(first, second)],
                        "preference": side,
                        "receipts": [r for r in receipts[c * k : (c + 1) * k] if r],
                    }
                )
            if self.spec.reward == "wins":
                value = math.fsum(1.0 if s > 0.5 else 0.5 if s == 0.5 else 0.0 for s in sides)
            else:
                value = math.fsum(sides)
            value /= len(sides)
            detail = {
                "group_identity": group.identity,
                "position": me,
                "size": n,
                "comparisons": rows,
            }
            out.append(MemberScore(Score(value, detail), tuple(calls)))
        return out


class ListwiseScorer:
    """``listwise``: the whole group in one prompt, each response's rating read in turn."""

    type = "listwise"

    def __init__(self, spec: ListwiseSpec, model: str, truncation_side: str = "right") -> None:
        self.spec = spec
        self.judge = ExpectedRatingScorer(spec, model)
        self.per_item = 1 if spec.read == "logprob_token_ids" else len(spec.label_strings)

    def prompt(self, group: CanonicalGroup) -> str:
        head = group.members[0]
        listed = "\n".join(
            self.spec.item_template.format(number=n + 1, response=m.response)
            for n, m in enumerate(group.members)
        )
        return self.spec.template.format(prompt=head.prompt, responses=listed, label=_label(head))

    def group_calls(self, group: CanonicalGroup) -> list[EngineCall]:
        content = self.prompt(group)
        calls: list[EngineCall] = []
        for n in range(len(group.members)):
            calls += self.judge.label_calls(
                content, (self.spec.answer_prefix or "").format(number=n + 1)
            )
        return calls

    def read_group(
        self, group: CanonicalGroup, answers: list[Any], receipts: list[str | None]
    ) -> list[MemberScore]:
        k, out = self.per_item, []
        for n, member in enumerate(group.members):
            span = range(n * k, (n + 1) * k)
            score = self.judge.read(member, answers[n * k : (n + 1) * k])
            detail = {
                **score.detail,
                "group_identity": group.identity,
                "position": n,
                "size": len(group.members),
                "receipts": [receipts[c] for c in span if receipts[c]],
            }
            out.append(
                MemberScore(Score(score.value, detail, score.failure, score.message), tuple(span))
            )
        return out
