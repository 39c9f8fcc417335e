"""The Ray Serve applications: one ingress plus one single-replica deployment per slot.

``build_app`` is the ``import_path`` of the compact config files: everything in one
application, which ``serve run CONFIG`` starts as is. ``rmgate serve`` expands the same
file (``gateway.serve.topology.render``) into an ingress application (``build_ingress``) and one
application per slot (``deployments.slot.replica:build_slot``), so that changing ``replicas``
later starts or stops only the slots concerned (``rmgate scale``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ray import serve
from ray.serve import Application

from deployments.engine.arg_names import check_engine_args
from deployments.slot.replica import SlotReplica
from gateway.core.api.errors import InvalidSlotCounts
from gateway.core.config.settings import MISSING_MODEL_HINT, AppConfig
from gateway.core.routing.slots import SlotTable
from gateway.core.service import RewardService
from gateway.http.app import ingress_app
from gateway.http.direct_port import serve_direct_port
from gateway.ledger.ledger import Ledger
from gateway.observability import tracing
from gateway.serve.auditor import Auditor
from gateway.serve.autoscaler import AutoscaleFeed
from gateway.serve.canary import Canary
from gateway.serve.labels import resolve_label_tokens, uses_rules
from gateway.serve.sandboxes import start_code_sandboxes
from gateway.serve.topology import (
    INGRESS_DEPLOYMENT,
    SLOT_DEPLOYMENT,
    SLOT_PREFIX_ARG,
    slot_app_name,
)
from gateway.transport.slot_transport import SlotTransport

logger = logging.getLogger("ray.serve")


class SlotAppHandles(Mapping[str, "SlotAppHandles.Model"]):
    """``handles[model][slot]``: Serve handles of the per-slot applications, made on first
    use, so a slot added by a later scale-up needs no new ingress."""

    class Model:
        def __init__(self, model: str, prefix: str = "") -> None:
            self.model = model
            self.prefix = prefix
            self._handles: dict[int, Any] = {}

        def __getitem__(self, slot: int) -> Any:
            if slot not in self._handles:
                self._handles[slot] = serve.get_deployment_handle(
                    SLOT_DEPLOYMENT, app_name=slot_app_name(self.model, slot, self.prefix)
                )
            return self._handles[slot]

    def __init__(self, models: list[str], prefix: str = "") -> None:
        self._models = {m: SlotAppHandles.Model(m, prefix) for m in models}

    def __getitem__(self, model: str) -> SlotAppHandles.Model:
        return self._models[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)


@serve.deployment(
    name=INGRESS_DEPLOYMENT, max_ongoing_requests=8192, ray_actor_options={"num_cpus": 0}
)
@serve.ingress()
class IngressReplica:
    """The ingress replica: canonicalizes, keys, seeds and routes each request to its slot.

    The FastAPI app is built in the replica, after this constructor
    (``__serve_build_asgi_app__``), around this replica's gateway: no module globals and
    nothing of the app pickled with the class."""

    def __init__(
        self,
        config: dict[str, Any],
        handles: Mapping[str, Any] | None = None,
        slot_app_prefix: str = "",
    ) -> None:
        # OpenTelemetry tracing when the replica's OTEL_* environment asks for it (off by
        # default: gateway.observability.tracing), once per replica process
        tracing.configure()
        # label token ids from the models' tokenizers, once (gateway.serve.labels)
        cfg = resolve_label_tokens(AppConfig.model_validate(config))
        limits = {m.name: m.max_queue_per_slot for m in cfg.models if m.max_queue_per_slot}
        if handles is None:
            handles = SlotAppHandles([m.name for m in cfg.models], slot_app_prefix)
        self.slots = SlotTable.from_config(cfg)
        self.transport = SlotTransport(
            handles,
            cfg.gateway,
            self.slots,
            limits,
            on_sleep={m.name: m.on_sleep for m in cfg.models},
        )
        # the ledger must open (a newer schema, an unreachable server: a clear error now);
        # later outages never fail a request (gateway.ledger.writer)
        self.ledger = (
            Ledger.open(cfg.gateway.ledger) if cfg.gateway.ledger.backend != "off" else None
        )
        # rule checks run in worker processes of their own (gateway.rules.pool)
        self.rules = None
        if uses_rules(cfg):
            from gateway.rules.pool import RulePool  # pebble: only where a rule is served

            self.rules = RulePool(cfg.gateway.rule_workers)
        # code_tests rules run code in sandboxes (gateway.sandbox), each proved by a real run
        # before the replica serves: never code run unsandboxed
        self.code = start_code_sandboxes(cfg)
        self.service = RewardService(
            cfg, self.transport, self.slots, self.ledger, self.rules, self.code
        )
        # re-answers a sample of what the ledger records on class mates (gateway.serve.auditor)
        self.auditor = Auditor(cfg, self.transport, self.slots, self.ledger)
        scaled = {m.name: m.autoscaling for m in cfg.models if m.autoscaling is not None}
        self.autoscale = (
            AutoscaleFeed(
                slot_app_prefix or "rmgate",
                scaled,
                max(m.startup_timeout_s for m in cfg.models),
            )
            if scaled
            else None
        )

    def __serve_build_asgi_app__(self) -> Any:
        canary = Canary(
            self.service.config, self.transport, self.slots, on_drift=self._forget_drifted
        )
        jobs = [canary.run, self._learn_classes, self._close_rules, self.auditor.run] + (
            [self.ledger.run] if self.ledger is not None else []
        )
        if self.autoscale is not None:
            feed, router = self.autoscale, self.service.router
            jobs.append(
                lambda: feed.run(
                    self.transport.ongoing,
                    self.slots.as_dict,
                    router.autoscaling,
                    self.transport.undescribed,
                )
            )
        if tracing.ENABLED:  # the spans still queued are exported when the replica stops
            jobs.append(tracing.run_until_shutdown)
        settings = self.service.config.gateway
        port = settings.direct_port
        if port is not None:
            # the same app (built just below, before the lifespan starts its jobs) on the
            # replicas' own port (gateway.http.direct_port)
            jobs.append(
                lambda: serve_direct_port(app, settings.direct_host, port, settings.max_body_bytes)
            )
        # the scoring endpoints' POSTs go to their route functions in front of FastAPI
        app = ingress_app(self.service, background=jobs, ledger=self.ledger, auditor=self.auditor)
        return app

    async def _learn_classes(self) -> None:
        """Ask every slot its numerics class as soon as the ingress runs: until a slot's
        class is known its requests are neither answered from the ledger nor recorded
        (nothing to name them by); waiting for each model's first request cost a restarted
        ingress its hits for that request's whole first burst."""
        for model, n in self.slots.as_dict().items():
            self.transport.slot_view(model, n)  # unknown slots are described in the background

    async def _close_rules(self) -> None:
        """End the rule pool's workers when the ingress stops (a lifespan job: it waits
        for shutdown, then closes)."""
        try:
            await asyncio.Event().wait()
        finally:
            if self.rules is not None:
                await asyncio.to_thread(self.rules.close)
            if self.code is not None:
                await self.code.close()

    async def _forget_drifted(self, model: str, slot: int, numerics_class: str) -> None:
        """A slot's numerics drifted: what it recorded in its old class is no longer
        answered from the ledger (kept for audit; ``rmgate ledger stats`` shows it)."""
        if self.ledger is not None:
            n = await self.ledger.invalidate(model, numerics_class, slot, reason="canary drift")
            logger.warning(
                "ledger: %d rows of %s slot %d (class %s) invalidated after its drift",
                n,
                model,
                slot,
                numerics_class,
            )

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this in place (no restart) when ``user_config`` changes: the slot
        counts of the per-slot layout (``{"slots": {model: n}}``). A count that cannot be
        applied (0, not an integer, an unknown model) is refused as a whole with a clear
        message (Serve reports the deployment as failed) and routing keeps the old counts."""
        slots = (user_config or {}).get("slots")
        if not slots:
            return
        try:
            self.service.set_slot_counts(dict(slots))
        except InvalidSlotCounts as exc:
            logger.error("rmgate: user_config refused: %s", exc.message)
            raise ValueError(f"rmgate: {exc.message}") from None


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder: ``args`` is an ``AppConfig`` (the config file's args).
    Engine argument names are checked against vLLM's own list here, before any slot starts
    (``serve run CONFIG`` comes through here; ``rmgate serve`` checks in ``render``)."""
    cfg = AppConfig.model_validate(args)
    missing = cfg.missing_paths()
    if missing:
        raise ValueError("; ".join(missing) + f"; {MISSING_MODEL_HINT}")
    for spec in cfg.models:
        check_engine_args(spec)
    handles = {
        m.name: [
            SlotReplica.options(  # type: ignore[attr-defined]  # a Serve Deployment
                name=slot_app_name(m.name, i), ray_actor_options=m.actor_options(i)
            ).bind(m.model_dump(), i)
            for i in range(m.replicas)
        ]
        for m in cfg.models
    }
    return IngressReplica.options(  # type: ignore[attr-defined]  # a Serve Deployment
        num_replicas=cfg.gateway.ingress_replicas
    ).bind(cfg.model_dump(), handles)


def build_ingress(args: dict[str, Any]) -> Application:
    """The ingress alone; its slots are separate applications (``gateway.serve.topology``)."""
    args = dict(args)
    prefix = str(args.pop(SLOT_PREFIX_ARG, ""))
    cfg = AppConfig.model_validate(args)
    ingress = IngressReplica.options(  # type: ignore[attr-defined]  # a Serve Deployment
        num_replicas=cfg.gateway.ingress_replicas
    )
    if prefix:
        return ingress.bind(cfg.model_dump(), None, prefix)
    return ingress.bind(cfg.model_dump())
