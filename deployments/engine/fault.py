"""A fault to inject on purpose: one slot whose answers differ while its fingerprint, class
and probe answers stay those of its mates.

This is the failure the continuous audit exists for (batch invariance leaking on some
shapes, a kernel that changed without a version string moving): the start-up probes and
the canary cannot see it, only the comparison of real answers can. The audit's negative
control turns it on with ``RMGATE_FAULT_NUDGE_EVERY=SLOT:N`` in a model's ``engine_env``:
on slot ``SLOT`` every ``N``-th ``/classify`` answer (probes, which carry the probe header,
excepted) has its last value moved by one ulp. The variable is not a kernel setting, so it
is not part of the slot's numerics identity. Never set it in production.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

FAULT_ENV = "RMGATE_FAULT_NUDGE_EVERY"
#: The slot an engine serves (set by ``plan_engine``), so one model-wide setting names one slot.
SLOT_ENV = "RMGATE_SLOT_INDEX"

Send = Callable[[dict[str, Any]], Awaitable[Any]]


def nudged(body: bytes) -> bytes:
    """``body`` (a ``/classify`` answer) with its last value one ulp larger."""
    payload = json.loads(body)
    probs = payload["data"][-1]["probs"]
    probs[-1] = math.nextafter(probs[-1], math.inf)
    return json.dumps(payload).encode()


class Nudger:
    """Counts answers; every ``every``-th one is nudged on its way out."""

    def __init__(self, every: int) -> None:
        self.every = max(1, every)
        self.count = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Nudger | None:
        spec = env.get(FAULT_ENV, "")
        if not spec:
            return None
        slot, _, every = spec.partition(":")
        if slot.strip() != env.get(SLOT_ENV, "").strip():
            return None
        return cls(int(every or 1))

    def wrap(self, path: str, send: Send) -> Send:
        """``send`` itself, or (every ``every``-th ``/classify``) one that nudges the body."""
        if path != "/classify":
            return send
        self.count += 1
        if self.count % self.every:
            return send
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def nudging(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if start.get("status") == 200:
                try:
                    body = nudged(body)
                except (ValueError, KeyError, IndexError, TypeError):
                    pass
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return nudging
