"""Calls a slot makes to its own engine to sleep and wake: the sleep gate's pause, resume
and count (``deployments.engine.sleep_gate``) and vLLM's ``/sleep`` and ``/wake_up``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

#: How long a sleep waits for the requests inside the engine to finish. Past it the engine
#: sleeps anyway; the ingress sends a request cut off that way again once its slot is awake.
DRAIN_TIMEOUT_S = 300.0
POLL_S = 0.05


class EngineControl:
    """One engine's control calls (``url`` and its secret's ``headers``)."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = headers

    async def _call(self, method: str, path: str, timeout_s: float = 60.0) -> dict[str, Any]:
        resp = await self.client.request(
            method, self.url + path, headers=self.headers, timeout=timeout_s
        )
        resp.raise_for_status()
        return resp.json() if resp.content else {}  # vLLM 0.24's /sleep answers no body

    async def pause(self) -> dict[str, Any]:
        return await self._call("POST", "/rmgate/pause")

    async def resume(self) -> dict[str, Any]:
        return await self._call("POST", "/rmgate/resume")

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> tuple[float, int]:
        """Wait until no request is inside the (paused) engine: seconds waited, and how many
        were still inside when the wait ended (0 unless it timed out)."""
        start = time.monotonic()
        while True:
            inside = int((await self._call("GET", "/rmgate/gate"))["inflight"])
            if inside == 0 or time.monotonic() - start >= timeout_s:
                return time.monotonic() - start, inside
            await asyncio.sleep(POLL_S)

    async def sleep(self, level: int) -> None:
        """vLLM's sleep mode: level 1 offloads the weights to host memory, 2 drops them."""
        await self._call("POST", f"/sleep?level={level}", timeout_s=600.0)

    async def wake_up(self) -> None:
        await self._call("POST", "/wake_up", timeout_s=600.0)

    async def reload_weights(self) -> None:
        """After a level-2 sleep the weights' memory comes back empty: vLLM's workers load
        them again from the model folder (``reload_weights``, a dev-mode RPC)."""
        resp = await self.client.post(
            self.url + "/collective_rpc",
            json={"method": "reload_weights"},
            headers=self.headers,
            timeout=600.0,
        )
        resp.raise_for_status()
