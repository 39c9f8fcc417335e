"""The class queue: placement's decision while a request waits for a place.

``placement`` decides, when a request arrives, which class mates may answer it and in
which order (``gateway.core.routing.placement``). When its chosen slot has no room (its
engine holds as many as its mode lets in), the request waits at every mate's gate at once
and the first mate the weighed rule (``placement.takes_waiter``) lets take it answers:
same bits whichever does, instead of queueing behind a stalled slot while a mate is free.
This module is that decision; the transport only says which mates are reachable now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.core.routing.deadline import Deadline
from gateway.core.routing.gate import SlotGate, acquire_first
from gateway.core.routing.placement import Placement, takes_waiter

Candidates = tuple[tuple[int, float], ...]


async def admit_in_class(
    placement: Placement,
    members: Sequence[tuple[int, SlotGate]],
    deadline: Deadline,
    service_s: Mapping[int, float] | None,
    what: str,
) -> tuple[SlotGate | None, Candidates]:
    """A place in the first of ``members`` (the placement's reachable class mates, in its
    order) to have room, and the candidates with that slot first; ``(None, the
    placement's candidates)`` when fewer than two mates can wait. ``service_s``: each
    mate's seconds per answer when loads are weighed by answer times (then a mate takes a
    waiter only while ``takes_waiter`` says so), else None (any free place takes it: the
    rule always would when counting requests, a property test)."""
    if len(members) < 2:
        return None, placement.candidates
    gates = [g for _, g in members]
    slots = [s for s, _ in members]

    def accepts(i: int) -> bool:  # placement's weighed rule, on the loads of now
        return takes_waiter(
            slots[i], {s: g.inflight for s, g in members}, sum(g.queued for g in gates), service_s
        )

    wait = deadline.left_or_raise(f"placing it in {what}'s class queue")
    try:
        index = await acquire_first(gates, accepts if service_s is not None else None, wait)
    except TimeoutError:
        raise deadline.exceeded(f"waiting in {what}'s class queue {slots}") from None
    chosen, gate = members[index]
    if chosen == placement.first:
        return gate, placement.candidates
    rest = [s for s, _ in placement.candidates if s != chosen]
    waits = [0.0] * len(rest)
    waits[-1] = placement.candidates[-1][1]
    return gate, ((chosen, 0.0), *zip(rest, waits))
