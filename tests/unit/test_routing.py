"""ServeTransport against fake Serve handles and a scripted engine: waits, failover, gates."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway.observability import metrics
from gateway.core.config import GatewaySettings
from gateway.transport.engine_client import HttpxEngineClient
from gateway.core.hashing import slot_for_key, slot_ranking
from gateway.transport.slot_transport import ServeTransport, SlotUnavailable


class _Call:
    def __init__(self, value):
        self.value = value

    def remote(self):
        async def get():
            return self.value
        return get()


class FakeHandle:
    def __init__(self, url: str) -> None:
        self.endpoint = _Call({"url": url, "fingerprint": url, "mode": "serialize",
                               "max_inflight": 1})


def engine(request: httpx.Request) -> httpx.Response:
    if request.url.host == "dead":
        raise httpx.ConnectError("refused")
    return httpx.Response(200, json={"host": request.url.host})


def transport(**settings) -> ServeTransport:
    t = ServeTransport({"m": [FakeHandle("http://dead"), FakeHandle("http://alive1"),
                              FakeHandle("http://alive2")]}, GatewaySettings(**settings))
    t.engine_client = HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(engine)))
    return t


async def test_wait_mode_never_leaves_the_slot():
    t = transport(slot_wait_s=0.6)
    start = time.monotonic()
    with pytest.raises(SlotUnavailable) as err:
        await t.post("m", 0, "/classify", b"{}", fallbacks=[1, 2])
    assert err.value.status == 503 and err.value.headers["Retry-After"]
    assert time.monotonic() - start >= 0.5


async def test_next_slot_mode_moves_to_the_ranking_and_counts_it():
    t = transport(slot_wait_s=5, failover="next_slot", failover_after_s=0.3)
    before = metrics.FAILOVERS.labels("m", "0", "2")._value.get()
    reply = await t.post("m", 0, "/classify", b"{}", fallbacks=[2, 1])
    assert reply.slot == 2 and b"alive2" in reply.body
    assert metrics.FAILOVERS.labels("m", "0", "2")._value.get() == before + 1


async def test_healthy_slot_answers_itself():
    reply = await transport(failover="next_slot").post("m", 1, "/classify", b"{}", fallbacks=[0])
    assert reply.slot == 1


async def test_gate_serializes_and_bounds_the_queue():
    t = transport(max_queue_per_slot=2)
    order: list[str] = []

    async def slow_engine(request: httpx.Request) -> httpx.Response:
        order.append("start")
        await asyncio.sleep(0.05)
        order.append("end")
        return httpx.Response(200, json={})

    t.engine_client = HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(slow_engine)))
    results = await asyncio.gather(*(t.post("m", 1, "/x", b"{}") for _ in range(3)),
                                   return_exceptions=True)
    assert all(not isinstance(r, Exception) for r in results)
    assert order == ["start", "end"] * 3  # one in flight at a time (max_inflight=1)
    over = await asyncio.gather(*(t.post("m", 1, "/x", b"{}") for _ in range(5)),
                                return_exceptions=True)
    rejected = [r for r in over if isinstance(r, Exception)]
    assert rejected and all(getattr(r, "status", None) == 503 for r in rejected)


def test_slot_ranking_is_a_deterministic_permutation_starting_at_the_own_slot():
    for key in range(0, 2**32, 2**32 // 500):
        for n in (1, 2, 5):
            ranking = slot_ranking(key, n)
            assert ranking[0] == slot_for_key(key, n) and sorted(ranking) == list(range(n))
            assert ranking == slot_ranking(key, n)
    # fallbacks spread: the second choice is not always the same slot
    assert len({slot_ranking(k, 4)[1] for k in range(1000)}) == 4
