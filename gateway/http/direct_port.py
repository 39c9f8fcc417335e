"""The ingress replicas' own HTTP port (``gateway.direct_port``): the same app, without
Serve's proxy in the path.

Through Serve a request crosses HAProxy, then Serve's direct-ingress server and replica
wrapper (request ids, Serve's metrics and access log, a receive task and a request task per
request) before the app sees it. Measured on 2 cores (``benchmarks/ingress_stack.py``) that
path costs more CPU than rmgate's own work. With ``direct_port`` set, every ingress replica
also serves the app on that port itself (uvicorn on the replica's event loop); the replicas
of one node share the port with ``SO_REUSEPORT``, so the kernel spreads connections over
them (per connection: a client with a pool of keep-alive connections reaches all of them).
Serve's port keeps serving the same app.

Serve cancels a handler whose client left; here ``CancelOnDisconnect`` does: it reads the
body first, hands the app a receive that replays it, and watches the connection while the
app runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("ray.serve")

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


class CancelOnDisconnect:
    """ASGI middleware: a client that disconnects cancels its request's handler (which
    counts it and closes its engine calls), as Serve does on its own port.

    The body is read before the app runs (at most ``max_body_bytes``: past that the app
    reads the rest itself and answers 413, unwatched), so that afterwards the only message
    the connection can bring is ``http.disconnect``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body was in: nothing to answer
            buffered.append(message)
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
            if size > self.max_body_bytes:
                await self.app(scope, _replay(buffered, receive), send)
                return
        await self._watched(scope, receive, send, buffered)

    async def _watched(
        self, scope: dict[str, Any], receive: Receive, send: Send, buffered: list[Message]
    ) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        answered = False
        left = False

        async def watch() -> None:
            nonlocal left
            message = await receive()  # the body is in: this ends only when the client leaves
            if message["type"] == "http.disconnect" and not answered:
                left = True
                handler.cancel()

        async def tracked_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered = True
            await send(message)

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, _replay(buffered, _never), tracked_send)
        except asyncio.CancelledError:
            if not left:
                raise  # the server is stopping, not the client leaving
            handler.uncancel()
        finally:
            watcher.cancel()


def _replay(buffered: list[Message], then: Receive) -> Receive:
    """A receive that returns ``buffered`` first, then defers to ``then``."""

    async def receive() -> Message:
        if buffered:
            return buffered.pop(0)
        return await then()

    return receive


async def _never() -> Message:
    """After the body, the app waits here; a disconnect cancels it from outside."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}  # pragma: no cover


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening socket that every ingress replica of the node binds alike."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve_direct_port(
    app: ASGIApp, host: str, port: int, max_body_bytes: int, keep_alive_s: float = 65.0
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled (the app's lifespan ends: the replica
    stops); then stop accepting and let the requests in flight finish."""
    import uvicorn

    try:
        sock = reuseport_socket(host, port)
    except OSError as exc:  # the port is another program's: say so, keep Serve's port
        logger.error("rmgate: cannot serve on %s:%d (gateway.direct_port): %s", host, port, exc)
        return
    # no proxy-headers middleware: rmgate reads no client address (one ASGI layer less per
    # request); no access log (the request metrics count every request)
    server = uvicorn.Server(
        uvicorn.Config(
            CancelOnDisconnect(app, max_body_bytes),
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_keep_alive=int(keep_alive_s),
            proxy_headers=False,
        )
    )
    # the replica's signals stay Serve's (uvicorn takes them when it runs in the main thread)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    logger.info("rmgate: the ingress also serves on %s:%d (SO_REUSEPORT)", host, port)
    try:
        await server.serve(sockets=[sock])
    except asyncio.CancelledError:
        server.should_exit = True
        await asyncio.shield(server.shutdown(sockets=[sock]))
        raise
    finally:
        sock.close()
