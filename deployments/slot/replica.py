"""The slot replica: a single-replica Ray Serve deployment that owns one vLLM engine.

One deployment per slot (``<model>-0 … <model>-(N-1)``) rather than N replicas of one
deployment: the slot index lives in the deployment name, so it survives restarts (Ray's
replica ids do not), routing by key needs no custom request router, and a dead slot does
not stall requests bound for healthy ones (docs/architecture.md, "Topology").
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from ray import serve
from ray.serve import Application

from deployments.engine.args import detect_platform, engine_headers, plan_engine
from deployments.engine.fingerprint import build_fingerprint, digest_dir
from deployments.engine.numerics import slot_identity, slot_numerics
from deployments.engine.ports import PortReservation
from deployments.engine.prefix_check import run_prefix_check
from deployments.engine.prefix_verdicts import recall_failure, remember_failure
from deployments.engine.process import EngineProcess
from deployments.engine.selftest import prove_batching, run_selftest
from deployments.engine.sleep_control import EngineControl
from deployments.slot.lifecycle import SlotLifecycle
from gateway.core.config.settings import ModelSpec

logger = logging.getLogger("ray.serve")
T = TypeVar("T")

ENGINE_HOST = "127.0.0.1"


def _node_address() -> str:
    """This Ray node's address (``--node-ip-address`` of its raylet: loopback in the
    one-machine tests, the interface address on a real cluster)."""
    import ray

    return ray.util.get_node_ip_address()


def _where(engine: EngineProcess) -> dict[str, Any]:
    """Where this slot runs, for ``/v1/models``: on one machine with several raylets the
    address is the same for every node, so the Ray node id is what tells them apart."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "address": _node_address(),
        "engine_host": engine.host,
        "engine_pid": engine.pid,
    }


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
        self.name = f"{self.spec.name}-{slot}"
        self.platform = detect_platform()
        self.selftest: dict[str, Any] | None = None
        self.prefix_cache: dict[str, Any] | None = None
        running = self._start_engine(self.spec)
        running, self.selftest = prove_batching(
            running,
            lambda: self.plan.mode,
            lambda s: self._probe(run_selftest, s),
            self._restart_engine,
        )
        if self.plan.prefix_cache:  # asked for (prefix_cache: auto): proven, or off
            check = self._probe(run_prefix_check, running)
            self.prefix_cache = {"enabled": check.passed, "check": check.as_dict()}
            logger.info("slot %s-%d: prefix-cache check %s", running.name, slot, check.summary())
            if not check.passed:
                remember_failure(self._identity(running), check)
                running = running.model_copy(update={"prefix_cache": "off"})
                self._restart_engine(running)
        #: What the engine runs now (after any fallback): what a wake starts again.
        self.running = running
        self.lifecycle = SlotLifecycle(self)
        # The slot's numerics class: its identity and its answers to the golden probes,
        # one at a time, before it serves (gateway.core.routing.numerics).
        self.numerics = slot_numerics(
            self.spec, self.plan, self.platform, self.model_digest, self.engine.url
        )
        logger.info(
            "slot %s-%d: numerics class %s (probe digest %s)",
            self.spec.name,
            slot,
            self.numerics["class_id"],
            (self.numerics["probe_digest"] or "-")[:12],
        )
        if self.numerics.get("error"):  # a class of its own: its keys never move
            logger.warning(
                "slot %s-%d: no numerics class (%s); its keys stay on it",
                self.spec.name,
                slot,
                self.numerics["error"],
            )
        self.client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))
        logger.info(
            "slot %s-%d: engine ready at %s (mode %s)",
            self.spec.name,
            slot,
            self.engine.url,
            self.plan.mode,
        )

    def _probe(self, check: Callable[..., T], spec: ModelSpec) -> T:
        """A start-up check (self-test, prefix-cache check) of the running engine."""
        return check(
            self.engine.url,
            spec.kind,
            spec.name,
            headers=engine_headers(self.plan),
            max_model_len=spec.max_model_len,
        )

    def _restart_engine(self, spec: ModelSpec) -> None:
        self.engine.stop()
        self._start_engine(spec)

    def _identity(self, spec: ModelSpec) -> dict[str, Any]:
        """The numerics identity of ``spec``'s engine as planned now (the key of its
        prefix-cache verdict)."""
        return slot_identity(spec, self.plan, self.platform, self.model_digest)

    def _start_engine(self, spec: ModelSpec) -> ModelSpec:
        """Start the slot's engine for ``spec``; returns the spec it runs: without the
        prefix cache where an identical engine's check failed on this host before
        (``deployments.engine.prefix_verdicts``), so that it does not start twice."""
        # loopback: only this node reaches the engine; node: the ingress on another node
        # does too. Either way the engine answers only callers with its secret, which only
        # the ingress is told (endpoint()): on a shared training node any local process
        # could otherwise reach it around the gateway, its auth and its metrics.
        host = ENGINE_HOST if spec.engine_host == "loopback" else _node_address()
        self.secret = secrets.token_urlsafe(32)
        with PortReservation(host) as reservation:  # held until our engine listens on it
            port = reservation.port
            self.plan = plan_engine(
                spec, self.platform, port=port, host=host, slot=self.slot, secret=self.secret
            )
            self.model_digest = digest_dir(spec.model_path)
            remembered = recall_failure(self._identity(spec)) if self.plan.prefix_cache else None
            if remembered is not None:
                logger.info(
                    "slot %s-%d: prefix cache off, its check failed here before (%s)",
                    spec.name,
                    self.slot,
                    remembered["remembered"]["file"],
                )
                self.prefix_cache = remembered
                spec = spec.model_copy(update={"prefix_cache": "off"})
                self.plan = plan_engine(
                    spec, self.platform, port=port, host=host, slot=self.slot, secret=self.secret
                )
            self.fingerprint = build_fingerprint(
                model_digest=self.model_digest,
                device=self.platform.name,
                mode=self.plan.mode,
                dtype=spec.engine_args.get("dtype"),
                attention=self.plan.attention_backend,
                prefix_cache=self.plan.prefix_cache,
            )
            if self.platform.device == "cuda":  # engines packed on one GPU must not share caches
                cache = Path(tempfile.gettempdir()) / "rmgate-cache" / f"{spec.name}-{self.slot}"
                self.plan.env.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
                self.plan.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
            self.engine = EngineProcess(self.plan, host, port, f"{spec.name}-{self.slot}")
            logger.info(
                "slot %s-%d: starting engine on port %d, mode %s",
                spec.name,
                self.slot,
                port,
                self.plan.mode,
            )
            self.engine.start()
            self.engine.wait_ready(spec.startup_timeout_s)
        return spec

    # ---- sleep and wake (deployments.slot.lifecycle) ------------------------------------
    def control(self) -> EngineControl:
        return EngineControl(self.client, self.engine.url, engine_headers(self.plan))

    def uses_sleep_mode(self) -> bool:
        return self.plan.sleep_mode

    def engine_group(self) -> int | None:
        return self.engine.pid if self.engine.alive() else None

    def stop_engine(self) -> None:
        self.engine.stop()

    def start_engine(self) -> None:
        """A stopped (or kept-out) engine started again as it last ran: new port, new secret."""
        self._restart_engine(self.running)

    def reprobe(self) -> dict[str, Any]:
        """The golden probes answered again; adopted only when the class is unchanged."""
        numerics = slot_numerics(
            self.spec, self.plan, self.platform, self.model_digest, self.engine.url
        )
        if numerics.get("class_id") == self.numerics.get("class_id"):
            self.numerics = numerics
        return numerics

    def numerics_class(self) -> str | None:
        return self.numerics.get("class_id")

    async def sleep(self, level: int = 1, by: str = "user") -> dict[str, Any]:
        """Sleep at vLLM's ``level`` (``deployments.slot.lifecycle``); ``by``: user or
        autoscaler (decides what a request finding it asleep does)."""
        return {"slot": self.slot, **await self.lifecycle.sleep(level, by)}  # type: ignore[arg-type]

    async def wake_up(self) -> dict[str, Any]:
        return {"slot": self.slot, **await self.lifecycle.wake_up()}

    async def state(self) -> dict[str, Any]:
        return {"slot": self.slot, **self.lifecycle.report()}

    async def endpoint(self) -> dict[str, Any]:
        """Where the ingress reaches this slot's engine, and what its answers depend on; a
        slot that is not awake says only its state (its engine is not to be called)."""
        if self.lifecycle.state != "awake":
            return {
                "slot": self.slot,
                "state": self.lifecycle.state,
                "sleep": self.lifecycle.report(),
                "numerics": self.numerics,
                "fingerprint": self.fingerprint,
            }
        return {
            "state": "awake",
            "url": self.engine.url,
            "fingerprint": self.fingerprint,
            "mode": self.plan.mode,
            "max_inflight": self.plan.max_inflight,
            "slot": self.slot,
            "engine_pid": self.engine.pid,
            "selftest": self.selftest,
            "prefix_cache": self.prefix_cache,
            "numerics": self.numerics,
            "node": _where(self.engine),
            "secret": self.secret,
        }

    async def forward(
        self,
        path: str,
        body: bytes,
        timeout_s: float,
        trace_headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """The ``handle`` transport: post ``body`` to the engine from inside the replica.
        ``trace_headers``: the ingress's engine-call span (``traceparent``, ``tracestate``)
        when it traces, for vLLM's own spans (``gateway.observability.tracing``)."""
        resp = await self.client.post(
            self.engine.url + path,
            content=body,
            timeout=timeout_s,
            headers={
                "content-type": "application/json",
                **engine_headers(self.plan),
                **(trace_headers or {}),
            },
        )
        return resp.status_code, resp.content

    async def check_health(self) -> None:
        """Ray Serve restarts this replica (and so the engine) when this raises; a slot that
        sleeps (or wakes) on purpose is healthy."""
        if self.lifecycle.state != "awake":
            return
        if not await self.engine.healthy(self.client):
            raise RuntimeError(f"engine of slot {self.spec.name}-{self.slot} is not healthy")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def build_slot(args: dict[str, Any]) -> Application:
    """One slot as its own Serve application (``{"spec": ModelSpec, "slot": i}``), so that
    adding or removing slots never changes this application's version
    (``gateway.serve.topology``)."""
    spec = ModelSpec(**args["spec"])
    slot = int(args["slot"])
    return SlotReplica.options(  # type: ignore[attr-defined]  # a Serve Deployment
        ray_actor_options=spec.actor_options(slot)
    ).bind(spec.model_dump(), slot)
