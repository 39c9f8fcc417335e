"""The rule pool: a bounded set of worker processes that run rule checks with a timeout.

A check that hangs (a regular expression that backtracks without end, ``math-verify`` on
adversarial input) is ended at its ``timeout_s``: pebble kills its worker and starts a new
one, and the item's component fails with ``timeout``; a worker that dies mid-check fails
it with ``crashed``. Neither blocks the event loop or another item. Workers are spawned
(not forked): the ingress runs threads (Ray's, the ledger writer's) that a fork would copy
mid-lock.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import TimeoutError as FutureTimeout

from pebble import ProcessExpired, ProcessPool

from gateway.core.api.errors import RuleCheckFailed
from gateway.core.scoring.base import RuleCall
from gateway.rules.checks import run_check


def _die_with_the_ingress() -> None:
    """Worker initializer (Linux): the kernel kills the worker when the process that
    started it dies, so a check still running (a regex that never ends) cannot outlive an
    ingress that was killed without closing its pool."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class RulePool:
    """``run`` a ``RuleCall`` in a worker; at most ``workers`` checks at once, the rest
    wait their turn (the request's deadline bounds the wait)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._pool = ProcessPool(
            max_workers=self.workers,
            initializer=_die_with_the_ingress,
            context=multiprocessing.get_context("spawn"),
        )

    async def run(self, call: RuleCall) -> float:
        future = self._pool.schedule(
            run_check,
            args=(call.check, call.options, call.response, call.label),
            timeout=call.timeout_s,
        )
        try:
            return await asyncio.wrap_future(future)
        except FutureTimeout:
            raise RuleCheckFailed(
                f"{call.check} did not finish within {call.timeout_s:g} s (its worker was ended)",
                reason="timeout",
            ) from None
        except ProcessExpired as exc:
            raise RuleCheckFailed(
                f"{call.check}'s worker process died ({exc})", reason="crashed"
            ) from None
        except asyncio.CancelledError:
            future.cancel()  # pebble ends the worker running it
            raise
        except Exception as exc:  # the check raised: a failure of this item's component
            raise RuleCheckFailed(
                f"{call.check} failed: {type(exc).__name__}: {exc}", reason="error"
            ) from None

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)
