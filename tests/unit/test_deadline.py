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

from gateway.core.concurrency import all_or_cancel
from gateway.core.config import AppConfig
from gateway.core.deadline import GUARD_MARGIN_S, Deadline
from gateway.core.errors import DeadlineExceeded, EngineRejected
from gateway.core.placement import Placement
from gateway.core.service import RewardGateway
from gateway.core.slots import SlotTable
from gateway.http.disconnect import ClientDisconnected, unless_disconnected
from gateway.observability import metrics
from tests.unit.test_routing import FakeClock, FakeHandle, transport

CONFIG = {"models": [{"name": "rm", "kind": "discriminative", "model_path": "/m/disrm",
                      "replicas": 1}],
          "gateway": {"placement": "pinned"}}


def gateway_over(handler, *, mode: str = "serialize", max_inflight: int = 1):
    """A ``RewardGateway`` whose one slot's engine is ``handler``."""
    cfg = AppConfig.model_validate(CONFIG)
    t, _ = transport(hosts=("engine",), handler=handler)
    t.directory.handles["m"] = []  # unused: the gateway's model is "rm"
    t.directory.handles["rm"] = [FakeHandle("http://engine", max_inflight, mode)]
    t.slots = t.directory.slots = SlotTable({"rm": 1})
    return RewardGateway(cfg, t, t.slots), t


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
        *(gw.pool("/classify", json.dumps({"input": f"x{i}"}).encode(), gw.deadline(0.3))
          for i in range(4)), return_exceptions=True)
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
        await gw.pool("/classify", json.dumps({"input": ["a", "b", "bad", "c"]}).encode(),
                      gw.deadline(30))
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


class _Request:
    """What ``unless_disconnected`` reads of a request: ``receive``."""

    def __init__(self, leaves_after_s: float | None) -> None:
        self.leaves_after_s = leaves_after_s

    async def receive(self) -> dict:
        if self.leaves_after_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.leaves_after_s)
        return {"type": "http.disconnect"}


async def test_a_client_that_leaves_cancels_the_work():
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    start = time.monotonic()
    with pytest.raises(ClientDisconnected):
        await unless_disconnected(_Request(0.05), work())  # type: ignore[arg-type]
    assert cancelled.is_set() and time.monotonic() - start < 1


async def test_a_client_that_stays_gets_the_result():
    assert await unless_disconnected(_Request(None), asyncio.sleep(0.01, "ok")) == "ok"  # type: ignore[arg-type]


def test_the_deadline_counts_down_on_its_clock():
    clock = FakeClock()
    deadline = Deadline.after(2.0, clock)
    assert deadline.remaining() == 2.0 and not deadline.expired
    clock.now += 2.5
    assert deadline.remaining() == 0.0 and deadline.expired
    with pytest.raises(DeadlineExceeded, match="deadline of 2s passed while testing"):
        deadline.left_or_raise("testing")
