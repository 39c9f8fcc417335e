"""The per-slot gate: at most ``capacity`` requests in a slot's engine, a bounded waiting room.

A class mate's request may wait at several gates at once (the class queue,
``gateway.core.routing.class_queue``): each waiter says which gates may take it.

The capacity is the slot's current mode's (1 when serialized, ``max_num_seqs`` when it
batches) and follows it: a slot that restarts under another mode (a self-test fallback to
``serialize``) reports a new ``max_inflight``, and ``resize`` applies it to the waiting
requests too. A full waiting room refuses at once (503 + Retry-After) instead of hoarding.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.core.api.errors import QueueFull


class _Gauge(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class _NoGauge:
    def inc(self, amount: float = 1) -> None:
        return None

    def dec(self, amount: float = 1) -> None:
        return None


#: How many waiters a freed place looks at, past the ones it may not take, before it stays
#: free (a bound on the hot path's work; the skipped ones are taken by their other gates).
SCAN_LIMIT = 16


class _Waiter:
    """A request waiting for a place: its future, and which gates may take it (None: any)."""

    __slots__ = ("future", "accepts")

    def __init__(
        self, future: asyncio.Future[SlotGate], accepts: Callable[[SlotGate], bool] | None = None
    ) -> None:
        self.future = future
        self.accepts = accepts


class SlotGate:
    """A resizable counting gate, first come first served, with a bounded waiting room."""

    def __init__(
        self,
        capacity: int,
        max_waiting: int,
        *,
        queued: _Gauge | None = None,
        inflight: _Gauge | None = None,
    ) -> None:
        self.capacity = max(1, capacity)
        self.max_waiting = max_waiting
        self.inflight = 0
        #: Requests counted in this waiting room (a class-queue waiter waits at every mate
        #: but is counted at one only, so a class holds the sum of its rooms).
        self.queued = 0
        self._waiters: deque[_Waiter] = deque()
        self._queued_gauge = queued or _NoGauge()
        self._inflight_gauge = inflight or _NoGauge()

    @property
    def waiting(self) -> int:
        return self.queued

    def _count(self, amount: int) -> None:
        self.queued += amount
        if amount > 0:
            self._queued_gauge.inc(amount)
        else:
            self._queued_gauge.dec(-amount)

    def resize(self, capacity: int) -> None:
        """Let ``capacity`` requests in from now on (those already in finish as they are)."""
        self.capacity = max(1, capacity)
        self._wake()

    @property
    def has_room(self) -> bool:
        """Whether a request arriving now would be let in at once (waiters this gate may
        not take can keep a place free: ``_wake`` after queueing settles that)."""
        return self.inflight < self.capacity and not self._waiters

    def _take(self) -> None:
        self.inflight += 1
        self._inflight_gauge.inc()

    def _wake(self) -> None:
        """Free places go to the oldest waiters this gate may take; the ones it may not
        (a class waiter its weighed rule keeps for a faster mate) keep their turn."""
        kept: list[_Waiter] = []
        while self._waiters and self.inflight < self.capacity and len(kept) < SCAN_LIMIT:
            waiter = self._waiters.popleft()
            if waiter.future.done():  # a waiter shared with other gates may be taken already
                continue
            if waiter.accepts is not None and not waiter.accepts(self):
                kept.append(waiter)
                continue
            self._take()
            waiter.future.set_result(self)
        self._waiters.extendleft(reversed(kept))

    def _discard(self, waiter: _Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    async def acquire(self, timeout_s: float | None = None) -> None:
        """A place, at once or after waiting at most ``timeout_s`` (``TimeoutError``: the
        request's deadline passed in the waiting room; it is no longer counted there)."""
        if self.has_room:
            self._take()
            return
        if self.queued >= self.max_waiting:
            raise QueueFull("slot queue is full; retry later")
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._count(1)
        self._wake()  # a place kept free for a faster mate's waiter is this one's
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # admitted and cancelled in the same instant: pass it on
            else:
                self._discard(waiter)
            raise
        finally:
            self._count(-1)

    def release(self) -> None:
        self.inflight -= 1
        self._inflight_gauge.dec()
        self._wake()


async def acquire_first(
    gates: Sequence[SlotGate],
    accepts: Callable[[int], bool] | None = None,
    timeout_s: float | None = None,
) -> int:
    """A place in one of ``gates`` (in preference order): the first with room now, else the
    first to free one; returns its index. ``accepts(i)``: whether gate ``i`` (not the
    first, the placement's own choice, which always may) may take the request now; asked
    again each time that gate frees a place. The request waits in every gate's FIFO but is
    counted in one waiting room only (the first gate's while it has space, else the
    emptiest), so the class as a whole queues as many as its rooms hold; ``QueueFull``
    when every room is full; ``TimeoutError`` when no place came within ``timeout_s``."""

    def may(i: int) -> bool:
        return i == 0 or accepts is None or accepts(i)

    for i, gate in enumerate(gates):
        if gate.has_room and may(i):
            gate._take()
            return i
    rooms = [g for g in gates if g.queued < g.max_waiting]
    if not rooms:
        raise QueueFull("every class mate's queue is full; retry later")
    # Counted where placement sent it while that room has space: the load view then shows
    # the queue at the slot expected to take it, not at a slow mate that refuses it (which
    # then looked busy, so its own keys stopped going to it even when it sat idle).
    home = gates[0] if gates[0] in rooms else min(rooms, key=lambda g: g.queued / g.max_waiting)
    index = {id(g): i for i, g in enumerate(gates)}
    waiter = _Waiter(
        asyncio.get_running_loop().create_future(),
        None if accepts is None else (lambda g: may(index[id(g)])),
    )
    for gate in gates:
        gate._waiters.append(waiter)
    home._count(1)
    for gate in gates:  # a place kept free (by a rule for other waiters) may be this one's
        if not waiter.future.done() and gate.inflight < gate.capacity:
            gate._wake()
    try:
        async with asyncio.timeout(timeout_s):
            admitted = await waiter.future
    except BaseException:
        if waiter.future.done() and not waiter.future.cancelled():
            waiter.future.result().release()  # admitted and cancelled in the same instant
        raise
    finally:
        home._count(-1)
        done = waiter.future.done() and not waiter.future.cancelled()
        taken = waiter.future.result() if done else None
        for gate in gates:
            # the admitting gate popped it already (a remove there would scan its whole
            # FIFO for nothing); elsewhere it is among the oldest, near the front
            if gate is not taken:
                gate._discard(waiter)
                if accepts is not None and gate._waiters and gate.inflight < gate.capacity:
                    gate._wake()  # a place it kept free: the waiters behind may take it
    return index[id(admitted)]
