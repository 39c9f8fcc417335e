"""Engine clients: how the ingress posts a canonical body to a slot's engine.

One client per transport kind, all raising rmgate's own ``EngineCallError``s
(``gateway.core.transport``), mapped here, once, from the library below:

* ``AiohttpEngineClient`` (``transport: direct``): straight to the vLLM server over
  loopback HTTP. aiohttp, not httpx, on this hot path: measured on this 2-core machine,
  4,000 POSTs at concurrency 32 to a local uvicorn server cost the client **2.23 ms CPU per
  request with httpx** (its pool scans every connection per request) and **0.12 ms with
  aiohttp** (0.86 s vs 8.9 s wall). On a host whose cores the engines saturate, the
  client's CPU is throughput taken from them.
* ``HandleEngineClient`` (``transport: handle``): through the slot replica's Serve handle
  (``SlotReplica.forward``), for engines the ingress cannot reach over the network.
* ``HttpxEngineClient``: the same contract over an ``httpx.AsyncClient`` (unit tests mount
  httpx's ``MockTransport`` on it).
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

import aiohttp
import httpx

from gateway.core.transport import (EngineConnectionLost, EngineNoAnswer, EngineUnreachable,
                                    SlotInfo)

CONNECT_TIMEOUT_S = 5.0


class AiohttpEngineClient:
    """Keep-alive connections to every engine; the session is made in the loop that uses it."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # limit=0: the per-slot gate, not the pool, bounds what reaches an engine
            # no cookies, no decompression: an engine sends neither, and each costs work
            # on every response
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def post(self, target: SlotInfo, path: str, body: bytes,
                   timeout_s: float) -> tuple[int, bytes]:
        url = target.url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._get_session().post(url, data=body, headers=target.headers,
                                                timeout=timeout) as resp:
                return resp.status, await resp.read()
        except aiohttp.ConnectionTimeoutError as exc:
            raise EngineUnreachable(f"{url}: {exc}") from exc
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise EngineNoAnswer(f"{url}: no answer within {timeout_s:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(f"{url}: {exc}") from exc
        except aiohttp.ClientError as exc:  # disconnected, payload cut, protocol errors
            raise EngineConnectionLost(f"{url}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HandleEngineClient:
    """Posts through the slot replica (``handles[model][slot].forward``); Ray's errors
    (actor died, replica restarting) mean the slot is unreachable for now."""

    def __init__(self, handles: Mapping[str, Any]) -> None:
        self.handles = handles

    async def post(self, target: SlotInfo, path: str, body: bytes,
                   timeout_s: float) -> tuple[int, bytes]:
        handle = self.handles[target.model][target.slot]
        try:
            status, content = await asyncio.wait_for(
                handle.forward.remote(path, body, timeout_s), timeout_s)
        except asyncio.TimeoutError:
            raise EngineNoAnswer(f"slot {target.model}-{target.slot}: the handle call got no "
                                 f"answer within {timeout_s:g}s") from None
        except Exception as exc:  # noqa: BLE001 - Ray's actor/handle errors, whatever type
            raise EngineConnectionLost(f"slot {target.model}-{target.slot}: "
                                       f"{type(exc).__name__}: {exc}") from exc
        return int(status), bytes(content)

    async def aclose(self) -> None:
        return None


class HttpxEngineClient:
    """The direct contract over an ``httpx.AsyncClient`` (tests mount a mock transport)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post(self, target: SlotInfo, path: str, body: bytes,
                   timeout_s: float) -> tuple[int, bytes]:
        url = target.url + path
        try:
            resp = await self._client.post(
                url, content=body, headers=target.headers,
                timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EngineUnreachable(f"{url}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise EngineNoAnswer(f"{url}: no answer within {timeout_s:g}s") from exc
        except httpx.TransportError as exc:
            raise EngineConnectionLost(f"{url}: {type(exc).__name__}: {exc}") from exc
        return resp.status_code, resp.content

    async def aclose(self) -> None:
        await self._client.aclose()
