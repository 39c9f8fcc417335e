"""How long engine requests wait for a place, per numerics class (for the dashboard).

The gate and the class queue (``gateway.core.routing``) decide who waits and for how
long; they know nothing of Prometheus. The transport wraps each wait in ``timed_wait``,
which observes ``rmgate_queue_wait_seconds`` (0 when a place was free: the histogram's
count is every admission) and counts a refusal by a full waiting room in
``rmgate_queue_full_total`` instead (it did not wait), so an operator sees both how long
requests queue and how often they are turned away, per class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gateway.core.api.errors import QueueFull
from gateway.observability import metrics

#: The histogram's child per (model, class): ``labels()`` costs more than the observation
#: on this per-request path (a few models and classes: bounded).
_WAITS: dict[tuple[str, str], Any] = {}


def _wait_of(model: str, label: str) -> Any:
    child = _WAITS.get((model, label))
    if child is None:
        child = _WAITS[(model, label)] = metrics.QUEUE_WAIT_SECONDS.labels(model, label)
    return child


@contextmanager
def timed_wait(
    model: str, numerics_class: str | None, clock: Callable[[], float]
) -> Iterator[None]:
    """Time the wait inside the ``with`` block (``clock``: the transport's own, so an
    injected test clock times it too). A wait that ends another way (its deadline, the
    client going away) is observed as long as it lasted."""
    label = numerics_class or "unknown"
    start = clock()
    try:
        yield
    except QueueFull:
        metrics.QUEUE_FULL.labels(model, label).inc()
        raise
    except BaseException:
        _wait_of(model, label).observe(clock() - start)
        raise
    _wait_of(model, label).observe(clock() - start)
