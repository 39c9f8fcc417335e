"""A small OTLP/HTTP trace receiver for tests and benchmarks: what a collector would get
from rmgate (and from vLLM, exporting with ``http/protobuf``), kept in memory.

It serves ``POST /v1/traces`` on 127.0.0.1 (``application/x-protobuf``, gzip or deflate
bodies too), decodes each ``ExportTraceServiceRequest`` and keeps its spans as
``ReceivedSpan``s: name, trace and span ids in hex, the parent's span id, kind, the span's
attributes as a dict and its resource's ``service.name``. No collector to install, no
port to choose::

    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
        ...  # run what traces, with env
        spans = receiver.wait_for(lambda spans: any(s.name == "rmgate.engine" for s in spans))

``python -m gateway.harness.otlp_receiver [--port N]`` runs one on its own (the
benchmark does, so that decoding spans costs the measured process nothing): it prints its
endpoint, then the number of spans received every few seconds until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"
#: OTLP's span kinds (``Span.SpanKind``), by number.
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span."""

    name: str
    trace_id: str
    span_id: str
    #: "" for a root span.
    parent_span_id: str
    kind: str
    attributes: dict[str, Any]
    #: The exporting process's ``service.name`` ("" when it sent none).
    service: str = ""
    start_ns: int = 0
    end_ns: int = 0
    #: 0 unset, 1 ok, 2 error (``Status.StatusCode``).
    status_code: int = 0
    events: tuple[str, ...] = field(default=())


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one serialized ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=KINDS.get(span.kind, str(span.kind)),
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        service=service,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        events=tuple(e.name for e in span.events),
                    )
                )
    return spans


class OtlpReceiver:
    """The receiver's state: the spans received so far (thread-safe)."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._changed = threading.Condition()
        #: Export requests answered (a test can tell "nothing was sent" from "no spans").
        self.requests = 0
        self.endpoint = ""

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self.requests += 1
            self._spans.extend(spans)
            self._changed.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        with self._changed:
            return list(self._spans)

    def clear(self) -> None:
        with self._changed:
            self._spans.clear()
            self.requests = 0

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """The spans received so far, once ``predicate`` holds for them; ``TimeoutError``
        (with what did arrive) when it does not within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        with self._changed:
            while not predicate(list(self._spans)):
                left = end - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self._spans})
                    raise TimeoutError(
                        f"no such spans within {timeout:g}s; received {len(self._spans)}: {names}"
                    )
                self._changed.wait(left)
            return list(self._spans)


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the exporter reuses its connection

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.split("?")[0] != PATH:
                self._answer(404, b"", "text/plain")
                return
            kind = (self.headers.get("content-type") or "").split(";")[0].strip()
            if kind != "application/x-protobuf":
                self._answer(415, b"only application/x-protobuf", "text/plain")
                return
            encoding = (self.headers.get("content-encoding") or "").strip().lower()
            try:
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                spans = decode(body)
            except Exception as exc:  # noqa: BLE001 - a bad body is the sender's error
                self._answer(400, str(exc).encode(), "text/plain")
                return
            receiver.add(spans)
            self._answer(
                200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"
            )

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # quiet: tests and benchmarks print what they need

    return Handler


@contextlib.contextmanager
def otlp_receiver(host: str = "127.0.0.1", port: int = 0) -> Iterator[OtlpReceiver]:
    """A receiver serving on ``host:port`` (0: a free port) in a daemon thread until the
    block ends; ``.endpoint`` is the URL for ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer((host, port), _handler(receiver))
    server.daemon_threads = True
    receiver.endpoint = f"http://{host}:{server.server_address[1]}{PATH}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--every-s", type=float, default=5.0)
    args = ap.parse_args()
    with otlp_receiver(port=args.port) as receiver:
        print(receiver.endpoint, flush=True)
        try:
            while True:
                time.sleep(args.every_s)
                print(f"{len(receiver.spans())} spans", flush=True)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
