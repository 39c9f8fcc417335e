"""Operations: ``/v1/models`` (slots, fingerprints, health, self-test), ``/health``
(liveness) and ``/metrics`` (Prometheus text; open, like ``/health``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from gateway.core.api.schemas import ModelList
from gateway.core.service import RewardService
from gateway.http.auth import auth_dependencies, current_gateway
from gateway.observability import metrics


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(tags=["ops"])

    @r.get("/v1/models", response_model=ModelList, dependencies=auth_dependencies(auth))
    async def models(gateway: RewardService = Depends(current_gateway)) -> JSONResponse:
        return JSONResponse((await gateway.models()).model_dump())

    @r.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:  # the slot counts as they are now (scale events change them)
            metrics.export_slot_counts(gateway.slots.as_dict())
            for model, n in gateway.slots.as_dict().items():
                view = gateway.transport.slot_view(model, n)
                metrics.export_slot_classes(model, view.classes.classes)
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @r.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return r
