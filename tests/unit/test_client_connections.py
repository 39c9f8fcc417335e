"""RewardClient reuses TCP connections: shown against a real HTTP server on 127.0.0.1.

A uvicorn server (in a background thread, on a free port) answers ``POST /v1/rewards`` and
counts the TCP connections it accepts, by a hook on the protocol's ``connection_made`` (and,
as a cross-check, the distinct client ``(host, port)`` pairs it sees). 1,000 verl-style
``compute_score`` calls from 8 threads must share at most ``concurrency`` (64) connections;
the negative control, a fresh client per call as the old code effectively had, opens one
connection per call, so the bound is a real test. Also: close()/aclose(), the context
managers, a sync call from inside a running loop, and one pool per event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

import gateway.client.verl as verl
from gateway.client import RewardClient, RewardRequestError

pytestmark = [pytest.mark.timeout(60), pytest.mark.timing]  # asserts durations: run when quiet
CALLS = 1000
VERL_CONCURRENCY = 64  # what gateway.client.verl gives its clients


class Counter:
    """Server-side bookkeeping, updated from the server's loop thread.

    ``live`` (connections not yet closed) is never reset: a connection of an earlier test may
    close after the next test's ``reset()``; ``open`` counts only those made since then.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.numbers = itertools.count()
        self.live: set[int] = set()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.mine: set[int] = set()  # TCP connections accepted since reset()
            self.peers: set[tuple[str, int]] = set()
            self.requests = 0

    @property
    def made(self) -> int:
        with self.lock:
            return len(self.mine)

    @property
    def open(self) -> int:
        with self.lock:
            return len(self.mine & self.live)


COUNTER = Counter()


class CountingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, one instance per TCP connection: count them."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        with COUNTER.lock:
            self.number = next(COUNTER.numbers)  # not id(self): ids of dead objects recur
            COUNTER.mine.add(self.number)
            COUNTER.live.add(self.number)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        with COUNTER.lock:
            COUNTER.live.discard(self.number)
        super().connection_lost(exc)


async def rewards(request: Request) -> JSONResponse:
    body = await request.json()
    assert request.client is not None
    with COUNTER.lock:
        COUNTER.requests += 1
        COUNTER.peers.add((request.client.host, request.client.port))
    items = body["items"]
    return JSONResponse(
        {
            "model": body.get("model", "rm"),
            "rewards": [float(it["response"]) for it in items],
            "details": [{"index": i, "key": "00000000", "slot": 0} for i in range(len(items))],
        }
    )


async def refusing(request: Request) -> JSONResponse:
    """A gateway in trouble: 500 on ``/fail/500``, 503 with ``Retry-After`` on ``/fail/503``
    (each after a pause, as a struggling server answers)."""
    await asyncio.sleep(0.2)
    status = int(request.path_params["status"])
    return JSONResponse(
        {"error": {"message": "trouble", "code": "x"}},
        status,
        headers={"Retry-After": "0.3"} if status == 503 else None,
    )


APP = Starlette(
    routes=[
        Route("/v1/rewards", rewards, methods=["POST"]),
        Route("/fail/{status}/v1/rewards", refusing, methods=["POST"]),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``127.0.0.1:PORT`` of a uvicorn server running in a daemon thread; stopped at the end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, not on proto 0 ones
    # like this; without it (inherited by accepted sockets) Nagle + delayed ACK cost ~40 ms
    # per request here.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no race with others
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        APP,
        http=CountingH11Protocol,
        loop="asyncio",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=60,
        timeout_graceful_shutdown=2,
        backlog=2048,
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(
        target=srv.run, kwargs={"sockets": [sock]}, name="test-uvicorn", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not srv.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture
def counter(server: str) -> Counter:
    COUNTER.reset()
    return COUNTER


@pytest.fixture
def fresh_verl_clients() -> Iterator[None]:
    """verl's client cache starts empty and its clients are closed afterwards (also on failure)."""

    def drain() -> None:
        with verl._CLIENTS_LOCK:
            clients = list(verl._CLIENTS.values())
            verl._CLIENTS.clear()
        for client in clients:
            client.close()

    drain()
    yield
    drain()


def sample(i: int) -> tuple[str, str, Any, dict[str, Any]]:
    """verl's positional arguments: data_source, solution_str, ground_truth, extra_info."""
    return ("sums", str(i), None, {"question": f"{i}+0="})


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def rmgate_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rmgate-client" and t.is_alive()]


# ---- connection reuse -----------------------------------------------------------------
def test_verl_compute_score_reuses_connections(server, counter, fresh_verl_clients):
    def call(i: int) -> dict[str, Any]:
        return verl.compute_score(*sample(i), reward_router_address=server, model="rm")

    with ThreadPoolExecutor(8) as pool:  # verl runs compute_score in an executor like this
        results = list(pool.map(call, range(CALLS)))

    assert [r["score"] for r in results] == [float(i) for i in range(CALLS)]
    assert all(r["rmgate_slot"] == 0 and isinstance(r["rmgate_slot"], int) for r in results)
    assert len(verl._CLIENTS) == 1
    assert counter.requests == CALLS
    print(
        f"\nreuse: {CALLS} compute_score calls from 8 threads opened {counter.made} TCP "
        f"connection(s) ({len(counter.peers)} distinct client ports)"
    )
    assert 1 <= counter.made <= VERL_CONCURRENCY
    assert len(counter.peers) == counter.made


def test_negative_control_fresh_client_per_call_opens_a_connection_per_call(server, counter):
    """What the old code effectively did (a new pool per call): the bound above is no given.

    Each call gets a fresh client with a fresh transport (a fresh pool); the transports share
    one SSL context only to skip the ~25 ms of CPU that building one costs per ``httpx``
    pool (which the old code paid per sample), so that this test stays fast.
    """
    ssl_context = ssl.create_default_context()

    def call(i: int) -> dict[str, Any]:
        item = verl.build_item(*sample(i)[1:])
        transport = httpx.AsyncHTTPTransport(verify=ssl_context)
        with RewardClient(
            server, model="rm", concurrency=VERL_CONCURRENCY, progress=False, transport=transport
        ) as client:
            reward, detail = client.score_detailed([item])[0]
        return verl._result(reward, detail)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(CALLS)))

    assert [r["score"] for r in results] == [float(i) for i in range(CALLS)]
    print(
        f"\nnegative control: {CALLS} calls with a fresh client each opened {counter.made} "
        f"TCP connection(s) ({len(counter.peers)} distinct client ports)"
    )
    assert counter.made > VERL_CONCURRENCY
    assert counter.made == CALLS
    # ... and each client's close() closed its connection
    assert wait_for(lambda: counter.open == 0), f"{counter.open} still open"


def test_concurrent_sync_calls_of_one_client_stay_within_concurrency(server, counter):
    """More parallel callers than pool slots: they queue for a connection, none is added."""
    with RewardClient(server, model="rm", concurrency=4, batch_size=1) as client:
        with ThreadPoolExecutor(16) as pool:
            got = list(
                pool.map(lambda i: client.score([{"prompt": "p", "response": str(i)}]), range(200))
            )
        assert got == [[float(i)] for i in range(200)]
        assert client.score([{"prompt": "p", "response": str(i)} for i in range(50)]) == [
            float(i) for i in range(50)
        ]
    assert 1 <= counter.made <= 4


# ---- close / aclose / context managers -----------------------------------------------
def test_close_is_idempotent_closes_connections_and_stops_the_thread(server, counter):
    before = set(rmgate_threads())
    client = RewardClient(server, model="rm", concurrency=8)
    assert client.score([{"prompt": "p", "response": "1"}]) == [1.0]
    runner = client._runner
    assert runner is not None and runner.thread.is_alive() and runner.thread not in before
    pool = runner.pool
    assert pool is not None and counter.open == 1

    client.close()
    assert not runner.thread.is_alive() and runner.loop.is_closed() and pool.is_closed
    assert wait_for(lambda: counter.open == 0)  # the server saw the connection go
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.score([{"prompt": "p", "response": "1"}])
    assert set(rmgate_threads()) <= before


def test_sync_context_manager(server, counter):
    with RewardClient(server, model="rm") as client:
        assert client.score_detailed([{"prompt": "p", "response": "2"}]) == [
            (2.0, {"index": 0, "key": "00000000", "slot": 0})
        ]
        runner = client._runner
    assert runner is not None and not runner.thread.is_alive()
    assert wait_for(lambda: counter.open == 0)


async def test_async_context_manager_and_aclose(server, counter):
    async with RewardClient(server, model="rm") as client:
        assert await client.ascore([{"prompt": "p", "response": "3"}]) == [3.0]
        pool = client._pools[asyncio.get_running_loop()].pool
        assert client.score([{"prompt": "p", "response": "4"}]) == [4.0]  # and the sync side
        runner = client._runner
    assert pool.is_closed and not client._pools
    assert runner is not None and not runner.thread.is_alive()
    await client.aclose()  # idempotent
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.ascore([{"prompt": "p", "response": "3"}])
    assert wait_for(lambda: counter.open == 0)


async def test_sync_call_from_inside_a_running_loop(server, counter):
    """Jupyter / verl's async workers: the sync API works and runs on the private thread."""
    client = RewardClient(server, model="rm")
    try:
        for i in range(5):
            assert client.score([{"prompt": "p", "response": str(i)}]) == [float(i)]
        assert client._runner is not None and not client._pools  # not in this loop's pool
        assert counter.made == 1
    finally:
        client.close()  # close() from inside a running loop must not deadlock either
    assert client._runner is None


async def test_close_from_inside_the_loop_schedules_that_loops_pool(server, counter):
    client = RewardClient(server, model="rm")
    assert await client.ascore([{"prompt": "p", "response": "5"}]) == [5.0]
    pool = client._pools[asyncio.get_running_loop()].pool
    client.close()  # sync close in the pool's own loop: it cannot block, so it schedules
    for _ in range(100):
        if pool.is_closed:
            break
        await asyncio.sleep(0.01)
    assert pool.is_closed


def test_one_pool_per_event_loop_closed_when_that_loop_ends(server, counter):
    with RewardClient(server, model="rm") as client:
        assert asyncio.run(client.ascore([{"prompt": "p", "response": "1"}])) == [1.0]
        (first,) = (e.pool for e in client._pools.values())
        assert first.is_closed  # asyncio.run's shutdown_asyncgens() closed it
        assert wait_for(lambda: counter.open == 0)
        assert asyncio.run(client.ascore([{"prompt": "p", "response": "2"}])) == [2.0]
        (second,) = (e.pool for e in client._pools.values())  # the dead loop's entry is gone
        assert second is not first and second.is_closed

        done: list[list[float]] = []
        pools: list[httpx.AsyncClient] = []
        loops_in_use = threading.Barrier(3)

        def in_own_loop(i: int) -> None:
            async def main() -> None:
                done.append(await client.ascore([{"prompt": "p", "response": str(i)}]))
                pools.append(await client._pool())
                loops_in_use.wait(5)  # both loops alive at once: two pools side by side
                loops_in_use.wait(5)

            asyncio.run(main())

        threads = [threading.Thread(target=in_own_loop, args=(i,)) for i in (7, 8)]
        for t in threads:
            t.start()
        loops_in_use.wait(5)
        assert len(client._pools) == 2 and len({id(p) for p in pools}) == 2
        assert not any(p.is_closed for p in pools)
        loops_in_use.wait(5)
        for t in threads:
            t.join(5)
        assert sorted(done) == [[7.0], [8.0]] and all(p.is_closed for p in pools)
    assert wait_for(lambda: counter.open == 0)


async def test_aclose_closes_pools_of_other_running_loops(server, counter):
    client = RewardClient(server, model="rm")
    assert await client.ascore([{"prompt": "p", "response": "1"}]) == [1.0]
    other_ready, release = threading.Event(), threading.Event()

    def other_loop() -> None:
        async def main() -> None:
            assert await client.ascore([{"prompt": "p", "response": "2"}]) == [2.0]
            other_ready.set()
            while not release.is_set():  # keep this loop running, not blocked
                await asyncio.sleep(0.01)

        asyncio.run(main())

    thread = threading.Thread(target=other_loop)
    thread.start()
    try:
        assert other_ready.wait(5)
        pools = [e.pool for e in client._pools.values()]
        assert len(pools) == 2 and not any(p.is_closed for p in pools)
        await client.aclose()
        assert all(p.is_closed for p in pools)
    finally:
        release.set()
        thread.join(5)
        client.close()
    assert wait_for(lambda: counter.open == 0)


# ---- verl -----------------------------------------------------------------------------
def test_verl_client_cache_is_thread_safe(fresh_verl_clients):
    start = threading.Barrier(8)

    def get(_: int) -> RewardClient:
        start.wait(5)
        return verl._client("127.0.0.1:1", "rm")

    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(get, range(8)))
    assert len({id(c) for c in clients}) == 1 and len(verl._CLIENTS) == 1


def test_injected_transport_still_works_and_is_reused():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"rewards": [1.0], "details": [{"slot": 0}]})

    with RewardClient("http://x", transport=httpx.MockTransport(handler), api_key="k") as c:
        assert c.score([{"prompt": "p", "response": "r"}]) == [1.0]
        first = c._runner.pool if c._runner else None
        assert c.score([{"prompt": "p", "response": "r"}]) == [1.0]
        assert c._runner is not None and c._runner.pool is first
    assert [r.headers["authorization"] for r in seen] == ["Bearer k", "Bearer k"]


@pytest.mark.parametrize("status", [500, 503])
def test_a_gateway_answering_5xx_costs_at_most_the_budget(server, status):
    """Over real HTTP: a 500 is not retried (one attempt); a 503 is, within the 1.5 s
    budget, never 8 attempts of the whole timeout each."""
    with RewardClient(f"http://{server}/fail/{status}", timeout_s=1.5) as client:
        start = time.monotonic()
        with pytest.raises(RewardRequestError) as err:
            client.score([{"prompt": "p", "response": "1"}])
        took = time.monotonic() - start
    assert err.value.status in (None, status) and took <= 1.5 + 0.3, took
    if status == 500:
        assert took < 1.0 and err.value.status == 500  # no retry
