"""Reward programs: components' scores -> one reward, in a fixed order, failures explicit.

Pure policy: ``combine`` decides the item's reward from its components' scores and the
program's ``on_failure``; the caller (``gateway.core.scoring.rewards``) ran the components and
records what was decided (metrics, details). The float result is the same every time:
transforms are applied in the listed order, and the weighted scores are added one by one
in the components' order, starting from 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.core.api.errors import RewardComponentFailed
from gateway.core.api.results import Route
from gateway.core.config.scoring import ClipStep, DefaultOnFailure, ProgramSpec, TransformStep


def apply_transform(value: float, steps: list[TransformStep]) -> float:
    """``value`` through each step in order: ``clip: [lo, hi]`` or ``affine: {scale,
    shift}`` (``value * scale + shift``)."""
    for step in steps:
        if isinstance(step, ClipStep):
            value = min(max(value, step.clip[0]), step.clip[1])
        else:
            value = value * step.affine.scale + step.affine.shift
    return value


@dataclass(frozen=True)
class ComponentScore:
    """One component's outcome for one item."""

    name: str
    weight: float
    #: The scorer's value (None: it gave none).
    score: float | None
    #: ``score`` through the component's transform (None when failed).
    transformed: float | None
    #: None when it succeeded; else a short reason (``timeout``, ``crashed``, ``error``,
    #: ``unparsed``, ``unreadable``, ``engine``) and a message.
    failure: str | None = None
    message: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()

    def as_detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "status": "failed" if self.failure else "ok",
            "weight": self.weight,
            "score": self.score,
            "transformed": self.transformed,
        }
        if self.failure:
            out.update(reason=self.failure, error=self.message)
        return {**out, **self.detail}


@dataclass(frozen=True)
class ProgramOutcome:
    """An item's combined reward and how it was reached."""

    #: None: masked (``on_failure: mask``), ``mask_reason`` says why.
    reward: float | None
    failed: tuple[str, ...] = ()
    default_used: bool = False
    mask_reason: str | None = None


def combine(program: ProgramSpec, parts: list[ComponentScore], index: int) -> ProgramOutcome:
    """The item's reward under the program's ``on_failure``; ``RewardComponentFailed``
    under ``error`` when a component failed, and under ``skip_component`` when all did
    (nothing is left to combine: never a silent 0); no reward (masked) under ``mask``."""
    failed = tuple(p.name for p in parts if p.failure)
    if failed:
        first = next(p for p in parts if p.failure)
        why = f"component {first.name!r} failed ({first.failure}: {first.message})"
        if program.on_failure == "error":
            raise RewardComponentFailed(
                f"item {index}: {why}; program {program.name!r} has on_failure: error",
                param=f"items[{index}]",
            )
        if program.on_failure == "mask":
            return ProgramOutcome(None, failed, mask_reason=why)
        if isinstance(program.on_failure, DefaultOnFailure):
            return ProgramOutcome(program.on_failure.default, failed, default_used=True)
        if len(failed) == len(parts):
            raise RewardComponentFailed(
                f"item {index}: every component of program {program.name!r} failed; {why}",
                param=f"items[{index}]",
            )
    reward = 0.0
    for part in parts:
        if not part.failure and part.transformed is not None:
            reward += part.weight * part.transformed
    return ProgramOutcome(reward, failed)
