"""Stage marks: how the core names the stages of a request (an engine request's answer, a
ledger lookup, a ledger write, an item's scoring, a rule check) for whoever traces them,
without knowing who that is.

The core stays free of tracing libraries (``tests/unit/test_layers.py``): it only knows
this protocol. ``gateway.observability.tracing`` installs a ``StageTracer`` over
OpenTelemetry when tracing is on; off (the default) ``TRACER`` is None and each marked
place costs one read of it, nothing else: the call sites test ``TRACER is None`` and take
their untraced path, so no span object, context manager or extra coroutine is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

#: What a stage's attribute may hold (OpenTelemetry's scalar attribute values).
Attribute = str | bool | int | float


class Stage(Protocol):
    """One running stage (an OpenTelemetry span is one)."""

    def set_attribute(self, key: str, value: Attribute) -> None: ...


class StageTracer(Protocol):
    """Opens a stage as the current one (its children nest under it) until the block ends;
    an exception leaving the block is recorded on it."""

    def stage(
        self, name: str, attributes: Mapping[str, Attribute]
    ) -> AbstractContextManager[Stage]: ...


#: The installed tracer; None: tracing is off.
TRACER: StageTracer | None = None


def install(tracer: StageTracer | None) -> None:
    """Trace the core's stages with ``tracer`` from now on (None: stop)."""
    global TRACER
    TRACER = tracer
