"""One deadline per request: admission, the engine call, backoff and every candidate end by
it; one failed item cancels its siblings; a client that leaves cancels its work. Against
fake Serve handles and scripted engines (the real engines: tests/integration/
test_deadlines.py)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from gateway.core.api.errors import DeadlineExceeded, EngineRejected
from gateway.core.config.settings import AppConfig
from gateway.core.routing.concurrency import all_or_cancel
from gateway.core.routing.deadline import GUARD_MARGIN_S, Deadline
from gateway.core.routing.placement import Placement
from gateway.core.routing.slots import SlotTable
from gateway.core.service import RewardService
from gateway.observability import metrics
from tests.unit.test_routing import FakeClock, FakeHandle, transport

CONFIG = {
    "models": [{"name": "rm", "kind": "discriminative", "model_path": "/m/disrm", "replicas": 1}],
    "gateway": {"placement": "pinned"},
}

pytestmark = pytest.mark.timing  # asserts durations / CPU shares: run when the machine is quiet


def gateway_over(handler, *, mode: str = "serialize", max_inflight: int = 1):
    """A ``RewardService`` whose one slot's engine is ``handler``."""
    cfg = AppConfig.model_validate(CONFIG)
    t, _ = transport(hosts=("engine",), handler=handler)
    t.directory.handles["m"] = []  # unused: the gateway's model is "rm"
    t.directory.handles["rm"] = [FakeHandle("http://engine", max_inflight, mode)]
    t.slots = t.directory.slots = SlotTable({"rm": 1})
    return RewardService(cfg, t, t.slots), t


def aborted(reason: str) -> float:
    return metrics.ENGINE_ABORTED.labels("rm", "0", reason)._value.get()


async def test_requests_behind_a_stalled_engine_all_end_at_their_deadline():
    """The engine never answers; four requests for its one place, 0.3 s each. Before, the
    ones at the gate waited for the one ahead to time out, then timed out themselves (up
    to 4 x 0.3 s); now every one ends at its own deadline, and the slot is empty after."""

    async def stalled(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    gw, t = gateway_over(stalled)
    before = aborted("cancelled")
    start = time.monotonic()
    results = await asyncio.gather(
        *(gw.classify(json.dumps({"input": f"x{i}"}).encode(), gw.deadline(0.3)) for i in range(4)),
        return_exceptions=True,
    )
    took = time.monotonic() - start
    assert all(isinstance(r, DeadlineExceeded) and r.status == 504 for r in results), results
    assert {r.code for r in results} == {"deadline_exceeded"}
    assert sum("gate" in r.message for r in results) == 3  # three never reached the engine
    assert took < 0.3 + GUARD_MARGIN_S + 0.2, took
    gate = t._gates[("rm", 0)]
    assert (gate.inflight, gate.queued) == (0, 0)
    assert aborted("cancelled") == before + 1  # the stalled engine call was abandoned


async def test_waiting_for_an_unreachable_slot_and_its_next_candidate_share_one_deadline():
    """Two candidates with 10 s of wait each, a deadline of 1.2 s: the request ends when
    the deadline does (the fake clock's backoffs add up to it), not after 20 s."""
    t, clock = transport(hosts=("dead", "dead"))
    deadline = Deadline.after(1.2, clock)
    with pytest.raises(DeadlineExceeded):
        await t.post("m", Placement(((0, 10.0), (1, 10.0))), "/x", b"{}", deadline)
    assert sum(clock.slept) == pytest.approx(1.2)


async def test_one_failed_item_cancels_its_siblings_and_their_engine_requests():
    """A list of four where one item is refused at once and three would run for ever:
    the request fails with that item's error, the three are cancelled (their engine
    connections closed, which makes vLLM abort them) and counted."""
    cancelled: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["input"]
        if text == "bad":
            return httpx.Response(400, json={"error": {"message": "too long"}})
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(text)
            raise
        raise AssertionError("unreachable")

    gw, _ = gateway_over(engine, mode="batch_invariant", max_inflight=8)
    before = aborted("cancelled")
    start = time.monotonic()
    with pytest.raises(EngineRejected) as err:
        await gw.classify(json.dumps({"input": ["a", "b", "bad", "c"]}).encode(), gw.deadline(30))
    assert time.monotonic() - start < 2 and "too long" in err.value.message
    assert sorted(cancelled) == ["a", "b", "c"]
    assert aborted("cancelled") == before + 3


async def test_all_or_cancel_raises_the_first_failure_itself():
    async def fail() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("first")

    async def forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(ValueError, match="first"):
        await all_or_cancel([forever(), fail(), forever()])
    assert await all_or_cancel([asyncio.sleep(0, result=i) for i in range(3)]) == [0, 1, 2]


async def test_a_cancelled_handler_is_counted_and_its_engine_call_aborted():
    """A client that leaves makes Serve cancel the handler (both of its HTTP paths do):
    the gateway counts it (``rmgate_client_disconnects_total``, status 499) and the
    cancellation reaches the engine call, whose connection closes."""
    from gateway.http.app import create_app

    entered = asyncio.Event()

    async def stalled(request: httpx.Request) -> httpx.Response:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    gw, _ = gateway_over(stalled)
    app = create_app(gw)
    body = json.dumps({"model": "rm", "input": "x"}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        raise AssertionError(f"nothing is sent to a client that left: {message}")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/classify",
        "raw_path": b"/classify",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        "root_path": "",
    }
    gone = metrics.CLIENT_DISCONNECTS.labels("/classify")._value.get()
    closed = metrics.REQUESTS.labels("", "/classify", "499")._value.get()
    before = aborted("cancelled")
    handler = asyncio.ensure_future(app(scope, receive, send))
    await asyncio.wait_for(entered.wait(), 5)
    handler.cancel()  # what Serve does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert metrics.CLIENT_DISCONNECTS.labels("/classify")._value.get() == gone + 1
    assert metrics.REQUESTS.labels("", "/classify", "499")._value.get() == closed + 1
    assert aborted("cancelled") == before + 1


def test_the_deadline_counts_down_on_its_clock():
    clock = FakeClock()
    deadline = Deadline.after(2.0, clock)
    assert deadline.remaining() == 2.0 and not deadline.expired
    clock.now += 2.5
    assert deadline.remaining() == 0.0 and deadline.expired
    with pytest.raises(DeadlineExceeded, match="deadline of 2s passed while testing"):
        deadline.left_or_raise("testing")
