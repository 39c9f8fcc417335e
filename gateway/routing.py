"""Reaching a slot's engine: endpoint discovery, the per-slot gate, waiting out restarts.

The ingress asks a slot replica (through its Serve handle) where its engine listens, then
posts straight to it over loopback HTTP (``direct``), or hands the body to the replica
(``handle``). Either way requests for a slot pass a gate of ``max_inflight`` (1 when the
policy serializes), so the engine never holds more than the policy allows and the
ingress can refuse work it cannot queue (503 + Retry-After) instead of hoarding it.

A request never moves to another slot: when a slot's engine is unreachable, the request
waits (up to ``slot_wait_s``) for Ray Serve to restart that replica, because another
slot could answer with other bits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gateway.config import GatewaySettings
from gateway.errors import GatewayError

logger = logging.getLogger("rmgate")

RETRY_BACKOFF_S = 0.5
MAX_ENGINE_5XX_RETRIES = 2


@dataclass
class EngineReply:
    status: int
    body: bytes
    fingerprint: str | None = None


@dataclass
class SlotInfo:
    url: str
    fingerprint: str | None
    mode: str
    max_inflight: int
    raw: dict[str, Any] = field(default_factory=dict)


class Transport(Protocol):
    """How the gateway core reaches slot ``slot`` of ``model``."""

    async def post(self, model: str, slot: int, path: str, body: bytes) -> EngineReply: ...

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None: ...


class _Gate:
    """A counting gate with a bounded waiting room."""

    def __init__(self, size: int, max_waiting: int) -> None:
        self.sem = asyncio.Semaphore(size)
        self.max_waiting = max_waiting
        self.waiting = 0

    async def __aenter__(self) -> None:
        if self.sem.locked() and self.waiting >= self.max_waiting:
            raise GatewayError(503, "slot queue is full; retry later", "queue_full",
                               headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc: object) -> None:
        self.sem.release()


class ServeTransport:
    """Transport over Ray Serve slot deployments (``handles[model][slot]``)."""

    def __init__(self, handles: dict[str, list[Any]], settings: GatewaySettings) -> None:
        self.handles = handles
        self.settings = settings
        self._info: dict[tuple[str, int], SlotInfo] = {}
        self._gates: dict[tuple[str, int], _Gate] = {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.request_timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))

    async def _fetch_info(self, model: str, slot: int, timeout_s: float) -> SlotInfo:
        raw = await asyncio.wait_for(self.handles[model][slot].endpoint.remote(), timeout_s)
        return SlotInfo(url=raw["url"], fingerprint=raw.get("fingerprint"), mode=raw["mode"],
                        max_inflight=int(raw.get("max_inflight", 1)), raw=raw)

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None:
        key = (model, slot)
        if key in self._info:
            return self._info[key]
        try:
            self._info[key] = await self._fetch_info(model, slot, timeout_s)
        except Exception:  # not up yet: the caller reports the slot as starting
            return None
        return self._info[key]

    def _gate(self, key: tuple[str, int], info: SlotInfo) -> _Gate:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(info.max_inflight, self.settings.max_queue_per_slot)
        return gate

    async def _send(self, key: tuple[str, int], info: SlotInfo, path: str, body: bytes) -> EngineReply:
        if self.settings.transport == "handle":
            status, content = await self.handles[key[0]][key[1]].forward.remote(
                path, body, self.settings.request_timeout_s)
            return EngineReply(status, content, info.fingerprint)
        resp = await self._client.post(info.url + path, content=body,
                                       headers={"content-type": "application/json"})
        return EngineReply(resp.status_code, resp.content, info.fingerprint)

    async def post(self, model: str, slot: int, path: str, body: bytes) -> EngineReply:
        key = (model, slot)
        deadline = time.monotonic() + self.settings.slot_wait_s
        engine_5xx = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                info = self._info.get(key)
                if info is None:
                    if remaining <= 0:
                        raise asyncio.TimeoutError
                    info = self._info[key] = await self._fetch_info(model, slot, remaining)
                async with self._gate(key, info):
                    reply = await self._send(key, info, path, body)
                if reply.status < 500 or engine_5xx >= MAX_ENGINE_5XX_RETRIES:
                    if reply.status >= 500:
                        raise GatewayError(502, f"engine of slot {model}-{slot} failed "
                                           f"({reply.status}): {reply.body[:500]!r}", "engine_error")
                    return reply
                engine_5xx += 1
                logger.warning("slot %s-%d answered %d; retrying", model, slot, reply.status)
            except httpx.TimeoutException as exc:
                if isinstance(exc, httpx.ConnectTimeout):
                    pass  # treat as unreachable below
                else:
                    raise GatewayError(504, f"engine of slot {model}-{slot} did not answer within "
                                       f"{self.settings.request_timeout_s:.0f}s", "engine_timeout")
            except (httpx.TransportError, asyncio.TimeoutError) as exc:
                logger.warning("slot %s-%d unreachable (%s); waiting for it", model, slot,
                               type(exc).__name__)
            except GatewayError:
                raise
            except Exception as exc:  # Ray actor died mid-call, handle errors
                logger.warning("slot %s-%d call failed (%s: %s); waiting for it", model, slot,
                               type(exc).__name__, exc)
            self._info.pop(key, None)
            if time.monotonic() + RETRY_BACKOFF_S > deadline:
                raise GatewayError(503, f"slot {model}-{slot} is unavailable; it did not come back "
                                   f"within {self.settings.slot_wait_s:.0f}s", "slot_unavailable",
                                   headers={"Retry-After": "5"})
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def aclose(self) -> None:
        await self._client.aclose()
