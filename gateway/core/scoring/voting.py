"""``judges: K``: K seeded samples of an item scorer, aggregated.

Each sample is the item scorer's own calls with an explicit ``seed`` (so its own engine
request: key, ledger row, receipt); the seeds derive from the item's identity and the
sample's index, never from its position in a request or group, so the same item gets the
same K samples in any batch, order or group. ``majority`` takes the most frequent score
(a tie: the smallest tied score); ``mean`` adds the scores in sample order
(``math.fsum``: the same float every time). A sample whose answer gave no score is left
out of the vote; with no score at all the item fails (the program's ``on_failure``).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from typing import Any

from gateway.core.config.scoring import JudgesSpec
from gateway.core.scoring.base import Call, EngineCall, RewardInput, Score, Scorer
from gateway.core.scoring.groups import item_identity

SEED_MASK = 0x7FFF_FFFF


def sample_seed(item: RewardInput, sample: int) -> int:
    digest = hashlib.sha256(f"{item_identity(item)}/judge-sample/{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & SEED_MASK


def aggregate(votes: list[float], how: str) -> float:
    if how == "mean":
        return math.fsum(votes) / len(votes)
    counts = Counter(votes)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


class VotingScorer:
    """K samples of ``inner`` (an item scorer of a generative model)."""

    def __init__(self, inner: Scorer, spec: JudgesSpec) -> None:
        self.inner, self.spec = inner, spec
        self.type = inner.type

    def calls(self, item: RewardInput) -> list[Call]:
        out: list[Call] = []
        for sample in range(self.spec.count):
            seed = sample_seed(item, sample)
            for call in self.inner.calls(item):
                assert isinstance(call, EngineCall)  # a judge's calls
                out.append(EngineCall(call.path, {**call.body, "seed": seed}))
        return out

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        k = len(answers) // self.spec.count
        samples = [
            self.inner.read(item, answers[s * k : (s + 1) * k]) for s in range(self.spec.count)
        ]
        votes = [s.value for s in samples if s.value is not None and not s.failure]
        detail = {
            "votes": [s.value if s.value is not None and not s.failure else None for s in samples],
            "seeds": [sample_seed(item, s) for s in range(self.spec.count)],
            "aggregate": self.spec.aggregate,
        }
        if not votes:
            first = samples[0]
            return Score(
                None,
                detail,
                first.failure or "unreadable",
                f"none of {self.spec.count} judge samples gave a score ({first.message})",
            )
        return Score(aggregate(votes, self.spec.aggregate), detail)
