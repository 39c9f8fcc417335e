"""How long each slot's engine takes per answer, as placement's bounded load weighs it.

A slot's queue shows a slot that is busy; it does not show one that is slow. A throttled
engine (its core shared with a busy process, a stalled GPU) holds its in-flight requests
just as a healthy one does, so by in-flight + queued it looks the same until its queue
builds. Round-trip times show it at once. This is Finagle's peak EWMA: an exponentially
weighted mean of the round trips of answered requests, raised to the age of the oldest
request still in flight when that is larger (a stalled engine answers nothing, so its mean
alone would not move). Mechanism only: placement (``gateway.core.routing.placement``) decides.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol


class GaugeChild(Protocol):
    def set(self, value: float) -> None: ...


class AnswerTimes:
    """Round-trip seconds of one slot's engine requests (peak EWMA)."""

    def __init__(
        self, clock: Callable[[], float], alpha: float = 0.3, gauge: GaugeChild | None = None
    ) -> None:
        self.clock = clock
        self.alpha = alpha
        self.gauge = gauge  # where the mean is shown (rmgate_slot_answer_seconds)
        self.mean_s: float | None = None
        #: token -> (start, share) of the requests in flight
        self._inflight: dict[int, tuple[float, int]] = {}
        #: share -> {token: start} in start order (the clock never goes back): the oldest
        #: request of each share is its first entry, so ``seconds`` looks at one request per
        #: distinct share instead of every request in flight (it runs for every slot at
        #: every placement: 4.6 % of an ingress's CPU under load, before)
        self._by_share: dict[int, dict[int, float]] = {}
        self._ids = itertools.count()

    def started(self, share: int = 1) -> int:
        """A request went to the engine; the token ``finished`` takes. ``share``: how many
        requests its round trip is shared by: a serialized engine computes the ones
        already in it first, so its round trip is that many service times, and a slot
        with more in it would look slower only for being busier (measured: in the
        slow-slot benchmark unnormalized round trips made the busy fast slot look slower
        than the stalled one, and keys moved *to* the stalled slot)."""
        token = next(self._ids)
        start, share = self.clock(), max(1, share)
        self._inflight[token] = (start, share)
        self._by_share.setdefault(share, {})[token] = start
        return token

    def finished(self, token: int, answered: bool) -> None:
        """The request came back; ``answered``: with an answer (its time counts)."""
        started = self._inflight.pop(token, None)
        if started is None:
            return
        start, share = started
        group = self._by_share[share]
        del group[token]
        if not group:
            del self._by_share[share]
        if not answered:
            return
        elapsed = (self.clock() - start) / share
        self.mean_s = (
            elapsed if self.mean_s is None else self.mean_s + self.alpha * (elapsed - self.mean_s)
        )
        if self.gauge is not None:
            self.gauge.set(self.mean_s)

    def seconds(self) -> float:
        """The slot's current estimate of seconds per answer (0.0 before any)."""
        now = self.clock()
        age = max(
            ((now - next(iter(group.values()))) / share for share, group in self._by_share.items()),
            default=0.0,
        )
        return max(self.mean_s or 0.0, age)
