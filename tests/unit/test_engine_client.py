"""The ingress's aiohttp engine client against a real local HTTP server: bytes pass through
unchanged, and each failure maps once onto rmgate's own engine errors (unreachable: wait for
the slot; no answer: 504; connection lost: wait and resend); the handle client maps Ray's."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from aiohttp import web

from gateway.core.transport import (EngineCallError, EngineConnectionLost, EngineNoAnswer,
                                    EngineUnreachable, SlotInfo)
from gateway.transport.engine_client import AiohttpEngineClient, HandleEngineClient


def target(url: str) -> SlotInfo:
    return SlotInfo(model="rm", slot=0, url=url, fingerprint=None, mode="serialize",
                    max_inflight=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def engine_server():
    """A real HTTP server in the test's own event loop."""
    seen: list[tuple[str, bytes]] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.headers["content-type"], body))
        return web.Response(body=b'{"echo": ' + body + b"}", status=200,
                            content_type="application/json")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def hang_up(request: web.Request) -> web.StreamResponse:
        request.transport.close()  # the connection dies without an answer
        await asyncio.sleep(0.1)
        return web.Response(text="never sent")

    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.post("/slow", slow), web.post("/fail", fail),
                    web.post("/hang_up", hang_up)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_bytes_pass_through_and_connections_are_reused():
    async with engine_server() as (url, seen):
        client = AiohttpEngineClient()
        body = '{"model":"rm","input":"é 2+3=5"}'.encode()
        for _ in range(3):
            status, content = await client.post(target(url), "/echo", body, timeout_s=10)
            assert status == 200 and content == b'{"echo": ' + body + b"}"
        assert seen == [("application/json", body)] * 3
        await client.aclose()


async def test_engine_status_is_returned_not_raised():
    async with engine_server() as (url, _):
        client = AiohttpEngineClient()
        assert await client.post(target(url), "/fail", b"{}", timeout_s=10) == (503, b"busy")
        await client.aclose()


async def test_no_answer_in_time_is_a_read_timeout():
    async with engine_server() as (url, _):
        client = AiohttpEngineClient()
        with pytest.raises(EngineNoAnswer):
            await client.post(target(url), "/slow", b"{}", timeout_s=0.3)
        await client.aclose()


async def test_nothing_listening_is_a_connect_error():
    client = AiohttpEngineClient()
    with pytest.raises(EngineUnreachable):
        await client.post(target(f"http://127.0.0.1:{_free_port()}"), "/echo", b"{}", timeout_s=5)
    await client.aclose()


async def test_a_dropped_connection_is_a_transport_error():
    async with engine_server() as (url, _):
        client = AiohttpEngineClient()
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


@pytest.mark.parametrize("outcome,error", [
    ("hang", EngineNoAnswer), (RuntimeError("ActorDiedError: the actor died"), EngineConnectionLost),
])
async def test_handle_client_maps_ray_errors_onto_rmgates(outcome, error):
    client = HandleEngineClient({"rm": [_Handle(outcome)]})
    with pytest.raises(error) as err:
        await client.post(target("http://unused"), "/classify", b"{}", timeout_s=0.2)
    assert isinstance(err.value, EngineCallError)


async def test_handle_client_passes_bytes():
    client = HandleEngineClient({"rm": [_Handle("ok")]})
    assert await client.post(target("http://unused"), "/classify", b"{1}", 5) == (200, b"{1}")
