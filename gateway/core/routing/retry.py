"""Retries of one request on one slot, as a small state object with explicit outcomes.

The policy: an engine 5xx is retried ``engine_5xx_retries`` times after a backoff, then
answered 502; an unreachable engine (connection refused, connection lost, Ray actor gone)
is waited out with a backoff until the slot's wait budget is spent, then 503: Ray Serve
restarts dead replicas, and another slot could answer with other bits. A request that was
sent but got no answer in time is not retried (504): it may still be running there.
The clock is injected, so tests need no wall-clock sleeps.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryConfig:
    engine_5xx_retries: int = 2
    backoff_s: float = 0.5


class Decision(enum.Enum):
    RETURN = "return"  # hand the reply to the caller
    RETRY = "retry"  # back off, then try the same slot again
    ENGINE_FAILED = "failed"  # the engine kept answering 5xx: 502
    GIVE_UP = "give_up"  # the slot stayed unreachable for the whole wait: 503


class RetryState:
    """What to do after each attempt on one slot within ``wait_s`` seconds."""

    def __init__(self, config: RetryConfig, wait_s: float, clock: Callable[[], float]) -> None:
        self.config = config
        self.wait_s = wait_s
        self.clock = clock
        self.deadline = clock() + wait_s
        self.engine_5xx = 0
        self.unreachable = 0

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def record_reply(self, status: int) -> Decision:
        if status < 500:
            return Decision.RETURN
        if self.engine_5xx >= self.config.engine_5xx_retries:
            return Decision.ENGINE_FAILED
        self.engine_5xx += 1
        return self._backoff_or(Decision.ENGINE_FAILED)

    def record_unreachable(self) -> Decision:
        self.unreachable += 1
        return self._backoff_or(Decision.GIVE_UP)

    def _backoff_or(self, otherwise: Decision) -> Decision:
        if self.clock() + self.config.backoff_s > self.deadline:
            return otherwise
        return Decision.RETRY
