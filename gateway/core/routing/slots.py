"""How many slots each model has right now: declared, validated state shared by the core
(which hashes keys over the count) and the transport (which hands back requests caught on a
slot that a scale-down removed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.core.api.errors import InvalidSlotCounts

if TYPE_CHECKING:  # pragma: no cover
    from gateway.core.config.settings import AppConfig

MAX_SLOTS = 256


class SlotTable:
    """Slot counts per model; ``update`` checks a whole change before applying any of it."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._models = frozenset(counts)
        self._counts: dict[str, int] = {}
        self.update(counts)

    @classmethod
    def from_config(cls, config: AppConfig) -> SlotTable:
        return cls({m.name: m.replicas for m in config.models})

    @property
    def models(self) -> frozenset[str]:
        return self._models

    def count(self, model: str) -> int:
        return self._counts[model]

    def as_dict(self) -> dict[str, int]:
        return dict(self._counts)

    def removed(self, model: str, slot: int) -> bool:
        """Whether ``slot`` is gone or going (at or above the model's current count)."""
        return slot >= self._counts.get(model, slot + 1)

    def validate(self, counts: Mapping[Any, Any]) -> dict[str, int]:
        """``counts`` as ``{model: n}`` or ``InvalidSlotCounts`` naming what is wrong."""
        if not isinstance(counts, Mapping) or not counts:
            raise InvalidSlotCounts("slot counts must be a non-empty mapping {model: n}")
        unknown = sorted(str(m) for m in counts if str(m) not in self._models)
        if unknown:
            raise InvalidSlotCounts(
                f"slot counts for models that are not served: {unknown}; "
                f"served: {sorted(self._models)}"
            )
        out: dict[str, int] = {}
        for model, n in counts.items():
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SLOTS:
                raise InvalidSlotCounts(
                    f"model {model}: a slot count must be an integer from 1 "
                    f"to {MAX_SLOTS}, got {n!r}"
                )
            out[str(model)] = n
        return out

    def update(self, counts: Mapping[Any, Any]) -> dict[str, int]:
        """Apply a (partial) change; returns the new counts of the models it named."""
        valid = self.validate(counts)
        self._counts.update(valid)
        return valid
