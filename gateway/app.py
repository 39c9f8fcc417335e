"""The Ray Serve application: one ingress plus one single-replica deployment per slot.

``build_app`` is the ``import_path`` target of the Serve config files, so the same
application starts with ``rmgate serve CONFIG``, ``serve run CONFIG`` and ``serve deploy``.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.replica import SlotReplica
from gateway.config import AppConfig
from gateway.ingress import create_app, set_current_gateway
from gateway.routing import ServeTransport
from gateway.service import RewardGateway

fastapi_app = create_app()


@serve.deployment(name="gateway", max_ongoing_requests=8192,
                  ray_actor_options={"num_cpus": 0})
@serve.ingress(fastapi_app)
class Gateway:
    """The ingress replica: canonicalizes, keys, seeds and routes each request to its slot."""

    def __init__(self, config: dict[str, Any], handles: dict[str, list[Any]]) -> None:
        cfg = AppConfig.model_validate(config)
        limits = {m.name: m.max_queue_per_slot for m in cfg.models if m.max_queue_per_slot}
        self.transport = ServeTransport(handles, cfg.gateway, limits)
        set_current_gateway(RewardGateway(cfg, self.transport))


def slot_deployment_name(model: str, slot: int) -> str:
    return f"{model}-{slot}"


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder: ``args`` is an ``AppConfig`` (the config file's args)."""
    cfg = AppConfig.model_validate(args)
    handles = {
        m.name: [
            SlotReplica.options(name=slot_deployment_name(m.name, i),
                                ray_actor_options=m.ray_actor_options).bind(m.model_dump(), i)
            for i in range(m.replicas)
        ]
        for m in cfg.models
    }
    return Gateway.bind(cfg.model_dump(), handles)
