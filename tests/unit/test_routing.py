"""The slot transport against fake Serve handles and a scripted engine: waits, failover,
gates, retries. The clock is injected: no test here sleeps on the wall clock."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.core.api.errors import (
    DeadlineExceeded,
    EngineFailed,
    InvalidSlotCounts,
    QueueFull,
    SlotRemoved,
    SlotUnavailable,
)
from gateway.core.config.settings import GatewaySettings
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.gate import SlotGate
from gateway.core.routing.hashing import slot_for_key, slot_ranking
from gateway.core.routing.placement import Placement, place
from gateway.core.routing.retry import Decision, RetryConfig, RetryState
from gateway.core.routing.slots import SlotTable
from gateway.observability import metrics
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.slot_transport import SlotTransport


class FakeClock:
    """Monotonic time that only moves when the transport sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class _Call:
    def __init__(self, value):
        self.value = value

    def remote(self):
        async def get():
            if isinstance(self.value, Exception):
                raise self.value
            return self.value() if callable(self.value) else self.value

        return get()


class FakeHandle:
    def __init__(self, url: str, max_inflight: int = 1, mode: str = "serialize") -> None:
        self.info = {"url": url, "fingerprint": url, "mode": mode, "max_inflight": max_inflight}
        self.endpoint = _Call(lambda: dict(self.info))


def engine(request: httpx.Request) -> httpx.Response:
    if request.url.host == "dead":
        raise httpx.ConnectError("refused")
    if request.url.host == "broken":
        return httpx.Response(500, text="boom")
    if request.url.host == "slow":
        raise httpx.ReadTimeout("no answer")
    return httpx.Response(200, json={"host": request.url.host})


def transport(hosts=("dead", "alive1", "alive2"), handler=engine, **settings):
    clock = FakeClock()
    handles = {"m": [FakeHandle(f"http://{h}") for h in hosts]}
    t = SlotTransport(
        handles,
        GatewaySettings(**settings),
        SlotTable({"m": len(hosts)}),
        engine_client=HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(handler))),
        clock=clock,
        sleep=clock.sleep,
    )
    return t, clock


def within(seconds: float) -> Deadline:
    """A request's deadline ``seconds`` from now (on the wall clock: the fake clock only
    moves the transport's own waits)."""
    return Deadline.after(seconds)


def only(slot: int, wait_s: float = 10.0) -> Placement:
    return Placement(((slot, wait_s),))


async def test_wait_mode_never_leaves_the_slot_and_waits_its_whole_budget():
    t, clock = transport()
    with pytest.raises(SlotUnavailable) as err:
        await t.post("m", only(0, 0.6), "/classify", b"{}", within(30))
    assert err.value.status == 503 and err.value.headers["Retry-After"]
    assert clock.slept == [0.5]  # one backoff fits in 0.6 s, the next would not


async def test_next_slot_mode_moves_to_the_ranking_and_counts_it():
    t, clock = transport()
    before = metrics.FAILOVERS.labels("m", "0", "2")._value.get()
    reply = await t.post(
        "m", Placement(((0, 0.3), (2, 5.0), (1, 5.0))), "/classify", b"{}", within(30)
    )
    assert reply.slot == 2 and b"alive2" in reply.body
    assert metrics.FAILOVERS.labels("m", "0", "2")._value.get() == before + 1


async def test_healthy_slot_answers_itself():
    t, _ = transport()
    reply = await t.post("m", Placement(((1, 5.0), (0, 5.0))), "/classify", b"{}", within(30))
    assert reply.slot == 1


async def test_engine_5xx_is_retried_then_502():
    t, clock = transport(hosts=("broken",))
    with pytest.raises(EngineFailed) as err:
        await t.post("m", only(0), "/x", b"{}", within(30))
    assert err.value.status == 502 and clock.slept == [0.5, 0.5]


async def test_no_answer_in_time_is_504_and_not_retried():
    t, clock = transport(hosts=("slow",))
    with pytest.raises(DeadlineExceeded) as err:
        await t.post("m", only(0), "/x", b"{}", within(2.0))
    assert err.value.status == 504 and clock.slept == []


async def test_removed_slot_is_handed_back():
    t, _ = transport()
    t.slots.update({"m": 1})
    with pytest.raises(SlotRemoved):
        await t.post("m", only(2), "/x", b"{}", within(30))


async def test_gate_serializes_and_bounds_the_queue():
    order: list[str] = []

    async def slow_engine(request: httpx.Request) -> httpx.Response:
        order.append("start")
        await asyncio.sleep(0.01)
        order.append("end")
        return httpx.Response(200, json={})

    t, _ = transport(handler=slow_engine, max_queue_per_slot=2)
    results = await asyncio.gather(
        *(t.post("m", only(1), "/x", b"{}", within(30)) for _ in range(3)), return_exceptions=True
    )
    assert all(not isinstance(r, Exception) for r in results)
    assert order == ["start", "end"] * 3  # one in flight at a time (max_inflight=1)
    over = await asyncio.gather(
        *(t.post("m", only(1), "/x", b"{}", within(30)) for _ in range(5)), return_exceptions=True
    )
    rejected = [r for r in over if isinstance(r, Exception)]
    assert rejected and all(isinstance(r, QueueFull) and r.status == 503 for r in rejected)


async def test_gate_follows_the_mode_a_restarted_slot_reports():
    """A slot that comes back batching (or serialized) gets a gate of its new size."""
    inflight, peak = 0, 0

    async def counting(request: httpx.Request) -> httpx.Response:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        return httpx.Response(200, json={})

    t, _ = transport(hosts=("a",), handler=counting)
    await asyncio.gather(*(t.post("m", only(0), "/x", b"{}", within(30)) for _ in range(4)))
    assert peak == 1
    t.directory.handles["m"][0].info.update(max_inflight=4, mode="batch_invariant")
    t.directory.forget("m", 0)  # what a failed call does when the replica restarts
    peak = 0
    await asyncio.gather(*(t.post("m", only(0), "/x", b"{}", within(30)) for _ in range(8)))
    assert peak == 4 and t._gates[("m", 0)].capacity == 4


async def test_gate_resize_wakes_waiters():
    gate = SlotGate(1, 10)
    await gate.acquire()
    waiters = [asyncio.ensure_future(gate.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    assert gate.waiting == 3
    gate.resize(3)
    await asyncio.sleep(0)
    assert gate.inflight == 3 and gate.waiting == 1
    gate.release()
    await asyncio.gather(*waiters)
    assert gate.inflight == 3


def test_retry_state_outcomes_are_explicit():
    now = [0.0]
    state = RetryState(RetryConfig(engine_5xx_retries=1, backoff_s=1.0), 2.5, lambda: now[0])
    assert state.record_reply(200) is Decision.RETURN
    assert state.record_reply(404) is Decision.RETURN
    assert state.record_reply(503) is Decision.RETRY
    assert state.record_reply(503) is Decision.ENGINE_FAILED
    assert state.record_unreachable() is Decision.RETRY
    now[0] = 2.0
    assert state.record_unreachable() is Decision.GIVE_UP


def test_placement_policy():
    key = 123456789
    assert place(key, 4, "wait", 120, 5).candidates == ((slot_for_key(key, 4), 120),)
    nxt = place(key, 4, "next_slot", 120, 5)
    assert [s for s, _ in nxt.candidates] == slot_ranking(key, 4)
    assert [w for _, w in nxt.candidates] == [5, 5, 5, 120]
    assert place(key, 1, "next_slot", 120, 5).candidates == ((0, 120),)


@pytest.mark.parametrize(
    "counts", [{"m": 0}, {"m": -1}, {"m": "2"}, {"m": True}, {"x": 2}, {"m": 1000}]
)
def test_slot_counts_are_validated_as_a_whole(counts):
    table = SlotTable({"m": 2, "n": 1})
    with pytest.raises(InvalidSlotCounts) as err:
        table.update({"n": 3, **counts})
    assert err.value.status == 400 and table.as_dict() == {"m": 2, "n": 1}
    with pytest.raises(InvalidSlotCounts):
        table.update({})


def test_slot_ranking_is_a_deterministic_permutation_starting_at_the_own_slot():
    for key in range(0, 2**32, 2**32 // 500):
        for n in (1, 2, 5):
            ranking = slot_ranking(key, n)
            assert ranking[0] == slot_for_key(key, n) and sorted(ranking) == list(range(n))
            assert ranking == slot_ranking(key, n)
    # fallbacks spread: the second choice is not always the same slot
    assert len({slot_ranking(k, 4)[1] for k in range(1000)}) == 4


async def _slot0_key_in_one_class(t: SlotTransport) -> Placement:
    """Both slots of ``t`` in class A; the class placement of a key whose slot is 0."""
    from gateway.core.routing.placement import place_in_class

    for h in t.directory.handles["m"]:
        h.info["numerics"] = {"class_id": "A"}
    for slot in (0, 1):
        await t.describe("m", slot, 5)
    view = t.slot_view("m", 2)
    assert view.classes.classes == ("A", "A")
    key = next(k for k in range(10_000) if slot_for_key(k, 2) == 0)
    return place_in_class(
        key,
        view.classes,
        view.load,
        failover="wait",
        slot_wait_s=120,
        failover_after_s=5,
        load_bound=1.25,
    )


async def test_a_dead_slots_keys_go_to_its_class_mate_at_once():
    """Within a numerics class a dead slot is left at once (no wait, no sleep), and the
    class mate's answer is not a cross-class failover."""
    t, clock = transport(hosts=("dead", "alive1"))
    placement = await _slot0_key_in_one_class(t)
    before = metrics.FAILOVERS.labels("m", "0", "1")._value.get()
    reply = await t.post("m", placement, "/classify", b"{}", within(30))
    assert reply.slot == 1 and reply.numerics_class == "A" and clock.slept == []
    assert metrics.FAILOVERS.labels("m", "0", "1")._value.get() == before
    # the dead slot keeps its class (its keys keep going to the mate), its info is forgotten
    assert t.slot_view("m", 2).classes.classes == ("A", "A")
    assert t.directory.cached("m", 0) is None


async def test_an_engine_that_keeps_answering_5xx_hands_its_keys_to_its_class_mate():
    """An engine shutting down with its node answers 500 ("cannot schedule new futures
    after shutdown") for a while: within a class the request goes to the class mate at once
    (same bits; the placement gives a class member no wait), never a 502; a placement
    outside a class (``wait``) still retries and answers 502."""
    t, clock = transport(hosts=("broken", "alive1"))
    placement = await _slot0_key_in_one_class(t)
    assert placement.within_class and placement.first == 0
    reply = await t.post("m", placement, "/classify", b"{}", within(30))
    assert reply.slot == 1 and b"alive1" in reply.body and clock.slept == []
    with pytest.raises(EngineFailed):  # the negative control: no class, no hand-over
        await t.post("m", only(0), "/classify", b"{}", within(30))
    assert clock.slept == [0.5, 0.5]


async def test_slot_view_reports_load_from_the_gates():
    t, _ = transport(hosts=("a", "b"))

    async def hold(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, json={})

    t.engine_client = HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(hold)))
    tasks = [asyncio.ensure_future(t.post("m", only(1), "/x", b"{}", within(30))) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert t.slot_view("m", 2).load == {0: 0, 1: 3}  # one in flight, two queued
    await asyncio.gather(*tasks)
    assert t.slot_view("m", 2).load == {0: 0, 1: 0}


async def test_a_class_mate_that_restarted_with_other_numerics_is_not_answered_on():
    """Placed while slot 1 was a class mate; slot 1 then comes back of another class (a
    restart with other flags). The transport must not answer there: the request is handed
    back to be placed again, and the slots' classes now say why."""
    from gateway.core.api.errors import SlotClassChanged
    from gateway.core.routing.placement import place_in_class

    t, _ = transport(hosts=("alive1", "alive2"))
    for h in t.directory.handles["m"]:
        h.info["numerics"] = {"class_id": "A"}
        h.info["engine_pid"] = 1
    for slot in (0, 1):
        await t.describe("m", slot, 5)
    key = next(k for k in range(10_000) if slot_for_key(k, 2) == 1)
    # slot 1 as the class's last candidate: the one that waits for its slot to come back
    placement = Placement(((1, 120.0),), home=1, numerics_class="A", within_class=True)
    t.directory.handles["m"][1].info.update(numerics={"class_id": "B"}, engine_pid=2)
    t.directory.forget("m", 1)  # what a failed call does when the replica restarts
    with pytest.raises(SlotClassChanged) as err:
        await t.post("m", placement, "/classify", b"{}", within(30))
    assert isinstance(err.value, SlotRemoved)  # the core places it again (service loop)
    again = t.slot_view("m", 2)
    assert again.classes.classes == ("A", "B") and again.classes.drained(1)
    replaced = place_in_class(
        key,
        again.classes,
        again.load,
        failover="wait",
        slot_wait_s=120,
        failover_after_s=5,
        load_bound=1.25,
    )
    assert replaced.candidates == ((0, 120.0),) and replaced.reason == "drained"
    assert (await t.post("m", replaced, "/classify", b"{}", within(30))).slot == 0
    # the negative control: a pinned placement (no class) still answers on slot 1
    assert (await t.post("m", only(1), "/classify", b"{}", within(30))).slot == 1


async def test_a_canary_verdict_holds_for_its_engine_and_not_after_a_restart():
    t, _ = transport(hosts=("alive1", "alive2"))
    for h in t.directory.handles["m"]:
        h.info.update(numerics={"class_id": "A"}, engine_pid=1)
    for slot in (0, 1):
        await t.describe("m", slot, 5)
    t.directory.set_class("m", 1, "drift-abc")
    t.directory.forget("m", 1)  # a hiccup: asked again, same engine
    await t.describe("m", 1, 5)
    assert t.directory.known_class("m", 1) == "drift-abc"
    t.directory.handles["m"][1].info.update(engine_pid=2)  # restarted: judged afresh
    t.directory.forget("m", 1)
    await t.describe("m", 1, 5)
    assert t.directory.known_class("m", 1) == "A"
