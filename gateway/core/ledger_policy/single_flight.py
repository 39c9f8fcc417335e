"""Identical requests in flight at once make one engine call.

A GRPO group sends the same (prompt, response) several times at once, and a retried batch
resends what is still running. Under one identity (``gateway.core.ledger_policy.identity``)
the first request leads: it makes the call; the others wait for its result and get the
same value.
A request that waits never depends on the leader's client: when the leader is cancelled
(its client went away) or fails, the flight ends without a result and the waiters run
again, one of them leading the next flight. A waiter that is itself cancelled stops
waiting without disturbing the flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Abandoned(Exception):
    """The leader ended without a result; the waiter runs again."""


class SingleFlight(Generic[K, V]):
    """At most one running ``work()`` per key; the rest share its result."""

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """``(value, shared)``: ``shared`` when another request's call produced it."""
        while True:
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, work), False
            try:
                return await asyncio.shield(flight), True
            except _Abandoned:
                continue  # the leader went away or failed: lead (or follow) anew

    async def _lead(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        flight: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            value = await work()
        except BaseException:
            # no result to share: the waiters run again (a failure is the leader's own,
            # a waiter may still succeed; a cancellation is the leader's client's)
            flight.set_exception(_Abandoned())
            flight.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        else:
            flight.set_result(value)
            return value
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
