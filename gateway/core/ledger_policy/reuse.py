"""Answering a reward once: from the ledger when it holds the identity, else by one engine
call per identity in flight, and recording every answer.

The core decides; the ledger (``gateway.ledger``) keeps. A reward's identity
(``gateway.core.ledger_policy.identity``) names the numerics class that computes it, so a recorded
answer is exactly what an engine of that class would answer now: a hit is correct by
construction, and an upgrade (another class) simply misses. This module is the policy of
the cache: when it may answer, under which identity a fresh answer is recorded, and what
the route says (``hit``, ``shared``, ``miss``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.core.api import stages
from gateway.core.api.results import EngineReply, Route
from gateway.core.ledger_policy.identity import reward_identity
from gateway.core.ledger_policy.row import GroupRow, LedgerRow
from gateway.core.ledger_policy.single_flight import SingleFlight

Answered = tuple[Route, EngineReply]


class RewardLedger(Protocol):
    """What the core needs of a ledger (``gateway.ledger.ledger.Ledger`` is one)."""

    async def lookup(self, identity: str) -> LedgerRow | None: ...

    def peek(self, identity: str) -> LedgerRow | None:
        """The row of ``identity`` if it is in memory (no I/O)."""

    def record(self, row: LedgerRow, remember: bool = True) -> None:
        """Keep ``row``; ``remember``: also answer it from memory (only when the store was
        asked first and had none: the store keeps the first row of an identity, and a hit
        must return that row's bytes)."""

    def counted(self, model: str, numerics_class: str | None, outcome: str) -> None: ...

    def record_group(self, row: GroupRow) -> None:
        """Keep a group scorer's row (its members' receipts)."""


@dataclasses.dataclass(frozen=True)
class Ask:
    """One engine request as the cache sees it."""

    model: str
    path: str
    body: bytes
    key: int
    #: The class expected to answer (the key's own slot's, as placement sees it); None
    #: while unknown: then no lookup and no shared flight, only recording.
    expected_class: str | None
    seed: int | None = None
    #: Whether this request may be answered from the ledger or by another's call.
    cacheable: bool = True


class RewardReuse:
    """Lookups, single flight and recording over one ledger."""

    def __init__(self, ledger: RewardLedger, keep_bodies: bool = True) -> None:
        self.ledger = ledger
        self.keep_bodies = keep_bodies
        self.flights: SingleFlight[str, Answered] = SingleFlight()

    async def answer(self, ask: Ask, call: Callable[[], Awaitable[Answered]]) -> Answered:
        """The answer to ``ask``: recorded, shared with an identical call in flight, or
        ``call()``'s own (then recorded)."""
        if not ask.cacheable or ask.expected_class is None:
            route, reply = await self._call_and_record(ask, call, remember=False)
            if not ask.cacheable:
                return route, reply
            outcome = "miss"
        else:
            identity = reward_identity(ask.model, ask.expected_class, ask.path, ask.body)
            row = await (
                self.ledger.lookup(identity)
                if stages.TRACER is None
                else self._traced_lookup(stages.TRACER, ask, identity)
            )
            if row is not None and row.status == 200:
                self.ledger.counted(ask.model, row.numerics_class, "hit")
                return hit_route(ask.key, row), EngineReply(
                    row.status, row.answer, row.fingerprint, row.slot, row.numerics_class
                )
            (route, reply), shared = await self.flights.run(
                identity, lambda: self._lead(ask, identity, call)
            )
            if route.cache == "hit" and not shared:
                return route, reply  # answered while it looked: counted as a hit already
            outcome = "shared" if shared else "miss"
        self.ledger.counted(ask.model, route.numerics_class or ask.expected_class, outcome)
        return dataclasses.replace(route, cache=outcome), reply

    async def _lead(
        self, ask: Ask, identity: str, call: Callable[[], Awaitable[Answered]]
    ) -> Answered:
        """The flight's work: look once more (an identical request may have been answered
        while this one looked in the store: it is in memory now), else call the engine."""
        row = self.ledger.peek(identity)
        if row is not None and row.status == 200:
            self.ledger.counted(ask.model, row.numerics_class, "hit")
            return hit_route(ask.key, row), EngineReply(
                row.status, row.answer, row.fingerprint, row.slot, row.numerics_class
            )
        return await self._call_and_record(ask, call)

    async def _call_and_record(
        self, ask: Ask, call: Callable[[], Awaitable[Answered]], remember: bool = True
    ) -> Answered:
        started = time.monotonic()
        route, reply = await call()
        if reply.status != 200 or reply.numerics_class is None:
            return route, reply  # an error is not a reward; an unknown class names nothing
        # the class that answered (a cross-class failover answers for another identity)
        identity = reward_identity(ask.model, reply.numerics_class, ask.path, ask.body)
        self._record(
            LedgerRow(
                identity=identity,
                model=ask.model,
                numerics_class=reply.numerics_class,
                endpoint=ask.path,
                body_digest=hashlib.sha256(ask.body).hexdigest(),
                body=ask.body if self.keep_bodies else None,
                answer=reply.body,
                status=reply.status,
                score=None,
                text=None,
                slot=reply.slot,
                fingerprint=reply.fingerprint,
                seed=ask.seed,
                latency_s=time.monotonic() - started,
                recorded_at=time.time(),
            ),
            remember and identity_looked_up(ask, reply),
        )
        return dataclasses.replace(route, receipt=identity), reply

    async def _traced_lookup(
        self, tracer: stages.StageTracer, ask: Ask, identity: str
    ) -> LedgerRow | None:
        """The ledger lookup as the stage ``rmgate.ledger.lookup``."""
        with tracer.stage(
            "rmgate.ledger.lookup",
            {"rmgate.model": ask.model, "rmgate.receipt": identity},
        ) as stage:
            row = await self.ledger.lookup(identity)
            stage.set_attribute("rmgate.ledger.found", row is not None and row.status == 200)
            return row

    def _record(self, row: LedgerRow, remember: bool) -> None:
        """Hand ``row`` to the ledger (its writer stores it off the request path); traced
        as the stage ``rmgate.ledger.write`` (the handoff, not the store's commit)."""
        if stages.TRACER is None:
            self.ledger.record(row, remember=remember)
            return
        with stages.TRACER.stage(
            "rmgate.ledger.write",
            {
                "rmgate.model": row.model,
                "rmgate.receipt": row.identity,
                "rmgate.numerics_class": row.numerics_class,
                "rmgate.slot": row.slot,
            },
        ):
            self.ledger.record(row, remember=remember)


def hit_route(key: int, row: LedgerRow) -> Route:
    """The route of an answer from the ledger: the slot that computed it, when recorded."""
    return Route(
        key,
        row.slot,
        row.slot,
        row.fingerprint,
        row.numerics_class,
        receipt=row.identity,
        cache="hit",
    )


def identity_looked_up(ask: Ask, reply: EngineReply) -> bool:
    """Whether the answer is recorded under the identity the ledger was asked for (a
    cross-class failover answers under another, never looked up)."""
    return ask.cacheable and reply.numerics_class == ask.expected_class


def cache_decision(setting: str, asked: bool | None) -> bool:
    """Whether a request may be answered from the ledger (or by a twin's call):
    ``gateway.cache`` (``on``, ``off``, ``opt_in``) and what the client asked
    (``x-rmgate-cache: on`` True, ``off`` False, nothing None). ``off`` from the client
    always wins; ``on`` is honoured unless the operator turned the cache off; no header
    follows the setting (``opt_in`` answers from the ledger only those who ask)."""
    if asked is False:
        return False
    if asked is True:
        return setting != "off"
    return setting == "on"
