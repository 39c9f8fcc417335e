"""The ingress's HTTP/1.1 client to its engines: keep-alive connections, one POST at a time
on each, parsed by ``httptools`` (the parser uvicorn serves with).

Why not aiohttp here: an engine call is always the same shape (a POST of a JSON body to a
vLLM server on loopback, a whole answer back, no redirects, cookies, proxies, compression or
streaming), and on a GPU host the ingress's CPU per request is what caps one ingress
process. Measured side by side (``benchmarks/engine_client_cpu.py``), aiohttp's general
machinery (a request and response object, a timer, a header multidict and a URL object per
call) is most of the client's cost; this client writes the request in one ``write`` and
answers from the parser's callbacks.

The contract is ``EngineClient``'s (``gateway.core.routing.engine_access``), with its
failures mapped here, once: nothing accepts the connection in ``CONNECT_TIMEOUT_S`` (or it
is refused): ``EngineUnreachable``; no whole answer within the call's time: ``EngineNoAnswer``; the
connection closed or answered something that is not HTTP: ``EngineConnectionLost``. A call
that ends before its answer (its time is up, it is cancelled: a sibling item failed, the
client left) closes its connection, which is how vLLM learns to abort the request.

A kept connection the engine closed while it sat idle (vLLM's server drops idle ones after
5 s; this client stops reusing them after ``KEEPALIVE_S``, 4 s, as aiohttp was configured
to) is noticed when it says so; a close that crosses the request on the wire is taken as
a stale connection when nothing of an answer came back: the connections kept to that engine
are dropped and the request goes once more, on a new connection.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any
from urllib.parse import urlsplit

import httptools

from gateway.core.routing.engine_access import (
    EngineConnectionLost,
    EngineNoAnswer,
    EngineUnreachable,
    SlotInfo,
)
from gateway.observability import tracing

CONNECT_TIMEOUT_S = 5.0
#: An idle connection is not reused past this (vLLM's server closes idle ones at 5 s).
KEEPALIVE_S = 4.0
#: Request heads kept (one per engine address, path and secret).
MAX_HEADS = 4096


class _Stale(Exception):
    """A reused connection closed before any byte of its answer: send again on a new one."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to one engine; at most one request on it at a time."""

    __slots__ = (
        "transport",
        "parser",
        "waiter",
        "status",
        "chunks",
        "answered_bytes",
        "closed",
        "idle_since",
        "reused",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.status = 0
        self.chunks: list[bytes] = []
        self.answered_bytes = False
        self.closed = False
        self.idle_since = 0.0
        self.reused = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection is not usable
            self.close()
            return
        self.answered_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineConnectionLost(f"the engine's answer is not HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None:
            self._fail(
                EngineConnectionLost(
                    f"the engine closed the connection before its answer was whole"
                    f"{f' ({exc})' if exc else ''}"
                )
                if self.answered_bytes or not self.reused
                else _Stale()
            )

    # -- httptools callbacks ------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if not self.parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((self.status, b"".join(self.chunks)))

    # -- the client's side --------------------------------------------------------------
    def send(
        self, request: bytes, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[tuple[int, bytes]]:
        self.status, self.chunks, self.answered_bytes = 0, [], False
        self.waiter = loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.waiter

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1EngineClient:
    """Keep-alive connections per engine, made in the loop that uses them (the ingress's).
    Unbounded, as the slot gates bound what reaches each engine."""

    def __init__(
        self, connect_timeout_s: float = CONNECT_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        #: (host, port) -> idle connections, the most recently used last
        self._idle: dict[tuple[str, int], collections.deque[_Connection]] = {}
        #: (url, path, secret) -> (host, port, the request's head without its length); a
        #: slot's headers are a function of its secret (``SlotInfo.headers``)
        self._heads: dict[tuple[str, str, str | None], tuple[str, int, bytes]] = {}
        self._open: set[_Connection] = set()

    def _head(self, target: SlotInfo, path: str) -> tuple[str, int, bytes]:
        key = (target.url, path, target.secret)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= MAX_HEADS:  # engines restarted many times: new secrets
                self._heads.clear()
            url = urlsplit(target.url)
            host, port = url.hostname or "127.0.0.1", url.port or 80
            lines = [
                f"POST {url.path.rstrip('/')}{path} HTTP/1.1",
                f"host: {url.netloc}",
                *(f"{k}: {v}" for k, v in target.headers.items()),
            ]
            head = self._heads[key] = (
                host,
                port,
                ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1"),
            )
        return head

    async def post(
        self, target: SlotInfo, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        host, port, head = self._head(target, path)
        if not tracing.ENABLED:
            request = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        else:  # the engine call's trace context, for vLLM's own spans (not in the cached head)
            request = b"%s%d\r\n%s\r\n%s" % (head, len(body), tracing.header_lines(), body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _ in range(2):  # the second only after a stale kept connection
            conn = self._take(host, port)
            if conn is None:
                conn = await self._connect(host, port, deadline, target.url)
            try:
                return await self._exchange(conn, request, deadline, loop, target.url, timeout_s)
            except _Stale:  # the others kept with it likely are too (the engine restarted)
                for stale in self._idle.pop((host, port), ()):
                    self._drop(stale)
                continue
            finally:
                self._release(conn, host, port)
        raise EngineConnectionLost(
            f"{target.url}: the engine closed two connections before answering"
        )

    async def _exchange(
        self,
        conn: _Connection,
        request: bytes,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
        url: str,
        timeout_s: float,
    ) -> tuple[int, bytes]:
        waiter = conn.send(request, loop)
        timer = loop.call_at(deadline, _time_up, waiter)
        try:
            return await waiter
        except TimeoutError:
            raise EngineNoAnswer(f"{url}: no answer within {timeout_s:g}s") from None
        except EngineConnectionLost as exc:
            raise EngineConnectionLost(f"{url}: {exc}") from None
        finally:
            timer.cancel()
            if conn.waiter is not None:  # ended before its answer: vLLM aborts on the close
                conn.waiter = None
                conn.close()

    async def _connect(self, host: str, port: int, deadline: float, url: str) -> _Connection:
        loop = asyncio.get_running_loop()
        left = deadline - loop.time()
        try:
            async with asyncio.timeout(min(self.connect_timeout_s, max(left, 0.0))):
                _, conn = await loop.create_connection(_Connection, host, port)
        except TimeoutError:
            if left <= self.connect_timeout_s:
                raise EngineNoAnswer(
                    f"{url}: no answer within the call's time (still connecting)"
                ) from None
            raise EngineUnreachable(
                f"{url}: no connection within {self.connect_timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise EngineUnreachable(f"{url}: {exc}") from exc
        self._open.add(conn)
        return conn

    def _take(self, host: str, port: int) -> _Connection | None:
        idle = self._idle.get((host, port))
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                conn.reused = True
                return conn
            self._drop(conn)
        return None

    def _release(self, conn: _Connection, host: str, port: int) -> None:
        if conn.closed or conn.waiter is not None:
            self._drop(conn)
            return
        now = time.monotonic()
        conn.idle_since = now
        idle = self._idle.setdefault((host, port), collections.deque())
        idle.append(conn)
        while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive_s):
            self._drop(idle.popleft())  # the oldest first: they expire in order

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def aclose(self) -> None:
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close


def _time_up(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
