"""Placement policy: which slots may answer a key, in which order, and how long each may
keep the request waiting. Pure: it returns a decision; the transport acts on it.

``wait`` (the default): only the key's own slot, for up to ``slot_wait_s`` (a request never
moves, so results never change). ``next_slot``: the key's ranking of slots, each given
``failover_after_s`` before the request moves on, the last one ``slot_wait_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.core.hashing import slot_for_key, slot_ranking

FailoverMode = Literal["wait", "next_slot"]


@dataclass(frozen=True)
class Placement:
    """Ordered candidates ``(slot, wait_s)``; the first is the key's own slot."""

    candidates: tuple[tuple[int, float], ...]

    @property
    def home(self) -> int:
        return self.candidates[0][0]


def place(key: int, slots: int, failover: FailoverMode, slot_wait_s: float,
          failover_after_s: float) -> Placement:
    """Where ``key`` goes among ``slots`` slots under the failover mode."""
    if failover != "next_slot" or slots < 2:
        return Placement(((slot_for_key(key, slots), slot_wait_s),))
    ranking = slot_ranking(key, slots)
    waits = [failover_after_s] * (len(ranking) - 1) + [slot_wait_s]
    return Placement(tuple(zip(ranking, waits)))
