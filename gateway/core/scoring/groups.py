"""A group as a set: its items' identities, their canonical order, the group's identity.

A group scorer's reward for an item must not depend on the order the trainer listed the
group's items in, so comparisons and listwise prompts use one order decided by the items
themselves: ascending item identity (sha256 over the item's canonical JSON: question,
conversation, response, label). Identical items are one member (same inputs, same
reward). The group's identity is sha256 over its members' identities in that order: what
the ledger's group row and the seeds of sampled judges derive from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.core.routing.keys import canonical_json
from gateway.core.scoring.base import RewardInput


def item_identity(item: RewardInput) -> str:
    """sha256 (hex) over what the item asks: never its index or its group's name."""
    return hashlib.sha256(
        canonical_json(
            {
                "prompt": item.prompt,
                "messages": item.messages,
                "response": item.response,
                "label": item.raw_label,
                "text": item.text,
            }
        )
    ).hexdigest()


@dataclass(frozen=True)
class CanonicalGroup:
    """A group's distinct items in canonical order."""

    name: str
    identity: str
    members: tuple[RewardInput, ...]
    #: item identity -> position in ``members``
    positions: dict[str, int]

    def position(self, item: RewardInput) -> int:
        return self.positions[item_identity(item)]


def canonical_group(name: str, items: list[RewardInput]) -> CanonicalGroup:
    """The group ``name`` of ``items`` (one request's items that carry it)."""
    by_identity: dict[str, RewardInput] = {}
    for item in items:
        by_identity.setdefault(item_identity(item), item)
    order = sorted(by_identity)
    identity = hashlib.sha256("\n".join(order).encode()).hexdigest()
    return CanonicalGroup(
        name,
        identity,
        tuple(by_identity[i] for i in order),
        {i: n for n, i in enumerate(order)},
    )
