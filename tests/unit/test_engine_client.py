"""The ingress's HTTP/1.1 engine client against a real local HTTP server: bytes pass through
unchanged, and each failure maps once onto rmgate's own engine errors (unreachable: wait for
the slot; no answer: 504; connection lost: wait and resend); the handle client maps Ray's."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from aiohttp import web

from gateway.core.routing.engine_access import (
    EngineCallError,
    EngineConnectionLost,
    EngineNoAnswer,
    EngineUnreachable,
    SlotInfo,
)
from gateway.transport.engine_client import HandleEngineClient, Http1EngineClient


def target(url: str) -> SlotInfo:
    return SlotInfo(model="rm", slot=0, url=url, fingerprint=None, mode="serialize", max_inflight=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    peers: list[object]
    cancelled: list[str]


server = _Server()


@contextlib.asynccontextmanager
async def engine_server():
    """A real HTTP server in the test's own event loop."""
    seen: list[tuple[str, bytes]] = []
    peers: list[object] = []  # the client's port per request: a reused connection repeats it
    cancelled: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.headers["content-type"], body))
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(
            body=b'{"echo": ' + body + b"}", status=200, content_type="application/json"
        )

    async def slow(request: web.Request) -> web.Response:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:  # aiohttp's server cancels a handler whose client left
            cancelled.append(request.path)
            raise
        return web.Response(text="late")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"a":', b" 1", b"}"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def close_after(request: web.Request) -> web.Response:
        return web.Response(body=b"bye", headers={"connection": "close"})

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def hang_up(request: web.Request) -> web.StreamResponse:
        request.transport.close()  # the connection dies without an answer
        await asyncio.sleep(0.1)
        return web.Response(text="never sent")

    app = web.Application()
    app.add_routes(
        [
            web.post("/echo", echo),
            web.post("/slow", slow),
            web.post("/fail", fail),
            web.post("/hang_up", hang_up),
            web.post("/chunked", chunked),
            web.post("/close_after", close_after),
        ]
    )
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        server.peers, server.cancelled = peers, cancelled
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_bytes_pass_through_and_connections_are_reused():
    async with engine_server() as (url, seen):
        client = Http1EngineClient()
        body = '{"model":"rm","input":"é 2+3=5"}'.encode()
        for _ in range(3):
            status, content = await client.post(target(url), "/echo", body, timeout_s=10)
            assert status == 200 and content == b'{"echo": ' + body + b"}"
        assert seen == [("application/json", body)] * 3
        assert len(set(server.peers)) == 1  # one kept connection served all three
        await client.aclose()


async def test_concurrent_calls_each_get_their_own_answer():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        bodies = [str(i).encode() for i in range(50)]
        answers = await asyncio.gather(*(client.post(target(url), "/echo", b, 10) for b in bodies))
        assert answers == [(200, b'{"echo": ' + b + b"}") for b in bodies]
        await client.aclose()


async def test_a_chunked_answer_is_read_whole():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        assert await client.post(target(url), "/chunked", b"{}", 10) == (200, b'{"a": 1}')
        assert (await client.post(target(url), "/echo", b"2", 10))[0] == 200
        await client.aclose()


async def test_a_connection_the_engine_closes_is_not_reused():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        assert await client.post(target(url), "/close_after", b"{}", 10) == (200, b"bye")
        for _ in range(2):
            assert (await client.post(target(url), "/echo", b"1", 10))[0] == 200
        assert len(set(server.peers)) == 1  # a new connection after the closed one, then kept
        await client.aclose()


async def test_a_kept_connection_the_engine_drops_is_replaced_without_an_error():
    """A kept connection whose close crosses the next request on the wire (the engine's
    keep-alive ran out, it restarted): nothing of an answer came back, so the request goes
    again on a new connection; the caller sees only its answer."""
    connections: list[int] = []

    class Engine(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.n, self.seen = transport, len(connections), 0
            connections.append(0)

        def data_received(self, data):
            connections[self.n] += 1
            if self.n == 0 and connections[0] == 2:
                self.transport.close()  # the first connection dies under its second request
                return
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    srv = await asyncio.get_running_loop().create_server(Engine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    client = Http1EngineClient()
    try:
        assert await client.post(target(url), "/x", b"{}", 5) == (200, b"ok")
        assert await client.post(target(url), "/x", b"{}", 5) == (200, b"ok")
        assert connections == [2, 1]
    finally:
        await client.aclose()
        srv.close()


async def test_a_call_that_times_out_or_is_cancelled_closes_its_connection():
    """How vLLM learns to abort: the connection of an abandoned call closes."""
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        with pytest.raises(EngineNoAnswer):
            await client.post(target(url), "/slow", b"{}", timeout_s=0.2)
        task = asyncio.create_task(client.post(target(url), "/slow", b"{}", timeout_s=10))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if len(server.cancelled) == 2:
                break
            await asyncio.sleep(0.02)
        assert server.cancelled == ["/slow", "/slow"]
        assert not client._open  # nothing kept of either
        assert (await client.post(target(url), "/echo", b"1", 10))[0] == 200
        await client.aclose()


async def test_engine_status_is_returned_not_raised():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        assert await client.post(target(url), "/fail", b"{}", timeout_s=10) == (503, b"busy")
        await client.aclose()


async def test_no_answer_in_time_is_a_read_timeout():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        with pytest.raises(EngineNoAnswer):
            await client.post(target(url), "/slow", b"{}", timeout_s=0.3)
        await client.aclose()


async def test_nothing_listening_is_a_connect_error():
    client = Http1EngineClient()
    with pytest.raises(EngineUnreachable):
        await client.post(target(f"http://127.0.0.1:{_free_port()}"), "/echo", b"{}", timeout_s=5)
    await client.aclose()


async def test_a_dropped_connection_is_a_transport_error():
    async with engine_server() as (url, _):
        client = Http1EngineClient()
        with pytest.raises(EngineConnectionLost):
            await client.post(target(url), "/hang_up", b"{}", timeout_s=5)
        # and the client keeps working afterwards
        assert (await client.post(target(url), "/echo", b"1", timeout_s=5))[0] == 200
        await client.aclose()


class _Forward:
    def __init__(self, outcome):
        self.outcome = outcome

    def remote(self, path, body, timeout_s):
        async def run():
            if self.outcome == "hang":
                await asyncio.sleep(5)
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return 200, body

        return run()


class _Handle:
    def __init__(self, outcome):
        self.forward = _Forward(outcome)


@pytest.mark.parametrize(
    "outcome,error",
    [
        ("hang", EngineNoAnswer),
        (RuntimeError("ActorDiedError: the actor died"), EngineConnectionLost),
    ],
)
async def test_handle_client_maps_ray_errors_onto_rmgates(outcome, error):
    client = HandleEngineClient({"rm": [_Handle(outcome)]})
    with pytest.raises(error) as err:
        await client.post(target("http://unused"), "/classify", b"{}", timeout_s=0.2)
    assert isinstance(err.value, EngineCallError)


async def test_handle_client_passes_bytes():
    client = HandleEngineClient({"rm": [_Handle("ok")]})
    assert await client.post(target("http://unused"), "/classify", b"{1}", 5) == (200, b"{1}")


async def test_an_idle_connection_past_its_keep_alive_is_not_reused():
    async with engine_server() as (url, _):
        client = Http1EngineClient(keepalive_s=0.1)
        assert (await client.post(target(url), "/echo", b"1", 10))[0] == 200
        await asyncio.sleep(0.15)  # past the client's keep-alive: a new connection
        assert (await client.post(target(url), "/echo", b"2", 10))[0] == 200
        assert (await client.post(target(url), "/echo", b"3", 10))[0] == 200  # kept again
        assert len(set(server.peers)) == 2 and server.peers[1] == server.peers[2]
        assert len(client._open) == 1
        await client.aclose()


async def test_after_an_engine_restart_no_other_stale_connection_is_tried():
    """Two kept connections, both dead (the engine restarted): the first one found stale
    drops the other too, and the request goes on a new connection."""
    requests: list[int] = []

    class Engine(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.n = transport, len(requests)
            requests.append(0)

        def data_received(self, data):
            requests[self.n] += 1
            if self.n < 2 and requests[self.n] == 2:
                self.transport.close()  # the old engine's connections die under a request
                return
            asyncio.get_running_loop().call_later(
                0.05, self.transport.write, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            )

    srv = await asyncio.get_running_loop().create_server(Engine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    client = Http1EngineClient()
    try:
        both = await asyncio.gather(*(client.post(target(url), "/x", b"{}", 5) for _ in range(2)))
        assert both == [(200, b"ok")] * 2 and requests == [1, 1]  # two connections kept
        assert await client.post(target(url), "/x", b"{}", 5) == (200, b"ok")
        # one stale connection tried (2 requests on it), not the other, then a new one
        assert sorted(requests) == [1, 1, 2] and requests[2] == 1
    finally:
        await client.aclose()
        srv.close()
