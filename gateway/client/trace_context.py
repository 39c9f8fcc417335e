"""The trainer's trace context on its rmgate requests, when the trainer traces.

A trainer instrumented with OpenTelemetry has a current span (a training step, a rollout)
when it asks for rewards; ``inject_trace_context`` adds that span's W3C ``traceparent`` (and
``tracestate``, and whatever else the trainer's configured propagators write) to a
request's headers, so the gateway's spans of that request, and vLLM's below them, join
the trainer's trace.

OpenTelemetry is optional on the trainer side (``rmgate``'s client needs httpx, pydantic
and tqdm only), so nothing here imports it unless the trainer already has: a process that
never imported ``opentelemetry`` has no trace context to pass on, and pays one dictionary
lookup per request.

The sync API (``RewardClient.score``, verl's ``compute_score``) runs its calls on the
client's own loop thread; ``asyncio.run_coroutine_threadsafe`` schedules them in a copy of
the calling thread's context, so the caller's current span is the current one there too.
"""

from __future__ import annotations

import sys

#: Imported by every use of OpenTelemetry's API (spans, contexts, propagation).
_OTEL_CONTEXT = "opentelemetry.context"


def inject_trace_context(headers: dict[str, str]) -> None:
    """Add the current trace context to ``headers`` (nothing without one)."""
    if _OTEL_CONTEXT not in sys.modules:
        return
    from opentelemetry import propagate

    propagate.inject(headers)
