"""The per-slot gate: at most ``capacity`` requests in a slot's engine, a bounded waiting room.

The capacity is the slot's current mode's (1 when serialized, ``max_num_seqs`` when it
batches) and follows it: a slot that restarts under another mode (a self-test fallback to
``serialize``) reports a new ``max_inflight``, and ``resize`` applies it to the waiting
requests too. A full waiting room refuses at once (503 + Retry-After) instead of hoarding.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

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
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._queued_gauge = queued or _NoGauge()
        self._inflight_gauge = inflight or _NoGauge()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def resize(self, capacity: int) -> None:
        """Let ``capacity`` requests in from now on (those already in finish as they are)."""
        self.capacity = max(1, capacity)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.inflight < self.capacity:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.inflight += 1
                self._inflight_gauge.inc()
                waiter.set_result(None)

    async def acquire(self) -> None:
        if self.inflight < self.capacity and not self._waiters:
            self.inflight += 1
            self._inflight_gauge.inc()
            return
        if len(self._waiters) >= self.max_waiting:
            raise QueueFull("slot queue is full; retry later")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._queued_gauge.inc()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # admitted and cancelled in the same instant: pass it on
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise
        finally:
            self._queued_gauge.dec()

    def release(self) -> None:
        self.inflight -= 1
        self._inflight_gauge.dec()
        self._wake()

    async def __aenter__(self) -> "SlotGate":
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
