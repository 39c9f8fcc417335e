"""Engine clients: how the ingress posts a canonical body to a slot's engine.

One client per transport kind, all raising rmgate's own ``EngineCallError``s
(``gateway.core.routing.engine_access``), mapped here, once, from the library below:

* ``Http1EngineClient`` (``transport: direct``, ``gateway.transport.http1_client``):
  straight to the vLLM server over loopback HTTP/1.1 with keep-alive connections. Not
  httpx (its pool scans every connection per request), not aiohttp (a request object, a
  timer, a header multidict and a URL per call) on this hot path: it costs a fraction of
  either's CPU per request (``benchmarks/engine_client_cpu.py`` measures the three side by
  side). On a host whose cores the engines saturate, the client's CPU is throughput taken
  from them.
* ``HandleEngineClient`` (``transport: handle``): through the slot replica's Serve handle
  (``SlotReplica.forward``), for engines the ingress cannot reach over the network.
* ``HttpxEngineClient``: the same contract over an ``httpx.AsyncClient`` (unit tests mount
  httpx's ``MockTransport`` on it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from gateway.core.routing.engine_access import (
    EngineConnectionLost,
    EngineNoAnswer,
    EngineUnreachable,
    SlotInfo,
)
from gateway.observability import tracing
from gateway.transport.http1_client import CONNECT_TIMEOUT_S, Http1EngineClient

__all__ = ["Http1EngineClient", "HandleEngineClient", "HttpxEngineClient"]


class HandleEngineClient:
    """Posts through the slot replica (``handles[model][slot].forward``); Ray's errors
    (actor died, replica restarting) mean the slot is unreachable for now."""

    def __init__(self, handles: Mapping[str, Any]) -> None:
        self.handles = handles

    async def post(
        self, target: SlotInfo, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        handle = self.handles[target.model][target.slot]
        # the engine call's trace context goes along only when tracing is on (the replica
        # adds it to its request to the engine)
        forward = (
            handle.forward.remote(path, body, timeout_s)
            if not tracing.ENABLED
            else handle.forward.remote(path, body, timeout_s, tracing.trace_headers())
        )
        try:
            status, content = await asyncio.wait_for(forward, timeout_s)
        except TimeoutError:
            raise EngineNoAnswer(
                f"slot {target.model}-{target.slot}: the handle call got no "
                f"answer within {timeout_s:g}s"
            ) from None
        except Exception as exc:  # noqa: BLE001 - Ray's actor/handle errors, whatever type
            raise EngineConnectionLost(
                f"slot {target.model}-{target.slot}: {type(exc).__name__}: {exc}"
            ) from exc
        return int(status), bytes(content)

    async def aclose(self) -> None:
        return None


class HttpxEngineClient:
    """The direct contract over an ``httpx.AsyncClient`` (tests mount a mock transport)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post(
        self, target: SlotInfo, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        url = target.url + path
        try:
            resp = await self._client.post(
                url,
                content=body,
                headers=target.headers
                if not tracing.ENABLED
                else {**target.headers, **tracing.trace_headers()},
                timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S),
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EngineUnreachable(f"{url}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise EngineNoAnswer(f"{url}: no answer within {timeout_s:g}s") from exc
        except httpx.TransportError as exc:
            raise EngineConnectionLost(f"{url}: {type(exc).__name__}: {exc}") from exc
        return resp.status_code, resp.content

    async def aclose(self) -> None:
        await self._client.aclose()
