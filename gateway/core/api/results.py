"""Typed outcomes of a request: what was decided and who answered.

The core returns these; only the HTTP layer turns them into ``x-rmgate-*`` headers
(``gateway.http.headers``), and ``/v1/rewards``, ``/get_reward`` and the trainer
integrations read their fields, never header strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def key_hex(key: int) -> str:
    """A request key as the 8 hex digits headers, details and logs show."""
    return f"{key:08x}"


@dataclass(frozen=True)
class EngineReply:
    status: int
    body: bytes
    fingerprint: str | None = None
    #: The slot that answered: the placement's first, unless failover moved the request.
    slot: int = 0
    numerics_class: str | None = None
    #: The transport placed the request on another class mate than the placement's first
    #: (the class queue: that mate freed a place first): why, for the route (``load``).
    reason: str | None = None


@dataclass(frozen=True)
class Route:
    """One engine request: its key, the slot its key maps to, and the slot that answered
    (another one only after a failover)."""

    key: int
    slot: int
    answered_by: int
    fingerprint: str | None = None
    #: The numerics class of the answering slot (None: not reported / pinned placement).
    numerics_class: str | None = None
    #: The answering slot was a class mate of the key's own slot (same bits by the class
    #: invariant), not a ``next_slot`` failover.
    within_class: bool = False
    #: Why a class mate answered: ``load`` (bounded load), ``drained`` (the key's own slot
    #: is outside the majority class), ``unavailable`` (it did not answer); None otherwise.
    placement_reason: str | None = None
    #: The reward's identity in the ledger (``gateway.core.ledger_policy.identity``), its
    #: receipt; None when it has none (no ledger, or the answering slot's class is unknown).
    receipt: str | None = None
    #: ``hit`` (answered from the ledger), ``shared`` (an identical request's engine call
    #: in flight answered it), ``miss`` (its own engine call); None: no cache.
    cache: str | None = None

    @property
    def failed_over(self) -> bool:
        return self.answered_by != self.slot and not self.within_class

    @property
    def placed_away(self) -> bool:
        return self.answered_by != self.slot and self.within_class


@dataclass(frozen=True)
class ComponentFailure:
    """A reward program's component that failed for one item, and whether the item's
    reward became the program's default because of it (for /metrics)."""

    program: str
    component: str
    reason: str


@dataclass(frozen=True)
class GatewayResult:
    """A request's outcome: the engine-shaped JSON body and everything that decided it."""

    model: str
    body: bytes = b""
    status: int = 200
    #: The key of the whole request body (a list input: the list's key).
    key: int | None = None
    #: One route per engine request, in item order (one for a chat or a single input).
    routes: tuple[Route, ...] = ()
    seed: int | None = None
    #: Whether the gateway derived ``seed`` (seed policy ``derive``, none sent).
    seed_derived: bool = False
    endpoint: str = ""
    #: ``(field, asked, sent)`` when the request asked for more output tokens than the
    #: model's context holds and the gateway sent the context length instead.
    max_tokens_clamped: tuple[str, int, int] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    #: Reward programs: every failed component of every item, and per program how many
    #: items got its ``on_failure`` default.
    component_failures: tuple[ComponentFailure, ...] = ()
    defaults_used: tuple[tuple[str, int], ...] = ()
    #: ``(model or program, items masked)`` under ``on_failure: mask``.
    masked: tuple[tuple[str, int], ...] = ()

    @property
    def key_hex(self) -> str | None:
        return None if self.key is None else key_hex(self.key)

    @property
    def slots(self) -> list[int]:
        """The slots that answered, per item."""
        return [r.answered_by for r in self.routes]

    @property
    def slot(self) -> int | None:
        """The answering slot of a one-request result."""
        return self.routes[0].answered_by if len(self.routes) == 1 else None

    @property
    def failovers(self) -> list[tuple[int, int]]:
        return [(r.slot, r.answered_by) for r in self.routes if r.failed_over]

    @property
    def placements(self) -> list[tuple[int, int, str]]:
        """``(own slot, answering slot, reason)`` of every item a class mate answered."""
        return [
            (r.slot, r.answered_by, r.placement_reason or "") for r in self.routes if r.placed_away
        ]

    @property
    def receipts(self) -> list[str]:
        """Per item, its receipt ("" where it has none)."""
        return [r.receipt or "" for r in self.routes]

    @property
    def cache(self) -> str | None:
        """``hit`` when every item was a hit, ``miss`` when any made its own engine call,
        else ``shared``; None when no item went through the cache."""
        outcomes = {r.cache for r in self.routes if r.cache}
        if not outcomes:
            return None
        return "miss" if "miss" in outcomes else ("shared" if "shared" in outcomes else "hit")

    @property
    def numerics_classes(self) -> list[str]:
        return sorted({r.numerics_class for r in self.routes if r.numerics_class})

    @property
    def fingerprints(self) -> list[str]:
        return sorted({r.fingerprint for r in self.routes if r.fingerprint})
