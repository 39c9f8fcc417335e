"""The class queue: a request any class mate may answer waits at all their gates at once and
goes to the first that frees a place (``gateway.transport.gate.acquire_first``), its own
slot preferred; against a stalled slot and a free mate, with the negative control (the same
scenario with ``class_queue: false`` queues behind the stalled slot)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.core.errors import QueueFull
from gateway.core.placement import Placement
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.gate import SlotGate, acquire_first
from tests.unit.test_routing import transport


async def test_the_first_gate_with_room_is_taken_in_preference_order():
    a, b = SlotGate(1, 10), SlotGate(1, 10)
    assert await acquire_first([a, b]) == 0 and (a.inflight, b.inflight) == (1, 0)
    assert await acquire_first([a, b]) == 1 and (a.inflight, b.inflight) == (1, 1)
    b.release()
    assert await acquire_first([a, b]) == 1  # the preferred one is full: the next with room


async def test_a_waiter_goes_to_whichever_gate_frees_first_and_leaves_the_other():
    a, b = SlotGate(1, 10), SlotGate(1, 10)
    await a.acquire()
    await b.acquire()
    waiter = asyncio.ensure_future(acquire_first([a, b]))
    await asyncio.sleep(0)
    assert (a.waiting, b.waiting) == (1, 1)  # it waits at both
    b.release()  # the second frees first
    assert await waiter == 1
    assert (a.waiting, b.waiting) == (0, 0) and (a.inflight, b.inflight) == (1, 1)
    a.release()  # nothing left waiting at a: its place stays free
    assert a.inflight == 0 and a.has_room


async def test_waiters_keep_their_arrival_order_across_gates():
    a, b = SlotGate(1, 10), SlotGate(1, 10)
    await a.acquire()
    await b.acquire()
    first = asyncio.ensure_future(acquire_first([a, b]))
    await asyncio.sleep(0)
    own = asyncio.ensure_future(b.acquire())  # a request pinned to b, after `first`
    await asyncio.sleep(0)
    b.release()
    await asyncio.sleep(0)
    assert first.done() and await first == 1 and not own.done()
    b.release()
    await own
    assert b.inflight == 1 and a.inflight == 1


async def test_every_waiting_room_full_is_queue_full_and_a_cancelled_waiter_leaves_no_trace():
    a, b = SlotGate(1, 1), SlotGate(1, 1)
    await a.acquire()
    await b.acquire()
    waiter = asyncio.ensure_future(acquire_first([a, b]))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await acquire_first([a, b])
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (a.waiting, b.waiting, a.inflight, b.inflight) == (0, 0, 1, 1)
    a.release()
    b.release()
    assert a.has_room and b.has_room


def _stalled_and_free(**settings):
    """Two serialized slots of class A: slot 0's engine holds every request until
    ``release`` is set, slot 1 answers at once."""
    release = asyncio.Event()

    async def engine(request: httpx.Request) -> httpx.Response:
        if request.url.host == "stalled":
            await release.wait()
        return httpx.Response(200, json={"host": request.url.host})

    t, clock = transport(hosts=("stalled", "free"), **settings)
    t.engine_client = HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(engine)))
    for h in t.directory.handles["m"]:
        h.info["numerics"] = {"class_id": "A"}
    return t, release


async def _describe(t) -> None:
    for slot in (0, 1):
        await t.describe("m", slot, 5)


# the placement bounded load gives a key of slot 0 on an idle gateway: its own slot first
HOME0 = Placement(((0, 0.0), (1, 120.0)), home=0, numerics_class="A", within_class=True)


@pytest.mark.parametrize("class_queue", [True, False])
async def test_requests_behind_a_stalled_slot_go_to_the_free_class_mate(class_queue: bool):
    t, release = _stalled_and_free(class_queue=class_queue)
    await _describe(t)
    tasks = [asyncio.ensure_future(t.post("m", HOME0, "/classify", b"{}", 30))
             for _ in range(6)]
    for _ in range(20):
        await asyncio.sleep(0)
    done = [task.result() for task in tasks if task.done()]
    if class_queue:
        # the first holds slot 0's only place; the other five are answered by slot 1
        assert len(done) == 5 and {r.slot for r in done} == {1}
        assert {r.reason for r in done} == {"load"}
    else:
        # the negative control: all six wait at slot 0's gate, behind the stalled one
        assert done == [] and t._gates[("m", 0)].waiting == 5
    release.set()
    replies = await asyncio.gather(*tasks)
    assert len(replies) == 6
    assert sum(r.slot == 0 for r in replies) == (1 if class_queue else 6)
    assert all(g.inflight == 0 and g.waiting == 0 for g in t._gates.values())


async def test_an_idle_gateway_answers_every_key_on_its_own_slot():
    t, release = _stalled_and_free()
    release.set()
    await _describe(t)
    for _ in range(3):  # one at a time: its own slot always has room
        reply = await t.post("m", HOME0, "/classify", b"{}", 30)
        assert reply.slot == 0 and reply.reason is None


async def test_a_pinned_placement_never_uses_the_class_queue():
    t, release = _stalled_and_free()
    await _describe(t)
    pinned = Placement(((0, 120.0),))
    tasks = [asyncio.ensure_future(t.post("m", pinned, "/classify", b"{}", 30))
             for _ in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not any(task.done() for task in tasks)
    release.set()
    assert {r.slot for r in await asyncio.gather(*tasks)} == {0}
