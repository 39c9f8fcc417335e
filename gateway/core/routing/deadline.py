"""A request's one deadline: set once at the edge, carried as a value to everything it waits on.

A timeout handed whole to each engine attempt, retry and failover candidate would let a
request run for several times its timeout. A ``Deadline`` is the instant by which the answer is
due; admission, the class queue, each engine call, each backoff and each candidate take
what is *left* of it (``remaining``), and when nothing is left the request ends with
``DeadlineExceeded`` (504 ``deadline_exceeded``). The clock (``time.monotonic`` unless
given to ``Deadline.after``) is injected, so unit tests that move time by hand move deadlines
with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core.api.errors import DeadlineExceeded

#: How far past its deadline a request may be answered: the last resort guard
#: (``Router.answer``) fires this much after the deadline, in case an inner wait did not
#: end at it; the inner waits end at the deadline itself.
GUARD_MARGIN_S = 0.25


@dataclass(frozen=True)
class Deadline:
    """The instant ``at`` (on ``clock``) by which a request must be answered."""

    at: float
    #: The whole budget, for messages ("within 2s").
    budget_s: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    #: What the request does if its slot sleeps (``x-rmgate-on-sleep``: wake, wait or
    #: refuse); None: its model's ``on_sleep``. Part of the request's waiting terms.
    on_sleep: str | None = None

    @classmethod
    def after(
        cls,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        on_sleep: str | None = None,
    ) -> Deadline:
        return cls(clock() + seconds, seconds, clock, on_sleep)

    def remaining(self) -> float:
        """Seconds left (0.0 once passed)."""
        return max(0.0, self.at - self.clock())

    @property
    def expired(self) -> bool:
        return self.clock() >= self.at

    def exceeded(self, what: str) -> DeadlineExceeded:
        """The error of this deadline, saying what was still being waited for."""
        return DeadlineExceeded(f"the request's deadline of {self.budget_s:g}s passed while {what}")

    def left_or_raise(self, what: str) -> float:
        """``remaining()``, or ``DeadlineExceeded`` when nothing is left."""
        left = self.remaining()
        if left <= 0:
            raise self.exceeded(what)
        return left
