"""Reaching a slot's engine: endpoint discovery, the per-slot gate, waiting out restarts.

The ingress asks a slot replica (through its Serve handle) where its engine listens, then
posts straight to it over loopback HTTP (``direct``), or hands the body to the replica
(``handle``). Either way requests for a slot pass a gate of ``max_inflight`` (1 when the
policy serializes), so the engine never holds more than the policy allows and the
ingress can refuse work it cannot queue (503 + Retry-After) instead of hoarding it.

A request never moves to another slot: when a slot's engine is unreachable, the request
waits (up to ``slot_wait_s``) for Ray Serve to restart that replica, because another
slot could answer with other bits. The one exception is a slot that scaling removed
(``set_slot_counts``): its requests are handed back (``SlotRemoved``) to be routed by
their key under the new count, which is where every later request with that key goes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import httpx

from gateway.observability import metrics
from gateway.core.config import GatewaySettings
from gateway.transport.engine_client import AiohttpEngineClient, EngineClient
from gateway.http.errors import GatewayError

logger = logging.getLogger("rmgate")

#: Per-request engine timeout override (the ingress sets it from ``x-rmgate-timeout``).
REQUEST_TIMEOUT_S: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "rmgate_request_timeout_s", default=None)

RETRY_BACKOFF_S = 0.5
MAX_ENGINE_5XX_RETRIES = 2


@dataclass
class EngineReply:
    status: int
    body: bytes
    fingerprint: str | None = None
    #: The slot that answered: the request's own, unless failover moved it.
    slot: int | None = None


class SlotUnavailable(GatewayError):
    """A slot's engine stayed unreachable for the whole wait."""


class SlotRemoved(SlotUnavailable):
    """The slot was scaled away while a request was bound for it; the caller routes the
    request again under the new slot count (its key's slot there, not a failover)."""


@dataclass
class SlotInfo:
    url: str
    fingerprint: str | None
    mode: str
    max_inflight: int
    raw: dict[str, Any] = field(default_factory=dict)


class Transport(Protocol):
    """How the gateway core reaches slot ``slot`` of ``model``."""

    async def post(self, model: str, slot: int, path: str, body: bytes,
                   fallbacks: Sequence[int] = ()) -> EngineReply: ...

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None: ...

    async def health(self, model: str, slot: int, timeout_s: float) -> str: ...


class _Gate:
    """A counting gate with a bounded waiting room (its depth is exported per slot)."""

    def __init__(self, size: int, max_waiting: int, labels: tuple[str, str]) -> None:
        self.sem = asyncio.Semaphore(size)
        self.max_waiting = max_waiting
        self.waiting = 0
        self.queued = metrics.QUEUED.labels(*labels)
        self.inflight = metrics.INFLIGHT.labels(*labels)

    async def __aenter__(self) -> None:
        if self.sem.locked() and self.waiting >= self.max_waiting:
            raise GatewayError(503, "slot queue is full; retry later", "queue_full",
                               headers={"Retry-After": "1"})
        self.waiting += 1
        self.queued.inc()
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1
            self.queued.dec()
        self.inflight.inc()

    async def __aexit__(self, *exc: object) -> None:
        self.inflight.dec()
        self.sem.release()


class ServeTransport:
    """Transport over Ray Serve slot deployments (``handles[model][slot]``)."""

    def __init__(self, handles: dict[str, list[Any]], settings: GatewaySettings,
                 queue_limits: dict[str, int] | None = None) -> None:
        self.handles = handles
        self.settings = settings
        self.queue_limits = queue_limits or {}
        self._info: dict[tuple[str, int], SlotInfo] = {}
        #: Current slots per model (the ingress's ``user_config``); slots at or above the
        #: count are gone or going.
        self.slot_counts: dict[str, int] = {}
        self._gates: dict[tuple[str, int], _Gate] = {}
        self.engine_client: EngineClient = AiohttpEngineClient()

    def set_slot_counts(self, counts: dict[str, int]) -> None:
        self.slot_counts.update(counts)
        for model, slot in list(self._info):
            if slot >= self.slot_counts.get(model, slot + 1):
                self._info.pop((model, slot), None)

    def _removed(self, model: str, slot: int) -> bool:
        return slot >= self.slot_counts.get(model, slot + 1)

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

    async def health(self, model: str, slot: int, timeout_s: float) -> str:
        """``healthy`` when the slot replica's own health check (its engine's /health)
        passes within ``timeout_s``, else ``unavailable`` (dead, restarting or starting)."""
        try:
            await asyncio.wait_for(self.handles[model][slot].check_health.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - any failure means not serving now
            return "unavailable"
        return "healthy"

    def _gate(self, key: tuple[str, int], info: SlotInfo) -> _Gate:
        gate = self._gates.get(key)
        if gate is None:
            limit = self.queue_limits.get(key[0], self.settings.max_queue_per_slot)
            gate = self._gates[key] = _Gate(info.max_inflight, limit, (key[0], str(key[1])))
        return gate

    async def _send(self, key: tuple[str, int], info: SlotInfo, path: str, body: bytes,
                    timeout_s: float) -> EngineReply:
        start = time.monotonic()
        if self.settings.transport == "handle":
            try:
                status, content = await asyncio.wait_for(
                    self.handles[key[0]][key[1]].forward.remote(path, body, timeout_s), timeout_s)
            except asyncio.TimeoutError:
                raise httpx.ReadTimeout("handle call timed out") from None
        else:
            status, content = await self.engine_client.post(info.url + path, body, timeout_s)
        labels = (key[0], str(key[1]))
        metrics.ENGINE_SECONDS.labels(*labels).observe(time.monotonic() - start)
        metrics.ENGINE_REQUESTS.labels(*labels, str(status)).inc()
        return EngineReply(status, content, info.fingerprint)

    async def post(self, model: str, slot: int, path: str, body: bytes,
                   fallbacks: Sequence[int] = ()) -> EngineReply:
        """Send to ``slot``; in ``failover: next_slot`` mode, move to ``fallbacks`` in order
        when a slot stays unreachable for ``failover_after_s`` (the last one waits the full
        ``slot_wait_s``). In ``wait`` mode the request only ever waits for its own slot."""
        candidates = [slot]
        if self.settings.failover == "next_slot":
            candidates += [s for s in fallbacks if s != slot]
        for n, target in enumerate(candidates):
            last = n == len(candidates) - 1
            wait_s = self.settings.slot_wait_s if last else self.settings.failover_after_s
            try:
                reply = await self._post_slot(model, target, path, body, wait_s)
            except SlotRemoved:
                raise
            except SlotUnavailable:
                if last:
                    raise
                continue
            reply.slot = target
            if target != slot:
                metrics.FAILOVERS.labels(model, str(slot), str(target)).inc()
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_slot(self, model: str, slot: int, path: str, body: bytes,
                         wait_s: float) -> EngineReply:
        key = (model, slot)
        deadline = time.monotonic() + wait_s
        timeout_s = REQUEST_TIMEOUT_S.get() or self.settings.request_timeout_s
        engine_5xx = 0
        while True:
            if self._removed(model, slot):
                raise SlotRemoved(503, f"slot {model}-{slot} was scaled away", "slot_removed",
                                  headers={"Retry-After": "1"})
            remaining = deadline - time.monotonic()
            try:
                info = self._info.get(key)
                if info is None:
                    if remaining <= 0:
                        raise asyncio.TimeoutError
                    info = self._info[key] = await self._fetch_info(model, slot, remaining)
                async with self._gate(key, info):
                    reply = await self._send(key, info, path, body, timeout_s)
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
                                       f"{timeout_s:g}s", "engine_timeout")
            except (httpx.TransportError, asyncio.TimeoutError) as exc:
                logger.warning("slot %s-%d unreachable (%s); waiting for it", model, slot,
                               type(exc).__name__)
            except GatewayError:
                raise
            except Exception as exc:  # Ray actor died mid-call, handle errors
                logger.warning("slot %s-%d call failed (%s: %s); waiting for it", model, slot,
                               type(exc).__name__, exc)
            self._info.pop(key, None)
            metrics.SLOT_UNAVAILABLE.labels(model, str(slot)).inc()
            if time.monotonic() + RETRY_BACKOFF_S > deadline:
                raise SlotUnavailable(503, f"slot {model}-{slot} is unavailable; it did not come "
                                      f"back within {wait_s:.0f}s", "slot_unavailable",
                                      headers={"Retry-After": "5"})
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def aclose(self) -> None:
        await self.engine_client.aclose()
