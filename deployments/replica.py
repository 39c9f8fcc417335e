"""The slot replica: a single-replica Ray Serve deployment that owns one vLLM engine.

One deployment per slot (``<model>-0 … <model>-(N-1)``) rather than N replicas of one
deployment: the slot index lives in the deployment name, so it survives restarts (Ray's
replica ids do not), routing by key needs no custom request router, and a dead slot does
not stall requests bound for healthy ones (DESIGN.md §2).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from ray import serve
from ray.serve import Application

from deployments.engine_args import detect_platform, plan_engine
from deployments.engine_process import EngineProcess, free_port
from deployments.fingerprint import build_fingerprint, digest_dir
from gateway.config import ModelSpec

logger = logging.getLogger("ray.serve")

ENGINE_HOST = "127.0.0.1"


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=4096,
    health_check_period_s=5,
    health_check_timeout_s=30,
    graceful_shutdown_timeout_s=20,
)
class SlotReplica:
    """Starts the slot's engine under the model's determinism policy and reports where it is."""

    def __init__(self, spec: dict[str, Any], slot: int) -> None:
        self.spec = ModelSpec(**spec)
        self.slot = slot
        platform = detect_platform()
        port = free_port(ENGINE_HOST)
        self.plan = plan_engine(self.spec, platform, port=port, host=ENGINE_HOST)
        self.fingerprint = build_fingerprint(
            model_digest=digest_dir(self.spec.model_path), device=platform.name,
            mode=self.plan.mode, dtype=self.spec.engine_args.get("dtype"))
        self.engine = EngineProcess(self.plan, ENGINE_HOST, port, f"{self.spec.name}-{slot}")
        logger.info("slot %s-%d: starting engine on port %d, mode %s", self.spec.name, slot,
                    port, self.plan.mode)
        self.engine.start()
        self.engine.wait_ready(self.spec.startup_timeout_s)
        self.client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))
        logger.info("slot %s-%d: engine ready at %s", self.spec.name, slot, self.engine.url)

    async def endpoint(self) -> dict[str, Any]:
        """Where the ingress reaches this slot's engine, and what its answers depend on."""
        return {"url": self.engine.url, "fingerprint": self.fingerprint, "mode": self.plan.mode,
                "max_inflight": self.plan.max_inflight, "slot": self.slot,
                "engine_pid": self.engine.pid}

    async def forward(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """The ``handle`` transport: post ``body`` to the engine from inside the replica."""
        resp = await self.client.post(self.engine.url + path, content=body, timeout=timeout_s,
                                      headers={"content-type": "application/json"})
        return resp.status_code, resp.content

    async def check_health(self) -> None:
        """Ray Serve restarts this replica (and so the engine) when this raises."""
        if not await self.engine.healthy(self.client):
            raise RuntimeError(f"engine of slot {self.spec.name}-{self.slot} is not healthy")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def build_slot(args: dict[str, Any]) -> Application:
    """One slot as its own Serve application (``{"spec": ModelSpec, "slot": i}``), so that
    adding or removing slots never changes this application's version (``gateway.topology``)."""
    spec = ModelSpec(**args["spec"])
    slot = int(args["slot"])
    return SlotReplica.options(ray_actor_options=spec.ray_actor_options).bind(
        spec.model_dump(), slot)
