"""The seam between the core and the mechanics that reach an engine.

The core (``gateway.core.service``) decides *where* a request goes (a ``Placement``) and
asks a ``Transport`` to get it answered; ``gateway.transport`` implements it over Ray
Serve. Engine clients raise the errors below, rmgate's own, mapped once at the client's
boundary (as httpx maps httpcore's), so no layer above speaks aiohttp's or Ray's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.api.results import EngineReply
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.numerics import ModelClasses
from gateway.core.routing.placement import Placement


def engine_auth(secret: str | None) -> dict[str, str]:
    """The header an engine wants on every request but ``/health`` (every engine has its
    slot's secret); the one definition, used by the ingress and by the slot replica."""
    return {"authorization": f"Bearer {secret}"} if secret else {}


@dataclass(frozen=True)
class SlotInfo:
    """Where a slot's engine listens and what its answers depend on (from the replica)."""

    model: str
    slot: int
    url: str
    fingerprint: str | None
    mode: str
    max_inflight: int
    raw: dict[str, Any] = field(default_factory=dict)
    #: The slot's numerics class (``gateway.core.routing.numerics``); None when it reported none.
    numerics_class: str | None = None
    #: The engine's secret (every slot makes one): sent as ``Authorization: Bearer``.
    secret: str | None = field(default=None, repr=False)

    #: What every request to this slot's engine carries (made once, not per request).
    headers: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "headers", {"content-type": "application/json", **engine_auth(self.secret)}
        )

    @classmethod
    def from_endpoint(cls, model: str, slot: int, raw: dict[str, Any]) -> SlotInfo:
        numerics = raw.get("numerics") or {}
        return cls(
            model=model,
            slot=slot,
            url=raw["url"],
            fingerprint=raw.get("fingerprint"),
            mode=raw["mode"],
            max_inflight=int(raw.get("max_inflight", 1)),
            raw={k: v for k, v in raw.items() if k != "secret"},  # never shown
            numerics_class=numerics.get("class_id"),
            secret=raw.get("secret"),
        )


@dataclass(frozen=True)
class SlotView:
    """What placement needs to know of a model's slots right now: their numerics classes
    (as last reported; a dead slot keeps its class), their load (in flight + queued) and
    how fast each answers."""

    classes: ModelClasses
    load: dict[int, int] = field(default_factory=dict)
    #: Per slot: its engine's current round-trip estimate in seconds (0.0: not measured).
    service_s: dict[int, float] = field(default_factory=dict)


class EngineCallError(Exception):
    """An engine call failed below HTTP (no status to read)."""


class EngineUnreachable(EngineCallError):
    """No connection could be made: the engine is down or restarting (wait for the slot)."""


class EngineNoAnswer(EngineCallError):
    """The request was sent but no answer came within the timeout (504)."""


class EngineConnectionLost(EngineCallError):
    """The connection broke before the answer was complete (wait for the slot, resend:
    every request is idempotent)."""


class SlotAsleep(Exception):
    """The slot is not awake (asleep, on its way, or kept out after a wake): its
    ``report`` says which, who put it to sleep, and why a kept-out slot was kept out."""

    def __init__(self, model: str, slot: int, report: dict[str, Any]) -> None:
        self.model, self.slot, self.report = model, slot, report
        self.state = str(report.get("state", "asleep"))
        super().__init__(f"slot {model}-{slot} is {self.state}")


class EngineClient(Protocol):
    """Posts one canonical body to a slot's engine; raises ``EngineCallError``s only."""

    async def post(
        self, target: SlotInfo, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    """How the core reaches the slots of a model."""

    async def post(
        self, model: str, placement: Placement, path: str, body: bytes, deadline: Deadline
    ) -> EngineReply:
        """Answer ``body`` on the placement's slots, in order, by ``deadline``; raises
        ``RmgateError``s (``SlotRemoved`` when scaling took the slot away under the
        request, ``DeadlineExceeded`` when the deadline passed)."""

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None: ...

    def slot_view(self, model: str, slots: int) -> SlotView:
        """Classes and load of ``model``'s first ``slots`` slots (never blocks)."""

    async def health(self, model: str, slot: int, timeout_s: float) -> str: ...

    async def slot_state(self, model: str, slot: int, timeout_s: float) -> dict[str, Any]:
        """The slot's sleep state (``deployments.slot.lifecycle``); ``unavailable`` when its
        replica does not answer."""

    async def sleep_slot(self, model: str, slot: int, level: int, by: str) -> dict[str, Any]:
        """Put the slot to sleep at ``level``; its report with the time it took."""

    async def wake_slot(self, model: str, slot: int, timeout_s: float) -> dict[str, Any]:
        """Wake the slot (one wake per slot at a time, however many ask)."""

    async def aclose(self) -> None: ...
