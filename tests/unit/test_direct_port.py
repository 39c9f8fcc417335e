"""The ingress's own port (``gateway.http.direct_port``): the body replayed to the app, a
client that leaves cancels the handler (as Serve does on its port), and the port shared by
several servers with SO_REUSEPORT, over real sockets."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway.http.direct_port import CancelOnDisconnect, serve_direct_port

SCOPE = {"type": "http", "method": "POST", "path": "/x", "headers": []}


def client(messages: list[dict], leave_after_body: asyncio.Event | None = None):
    """An ASGI receive: ``messages``, then (when set) ``http.disconnect`` once the event is."""
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        if leave_after_body is not None:
            await leave_after_body.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


async def test_the_app_reads_the_whole_body_and_answers():
    seen: list[bytes] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(m):
        sent.append(m)

    wrapped = CancelOnDisconnect(app, max_body_bytes=100)
    await wrapped(
        SCOPE,
        client(
            [
                {"type": "http.request", "body": b"ab", "more_body": True},
                {"type": "http.request", "body": b"c"},
            ]
        ),
        send,
    )
    assert seen == [b"abc"] and sent[-1]["body"] == b"ok"


async def test_a_client_that_leaves_cancels_the_handler():
    left = asyncio.Event()
    cancelled = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        left.set()  # the client goes while the handler waits (for its engine)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def send(m):
        raise AssertionError("nothing is sent to a client that left")

    wrapped = CancelOnDisconnect(app, max_body_bytes=100)
    await asyncio.wait_for(
        wrapped(SCOPE, client([{"type": "http.request", "body": b"{}"}], left), send), 5
    )
    assert cancelled.is_set()
    assert not asyncio.current_task().cancelling()  # the cancel stayed inside


async def test_a_disconnect_after_the_answer_cancels_nothing():
    done = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        done.set()  # uvicorn's receive answers http.disconnect once the response is complete
        await asyncio.sleep(0.05)  # cleanup after the answer: must not be cancelled
        cleaned_up.set()

    sent = []

    async def send(m):
        sent.append(m)

    wrapped = CancelOnDisconnect(app, max_body_bytes=100)
    await asyncio.wait_for(
        wrapped(SCOPE, client([{"type": "http.request", "body": b"{}"}], done), send), 5
    )
    assert cleaned_up.is_set(), "the handler was cancelled after its answer"
    assert sent[-1]["body"] == b"ok"


async def test_a_body_over_the_limit_is_left_to_the_app_to_refuse():
    chunks = [{"type": "http.request", "body": b"x" * 60, "more_body": True}] * 3 + [
        {"type": "http.request", "body": b"y"}
    ]
    got = []

    async def app(scope, receive, send):
        while True:
            m = await receive()
            got.append(m["body"])
            if not m.get("more_body"):
                break

    await CancelOnDisconnect(app, max_body_bytes=100)(SCOPE, client(chunks), None)
    assert b"".join(got) == b"x" * 180 + b"y"


async def test_a_client_gone_before_its_body_never_reaches_the_app():
    async def app(scope, receive, send):
        raise AssertionError("called")

    await CancelOnDisconnect(app, 100)(SCOPE, client([{"type": "http.disconnect"}]), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
async def test_two_servers_share_the_port_and_a_closed_connection_cancels():
    port = _free_port()
    served: dict[str, int] = {"a": 0, "b": 0}
    cancelled = asyncio.Event()

    def app(name: str) -> FastAPI:
        api = FastAPI()

        @api.post("/who")
        async def who(request: Request) -> Response:
            await request.body()
            served[name] += 1
            return Response(name.encode())

        @api.post("/slow")
        async def slow(request: Request) -> Response:
            await request.body()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return Response(b"late")

        return api

    servers = [
        asyncio.create_task(serve_direct_port(app(n), "127.0.0.1", port, 1 << 20))
        for n in ("a", "b")
    ]
    try:
        for _ in range(100):  # both listening
            await asyncio.sleep(0.05)
            try:
                async with httpx.AsyncClient() as c:
                    await c.post(f"http://127.0.0.1:{port}/who", content=b"{}")
                break
            except httpx.ConnectError:
                continue
        for _ in range(40):  # a new connection each: the kernel spreads them
            async with httpx.AsyncClient() as c:
                r = await c.post(f"http://127.0.0.1:{port}/who", content=b"{}")
                assert r.text in ("a", "b")
        assert served["a"] > 0 and served["b"] > 0, served
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 5)
    finally:
        for task in servers:
            task.cancel()
        await asyncio.gather(*servers, return_exceptions=True)
