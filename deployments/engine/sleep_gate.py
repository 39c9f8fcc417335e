"""The engine's sleep gate: holds new requests out while its slot sleeps, counts the ones in.

Runs inside the vLLM server (added with vLLM's ``--middleware``, inside the secret guard,
so its control paths need the slot's secret too). Before a slot sleeps it pauses the gate
(``POST /rmgate/pause``): from then on every request but the probe, liveness and vLLM's own
sleep routes is answered ``503`` with ``ASLEEP_CODE``, which the ingress reads as "asleep"
(never as an engine failure), and the slot waits until ``GET /rmgate/gate`` counts no
request inside before it sleeps or stops the engine: no request is cut off by a sleep.
Ingress replicas that still hold the engine's address learn it from that answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.engine.fault import Nudger
from gateway.core.elastic.sleep import ASLEEP_CODE

#: Paths that pass a paused gate: liveness, metrics, vLLM's sleep routes and the RPC a
#: level-2 wake reloads the weights with.
PASS_PATHS = frozenset(
    {"/health", "/metrics", "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/version"}
)
CONTROL_PREFIX = "/rmgate/"
#: Requests carrying this header pass a paused gate: the slot's numerics probes after a wake.
PROBE_HEADER = "x-rmgate-probe"
_PROBE_KEY = PROBE_HEADER.encode()

Scope = dict[str, Any]
Send = Callable[..., Awaitable[Any]]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Send], Awaitable[None]]


async def _answer(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SleepGate:
    """Pure ASGI middleware: ``paused`` refuses, ``inflight`` counts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.paused = False
        self.inflight = 0
        #: The audit's negative control only (``deployments.engine.fault``); None in service.
        self.nudger = Nudger.from_env()

    def _state(self) -> dict[str, Any]:
        return {"paused": self.paused, "inflight": self.inflight}

    async def __call__(
        self, scope: Scope, receive: Callable[..., Awaitable[Any]], send: Send
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path.startswith(CONTROL_PREFIX):
            await self._control(path, scope.get("method", "GET"), send)
            return
        if path in PASS_PATHS or any(k == _PROBE_KEY for k, _ in scope.get("headers") or []):
            await self.app(scope, receive, send)
            return
        if self.paused:
            await _answer(
                send,
                503,
                {
                    "error": {
                        "message": "this slot is asleep",
                        "type": "unavailable",
                        "code": ASLEEP_CODE,
                    }
                },
            )
            return
        self.inflight += 1
        if self.nudger is not None:
            send = self.nudger.wrap(path, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    async def _control(self, path: str, method: str, send: Send) -> None:
        action = path[len(CONTROL_PREFIX) :]
        if action == "pause" and method == "POST":
            self.paused = True
        elif action == "resume" and method == "POST":
            self.paused = False
        elif not (action == "gate" and method == "GET"):
            await _answer(send, 404, {"error": f"no gate action {method} {path}"})
            return
        await _answer(send, 200, self._state())
