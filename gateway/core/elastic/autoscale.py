"""Autoscaling decisions, as policy: how many slots a model's load asks for, and when.

Ray Serve's own autoscaler cannot drive rmgate's slots: each slot is an application of
one replica (its index must survive restarts and a new slot must prove its numerics class
before it takes traffic: ``gateway.serve.topology``), so the scaler here decides with
Serve's rule and names and ``gateway.serve.autoscaler`` applies the decision in rmgate's
gap-free steps. The rule: ``ceil(ongoing / target_ongoing_per_slot)`` slots, within
``[min_slots, max_slots]``, once that has held for ``upscale_delay_s`` (more) or
``downscale_delay_s`` (fewer). Zero slots is one slot asleep; waking it takes no delay (a
request waits for it). A model with slots still starting is never scaled down: idleness is
measured on slots that serve, so the downscale delay starts once they all do (else a slow
start, longer than the delay, would be undone the moment it ends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gateway.core.config.elastic import AutoscalingSpec

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class ScaleDecision:
    """Move ``model`` from ``current`` to ``target`` slots (0: one slot, asleep)."""

    model: str
    current: int
    target: int
    reason: str

    @property
    def direction(self) -> Direction:
        return "up" if self.target > self.current else "down"


class ScaleRule:
    """One model's rule, fed one observation at a time (pure: the caller's clock)."""

    def __init__(self, model: str, spec: AutoscalingSpec) -> None:
        self.model = model
        self.spec = spec
        self._since: float | None = None  # when the load began to ask for a change
        self._up: bool | None = None  # which way
        self._held = 0  # up: the fewest slots asked for since; down: the most

    def desired(self, ongoing: float) -> int:
        want = math.ceil(ongoing / self.spec.target_ongoing_per_slot) if ongoing > 0 else 0
        return max(self.spec.min_slots, min(self.spec.max_slots, want))

    def reset(self) -> None:
        self._since, self._up, self._held = None, None, 0

    def observe(
        self, now: float, ongoing: float, current: int, starting: int = 0
    ) -> ScaleDecision | None:
        """The decision this observation completes, if any. ``current``: the model's slots
        (0 when scaled to zero); ``starting``: how many of them do not serve yet."""
        want = self.desired(ongoing)
        up = want > current
        if want == current or (starting and not up):
            self.reset()
            return None
        if self._since is None or self._up is not up:
            self._since, self._up, self._held = now, up, want
        else:
            self._held = min(self._held, want) if up else max(self._held, want)
        if up:
            delay = 0.0 if current == 0 else self.spec.upscale_delay_s
        else:
            delay = self.spec.downscale_delay_s
        if now - self._since < delay:
            return None
        target = self._held
        self.reset()
        return ScaleDecision(
            self.model,
            current,
            target,
            f"{ongoing:g} requests ongoing on {current} slots (target "
            f"{self.spec.target_ongoing_per_slot:g} per slot) asked for {target} for {delay:g}s",
        )
