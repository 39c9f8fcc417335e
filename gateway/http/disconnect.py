"""Stop working for a client that went away.

uvicorn (the ingress replica's server behind HAProxy) does not cancel a handler when its
client disconnects; it only tells ``receive()``. A trainer killed or timed out mid-batch
would leave its engine requests running to the end, and under a restart storm the engines
would compute for nobody. So, as vLLM's own ``with_cancellation`` does, the handler's work
races a listener for ``http.disconnect``: when the client goes first, the work is
cancelled, which closes its engine connections, which makes vLLM abort those requests.
(Behind Serve's own proxy, Serve cancels the handler itself; both end the same way.)
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from fastapi import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed its connection before its answer was ready."""


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read before: every message left
    is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ``ClientDisconnected`` once the client is gone (``work`` then
    cancelled and awaited, so its engine calls are closed before this returns)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected
