"""The class queue: a request any class mate may answer waits at all their gates at once and
goes to the first that frees a place (``gateway.core.routing.gate.acquire_first``), its own
slot preferred; against a stalled slot and a free mate, with the negative control (the same
scenario with ``class_queue: false`` queues behind the stalled slot)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.core.api.errors import QueueFull
from gateway.core.routing.gate import SlotGate, acquire_first
from gateway.core.routing.placement import Placement
from gateway.transport.engine_client import HttpxEngineClient
from tests.unit.test_routing import transport, within


async def two_full_gates(max_waiting: int = 10) -> tuple[SlotGate, SlotGate]:
    """Two class mates' gates of one place each, both taken."""
    a, b = SlotGate(1, max_waiting), SlotGate(1, max_waiting)
    await a.acquire()
    await b.acquire()
    return a, b


async def test_the_first_gate_with_room_is_taken_in_preference_order():
    a, b = SlotGate(1, 10), SlotGate(1, 10)
    assert await acquire_first([a, b]) == 0 and (a.inflight, b.inflight) == (1, 0)
    assert await acquire_first([a, b]) == 1 and (a.inflight, b.inflight) == (1, 1)
    b.release()
    assert await acquire_first([a, b]) == 1  # the preferred one is full: the next with room


async def test_a_waiter_goes_to_whichever_gate_frees_first_and_leaves_the_other():
    a, b = await two_full_gates()
    waiter = asyncio.ensure_future(acquire_first([a, b]))
    await asyncio.sleep(0)
    assert len(a._waiters) == len(b._waiters) == 1  # it waits at both ...
    assert a.waiting + b.waiting == 1  # ... and is counted once
    b.release()  # the second frees first
    assert await waiter == 1
    assert (a.waiting, b.waiting) == (0, 0) and (a.inflight, b.inflight) == (1, 1)
    a.release()  # nothing left waiting at a: its place stays free
    assert a.inflight == 0 and a.has_room


async def test_waiters_keep_their_arrival_order_across_gates():
    a, b = await two_full_gates()
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
    a, b = await two_full_gates(1)
    waiters = [asyncio.ensure_future(acquire_first([a, b])) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):  # one waiting place each: both taken
        await asyncio.wait_for(acquire_first([a, b]), 1)
    for waiter in waiters:
        waiter.cancel()
    for waiter in waiters:
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert (a.waiting, b.waiting, a.inflight, b.inflight) == (0, 0, 1, 1)
    assert not a._waiters and not b._waiters
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
        if request.url.host == "free" and getattr(release, "free_is_dead", False):
            raise httpx.ConnectError("refused")
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
    t, release = _stalled_and_free(experimental={"class_queue": class_queue})
    await _describe(t)
    tasks = [
        asyncio.ensure_future(t.post("m", HOME0, "/classify", b"{}", within(30))) for _ in range(6)
    ]
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
        reply = await t.post("m", HOME0, "/classify", b"{}", within(30))
        assert reply.slot == 0 and reply.reason is None


async def test_a_placement_across_slots_not_within_a_class_never_uses_the_class_queue():
    """``failover: next_slot`` lists both slots but is not a class placement: the request
    waits at its first slot (the free one is only for after ``failover_after_s``)."""
    t, release = _stalled_and_free()
    await _describe(t)
    pinned = Placement(((0, 120.0), (1, 120.0)))
    tasks = [
        asyncio.ensure_future(t.post("m", pinned, "/classify", b"{}", within(30))) for _ in range(3)
    ]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not any(task.done() for task in tasks)
    release.set()
    assert {r.slot for r in await asyncio.gather(*tasks)} == {0}


async def test_admitted_and_cancelled_in_the_same_instant_passes_the_place_on():
    a, b = await two_full_gates()
    waiter = asyncio.ensure_future(acquire_first([a, b]))
    await asyncio.sleep(0)
    a.release()  # admits the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (a.inflight, b.inflight, a.waiting, b.waiting) == (0, 1, 0, 0)


async def test_a_class_holds_the_sum_of_its_waiting_rooms_each_waiter_counted_once():
    a, b = await two_full_gates(2)
    waiters = [asyncio.ensure_future(acquire_first([a, b])) for _ in range(4)]
    await asyncio.sleep(0)
    assert all(not w.done() for w in waiters)  # 4 fit: 2 + 2
    assert (a.waiting, b.waiting) == (2, 2)
    with pytest.raises(QueueFull):
        await acquire_first([a, b])
    for _ in range(4):
        (a if a.inflight else b).release()
        await asyncio.sleep(0)
    await asyncio.gather(*waiters)
    assert a.waiting == b.waiting == 0 and a.inflight + b.inflight == 2


@pytest.mark.parametrize("change", ["other class", "removed", "unreachable"])
async def test_a_place_the_class_queue_took_is_given_back_when_the_slot_cannot_answer(change):
    """Admitted by slot 1's gate, slot 1 then turns out to be of another class, scaled away
    or dead: its place is released (no leak) and the request ends as that case says."""
    from gateway.core.api.errors import SlotClassChanged, SlotRemoved, SlotUnavailable

    t, release = _stalled_and_free()
    await _describe(t)
    first = asyncio.ensure_future(t.post("m", HOME0, "/classify", b"{}", within(30)))
    await asyncio.sleep(0.01)  # holds slot 0's only place
    gate1 = t._gates[("m", 1)]
    await gate1.acquire()  # slot 1 full too: the next request waits at both
    waiting = asyncio.ensure_future(t.post("m", HOME0, "/classify", b"{}", within(30)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert gate1.waiting + t._gates[("m", 0)].waiting == 1
    if change == "other class":
        t.directory.set_class("m", 1, "B")
    elif change == "removed":
        t.slots.update({"m": 1})
    else:
        release.free_is_dead = True  # slot 1's engine refuses connections from now on
    gate1.release()  # admits the waiter at slot 1
    if change == "unreachable":
        release.set()  # it moves on to slot 0 (the last candidate), which now answers
        reply = await waiting
        assert reply.slot == 0
    else:
        with pytest.raises((SlotClassChanged, SlotRemoved, SlotUnavailable)):
            await waiting
        release.set()
    await first
    assert gate1.inflight == 0 and gate1.waiting == 0
    assert t._gates[("m", 0)].inflight == 0


async def test_a_gate_the_rule_refuses_keeps_its_place_free_and_its_own_waiters_get_it():
    """``accepts`` says gate 1 (a slow mate) may not take the waiter: it waits for gate 0
    (its placement's choice) though gate 1 has room; a request pinned to gate 1 still gets
    that free place at once; and when the rule turns, a place freed there is taken."""
    fast, slow = SlotGate(1, 10), SlotGate(2, 10)
    await fast.acquire()
    allow = {"slow": False}
    waiter = asyncio.ensure_future(acquire_first([fast, slow], lambda i: allow["slow"]))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done() and slow.inflight == 0 and len(slow._waiters) == 1
    await asyncio.wait_for(slow.acquire(), 1)  # its own request is not kept waiting
    assert slow.inflight == 1
    allow["slow"] = True
    slow.release()  # the rule says yes now: the freed place takes the class waiter
    await asyncio.sleep(0)
    assert waiter.done() and await waiter == 1 and slow.inflight == 1 and fast.inflight == 1


async def test_refused_by_the_slow_gate_the_waiter_goes_to_the_fast_one_when_it_frees():
    fast, slow = SlotGate(1, 10), SlotGate(4, 10)
    await fast.acquire()
    waiter = asyncio.ensure_future(acquire_first([fast, slow], lambda i: False))
    await asyncio.sleep(0)
    slow_own = await asyncio.wait_for(acquire_first([slow, fast], lambda i: False), 1)
    assert slow_own == 0  # the placement's own choice is never refused
    assert not waiter.done()
    fast.release()
    assert await waiter == 0 and fast.inflight == 1 and slow.inflight == 1
    assert not fast._waiters and not slow._waiters


async def test_a_plain_waiter_behind_refused_class_waiters_is_not_stranded():
    """More refused class waiters than one wake looks at (``SCAN_LIMIT``) sit in front of a
    request pinned to the slow gate while it has a free place: it is let in at once, and
    the class waiters leave for the fast gate as it frees places."""
    from gateway.core.routing.gate import SCAN_LIMIT

    fast, slow = SlotGate(1, 100), SlotGate(1, 100)
    await fast.acquire()
    waiters = [
        asyncio.ensure_future(acquire_first([fast, slow], lambda i: False))
        for _ in range(SCAN_LIMIT + 4)
    ]
    await asyncio.sleep(0)
    pinned = asyncio.ensure_future(slow.acquire())
    for _ in range(3):
        await asyncio.sleep(0)
    if not pinned.done():  # past the scan: each class waiter that leaves rescans the gate
        for _ in range(len(waiters)):
            fast.release()
            await asyncio.sleep(0)
    await asyncio.wait_for(pinned, 1)
    assert slow.inflight == 1
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


@pytest.mark.parametrize("load_weight", ["answer_time", "count"])
async def test_weighed_by_answer_times_the_queue_leaves_the_slow_mates_place_to_the_fast_one(
    load_weight: str,
):
    """Slot 0 answers 100x slower than slot 1 (as measured) and holds one request; slot
    1's two places are taken and a request placed on slot 1 arrives: weighed by answer
    times it waits for slot 1 (a few answer times there beat 200 here); counted by
    requests (the negative control, the class queue as it was) it takes slot 0's free
    second place at once."""
    from gateway.transport.answer_times import AnswerTimes

    t, release = _stalled_and_free(experimental={"load_weight": load_weight})
    release.set()
    for h in t.directory.handles["m"]:
        h.info["max_inflight"] = 2
    await _describe(t)
    for slot, seconds in ((0, 1.0), (1, 0.01)):
        t._answer_times[("m", slot)] = times = AnswerTimes(t.clock)
        times.mean_s = seconds
    gate0, gate1 = (t.gate(t.directory.cached("m", s)) for s in (0, 1))
    await gate0.acquire()
    await gate1.acquire()
    await gate1.acquire()
    home1 = Placement(((1, 0.0), (0, 120.0)), home=1, numerics_class="A", within_class=True)
    task = asyncio.ensure_future(t.post("m", home1, "/classify", b"{}", within(30)))
    for _ in range(20):
        await asyncio.sleep(0)
    if load_weight == "count":
        assert task.done() and task.result().slot == 0 and task.result().reason == "load"
        return
    assert not task.done() and gate0.inflight == 1 and gate1.waiting + gate0.waiting == 1
    # counted where it will be answered, not in the slow slot's room
    assert t.slot_view("m", 2).load == {0: 1, 1: 3}
    gate1.release()
    reply = await asyncio.wait_for(task, 5)
    assert reply.slot == 1 and reply.reason is None
    assert (gate0.inflight, gate1.inflight, gate0.waiting, gate1.waiting) == (1, 1, 0, 0)


async def test_a_waiter_is_counted_in_its_first_gates_room_while_that_has_space():
    a, b = await two_full_gates(3)
    waiters = [asyncio.ensure_future(acquire_first([b, a])) for _ in range(4)]
    await asyncio.sleep(0)
    # b's room (the placement's choice) while it has space, then the emptiest (before:
    # always the emptiest, which spread them 2 / 2 and showed a refusing mate as busy)
    assert (a.waiting, b.waiting) == (1, 3)
    assert [w.done() for w in waiters] == [False] * 4
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert (a.waiting, b.waiting) == (0, 0)
