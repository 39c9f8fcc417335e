"""OpenTelemetry tracing of the ingress: a span per request and per stage, exported over
OTLP/HTTP, the trainer's trace continued and handed on to vLLM.

**On only when the environment asks** (``traces_endpoint``), in this order:

* ``OTEL_SDK_DISABLED=true``: off, whatever else is set;
* ``OTEL_TRACES_EXPORTER``: ``none`` (or a list without ``otlp``) is off, a list with
  ``otlp`` is on;
* else on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
  is set; nothing set: off. (OpenTelemetry's own default exporter is ``otlp``; rmgate
  does not trace unless told to, so a gateway never posts spans to a localhost collector
  nobody runs.)
* The protocol is OTLP/HTTP with protobuf: ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``, when
  set, must be ``http/protobuf`` (else off, with an error in the log).

On, the endpoint is ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as given, else
``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else ``http://localhost:4318/v1/traces``.
The exporter reads the rest of ``OTEL_EXPORTER_OTLP_*`` itself (headers, timeout,
compression, certificates), the batch processor ``OTEL_BSP_*``, the sampler
``OTEL_TRACES_SAMPLER[_ARG]`` (default: parent-based, always on), the resource
``OTEL_RESOURCE_ATTRIBUTES``; ``service.name`` is ``OTEL_SERVICE_NAME``, default
``rmgate``. Propagation is W3C Trace Context (``traceparent``, ``tracestate``). The tracer
provider is this module's own, not OpenTelemetry's global one.

**Off** (the default) nothing of OpenTelemetry is imported, and each traced place on the
request path reads ``ENABLED`` (or ``gateway.core.api.stages.TRACER``) once and takes its
untraced path: no span, no context, no header.

What is traced (``docs/operations.md``, "Tracing"): the edge (``gateway.http.handler``),
the core's stages (``gateway.core.api.stages``: an engine request's answer, the ledger
lookup and write, an item's scoring, a rule check), the wait for a place at a slot
(``gateway.transport.slot_transport``) and the engine call, whose ``traceparent`` the
engine clients send to vLLM (``gateway.transport.http1_client``, ``engine_client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.core.api import stages
from gateway.core.routing.engine_access import SlotInfo

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger("rmgate")

#: Whether requests are traced now: the one check the request path makes when off.
ENABLED = False

DEFAULT_SERVICE_NAME = "rmgate"
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
PROTOCOL = "http/protobuf"
#: The incoming request headers a trace context is read from (W3C Trace Context).
TRACE_HEADERS = (b"traceparent", b"tracestate")
#: ``x-rmgate-*`` answer headers -> the edge span's attributes.
RESULT_ATTRIBUTES = {
    "x-rmgate-model": "rmgate.model",
    "x-rmgate-key": "rmgate.key",
    "x-rmgate-slot": "rmgate.slot",
    "x-rmgate-class": "rmgate.numerics_class",
    "x-rmgate-cache": "rmgate.cache",
    "x-rmgate-receipt": "rmgate.receipt",
    "x-rmgate-seed": "rmgate.seed",
    "x-rmgate-placement": "rmgate.placement",
    "x-rmgate-failover": "rmgate.failover",
}


def _flag(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip().lower()


def traces_endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces endpoint when ``env`` asks for tracing, else None (the
    decision of the module docstring; a setting that cannot be honoured is logged)."""
    if _flag(env, "OTEL_SDK_DISABLED") == "true":
        return None
    exporters = {e.strip() for e in _flag(env, "OTEL_TRACES_EXPORTER").split(",") if e.strip()}
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    common = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if exporters:
        if "otlp" not in exporters:
            if exporters != {"none"}:
                logger.error(
                    "rmgate: OTEL_TRACES_EXPORTER=%s: rmgate exports traces with otlp only; "
                    "tracing stays off",
                    ",".join(sorted(exporters)),
                )
            return None
    elif not traces and not common:
        return None
    protocol = _flag(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _flag(
        env, "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol and protocol != PROTOCOL:
        logger.error(
            "rmgate: OTLP protocol %s: rmgate exports traces over %s only; tracing stays off",
            protocol,
            PROTOCOL,
        )
        return None
    if traces:
        return traces
    if common:
        return common.rstrip("/") + "/v1/traces"
    return DEFAULT_ENDPOINT


def _resource_service_name(resource_attributes: str) -> str | None:
    """``service.name`` of an ``OTEL_RESOURCE_ATTRIBUTES`` value (``k=v,k=v``), if any."""
    for pair in resource_attributes.split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "service.name" and value.strip():
            return value.strip()
    return None


@dataclass
class _Tracing:
    """What ``configure`` set up."""

    provider: TracerProvider
    tracer: Tracer
    propagator: TraceContextTextMapPropagator
    endpoint: str


_state: _Tracing | None = None


class _Stages:
    """The core's ``StageTracer`` over this module's tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def stage(
        self, name: str, attributes: Mapping[str, stages.Attribute]
    ) -> contextlib.AbstractContextManager[stages.Stage]:
        return self.tracer.start_as_current_span(name, attributes=attributes)


def configure(env: Mapping[str, str] | None = None) -> bool:
    """Trace when ``env`` (default: the process's environment) asks for it; whether tracing
    is on now. Replaces an earlier configuration (its spans flushed first): tests call it
    with their own ``env``; the ingress replica calls it once, before it builds its app."""
    global _state
    env = os.environ if env is None else env
    shutdown()
    endpoint = traces_endpoint(env)
    if endpoint is None:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError as exc:
        logger.error(
            "rmgate: tracing asked for (%s) but OpenTelemetry's SDK is not installed "
            "(opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http; rmgate[server] "
            "has them): %s",
            endpoint,
            exc,
        )
        return False
    # the process's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), named rmgate
    # unless the environment names it
    name = (
        env.get("OTEL_SERVICE_NAME")
        or _resource_service_name(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        or DEFAULT_SERVICE_NAME
    )
    resource = Resource.create({}).merge(Resource({"service.name": name}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("rmgate")
    _state = _Tracing(provider, tracer, TraceContextTextMapPropagator(), endpoint)
    set_enabled(True)
    logger.info("rmgate: tracing on: OTLP/HTTP to %s as service %s", endpoint, name)
    return True


def set_enabled(on: bool) -> None:
    """Trace requests (``on``) or not, keeping the configuration (the benchmark compares
    both in one process); tracing that was never configured stays off."""
    global ENABLED
    ENABLED = on and _state is not None
    stages.install(_Stages(_state.tracer) if ENABLED and _state is not None else None)


def flush(timeout_s: float = 5.0) -> bool:
    """Export the spans ended so far now (a benchmark's round, a test); True when done."""
    return _state is None or _state.provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Stop tracing: spans ended so far are exported (the batch processor flushes), then
    the exporter closes. Idempotent."""
    global _state
    set_enabled(False)
    state, _state = _state, None
    if state is not None:
        state.provider.shutdown()


async def run_until_shutdown() -> None:
    """A lifespan job of the ingress app (``gateway.http.app.create_app``'s ``background``):
    waits for the app's shutdown, then flushes and stops tracing (off the event loop: the
    export is a blocking HTTP post)."""
    try:
        await asyncio.Event().wait()
    finally:
        if _state is not None:
            await asyncio.to_thread(shutdown)


# ---- the edge ---------------------------------------------------------------------------
class Edge:
    """The request's server span, given its answer by the handler."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        """The answer's status and what decided it (its ``x-rmgate-*`` headers); an error
        answer's ``code`` as ``rmgate.error``."""
        span = self.span
        span.set_attribute("http.response.status_code", status)
        for header, attribute in RESULT_ATTRIBUTES.items():
            value = headers.get(header)
            if value:
                span.set_attribute(attribute, value)
        if status >= 400:
            code = _error_code(body)
            if code:
                span.set_attribute("rmgate.error", code)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code) if code is not None else None


@contextlib.contextmanager
def server_span(route: str, scope: Mapping[str, Any]) -> Iterator[Edge]:
    """The request's server span (``POST <route>``), a child of the trace context its
    ``traceparent`` carries (a new trace without one); current while the block runs, so
    every stage of the request nests under it. Only called when ``ENABLED``."""
    assert _state is not None
    from opentelemetry.trace import SpanKind

    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in TRACE_HEADERS
    }
    parent = _state.propagator.extract(carrier) if carrier else None
    method = scope.get("method", "POST")
    attributes: dict[str, stages.Attribute] = {
        "http.request.method": method,
        "http.route": route,
        "url.path": scope.get("path", route),
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    with _state.tracer.start_as_current_span(
        f"{method} {route}", context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        try:
            yield Edge(span)
        except asyncio.CancelledError:
            # the client left (``gateway.http.handler.CLIENT_CLOSED``): no answer was sent
            span.set_attribute("http.response.status_code", 499)
            span.set_attribute("rmgate.client_closed", True)
            raise


# ---- the transport ----------------------------------------------------------------------
def _in_a_trace() -> bool:
    """Whether a sampled span is current (a traced request's): the transport's background
    calls (the canary's probes, discovery) make no spans of their own."""
    from opentelemetry.trace import get_current_span

    return get_current_span().is_recording()


async def queued(
    waiting: Awaitable[Any],
    model: str,
    slot: int | None,
    load: Mapping[str, int],
    taken: Callable[[Any], int] | None = None,
) -> Any:
    """The wait for a place at a slot's gate (``slot``), or in its class queue (``slot``
    None; ``taken`` reads the slot that took the request from the result), as the span
    ``rmgate.queue``; ``load`` is what was ahead then. Only called when ``ENABLED``."""
    if _state is None or not _in_a_trace():
        return await waiting
    attributes: dict[str, stages.Attribute] = {
        "rmgate.model": model,
        "rmgate.queue": "slot" if slot is not None else "class",
    }
    if slot is not None:
        attributes["rmgate.slot"] = slot
    attributes.update({f"rmgate.queue.{k}": v for k, v in load.items()})
    with _state.tracer.start_as_current_span("rmgate.queue", attributes=attributes) as span:
        result = await waiting
        if taken is not None:
            span.set_attribute("rmgate.slot", taken(result))
        return result


async def engine_call(call: Awaitable[tuple[int, bytes]], info: SlotInfo, path: str) -> Any:
    """One engine call as the client span ``rmgate.engine``, current while it runs, so
    the engine client sends its ``traceparent`` (``trace_headers``) and vLLM's own spans
    (``--otlp-traces-endpoint``) nest under it. Only called when ``ENABLED``."""
    if _state is None or not _in_a_trace():
        return await call
    from opentelemetry.trace import SpanKind, Status, StatusCode

    attributes: dict[str, stages.Attribute] = {
        "rmgate.model": info.model,
        "rmgate.slot": info.slot,
        "rmgate.engine.mode": info.mode,
        "http.request.method": "POST",
        "url.full": info.url + path,
        "url.path": path,
    }
    if info.numerics_class is not None:
        attributes["rmgate.numerics_class"] = info.numerics_class
    if info.fingerprint:
        attributes["rmgate.fingerprint"] = info.fingerprint
    with _state.tracer.start_as_current_span(
        "rmgate.engine", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        try:
            status, content = await call
        except asyncio.CancelledError:
            span.set_attribute("rmgate.engine.aborted", "cancelled")
            raise
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
        return status, content


def trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the current span, for a request to an
    engine; empty when tracing is off or no span is current."""
    carrier: dict[str, str] = {}
    if _state is not None:
        _state.propagator.inject(carrier)
    return carrier


def header_lines() -> bytes:
    """``trace_headers`` as HTTP/1.1 header lines (each ending in CRLF)."""
    return "".join(f"{k}: {v}\r\n" for k, v in trace_headers().items()).encode("latin-1")
