"""The per-slot gate: at most ``capacity`` requests in a slot's engine, a bounded waiting room.

``acquire_first`` waits at several gates at once (a numerics class's members): a request
that any of them may answer with the same bits is admitted by the first that has room, its
own slot preferred, instead of waiting behind a stalled slot while a class mate is free.

The capacity is the slot's current mode's (1 when serialized, ``max_num_seqs`` when it
batches) and follows it: a slot that restarts under another mode (a self-test fallback to
``serialize``) reports a new ``max_inflight``, and ``resize`` applies it to the waiting
requests too. A full waiting room refuses at once (503 + Retry-After) instead of hoarding.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, Sequence

from gateway.core.errors import QueueFull


class _Gauge(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class _NoGauge:
    def inc(self, amount: float = 1) -> None:
        return None

    def dec(self, amount: float = 1) -> None:
        return None


class SlotGate:
    """A resizable counting gate, first come first served, with a bounded waiting room."""

    def __init__(self, capacity: int, max_waiting: int, *, queued: _Gauge | None = None,
                 inflight: _Gauge | None = None) -> None:
        self.capacity = max(1, capacity)
        self.max_waiting = max_waiting
        self.inflight = 0
        #: Requests counted in this waiting room (a class-queue waiter waits at every mate
        #: but is counted at one only, so a class holds the sum of its rooms).
        self.queued = 0
        self._waiters: deque[asyncio.Future[SlotGate]] = deque()
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
        """Whether a request arriving now would be let in at once."""
        return self.inflight < self.capacity and not self._waiters

    def _take(self) -> None:
        self.inflight += 1
        self._inflight_gauge.inc()

    def _wake(self) -> None:
        while self._waiters and self.inflight < self.capacity:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a waiter shared with other gates may be taken already
                self._take()
                waiter.set_result(self)

    def _discard(self, waiter: "asyncio.Future[SlotGate]") -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    async def acquire(self) -> None:
        if self.has_room:
            self._take()
            return
        if self.queued >= self.max_waiting:
            raise QueueFull("slot queue is full; retry later")
        waiter: asyncio.Future[SlotGate] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._count(1)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
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

    def admitted(self) -> "_Admitted":
        """Release on exit of a place ``acquire_first`` already took."""
        return _Admitted(self)

    async def __aenter__(self) -> "SlotGate":
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class _Admitted:
    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate

    async def __aenter__(self) -> SlotGate:
        return self.gate

    async def __aexit__(self, *exc: object) -> None:
        self.gate.release()


async def acquire_first(gates: Sequence[SlotGate]) -> int:
    """A place in one of ``gates`` (in preference order): the first with room now, else the
    first to free one; returns its index. The request waits in every gate's FIFO but is
    counted in one waiting room only (the emptiest, ties in preference order), so the
    class as a whole queues as many as its rooms hold; ``QueueFull`` when every room is
    full."""
    for i, gate in enumerate(gates):
        if gate.has_room:
            gate._take()
            return i
    rooms = [g for g in gates if g.queued < g.max_waiting]
    if not rooms:
        raise QueueFull("every class mate's queue is full; retry later")
    home = min(rooms, key=lambda g: g.queued / g.max_waiting)
    waiter: asyncio.Future[SlotGate] = asyncio.get_running_loop().create_future()
    for gate in gates:
        gate._waiters.append(waiter)
    home._count(1)
    try:
        admitted = await waiter
    except BaseException:
        if waiter.done() and not waiter.cancelled():
            waiter.result().release()  # admitted and cancelled in the same instant
        raise
    finally:
        home._count(-1)
        taken = waiter.result() if waiter.done() and not waiter.cancelled() else None
        for gate in gates:
            # the admitting gate popped it already (a remove there would scan its whole
            # FIFO for nothing); elsewhere it is among the oldest, near the front
            if gate is not taken:
                gate._discard(waiter)
    return next(i for i, g in enumerate(gates) if g is admitted)
