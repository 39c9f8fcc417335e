"""Placement policy: which slots may answer a key, in which order, how long each may keep
the request waiting, and why. Pure: it returns a decision; the transport acts on it.

Without class information (``pinned``, or a slot whose class is not known yet) a key goes
to its own slot (jump hash) only:

* ``failover: wait`` (the default): the key's slot, for up to ``slot_wait_s`` (a request
  never moves, so results never change);
* ``failover: next_slot``: the key's ranking of slots, each given ``failover_after_s``
  before the request moves on, the last one ``slot_wait_s`` (across classes: marked).

With ``placement: class`` a key may be answered by any slot of its preferred slot's
numerics class (``gateway.core.routing.numerics``), bits unchanged. The members are taken in the
key's own ranking; under bounded load (Mirokni et al.'s consistent hashing with bounded
loads) the first member whose in-flight + queued requests are below
``ceil(c · (total + 1) / members)`` answers, else the least loaded; each member's load is
weighed by how much slower it answers than its fastest mate (``bounded_choice``). A dead
member is left at once for the next (``wait_s`` 0); the last one waits ``slot_wait_s``.
An idle gateway places every key on its own slot, exactly as ``pinned``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.core.routing.hashing import slot_for_key, slot_ranking
from gateway.core.routing.numerics import ModelClasses

FailoverMode = Literal["wait", "next_slot"]
PlacementMode = Literal["pinned", "class"]
#: Why a request is placed away from its preferred slot.
Reason = Literal["preferred", "load", "drained"]


@dataclass(frozen=True)
class Placement:
    """Ordered candidates ``(slot, wait_s)``; ``home`` is the key's own (preferred) slot."""

    candidates: tuple[tuple[int, float], ...]
    home: int = -1
    #: Why the first candidate was chosen: the preferred slot, its load, or a drain.
    reason: Reason = "preferred"
    #: The numerics class the candidates share (None: unknown, or pinned placement).
    numerics_class: str | None = None
    #: Whether every candidate is of one class (False: ``next_slot`` across slots).
    within_class: bool = False

    def __post_init__(self) -> None:
        if self.home < 0:
            object.__setattr__(self, "home", self.candidates[0][0])

    @property
    def first(self) -> int:
        return self.candidates[0][0]


def place(
    key: int, slots: int, failover: FailoverMode, slot_wait_s: float, failover_after_s: float
) -> Placement:
    """Where ``key`` goes among ``slots`` slots, pinned to its own slot (or its ranking under
    ``next_slot``)."""
    if failover != "next_slot" or slots < 2:
        return Placement(((slot_for_key(key, slots), slot_wait_s),))
    ranking = slot_ranking(key, slots)
    waits = [failover_after_s] * (len(ranking) - 1) + [slot_wait_s]
    return Placement(tuple(zip(ranking, waits)))


def slowness(members: list[int], service_s: Mapping[int, float] | None) -> dict[int, float]:
    """Each member's seconds per answer relative to the fastest member's (>= 1; 1 where
    nothing was measured yet). Weighs a request on a slow slot as that many requests."""
    known = {s: service_s[s] for s in members if service_s and service_s.get(s, 0) > 0}
    fastest = min(known.values(), default=0.0)
    return {s: (known[s] / fastest if s in known else 1.0) for s in members}


def bounded_choice(
    members: list[int],
    load: Mapping[int, int],
    c: float,
    service_s: Mapping[int, float] | None = None,
) -> int:
    """The first of ``members`` (in the key's ranking) under the bounded-load capacity,
    else the least loaded (ties: ranking order).

    Loads are weighed by each member's slowness (``service_s``: seconds per answer, as
    measured): a request on a slot answering 10x slower than its fastest mate counts as 10.
    A slot that merely queues more is seen by its queue; one that answers slower (a
    throttled or shared core, a stalled engine still holding its in-flight requests) only by
    its answer rate. An idle member always takes its own keys (nothing to wait for), so an
    idle gateway still places every key on its own slot."""
    weight = slowness(members, service_s)
    total = sum(load.get(s, 0) * weight[s] for s in members)
    capacity = max(1, math.ceil(c * (total + 1) / len(members)))
    for s in members:
        if load.get(s, 0) == 0 or (load.get(s, 0) + 1) * weight[s] <= capacity:
            return s
    return min(members, key=lambda s: ((load.get(s, 0) + 1) * weight[s], members.index(s)))


def takes_waiter(
    slot: int,
    inflight: Mapping[int, int],
    queued: int,
    service_s: Mapping[int, float] | None = None,
) -> bool:
    """Whether class mate ``slot``, with a place free, takes a request of the class queue
    now rather than leave it to its mates (``inflight``: every member's requests in its
    engine; ``queued``: the class's waiting requests). Shortest expected delay: the
    request would finish here after ``(inflight + 1)`` of this slot's answer times, at a
    mate after its own in-flight ones and its share of the queue. Unweighted (``count``)
    a free place always takes it; weighed by answer times (``answer_time``), a slot ten
    times slower than its mate keeps its second place free until the mate's queue is
    ten deep: were the first free place to take any waiter, a slow slot would answer far
    more than its speed's share (the slow-slot benchmark, ``benchmarks/slow_slot.py``,
    measures both). An idle slot always takes one, as bounded load's idle slot takes its
    own keys: its answers add to the class's rate, and one request at a time bounds what
    waits on it; without this a slow slot sits idle between its own keys while its mate
    queues."""
    others = [s for s in inflight if s != slot]
    if not others or inflight[slot] == 0:
        return True
    weight = slowness(list(inflight), service_s)
    mine = (inflight[slot] + 1) * weight[slot]
    share = queued / len(others)
    return mine <= min((inflight[s] + 1 + share) * weight[s] for s in others)


def place_in_class(
    key: int,
    classes: ModelClasses,
    load: Mapping[int, int],
    *,
    failover: FailoverMode,
    slot_wait_s: float,
    failover_after_s: float,
    load_bound: float,
    service_s: Mapping[int, float] | None = None,
) -> Placement:
    """Where ``key`` goes when its slots' numerics classes are known (``placement: class``)."""
    n = len(classes.classes)
    home = slot_for_key(key, n)
    mates = classes.mates(home)
    if classes.classes[home] is None or (len(mates) < 2 and not classes.drained(home)):
        pinned = place(key, n, failover, slot_wait_s, failover_after_s)
        return Placement(pinned.candidates, home, "preferred", classes.classes[home])
    members = [s for s in slot_ranking(key, n) if s in mates]
    if not members:  # every slot drained: nothing better than its own slot
        return place(key, n, failover, slot_wait_s, failover_after_s)
    chosen = bounded_choice(members, load, load_bound, service_s)
    order = [chosen] + [s for s in members if s != chosen]
    waits = [0.0] * (len(order) - 1) + [slot_wait_s]
    reason: Reason = (
        "drained" if classes.drained(home) else ("preferred" if chosen == home else "load")
    )
    return Placement(
        tuple(zip(order, waits)), home, reason, classes.classes[order[0]], within_class=True
    )
