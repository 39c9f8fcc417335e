"""OpenTelemetry tracing (``gateway.observability.tracing``), end to end in one process: the
real ingress app, the real slot transport and HTTP/1.1 engine client, a fake vLLM server on
a loopback port that keeps each request's headers, and an OTLP/HTTP receiver
(``gateway.harness.otlp_receiver``) that keeps every span exported.

A request sent with a trainer's ``traceparent`` yields the edge span, the stage spans
(scoring, answer, ledger lookup, queue, engine, ledger write) in the trainer's trace, and
the engine request carries the engine span's ``traceparent``. Off (the default) nothing is
sent, no trace header reaches an engine and OpenTelemetry is never imported. The trainer
side (``RewardClient``, verl, TRL) passes its current trace context on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from deployments.engine.args import plan_engine
from gateway.core.config.settings import AppConfig
from gateway.core.routing.engine_access import SlotInfo
from gateway.core.routing.slots import SlotTable
from gateway.core.service import RewardService
from gateway.harness.canned_engine import CLASSIFY
from gateway.harness.otlp_receiver import ReceivedSpan, otlp_receiver
from gateway.http.app import create_app, ingress_app
from gateway.http.direct_port import CancelOnDisconnect
from gateway.ledger.ledger import Ledger
from gateway.ledger.sqlite_store import SqliteLedger
from gateway.ledger.writer import LedgerWriter
from gateway.observability import tracing
from gateway.transport.engine_client import HandleEngineClient, HttpxEngineClient
from gateway.transport.slot_transport import SlotTransport
from tests.unit.test_numerics import CPU, identity, spec

ROOT = Path(__file__).resolve().parents[2]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

CONFIG = {
    "models": [{"name": "rm", "kind": "discriminative", "model_path": "/m/rm", "replicas": 2}],
    "programs": [
        {
            "name": "checked",
            "components": [
                {"name": "rm", "model": "rm", "weight": 0.5},
                {"name": "exact", "weight": 1.0, "rule": {"type": "exact_match"}},
            ],
        }
    ],
    "gateway": {"cache": "on"},
}
ITEM = {"prompt": "2+3=", "response": "5", "label": "5"}


class FakeEngine:
    """A vLLM server stand-in on a loopback port: answers every POST with a canned
    ``/classify`` answer over keep-alive HTTP/1.1 and keeps each request's headers."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.server: asyncio.Server | None = None
        self.url = ""
        self.connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> FakeEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                lines = head.split("\r\n")[1:]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines if line)
                }
                await reader.readexactly(int(headers["content-length"]))
                self.requests.append(headers)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(CLASSIFY), CLASSIFY)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.connections:  # its handlers end on their own, not cancelled
            writer.close()
        await asyncio.sleep(0.05)


class _Call:
    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def remote(self) -> Any:
        async def answer() -> dict[str, Any]:
            return dict(self.value)

        return answer()


class Slot:
    """A slot replica's handle: reports the fake engine's URL and numerics class ``A``."""

    def __init__(self, url: str) -> None:
        self.endpoint = _Call(
            {
                "url": url,
                "fingerprint": "fp",
                "mode": "serialize",
                "max_inflight": 1,
                "numerics": {"class_id": "A", "probe_digest": "d"},
            }
        )


class Rules:
    """The rule pool's stand-in: exact match."""

    async def run(self, call: Any) -> float:
        return 1.0 if call.response.strip() == (call.label or "").strip() else 0.0


@pytest.fixture
def receiver():
    with otlp_receiver() as r:
        yield r


@pytest.fixture
def traced(receiver):
    """Tracing on, exporting to ``receiver``; off again afterwards."""
    assert tracing.configure({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint})
    yield receiver
    tracing.shutdown()


@pytest_asyncio.fixture(loop_scope="function")  # the test's loop: the engine's server is in it
async def gateway(tmp_path):
    """(service, the fake engine): the real transport over two slots of one class, a
    ledger in memory and SQLite."""
    engine = await FakeEngine().start()
    cfg = AppConfig.model_validate(CONFIG)
    slots = SlotTable.from_config(cfg)
    transport = SlotTransport({"rm": [Slot(engine.url), Slot(engine.url)]}, cfg.gateway, slots)
    for slot in range(2):  # the classes known before the first request (the ledger needs them)
        assert await transport.describe("rm", slot, 5.0) is not None
    store = SqliteLedger(tmp_path / "ledger.sqlite3")
    ledger = Ledger(store, LedgerWriter(store, flush_interval_s=0.01), recent=1000)
    service = RewardService(cfg, transport, slots, ledger, Rules())
    yield service, engine
    await transport.aclose()
    await engine.stop()


def client_of(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = by_name(spans, name)
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def trace_id_of(traceparent: str) -> str:
    return traceparent.split("-")[1]


async def test_a_traced_request_continues_the_trainers_trace_down_to_the_engine(gateway, traced):
    service, engine = gateway
    async with client_of(ingress_app(service)) as client:
        first = await client.post(
            "/v1/rewards",
            json={"model": "rm", "items": [ITEM]},
            headers={"traceparent": TRACEPARENT, "x-rmgate-timeout": "20"},
        )
    assert first.status_code == 200, first.text
    assert first.headers["x-rmgate-cache"] == "miss"
    assert tracing.flush()
    spans = traced.wait_for(lambda s: any(x.name == "POST /v1/rewards" for x in s))

    assert {s.trace_id for s in spans} == {TRACE_ID}  # one trace: the trainer's
    assert {s.service for s in spans} == {"rmgate"}
    edge = one(spans, "POST /v1/rewards")
    assert edge.parent_span_id == PARENT_ID and edge.kind == "server"
    assert edge.attributes["http.request.method"] == "POST"
    assert edge.attributes["http.route"] == "/v1/rewards"
    assert edge.attributes["http.response.status_code"] == 200
    assert edge.attributes["rmgate.model"] == "rm"
    assert edge.attributes["rmgate.cache"] == "miss"
    assert edge.attributes["rmgate.numerics_class"] == "A"
    assert edge.attributes["rmgate.receipt"] == first.headers["x-rmgate-receipt"]
    assert edge.attributes["rmgate.slot"] == first.headers["x-rmgate-slot"]

    score = one(spans, "rmgate.score")
    assert score.parent_span_id == edge.span_id
    assert score.attributes["rmgate.item"] == 0 and score.attributes["rmgate.scorer"] == "model"
    assert score.attributes["rmgate.reward"] == first.json()["rewards"][0]

    answer = one(spans, "rmgate.answer")
    assert answer.parent_span_id == score.span_id
    slot = int(first.headers["x-rmgate-slot"])
    assert answer.attributes["rmgate.model"] == "rm"
    assert answer.attributes["rmgate.endpoint"] == "/classify"
    assert answer.attributes["rmgate.key"] == first.json()["details"][0]["key"]
    assert answer.attributes["rmgate.slot"] == slot
    assert answer.attributes["rmgate.numerics_class"] == "A"
    assert answer.attributes["rmgate.cache"] == "miss"
    assert answer.attributes["rmgate.receipt"] == first.headers["x-rmgate-receipt"]
    assert answer.attributes["http.response.status_code"] == 200

    lookup = one(spans, "rmgate.ledger.lookup")
    assert lookup.parent_span_id == answer.span_id
    assert lookup.attributes["rmgate.ledger.found"] is False
    queue = one(spans, "rmgate.queue")  # two class mates: the class queue admits
    assert queue.parent_span_id == answer.span_id
    assert queue.attributes["rmgate.queue"] == "class"
    assert queue.attributes["rmgate.queue.mates"] == 2
    assert queue.attributes["rmgate.slot"] == slot
    engine_span = one(spans, "rmgate.engine")
    assert engine_span.parent_span_id == answer.span_id and engine_span.kind == "client"
    assert engine_span.attributes["rmgate.model"] == "rm"
    assert engine_span.attributes["rmgate.slot"] == slot
    assert engine_span.attributes["rmgate.numerics_class"] == "A"
    assert engine_span.attributes["http.response.status_code"] == 200
    assert engine_span.attributes["url.full"] == engine.url + "/classify"
    write = one(spans, "rmgate.ledger.write")
    assert write.parent_span_id == answer.span_id
    assert write.attributes["rmgate.receipt"] == first.headers["x-rmgate-receipt"]
    assert write.attributes["rmgate.slot"] == slot
    # the stages in order: looked up, waited, called, recorded
    assert lookup.end_ns <= queue.start_ns <= queue.end_ns <= engine_span.start_ns
    assert engine_span.end_ns <= write.start_ns

    # vLLM heard of the engine call's span (its own spans nest under it)
    (sent,) = engine.requests
    assert sent["traceparent"] == f"00-{TRACE_ID}-{engine_span.span_id}-01"
    assert sent["content-type"] == "application/json"  # its own headers kept

    # the same request again: a hit, no engine call, the ledger says so
    traced.clear()
    async with client_of(ingress_app(service)) as client:
        again = await client.post(
            "/v1/rewards",
            json={"model": "rm", "items": [ITEM]},
            headers={"traceparent": TRACEPARENT},
        )
    assert again.headers["x-rmgate-cache"] == "hit"
    assert tracing.flush()
    spans = traced.wait_for(lambda s: any(x.name == "POST /v1/rewards" for x in s))
    assert one(spans, "POST /v1/rewards").attributes["rmgate.cache"] == "hit"
    assert one(spans, "rmgate.answer").attributes["rmgate.cache"] == "hit"
    assert one(spans, "rmgate.ledger.lookup").attributes["rmgate.ledger.found"] is True
    assert not by_name(spans, "rmgate.engine") and not by_name(spans, "rmgate.ledger.write")
    assert len(engine.requests) == 1

    # tracing off: nothing exported, no trace header to the engine
    tracing.shutdown()
    traced.clear()
    async with client_of(ingress_app(service)) as client:
        off = await client.post(
            "/v1/rewards",
            json={"model": "rm", "items": [ITEM]},
            headers={"traceparent": TRACEPARENT, "x-rmgate-cache": "off"},
        )
    assert off.status_code == 200 and len(engine.requests) == 2
    assert "traceparent" not in engine.requests[-1]
    await asyncio.sleep(0.2)
    assert traced.requests == 0 and traced.spans() == []


async def test_every_edge_opens_the_server_span(gateway, traced):
    """The hot path, FastAPI's own routing and the direct port's ASGI stack all reach the
    one handler, which opens the span; without a traceparent a request starts a trace."""
    service, _ = gateway
    apps = {
        "hot": ingress_app(service),
        "fastapi": create_app(service),
        "direct": CancelOnDisconnect(ingress_app(service), 1 << 20),
    }
    parents = {}
    for n, (name, app) in enumerate(apps.items()):
        trace_id = f"{n + 1:032x}"
        parents[trace_id] = name
        async with client_of(app) as client:
            answer = await client.post(
                "/classify",
                json={"model": "rm", "input": name},
                headers={"traceparent": f"00-{trace_id}-{PARENT_ID}-01"},
            )
        assert answer.status_code == 200, (name, answer.text)
    async with client_of(apps["hot"]) as client:  # no traceparent: a trace of its own
        assert (await client.post("/classify", json={"model": "rm", "input": "x"})).is_success
    assert tracing.flush()
    spans = traced.wait_for(lambda s: len(by_name(s, "POST /classify")) == 4)
    edges = by_name(spans, "POST /classify")
    joined = {s.trace_id: s for s in edges if s.trace_id in parents}
    assert set(joined) == set(parents)
    assert all(s.parent_span_id == PARENT_ID for s in joined.values())
    (alone,) = [s for s in edges if s.trace_id not in parents]
    assert alone.parent_span_id == ""
    for edge in edges:  # each edge's stages are in its own trace
        children = [s for s in spans if s.parent_span_id == edge.span_id]
        assert [s.name for s in children] == ["rmgate.answer"], edge.trace_id


async def test_a_program_traces_each_item_and_its_rule_check(gateway, traced):
    service, _ = gateway
    async with client_of(ingress_app(service)) as client:
        answer = await client.post(
            "/v1/rewards",
            json={"model": "checked", "items": [ITEM, {**ITEM, "response": "6"}]},
            headers={"traceparent": TRACEPARENT},
        )
    assert answer.status_code == 200, answer.text
    assert tracing.flush()
    spans = traced.wait_for(lambda s: len(by_name(s, "rmgate.rule")) == 2)
    scores = sorted(by_name(spans, "rmgate.score"), key=lambda s: s.attributes["rmgate.item"])
    assert [s.attributes["rmgate.scorer"] for s in scores] == ["program", "program"]
    assert [s.attributes["rmgate.model"] for s in scores] == ["checked", "checked"]
    rules = {s.parent_span_id: s for s in by_name(spans, "rmgate.rule")}
    assert rules[scores[0].span_id].attributes["rmgate.rule.score"] == 1.0
    assert rules[scores[1].span_id].attributes["rmgate.rule.score"] == 0.0
    assert {s.attributes["rmgate.rule"] for s in rules.values()} == {"exact_match"}
    answers = by_name(spans, "rmgate.answer")
    assert {s.parent_span_id for s in answers} == {s.span_id for s in scores}


async def test_every_engine_client_sends_the_engine_spans_context(traced):
    """The direct HTTP/1.1 client is covered above; the httpx one and the slot replica's
    handle carry the same headers, and nothing when tracing is off."""
    info = SlotInfo("rm", 0, "http://engine", "fp", "serialize", 1, secret="s")
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, content=CLASSIFY)

    class Forward:
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def remote(self, *args: Any) -> Any:
            self.calls.append(args)

            async def answer() -> tuple[int, bytes]:
                return 200, CLASSIFY

            return answer()

    class Handle:
        forward = Forward()

    clients = {
        "httpx": HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(handler))),
        "handle": HandleEngineClient({"rm": [Handle()]}),
    }
    scope = {"headers": [(b"traceparent", TRACEPARENT.encode())], "path": "/classify"}
    with tracing.server_span("/classify", scope):
        for client in clients.values():
            call = client.post(info, "/classify", b"{}", 5.0)
            assert (await tracing.engine_call(call, info, "/classify"))[0] == 200
    assert trace_id_of(seen[0]["traceparent"]) == TRACE_ID
    assert seen[0]["authorization"] == "Bearer s"
    (path, body, timeout_s, headers) = Handle.forward.calls[0]
    assert trace_id_of(headers["traceparent"]) == TRACE_ID
    assert tracing.flush()
    engine_spans = traced.wait_for(lambda s: len(by_name(s, "rmgate.engine")) == 2)
    sent = {seen[0]["traceparent"], headers["traceparent"]}
    assert sent == {f"00-{TRACE_ID}-{s.span_id}-01" for s in by_name(engine_spans, "rmgate.engine")}

    tracing.shutdown()
    for client in clients.values():
        assert (await client.post(info, "/classify", b"{}", 5.0))[0] == 200
    assert "traceparent" not in seen[-1]
    assert len(Handle.forward.calls[-1]) == 3  # the replica's call as before
    await clients["httpx"].aclose()


def test_the_environment_decides_whether_to_trace():
    endpoint = tracing.traces_endpoint
    assert endpoint({}) is None  # nothing asked: off
    assert endpoint({"OTEL_SERVICE_NAME": "x"}) is None
    assert endpoint({"OTEL_TRACES_EXPORTER": "otlp"}) == "http://localhost:4318/v1/traces"
    assert endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}) == "http://c/t"
    traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}
    assert endpoint({**traces, "OTEL_SDK_DISABLED": "true"}) is None
    assert endpoint({**traces, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert endpoint({**traces, "OTEL_TRACES_EXPORTER": "console"}) is None
    assert endpoint({**traces, "OTEL_TRACES_EXPORTER": "console,otlp"}) == "http://c/t"
    assert endpoint({**traces, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None
    assert endpoint({**traces, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert not tracing.configure({})
    assert not tracing.ENABLED


def test_the_service_is_named_by_the_environment(receiver):
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "gw-a"}
    for given, name in ((env, "gw-a"), ({**env, "OTEL_SERVICE_NAME": ""}, "rmgate")):
        assert tracing.configure(given)
        with tracing.server_span("/classify", {"headers": []}):
            pass
        tracing.shutdown()  # flushes
        (span,) = receiver.wait_for(lambda s: len(s) == 1)
        assert span.service == name
        receiver.clear()


OFF_SCRIPT = """
import asyncio, sys
import httpx
from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.harness.canned_engine import CannedTransport
from gateway.http.app import ingress_app
from gateway.observability import tracing

async def main():
    assert not tracing.configure()
    app = ingress_app(RewardService(AppConfig.model_validate({CONFIG}), CannedTransport()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        r = await c.post("/v1/rewards", json={{"model": "rm", "items": [{ITEM}]}},
                         headers={{"traceparent": "{TRACEPARENT}"}})
        assert r.status_code == 200, r.text
    print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "asked",
    [{}, {"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}],
    ids=["nothing", "sdk-disabled", "exporter-none"],
)
def test_off_sends_nothing_and_imports_no_opentelemetry(receiver, asked):
    """In a fresh process, as an ingress replica starts: the environment does not ask (or
    names an endpoint but turns tracing off), a request with a traceparent is answered,
    and no OpenTelemetry module was imported, nothing reached the receiver."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if asked:
        env.update(asked, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint)
    script = OFF_SCRIPT.format(CONFIG=CONFIG, ITEM=ITEM, TRACEPARENT=TRACEPARENT)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert receiver.requests == 0


# ---- the trainer side ---------------------------------------------------------------------
@pytest.fixture
def trainer_tracer():
    """The trainer's own tracer (its SDK provider, not the gateway's)."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    yield provider.get_tracer("trainer")
    provider.shutdown()


def recording_gateway(seen: list[httpx.Headers]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        n = len(json.loads(request.content)["items"])
        return httpx.Response(200, json={"rewards": [1.0] * n, "details": [{"slot": 0}] * n})

    return httpx.MockTransport(handler)


async def test_reward_client_and_trainer_adapters_pass_the_trace_on(trainer_tracer, monkeypatch):
    from gateway.client import RewardClient, trl, verl

    seen: list[httpx.Headers] = []
    with RewardClient(
        "http://gw", model="rm", transport=recording_gateway(seen), timeout_s=10
    ) as client:
        monkeypatch.setitem(verl._CLIENTS, ("gw:1", "rm"), client)
        reward = trl.reward_function("http://gw", "rm", client=client)
        with trainer_tracer.start_as_current_span("training-step") as step:
            trace_id = format(step.get_span_context().trace_id, "032x")
            await client.ascore([ITEM])  # this loop
            await asyncio.to_thread(client.score, [ITEM])  # the client's own loop thread
            await asyncio.to_thread(
                lambda: verl.compute_score(
                    "d", "5", "5", {"prompt": "2+3="}, reward_router_address="gw:1", model="rm"
                )
            )
            await asyncio.to_thread(reward, ["2+3="], ["5"])
            await verl.compute_score_async(
                "d", "5", "5", {"prompt": "2+3="}, reward_router_address="gw:1", model="rm"
            )
        await client.ascore([ITEM])  # no current span: nothing to pass on
    assert len(seen) == 6
    for headers in seen[:5]:
        assert trace_id_of(headers["traceparent"]) == trace_id
        assert headers["x-rmgate-timeout"]  # the client's own headers kept
    assert "traceparent" not in seen[5]


def test_the_client_works_without_opentelemetry():
    """The trainer side needs only httpx, pydantic and tqdm: with OpenTelemetry not
    importable, scoring works and nothing tried to import it."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # not installed
import httpx
from gateway.client import RewardClient

def handler(request):
    assert "traceparent" not in request.headers
    return httpx.Response(200, json={"rewards": [0.5], "details": [{}]})

with RewardClient("http://gw", transport=httpx.MockTransport(handler)) as client:
    assert client.score([{"prompt": "p", "response": "r"}]) == [0.5]
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.")))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


# ---- vLLM's own spans ---------------------------------------------------------------------
def test_vllm_traces_with_an_engine_arg_and_keeps_its_numerics_class():
    """``engine_args.otlp_traces_endpoint`` reaches vLLM's command line; it (and the OTEL_*
    of ``engine_env``) leaves the slot's numerics identity, hence its class and its ledger
    rows, as they were."""
    traced = spec(
        engine_args={
            "dtype": "float32",
            "max_model_len": 512,
            "otlp_traces_endpoint": "http://collector:4318/v1/traces",
        },
        engine_env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "vllm-rm",
        },
    )
    plan = plan_engine(traced, CPU, port=9)
    flag = plan.args.index("--otlp-traces-endpoint")
    assert plan.args[flag + 1] == "http://collector:4318/v1/traces"
    assert plan.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert identity(traced) == identity(spec())


# ---- the benchmark's switch ----------------------------------------------------------------
async def test_the_cpu_benchmark_measures_traced_rounds_beside_untraced_ones(receiver):
    """``benchmarks.ingress_cpu --tracing`` in miniature: the traced rounds export every
    span of theirs, the others none, and tracing is off again afterwards."""
    from benchmarks.ingress_cpu import measure

    assert tracing.configure({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint})
    try:
        tracing.set_enabled(False)
        result = await measure(
            requests=4, rounds=1, concurrency=2, names=("classify",), with_tracing=True
        )
    finally:
        tracing.shutdown()
    assert {"gateway_ms", "traced_ms", "tracing_overhead"} <= set(result["classify"])
    assert not tracing.ENABLED
    edges = by_name(receiver.spans(), "POST /classify")
    assert len(edges) == 200 + 4  # the traced app's warm-up and its round, nothing else
    assert {s.trace_id for s in edges} == {TRACE_ID}
